"""``python -m layerwise``: the command line, as ``layerwise``."""

from .cli import main

main()
