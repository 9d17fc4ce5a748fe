"""A training run: the checks before launch, the trainer, the DeepSpeed engine, checkpoints, ranks, stops, metrics, evaluation."""
