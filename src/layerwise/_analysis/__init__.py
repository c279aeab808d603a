"""What the layers do: statistics across layers (stats, as ``lw.analyze``), figures (plot), the
HTML report (report), and the terminal's tokens x layers table (show)."""
