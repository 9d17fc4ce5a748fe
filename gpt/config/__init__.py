"""What a run is told to do: its settings, its DeepSpeed JSON, the checks before launch, and what the machine under it can do."""
