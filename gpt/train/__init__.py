"""A training run: its start (checks, lock, group), the trainer, the DeepSpeed engine, checkpoints, stops, metrics."""
