#!/usr/bin/env bash
# GPT-2 124M on 8x A800 80GB (A100 80GB likewise; launch/h800_80gb.sh reuses it): bf16, ZeRO-1,
# torch.compile, the planner's micro-batch (planned: 64 x 1024 x 8 GPUs = 524288 tokens/step, no
# accumulation; build-nanogpt ran 64 on 80GB). Larger models: --model d24 with ds_configs/zero2_bf16_ckpt.json and a smaller micro_batch.
set -euo pipefail
# Paths a user gives (DATA, flags) are the caller's; the repo's own files are found from here
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
source "$repo/launch/require_gpus.sh"
python -m gpt.commands.plan --model d12 --seq_len 1024 --ds_config "$repo"/ds_configs/zero1_bf16.json --gpu ${GPU_PLAN:-a800-80gb} --world_size "${NUM_GPUS:-8}"
require_gpus "${GPU_NAME:-A800}" 80
deepspeed --num_gpus "${NUM_GPUS:-8}" "$repo/train_ds.py" --ds_config "$repo"/ds_configs/zero1_bf16.json \
  --model d12 --seq_len 1024 --micro_batch auto --data "${DATA:-$repo/data/fineweb10B}" --out_dir "$repo/runs/d12_bf16" --resume auto --compile "$@"
