"""What DeepSpeed 0.19's parser accepts and its engine then refuses inside every rank (an AssertionError, ValueError or
Exception from deepspeed.initialize or the ZeRO optimizer, deepspeed/runtime/engine.py and zero/stage_1_and_2.py), or
overrides without a word: refused before launch, one line each. engine_problems: for a JSON whose structure, values
and DeepSpeed's own parser passed (gpt/config/ds_checks.py asks, with DeepSpeed's parsed ZeRO block)."""
import json

from gpt.config.ds_config import bf16_config, fp16_config, grad_accum_dtype, precision, zero_stage

# ZeRO 1/2 align all-gather buffers to 4 bytes: 2 16-bit elements (DeepSpeedZeroOptimizer's
# nccl_start_alignment_factor), and assert that allgather_bucket_size is a multiple of it.
ALLGATHER_ALIGNMENT = 2

# 16-bit master weights and gradients: DeepSpeed runs them only with ZeRO-Offload's CPU Adam (offload is refused here)
# or, for bf16, with its optimizer states in bf16 too (bf16_optimizer_states), which this trainer does not run.
MASTER_WEIGHTS = {"fp16": "fp16_master_weights_and_grads", "bf16": "bf16_master_weights_and_grads"}


def engine_problems(ds_config, zero, path):
    """Every such problem of the JSON: ZeRO's own asserts, the precision blocks' master weights, the optimizer's
    mode, the accumulation the trainer's loop relies on. `zero`: DeepSpeed's parsed zero_optimization block."""
    return (zero_asserts(ds_config, zero, path) + master_weight_problems(ds_config, path)
            + [p for p in (adam_mode_problem(ds_config, path), accumulation_problem(ds_config, path)) if p])


def uses_bf16_optimizer(ds_config):
    """Whether DeepSpeed 0.19 builds its BF16_Optimizer (engine._do_optimizer_sanity_check): bf16 parameters, fp32
    gradient accumulation, ZeRO 1 (offload is refused here)."""
    return (precision(ds_config) == "bf16" and grad_accum_dtype(ds_config) == "fp32"
            and zero_stage(ds_config) == 1)


def zero_asserts(ds_config, zero, path):
    """The combinations DeepSpeed 0.19's ZeRO optimizer refuses only once every rank has started: ZeRO-2's
    reduce-scatter averages after the sum, so no pre-scaling and no pre-division; skipping the gradient norm leaves
    nothing to clip with, and BF16_Optimizer cannot skip it; an all-gather bucket off the alignment; the ZeRO-1 removed
    in 0.5.9; ZenFlow (built on ZeRO-Offload, which this trainer does not run)."""
    found = []
    if zero.stage == 2 and zero.reduce_scatter:
        if ds_config.get("prescale_gradients") is True:
            found.append(f"{path}: prescale_gradients true is not supported by DeepSpeed with ZeRO 2's reduce-scatter "
                         f"(it averages after the sum): remove it, or set zero_optimization.reduce_scatter false")
        if ds_config.get("gradient_predivide_factor", 1.0) != 1.0:
            found.append(f"{path}: gradient_predivide_factor {ds_config['gradient_predivide_factor']} is not supported "
                         f"by DeepSpeed with ZeRO 2's reduce-scatter: remove it, or set "
                         f"zero_optimization.reduce_scatter false")
    if not zero.compute_grad_norm and ds_config.get("gradient_clipping", 0) != 0:
        found.append(f"{path}: zero_optimization.compute_grad_norm false leaves DeepSpeed no norm to clip with: set "
                     f"gradient_clipping 0, or remove compute_grad_norm")
    elif not zero.compute_grad_norm and uses_bf16_optimizer(ds_config):
        found.append(f"{path}: zero_optimization.compute_grad_norm false is not supported by DeepSpeed with ZeRO 1, "
                     f"bf16 and fp32 gradient accumulation (its BF16_Optimizer always measures the norm): remove it, "
                     f"or use ZeRO 2")
    if zero.stage in (1, 2) and zero.allgather_bucket_size % ALLGATHER_ALIGNMENT:
        found.append(f"{path}: zero_optimization.allgather_bucket_size {zero.allgather_bucket_size} must be a multiple "
                     f"of {ALLGATHER_ALIGNMENT} (ZeRO aligns its all-gather buffers to 4 bytes, {ALLGATHER_ALIGNMENT} "
                     f"16-bit elements)")
    if zero.legacy_stage1:
        found.append(f"{path}: zero_optimization.legacy_stage1 true: DeepSpeed removed that ZeRO 1 in 0.5.9 and "
                     f"refuses it: remove it (\"stage\": 1 is today's ZeRO 1)")
    if zero.zenflow is not None:
        found.append(f"{path}: zero_optimization.zenflow is not supported by this trainer (ZenFlow runs on "
                     f"ZeRO-Offload's CPU optimizer, which this trainer does not run): remove it")
    return found


def master_weight_problems(ds_config, path):
    """fp16/bf16 blocks asking for 16-bit master weights (MASTER_WEIGHTS), in any spelling of true DeepSpeed reads
    ("true", 1, ...): refused, named."""
    sections = {"fp16": fp16_config(ds_config), "bf16": bf16_config(ds_config)}
    return [f"{path}: {name}.{key} true is not supported by this trainer (16-bit master weights and gradients: "
            f"DeepSpeed runs them only with ZeRO-Offload's CPU Adam or bf16 optimizer states, neither of which this "
            f"trainer runs): remove it" for name, key in MASTER_WEIGHTS.items() if getattr(sections[name], key)]


def adam_mode_problem(ds_config, path):
    """"type": "AdamW" with adam_w_mode false: DeepSpeed builds AdamW whatever adam_w_mode says (engine.py's
    effective_adam_w_mode), so the L2 Adam asked for would be dropped without a word."""
    optimizer = ds_config.get("optimizer") or {}
    params = optimizer.get("params") if isinstance(optimizer.get("params"), dict) else {}
    if str(optimizer.get("type", "AdamW")).lower() == "adamw" and params.get("adam_w_mode") is False:
        return (f"{path}: optimizer.params.adam_w_mode false contradicts optimizer.type "
                f"{json.dumps(optimizer.get('type', 'AdamW'))} (DeepSpeed would run AdamW's decoupled weight decay "
                f"anyway): use \"type\": \"Adam\" for Adam with L2 weight decay, or remove adam_w_mode")
    return None


def accumulation_problem(ds_config, path):
    """managed_gradient_accumulation false makes every engine.step() an update (the caller owns the boundary); the
    trainer steps the engine after each micro-batch and lets DeepSpeed decide when a step's gradients are whole, so
    each micro-batch would be an update of its own."""
    if ds_config.get("managed_gradient_accumulation") is False:
        return (f"{path}: managed_gradient_accumulation false is not supported by this trainer (it steps the engine "
                f"after every micro-batch and lets DeepSpeed accumulate, so each micro-batch would be an update of "
                f"its own): remove it")
    return None
