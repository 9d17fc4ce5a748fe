#!/usr/bin/env bash
# GPT-2 124M on 8x H800 80GB (H100 80GB likewise): the A800 recipe (bf16, ZeRO-1, micro_batch 64,
# torch.compile), checked against an H800. Hopper's ~3x bf16 peak shows up as tokens/s, not as a config change.
exec env GPU_NAME="${GPU_NAME:-H800}" GPU_PLAN=h800-80gb bash "$(dirname "$0")/a800_80gb.sh" "$@"
