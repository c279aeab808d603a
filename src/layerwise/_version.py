"""layerwise's version, in one module that imports nothing: every module that records it (outputs'
metadata, ``--version``, the server) imports it from here, never from the package's ``__init__``."""

__version__ = "0.3.0.dev0"
