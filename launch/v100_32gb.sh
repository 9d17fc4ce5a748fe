#!/usr/bin/env bash
# GPT-2 124M on 8x V100 32GB. V100 has no bf16: fp16 with dynamic loss scaling, LayerNorm/softmax/loss
# in fp32. ZeRO-2 partitions gradients and optimizer states. The plan is printed first; --micro_batch auto
# lets the planner pick on the GPU itself (planned: 32 x 1024 x 8 GPUs x 2 accumulation steps = 524288).
# If the log shows "Current loss scale already at minimum": switch to a bf16 GPU, or raise
# hysteresis / lower initial_scale_power in ds_configs/zero2_fp16.json.
set -euo pipefail
# Paths a user gives (DATA, flags) are the caller's; the repo's own files are found from here
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
source "$repo/launch/require_gpus.sh"
python -m gpt.commands.plan --model d12 --seq_len 1024 --ds_config "$repo"/ds_configs/zero2_fp16.json --gpu v100-32gb --world_size "${NUM_GPUS:-8}"
require_gpus V100 32
deepspeed --num_gpus "${NUM_GPUS:-8}" "$repo/train_ds.py" --ds_config "$repo"/ds_configs/zero2_fp16.json \
  --model d12 --seq_len 1024 --micro_batch auto --data "${DATA:-$repo/data/fineweb10B}" --out_dir "$repo/runs/v100_d12" --resume auto "$@"
