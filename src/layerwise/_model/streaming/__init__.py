"""Layer streaming: a model larger than memory run layer by layer over blocks of texts (the
forward, the weights readers, the block plan, where the residual stream waits, which models
stream, and whether a model streams by default)."""
