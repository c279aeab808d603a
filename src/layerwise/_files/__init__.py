"""Results as files: extract_to_file and the .npz/.jsonl layouts (writers), the block-by-block
writer they share (blocks), Parquet output (parquet), and a store's rows pooled into files without
the model (export)."""
