"""What goes into the engine: texts, pairs and pre-split words encoded with everything needed to map
back (encoding), sliding windows for long texts (windows), and corpora read from files in blocks
(corpus, with its formats and sources; readers for the probing and pretraining files)."""
