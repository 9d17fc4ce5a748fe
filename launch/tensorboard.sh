#!/usr/bin/env bash
# Watch runs: loss, val_loss, lr, grad_norm, tokens_per_s, mfu (and loss_scale, skipped_steps with fp16).
cd "$(dirname "$0")/.."
exec tensorboard --logdir "${1:-runs}" --bind_all --port "${PORT:-6006}"
