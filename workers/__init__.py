"""The background actors the service owns: the single writer that applies ops, evicts and
checkpoints."""
