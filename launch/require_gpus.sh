# Sourced by the GPU recipes: stop early, with a reason, on a machine without the GPUs a recipe is for.
# usage: require_gpus "V100" 32   (name fragment as nvidia-smi prints it, minimum memory in GB)
require_gpus() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "$(basename "$0"): no NVIDIA GPU on this machine; this recipe is for $1 ${2}GB. On CPU run launch/cpu_demo.sh." >&2
    exit 1
  fi
  local name mem
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  if [[ "$name" != *"$1"* ]] || (( mem < ${2} * 1000 )); then
    echo "$(basename "$0"): found '$name' (${mem} MiB); this recipe is tuned for $1 ${2}GB. Set FORCE=1 to run anyway." >&2
    [ "${FORCE:-0}" = 1 ] || exit 1
  fi
}
