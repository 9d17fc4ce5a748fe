"""DeepSpeed's Muon (MuonWithAuxAdam) as this trainer runs it: which parameters Muon steps, the learning rate of each
param group, what the log calls the norm DeepSpeed measures, and the JSON's Muon settings applied again on a resume.
What the JSON may hold: gpt/config/muon_checks.py.

Parameter groups: the trainer passes (decay, no decay) groups; DeepSpeed's engine splits each into a Muon half and an
Adam half (_muon_param_groups), named "group0-muon-params", "group0-adam-params", "group1-adam-params": the block
matrices (decay), the embeddings and tied head (decay), every 1-D parameter (no decay). The Muon half's lr is the
JSON's muon_lr, the Adam half's is --lr; the schedule's LambdaLR scales each group from its own base lr."""
import contextlib

import deepspeed
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

from gpt.config.muon_checks import DEFAULT_MUON_LR


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
    """The learning rate --lr sets, as it is now: the first param group not on Muon's half."""
    return next(group["lr"] for group in engine.optimizer.param_groups if not group.get("use_muon"))


def base_lrs(engine, lr):
    """Each param group's peak learning rate: the JSON's muon_lr on Muon's half, `lr` (--lr) on the rest."""
    muon_lr = engine.optimizer_params().get("muon_lr", DEFAULT_MUON_LR)
    return [muon_lr if group.get("use_muon") else lr for group in engine.optimizer.param_groups]


def norm_name(engine):
    """What the norm DeepSpeed reports (engine.get_global_grad_norm) is, as the log names it: under Muon in
    DeepSpeedZeroOptimizer it is taken after orthogonalisation (Muon's update on the matrices, the gradient on the
    rest), so 'update_norm'; BF16_Optimizer and every Adam run measure the gradient: 'grad_norm'."""
    return "update_norm" if uses_muon(engine) and not isinstance(engine.optimizer, BF16_Optimizer) else "grad_norm"


def describe(engine):
    """The optimizer in the log's header: its class, and under Muon which parameters each half steps at which lr."""
    if not uses_muon(engine):
        return type(engine.basic_optimizer).__name__
    muon_lr = engine.optimizer_params().get("muon_lr", DEFAULT_MUON_LR)
    return (f"{type(engine.basic_optimizer).__name__} (Muon at muon_lr {muon_lr:g} on the block matrices, AdamW at "
            f"--lr on the embeddings, head and 1-D parameters)")


# The JSON's settings of each half (optimizer.params), as the groups name them
HALF_SETTINGS = {True: ("momentum", "ns_method"), False: ("betas", "eps")}


def reapply_group_settings(engine, weight_decay):
    """After a Muon checkpoint's optimizer state is loaded: its param groups as this run asks, where DeepSpeed put the
    saved ones in their place: --weight_decay on the groups split from the first (decay) group and 0 on the rest;
    the JSON's momentum and ns_method on Muon's half, betas and eps on Adam's; muon_lr as the Muon groups' base lr
    (the schedule's position kept). Returns {name: (value now, the checkpoint's)} for what changed."""
    asked, changed = engine.optimizer_params(), {}
    alike = lambda value: list(value) if isinstance(value, tuple) else value  # noqa: E731 -- betas: JSON's list
    scheduler = engine.lr_scheduler
    for index, group in enumerate(engine.optimizer.param_groups):
        decay = weight_decay if group["name"].startswith("group0-") else 0.0
        own = {key: asked[key] for key in HALF_SETTINGS[group["use_muon"]] if key in asked}
        wanted = {"weight_decay": decay, **own}
        for key, value in wanted.items():
            if alike(group.get(key)) != alike(value):
                changed.setdefault("--weight_decay" if key == "weight_decay" else f"optimizer.params.{key}",
                                   (alike(value), alike(group.get(key))))
                group[key] = value
        muon_lr = asked.get("muon_lr", DEFAULT_MUON_LR)
        if group["use_muon"] and scheduler.base_lrs[index] != muon_lr:
            changed.setdefault("optimizer.params.muon_lr", (muon_lr, scheduler.base_lrs[index]))
            scheduler.base_lrs[index] = muon_lr
            group["lr"] = muon_lr * scheduler.lr_lambdas[index](scheduler.last_epoch)
    return changed
