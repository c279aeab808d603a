"""What layerwise knows of model families: what kind of text transformer a config describes (kinds.py,
from transformers' mappings), and the one table of the families it knows more of (table.py: each
family's packed forward, layer list, final norm, taps, positions, and docs/models.md's row)."""
