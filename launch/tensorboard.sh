#!/usr/bin/env bash
# Watch runs: the losses first (loss/train, loss/val), then memory/, optim/ (lr, grad_norm, fp16's loss scale),
# perf/ (tokens_per_s, mfu), score/ (HellaSwag); samples and settings (Text), the main settings (HParams) and
# Custom Scalars' charts. A run writes its events to OUT_DIR/tensorboard/<out_dir's name>/:
# `launch/tensorboard.sh runs` shows every run under runs/, `launch/tensorboard.sh OUT_DIR` one.
cd "$(dirname "$0")/.."
exec tensorboard --logdir "${1:-runs}" --bind_all --port "${PORT:-6006}"
