#!/usr/bin/env bash
# The CPU demo: install, turn the embedded Shakespeare corpus into GPT-2 token shards, and train a small
# GPT-2 with DeepSpeed on 2 CPU ranks (gloo) for a few minutes. Ends with a text sample and the val loss.
# TensorBoard: tensorboard --logdir runs/ (events in runs/cpu_demo/<date-time>/tensorboard/<date-time>/)
set -euo pipefail
# Flags added after the script's name are the caller's (a relative --out_dir is from where you stand); the repo's
# own files are found from here: the shards in data/shakespeare, the runs in runs/cpu_demo
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
bash "$repo/launch/setup_cpu.sh"
data=$repo/data/shakespeare
[ -f "$data/shakespeare_train_000001.bin" ] || python -m gpt.commands.prepare shakespeare --out_dir "$data"
export DS_ACCELERATOR=cpu  # this recipe is the CPU twin: say so instead of letting DeepSpeed probe
# bf16 where the CPU declares bf16 units (AMX, AVX512-BF16), else fp32: emulated bf16 is 3-100x slower.
# 120k tokens: ~1 min on a 2-core AMX Xeon in bf16 or fp32; 3 min measured on a 2-core AVX2-only EPYC (fp32).
config=$(python -m gpt.commands.hardware)
# AdamW's demo recipe; a Muon JSON named in "$@" carries its own (adam_lr, muon_lr) and its warmup is the trainer's
# default (a tenth of the run), which a flag given here would override
case " $* " in *_muon.json*) adamw_recipe=() ;; *) adamw_recipe=(--warmup_steps 6 --lr 3e-3) ;; esac
deepspeed --num_gpus 2 "$repo/train_ds.py" \
  --ds_config "$config" \
  --model d4 --seq_len 256 --micro_batch 4 --total_batch_tokens 2048 \
  --max_steps 60 "${adamw_recipe[@]}" \
  --data "$data" --out_dir "$repo/runs/cpu_demo/$(date +%Y%m%d-%H%M%S)" \
  --val_every 20 --val_tokens 16384 --sample_every 60 --sample_tokens 96 "$@"
