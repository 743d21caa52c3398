"""The single writer: the task that applies ops to tables, evicts, and checkpoints."""
