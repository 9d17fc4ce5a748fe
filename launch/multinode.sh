#!/usr/bin/env bash
# Several nodes through DeepSpeed's launcher. A hostfile lists every node with its GPU count, e.g.
#     node1 slots=8
#     node2 slots=8
# and every node needs the repo and the data at the same path. Two ways to start the job:
#   over ssh (pdsh), from node1, with passwordless ssh to every node:
#       bash launch/multinode.sh
#   one command per node, no ssh (as in tests/integration/test_multinode.py, two nodes on one machine):
#       NODE_RANK=0 MASTER_ADDR=node1 bash launch/multinode.sh      # on node1
#       NODE_RANK=1 MASTER_ADDR=node1 bash launch/multinode.sh      # on node2
# Extra arguments go to train_ds.py (the last of a repeated flag wins). The run resumes from the newest
# complete checkpoint in its out_dir, so the same command relaunches a job after a node died (the survivors
# exit with an error after --collective_timeout) or after a SIGTERM to any launcher (a checkpoint, exit 0).
# With DS_ACCELERATOR=cpu the GPU check is skipped (CPU ranks, for the tests).
# 524288 tokens/step on 16 GPUs x micro 32 x 1024 = 1 accumulation step.
set -euo pipefail
# Paths a user gives (DATA, OUT_DIR, HOSTFILE, flags) are the caller's; the repo's own files are found from here
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if [ "${DS_ACCELERATOR:-}" != cpu ]; then
  source "$repo/launch/require_gpus.sh"
  require_gpus "${GPU_NAME:-A800}" "${GPU_GB:-80}"
fi
hostfile=${HOSTFILE:-$repo/hostfile}
# DeepSpeed's launcher trains on this node alone when the hostfile is missing, and a bad line is its traceback
if [ ! -f "$hostfile" ] || [ ! -r "$hostfile" ]; then
  echo "error: HOSTFILE=$hostfile: not a readable file: list every node and its GPUs, one per line ('node1 slots=8')" >&2
  exit 2
fi
line_no=0
while IFS= read -r line || [ -n "$line" ]; do
  line_no=$((line_no + 1))
  if ! [[ "$line" =~ ^[[:space:]]*(#.*)?$ || "$line" =~ ^[[:space:]]*[^[:space:]#]+[[:space:]]+slots=[0-9]+[[:space:]]*$ ]]; then
    echo "error: HOSTFILE=$hostfile: line $line_no, '$line', is not 'HOST slots=N'" >&2
    exit 2
  fi
done < "$hostfile"
launcher=(deepspeed --hostfile "$hostfile" --master_port "${MASTER_PORT:-29500}")
if [ -n "${NODE_RANK:-}" ]; then
  launcher+=(--no_ssh --node_rank "$NODE_RANK" --master_addr "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}")
else
  launcher+=(--master_addr "${MASTER_ADDR:-$(hostname)}")
fi
# exec: this script's PID is the launcher's, so a SIGTERM to it reaches the launcher (gpt/train/stop.py)
exec "${launcher[@]}" "$repo/train_ds.py" --ds_config "${DS_CONFIG:-$repo/ds_configs/zero1_bf16.json}" --model d12 \
  --micro_batch auto --data "${DATA:-$repo/data/fineweb10B}" --out_dir "${OUT_DIR:-$repo/runs/multinode_d12}" --resume auto "$@"
