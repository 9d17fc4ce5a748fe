"""dsgpt: GPT-2 pretraining under the DeepSpeed engine. README's "Layout" maps each module to its concern;
train_ds.py (-> gpt.train.trainer) trains, gpt-prepare / gpt-plan / gpt-eval / gpt-sample / gpt-export are the tools."""
