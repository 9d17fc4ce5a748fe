#!/usr/bin/env bash
# Watch runs: the losses first (loss/train, loss/val), then memory/, optim/ (lr, grad_norm, fp16's loss scale),
# perf/ (tokens_per_s, mfu), score/ (HellaSwag); samples and settings (Text), the main settings (HParams) and
# Custom Scalars' charts. A run writes its events to OUT_DIR/tensorboard/<out_dir's name>/:
# `launch/tensorboard.sh runs` shows every run under runs/, `launch/tensorboard.sh OUT_DIR` one. A relative
# OUT_DIR is the caller's (from any directory); without one, the repository's runs/.
logdir="${1:-}"
case "$logdir" in
  "") logdir="$(dirname "$0")/../runs" ;;
  /*) ;;
  *) logdir="$PWD/$logdir" ;;
esac
exec tensorboard --logdir "$logdir" --bind_all --port "${PORT:-6006}"
