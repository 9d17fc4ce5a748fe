"""dsgpt: GPT-2 pretraining under the DeepSpeed engine."""
