#!/usr/bin/env bash
# Watch runs: loss, val_loss, lr, grad_norm, tokens_per_s, mfu (and loss_scale, skipped_steps with fp16), samples,
# settings (HParams) and Custom Scalars' charts. A run writes its events to OUT_DIR/tensorboard/<out_dir's name>/:
# `launch/tensorboard.sh runs` shows every run under runs/, `launch/tensorboard.sh OUT_DIR` one.
cd "$(dirname "$0")/.."
exec tensorboard --logdir "${1:-runs}" --bind_all --port "${PORT:-6006}"
