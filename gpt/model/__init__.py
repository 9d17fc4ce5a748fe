"""The network: GPT-2 as a torch-only module, and the loss kernels that train it without the full logits."""
