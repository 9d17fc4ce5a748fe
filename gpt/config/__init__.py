"""What a run is told to do: its settings, its DeepSpeed JSON, and what the machine under it can do."""
