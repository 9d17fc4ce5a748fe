"""The floor under config, memory and train: DeepSpeed imported quietly, ranks and the process group, the host fixes a run needs, device memory, the lock files."""
