"""A training run and what it drives: the trainer, the DeepSpeed engine, checkpoints, ranks, stops, metrics and evaluation."""
