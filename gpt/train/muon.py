"""DeepSpeed's Muon (MuonWithAuxAdam) as this trainer runs it: which parameters Muon steps, the learning rate of each
param group, what the log calls the norm DeepSpeed measures, and muon_lr applied again on a resume.
What the JSON may hold: gpt/config/muon_checks.py.

Parameter groups: the trainer passes (decay, no decay) groups; DeepSpeed's engine splits each into a Muon half and an
Adam half (_muon_param_groups), named "group0-muon-params", "group0-adam-params", "group1-adam-params": the block
matrices (decay), the embeddings and tied head (decay), every 1-D parameter (no decay). The Muon half's lr is the
JSON's muon_lr (0.02 where it has none: gpt.train.engine.fill writes it in), the Adam half's the run's lr (--lr, or the
JSON's adam_lr); the schedule's LambdaLR scales each group from its own base lr."""
import contextlib

import deepspeed
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

from gpt.config.muon_checks import RECIPE


def block_matrices(model):
    """The parameters Muon steps (their ids): the transformer blocks' matrices only. The embeddings (wte, wpe), the
    head tied to wte and every 1-D parameter stay on the auxiliary Adam, as Muon's authors prescribe. (DeepSpeed's
    own rule, by name: every >= 2-D parameter whose name holds neither "embed" nor "lm_head", would put wte and wpe
    on Muon.)"""
    return {id(p) for p in model.transformer.h.parameters() if p.dim() >= 2}


@contextlib.contextmanager
def blocks_tagged_for_muon():
    """Inside: deepspeed.initialize tags the block_matrices for Muon. DeepSpeed's set_optimizer_flags, which
    initialize calls before it builds the optimizer, sets use_muon on every parameter by its name rule, over any tag
    set before: this runs it (for its other tags), then sets use_muon by this trainer's rule. Without Muon: as is."""
    original = deepspeed.set_optimizer_flags

    def tag(config_class, model):
        original(config_class, model)
        if config_class.optimizer_name == "muon":
            chosen = block_matrices(model)
            for parameter in model.parameters():
                parameter.use_muon = id(parameter) in chosen
    deepspeed.set_optimizer_flags = tag
    try:
        yield
    finally:
        deepspeed.set_optimizer_flags = original


def uses_muon(engine):
    return any(group.get("use_muon") for group in engine.optimizer.param_groups)


def lr_flag_lr(engine):
    """The run's lr (--lr, or a Muon JSON's adam_lr) as it is now: the first param group not on Muon's half."""
    return next(group["lr"] for group in engine.optimizer.param_groups if not group.get("use_muon"))


def base_lrs(engine, lr):
    """Each param group's peak learning rate: the JSON's muon_lr on Muon's half, `lr` (the run's) on the rest."""
    muon_lr = engine.optimizer_params()["muon_lr"] if uses_muon(engine) else None
    return [muon_lr if group.get("use_muon") else lr for group in engine.optimizer.param_groups]


def setting_name(engine, flag):
    """How a line names the run setting `flag` (lr, weight_decay): the Muon JSON's key where the run trains at the
    JSON's value (fill keeps the key only then), else the flag."""
    key = RECIPE.get(flag)
    return f"optimizer.params.{key}" if uses_muon(engine) and key in engine.optimizer_params() else f"--{flag}"


def norm_name(engine):
    """What the norm DeepSpeed reports (engine.get_global_grad_norm) is, as the log names it: under Muon in
    DeepSpeedZeroOptimizer it is taken after orthogonalisation (Muon's update on the matrices, the gradient on the
    rest), so 'update_norm'; BF16_Optimizer and every Adam run measure the gradient: 'grad_norm'."""
    return "update_norm" if uses_muon(engine) and not isinstance(engine.optimizer, BF16_Optimizer) else "grad_norm"


def describe(engine):
    """The optimizer in the log's header: its class, and under Muon which parameters each half steps at which peak
    learning rate, as the schedule holds them."""
    if not uses_muon(engine):
        return type(engine.basic_optimizer).__name__
    groups, peaks = engine.basic_optimizer.param_groups, engine.lr_scheduler.base_lrs
    muon_lr, adam_lr = (next(peak for group, peak in zip(groups, peaks) if bool(group.get("use_muon")) is half)
                        for half in (True, False))
    adam = setting_name(engine, "lr").removeprefix("optimizer.params.")
    return (f"{type(engine.basic_optimizer).__name__} (Muon at muon_lr {muon_lr:g} on the block matrices, AdamW at "
            f"{adam} {adam_lr:g} on the embeddings, head and 1-D parameters)")


def muon_lr_change(engine):
    """After a Muon checkpoint's load: the schedule DeepSpeed loaded keeps the checkpoint's muon_lr as the Muon
    groups' peak; this run's JSON's goes back (the schedule's position kept). The groups' other settings (momentum,
    ns_method, betas, eps, weight decay) go back with every optimizer's: gpt/train/resume_settings.py. Returns its
    line, or none."""
    groups, notes = engine.basic_optimizer.param_groups, []
    if not any(group.get("use_muon") for group in groups):
        return notes
    muon_lr, scheduler = engine.optimizer_params()["muon_lr"], engine.lr_scheduler
    for index, group in enumerate(groups):
        if group.get("use_muon") and scheduler.base_lrs[index] != muon_lr:
            notes = [f"optimizer.params.muon_lr {muon_lr} applied (the checkpoint's run had {scheduler.base_lrs[index]})"]
            scheduler.base_lrs[index] = muon_lr
            group["lr"] = muon_lr * scheduler.lr_lambdas[index](scheduler.last_epoch)
    return notes
