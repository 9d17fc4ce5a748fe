#!/usr/bin/env bash
# Run a command as on a slower CPU without bf16 units, made on any machine: failures that a user's slower or
# older CPU would show, found here first.
#   - busy neighbours: N processes spinning in pure Python beside the command (default 4: on a 2-core machine the
#     command gets about a third of the CPU, "a machine three times slower"), ended with it;
#   - oneDNN capped below its bf16 instructions (default AVX512_CORE: an Intel Cascade Lake, AVX-512 without bf16
#     units, where bf16 matmuls run 3-5x slower than fp32; AVX2 for an AVX2-only AMD EPYC, ~90x), with inductor's
#     cache of its own (its CPU kernels are not keyed on the ISA: docs/testing.md);
#   - SIGINT ignored, as a non-interactive shell starts a background job (`cmd &` in a script or a CI harness): how the
#     suite ran when the stop tests failed on the Cascade Lake machine (the runs they start inherited it; --keep-sigint
#     leaves SIGINT as it is);
#   - DSGPT_SLOW_MACHINE=1 in the command's environment, so a test can say which machine it ran on.
# usage: launch/slow_machine.sh [--busy N] [--isa ONEDNN_ISA|none] [--keep-sigint] [--] COMMAND [ARG...]
#   launch/slow_machine.sh python -m pytest -q tests/integration/test_stops_runs.py tests/integration/test_checkpoint_runs.py
#   launch/slow_machine.sh --isa AVX2 python -m gpt.commands.hardware     # the CPU choice as on an AVX2-only EPYC
set -euo pipefail
busy=4 isa=AVX512_CORE ignore_sigint=1
while [ $# -gt 0 ]; do
  case "$1" in
    --busy) busy=$2; shift 2 ;;
    --isa) isa=$2; shift 2 ;;
    --keep-sigint) ignore_sigint=0; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "$(basename "$0"): no command given (usage: $(basename "$0") [--busy N] [--isa ISA] COMMAND...)" >&2; exit 2; }
[[ "$busy" =~ ^[0-9]+$ ]] || { echo "$(basename "$0"): --busy $busy must be a whole number of processes" >&2; exit 2; }

neighbours=()
stop_neighbours() {  # and wait for them: nothing of the stand-in outlives the command
  [ ${#neighbours[@]} -eq 0 ] && return
  kill "${neighbours[@]}" 2>/dev/null || true
  wait "${neighbours[@]}" 2>/dev/null || true
}
trap stop_neighbours EXIT
for _ in $(seq 1 "$busy"); do
  python3 -c "while True: pass" &
  neighbours+=($!)
done

export DSGPT_SLOW_MACHINE=1
if [ "$isa" != none ]; then
  export ONEDNN_MAX_CPU_ISA=$isa TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_slow_machine_$isa}
fi
echo "slow machine: $busy busy neighbours on $(nproc) cores, ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-unset}," \
  "SIGINT $([ "$ignore_sigint" = 1 ] && echo ignored || echo as it was)" >&2
[ "$ignore_sigint" = 1 ] && trap '' INT  # inherited by the command, as a background job's
status=0
"$@" || status=$?
exit "$status"
