#!/usr/bin/env bash
# Several nodes through DeepSpeed's launcher (pdsh over ssh). A hostfile lists one node per line with its
# GPU count, e.g.
#     node1 slots=8
#     node2 slots=8
# Every node needs the repo and the data at the same path and passwordless ssh from this node.
# 524288 tokens/step on 16 GPUs x micro 32 x 1024 = 1 accumulation step.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/require_gpus.sh
python -m gpt.plan --model d12 --seq_len 1024 --ds_config "${DS_CONFIG:-ds_configs/zero1_bf16.json}" \
  --gpu "${GPU_PLAN:-a800-80gb}" --world_size "${WORLD_SIZE:-16}"
require_gpus "${GPU_NAME:-A800}" "${GPU_GB:-80}"
deepspeed --hostfile "${HOSTFILE:-hostfile}" --master_addr "${MASTER_ADDR:-$(hostname)}" --master_port 29500 \
  train_ds.py --ds_config "${DS_CONFIG:-ds_configs/zero1_bf16.json}" --model d12 --micro_batch auto \
  --data "${DATA:-data/fineweb10B}" --out_dir runs/multinode_d12 "$@"
