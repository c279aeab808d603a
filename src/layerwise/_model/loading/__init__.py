"""Where a model comes from and how it is loaded: hub names, folders, GGUF files, the light
model, accelerate's placement, the tokenizer checks."""
