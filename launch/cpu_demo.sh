#!/usr/bin/env bash
# The CPU demo: install, turn the embedded Shakespeare corpus into GPT-2 token shards, and train a small
# GPT-2 with DeepSpeed on 2 CPU ranks (gloo) for a few minutes. Ends with a text sample and the val loss.
# TensorBoard: tensorboard --logdir runs/
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup_cpu.sh
[ -f data/shakespeare/shakespeare_train_000001.bin ] || python -m gpt.prepare shakespeare --out_dir data/shakespeare
export DS_ACCELERATOR=cpu  # this recipe is the CPU twin: say so instead of letting DeepSpeed probe
deepspeed --num_gpus 2 train_ds.py \
  --ds_config ds_configs/zero2_bf16.json \
  --model d4 --seq_len 256 --micro_batch 4 --total_batch_tokens 4096 \
  --max_steps 80 --warmup_steps 8 --lr 2e-3 \
  --data data/shakespeare --out_dir runs/cpu_demo \
  --val_every 20 --val_tokens 16384 --sample_every 80 --sample_tokens 96 "$@"
