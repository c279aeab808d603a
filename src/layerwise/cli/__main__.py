"""python -m layerwise.cli: the command line, as the ``layerwise`` script runs it."""

from . import main

main()
