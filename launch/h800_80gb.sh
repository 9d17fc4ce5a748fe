#!/usr/bin/env bash
# GPT-2 124M on 8x H800 80GB (H100 80GB likewise): bf16, ZeRO-1, micro_batch 64, torch.compile;
# 524288 tokens/step = 64 x 1024 x 8 GPUs, no accumulation.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/require_gpus.sh
require_gpus H800 80
deepspeed --num_gpus "${NUM_GPUS:-8}" train_ds.py --ds_config ds_configs/zero1_bf16.json \
  --model d12 --seq_len 1024 --micro_batch 64 --data "${DATA:-data/fineweb10B}" --out_dir runs/h800_d12 --compile "$@"
