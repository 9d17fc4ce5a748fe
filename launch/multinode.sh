#!/usr/bin/env bash
# Several nodes through DeepSpeed's launcher. A hostfile lists every node with its GPU count, e.g.
#     node1 slots=8
#     node2 slots=8
# and every node needs the repo and the data at the same path. Two ways to start the job:
#   over ssh (pdsh), from node1, with passwordless ssh to every node (each asked first, SSH_TIMEOUT s, default 10):
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
# DeepSpeed's own reading of it: a node listed twice and no node at all are its tracebacks; slots=0 started no rank
# and exited 0. What it accepts (a comment after the slots) is accepted here too.
line_no=0
hosts=()
declare -A listed_on
while IFS= read -r line || [ -n "$line" ]; do
  line_no=$((line_no + 1))
  [[ "$line" =~ ^[[:space:]]*(#.*)?$ ]] && continue
  if ! [[ "$line" =~ ^[[:space:]]*([^[:space:]#]+)[[:space:]]+slots=([0-9]+)[[:space:]]*(#.*)?$ ]]; then
    echo "error: HOSTFILE=$hostfile: line $line_no, '$line', is not 'HOST slots=N'" >&2
    exit 2
  fi
  host=${BASH_REMATCH[1]} slots=${BASH_REMATCH[2]}
  if [[ "$slots" =~ ^0+$ ]]; then
    echo "error: HOSTFILE=$hostfile: line $line_no, '$line': slots=$slots starts no rank on $host (1 or more GPUs)" >&2
    exit 2
  fi
  if [ -n "${listed_on[$host]:-}" ]; then
    echo "error: HOSTFILE=$hostfile: line $line_no: $host is listed already, on line ${listed_on[$host]}" >&2
    exit 2
  fi
  listed_on[$host]=$line_no
  hosts+=("$host")
done < "$hostfile"
if [ "${#hosts[@]}" -eq 0 ]; then
  echo "error: HOSTFILE=$hostfile: lists no node: one line per node and its GPUs ('node1 slots=8')" >&2
  exit 2
fi
launcher=(deepspeed --hostfile "$hostfile" --master_port "${MASTER_PORT:-29500}")
if [ -n "${NODE_RANK:-}" ]; then
  if ! [[ "$NODE_RANK" =~ ^[0-9]{1,6}$ ]] || [ "$NODE_RANK" -ge "${#hosts[@]}" ]; then
    echo "error: NODE_RANK=$NODE_RANK: not a node of HOSTFILE=$hostfile (0 to $(( ${#hosts[@]} - 1 )), its lines in order)" >&2
    exit 2
  fi
  launcher+=(--no_ssh --node_rank "$NODE_RANK" --master_addr "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}")
else
  # Over ssh every node must answer, without a password or a prompt: DeepSpeed asks the first node alone, with no
  # time limit (an unreachable address said nothing for minutes). One node is launched here, without ssh.
  if [ "${#hosts[@]}" -gt 1 ]; then
    wait_s=${SSH_TIMEOUT:-10}
    if ! [[ "$wait_s" =~ ^[1-9][0-9]{0,3}$ ]]; then
      echo "error: SSH_TIMEOUT=$wait_s: not a number of seconds (1 to 9999)" >&2
      exit 2
    fi
    for host in "${hosts[@]}"; do
      status=0
      answer=$(timeout "$wait_s" ssh -o BatchMode=yes -o ConnectTimeout="$wait_s" "$host" true 2>&1 </dev/null) || status=$?
      if [ "$status" -ne 0 ]; then
        reason=${answer##*$'\n'}  # ssh's last line
        [ "$status" -eq 124 ] && reason="no answer within $wait_s s, SSH_TIMEOUT"
        echo "error: HOSTFILE=$hostfile: node $host is not reachable over ssh (${reason:-ssh exit status $status}): every node needs passwordless ssh from this one; or start one command per node with NODE_RANK (docs/multinode.md)" >&2
        exit 2
      fi
    done
    if ! command -v pdsh >/dev/null; then
      echo "error: several nodes over ssh need pdsh (DeepSpeed's launcher runs it): install it, or start one command per node with NODE_RANK (docs/multinode.md)" >&2
      exit 2
    fi
  fi
  launcher+=(--no_ssh_check --master_addr "${MASTER_ADDR:-$(hostname)}")
fi
# exec: this script's PID is the launcher's, so a SIGTERM to it reaches the launcher (gpt/train/stop.py)
exec "${launcher[@]}" "$repo/train_ds.py" --ds_config "${DS_CONFIG:-$repo/ds_configs/zero1_bf16.json}" --model d12 \
  --micro_batch auto --data "${DATA:-$repo/data/fineweb10B}" --out_dir "${OUT_DIR:-$repo/runs/multinode_d12}" --resume auto "$@"
