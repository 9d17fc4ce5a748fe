"""What DeepSpeed 0.19's Muon (`"optimizer": {"type": "Muon"}`, MuonWithAuxAdam) keeps per rank, for the planner.

The split is the trainer's: the transformer blocks' weight matrices on Muon, everything else (the embeddings, the
head tied to wte, every bias and LayerNorm parameter) on Muon's auxiliary Adam. A Muon matrix has one momentum buffer
where Adam has two moments; where that buffer lives depends on the ZeRO optimizer DeepSpeed wraps Muon in:
- BF16_Optimizer (bf16, ZeRO 1, fp32 gradient accumulation): an fp32 buffer shaped like the Muon group's fp32
  partition (`_prepare_muon_updates`), so partitioned as the master weights are;
- DeepSpeedZeroOptimizer (ZeRO 1/2 otherwise): Newton-Schulz needs whole matrices, so each rank keeps the momentum
  of every Muon matrix that overlaps its partition of the flat Muon group, whole (`_muon_momentum_buffer`), in the
  gradients' dtype, and a second buffer of that size that stages the step's momentum until the step survives its
  overflow check (`_muon_staging_momentum`; kept between steps);
- no ZeRO: MuonWithAuxAdam's own step keeps an fp32 buffer per matrix."""

import copy

from gpt.config.muon_checks import uses_muon

# DeepSpeed pads each flat parameter group to a multiple of this times the ranks (nccl_start_alignment_factor)
ALIGNMENT = 2


def muon_twin(ds_config):
    """A copy of a DeepSpeed JSON with DeepSpeed's Muon in place of its optimizer and no gradient clipping: what the
    planner and its tests count for a Muon run on the same ZeRO stage and precision (the bytes do not depend on
    Muon's settings)."""
    twin = copy.deepcopy(ds_config)
    twin["optimizer"] = {"type": "Muon", "params": {"muon_lr": 0.02, "momentum": 0.95}}
    twin.pop("gradient_clipping", None)
    return twin


def optimizer_of(ds_config):
    """The optimizer a JSON trains with, as a plan names it: its optimizer block's type, AdamW without one."""
    return "Muon" if uses_muon(ds_config) else str(((ds_config or {}).get("optimizer") or {}).get("type", "AdamW"))


def muon_matrix_shapes(config):
    """The shapes of the matrices the trainer puts on Muon (gpt.train.muon.block_matrices) for a GPTConfig, in the
    model's order: per block, attention's fused qkv and projection, the MLP's two."""
    h = config.n_embd
    return [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h)] * config.n_layer


def overlapping_elements(shapes, world_size):
    """The most elements any rank holds when it keeps whole every matrix that overlaps its partition of the flat
    Muon group: DeepSpeed's MuonWithAuxAdam orders a Muon group by shape, largest first (original_muon.py), and ZeRO
    pads the flat group to ALIGNMENT x ranks and cuts it in equal parts (get_partition_info)."""
    numels = [rows * columns for rows, columns in sorted(shapes, reverse=True)]
    total = sum(numels)
    size = -(-total // (ALIGNMENT * world_size)) * ALIGNMENT
    held = [0] * world_size
    start = 0
    for numel in numels:
        for rank in range(start // size, (start + numel - 1) // size + 1):
            held[rank] += numel
        start += numel
    return max(held)


def muon_optimizer_state_bytes(config, n_params, stage, world_size, optimizer):
    """Bytes per rank of Muon's momentum and its Adam's two fp32 moments (what model_state_bytes counts as
    optimizer_states for AdamW). optimizer: 'none' (ZeRO 0), 'bf16' (BF16_Optimizer), or the gradients' element
    bytes under DeepSpeedZeroOptimizer (the momentum's dtype)."""
    shapes = muon_matrix_shapes(config)
    n_muon = sum(rows * columns for rows, columns in shapes)
    if optimizer == "none":
        return 8 * (n_params - n_muon) + 4 * n_muon
    adam = 8 * (n_params - n_muon) / world_size
    if optimizer == "bf16":
        return adam + 4 * n_muon / world_size
    return adam + 2 * optimizer * overlapping_elements(shapes, world_size)  # the momentum and its staged copy
