"""From hidden states to features: layer specs (layers), pooling (pool), fusions (fuse), the
trainable scalar mix (scalar_mix), the OutputPlan that names a run's outputs (plan), and those
outputs computed over an extraction stream (stream)."""
