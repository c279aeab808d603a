"""The engine: batches of tokenised inputs in, each batch's rows on the host out."""
