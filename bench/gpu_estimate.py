"""ESTIMATED (not measured) training throughput on GPUs, from the FLOP model alone:

    tokens/s per GPU = assumed MFU x datasheet peak / training FLOPs per token (6N + attention)

There is no GPU in this project's test environment, so nothing here is a measurement. The assumed MFU
brackets follow published GPT-2 runs: llm.c reports ~60% MFU for GPT-2 124M on A100s in bf16; V100's fp16
tensor cores and H100's much higher peak are harder to keep fed from PyTorch, so their brackets are lower.

    python bench/gpu_estimate.py
"""

import torch

from gpt.config.hardware import GPU_PEAK_FLOPS
from gpt.model.model import GPT, PRESETS

# (GPU, dtype, assumed MFU low and high)
GPUS = [("V100", "fp16", (0.3, 0.4)), ("A100", "bf16", (0.4, 0.6)), ("H100", "bf16", (0.35, 0.5))]
SEQ_LEN, GPU_COUNT, TOKENS = 1024, 8, 10e9  # the FineWeb-edu 10B sample, one epoch


def d12_flops_per_token():
    with torch.device("meta"):  # shapes only: no weights allocated
        model = GPT(PRESETS["d12"])
    return model.flops_per_token(SEQ_LEN)


def main():
    per_token = d12_flops_per_token()
    print(f"d12 (GPT-2 124M), seq_len {SEQ_LEN}: {per_token / 1e9:.3f} GFLOP per training token\n")
    print(f"| GPU | dtype | datasheet peak | assumed MFU | tokens/s per GPU | {GPU_COUNT} GPUs: hours for 10B tokens |")
    print("|---|---|---|---|---|---|")
    for gpu, dtype, assumed_mfu in GPUS:
        peak = GPU_PEAK_FLOPS[gpu][dtype]
        for mfu in assumed_mfu:
            tokens_per_s = mfu * peak / per_token
            hours = TOKENS / (tokens_per_s * GPU_COUNT) / 3600
            print(f"| {gpu} | {dtype} | {peak / 1e12:.0f} TFLOP/s | {mfu:.0%} | ~{tokens_per_s / 1e3:.0f}k | ~{hours:.1f} |")


if __name__ == "__main__":
    main()
