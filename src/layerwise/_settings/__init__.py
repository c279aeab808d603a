"""How a model is loaded and run (Settings), and how settings spell device maps and sizes."""
