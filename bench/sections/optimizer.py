"""optimizer: which Adam the DeepSpeed JSONs should name. The trainer's step with each (torch's AdamW through
DeepSpeed's torch_adam: fused, foreach, the per-tensor loop; DeepSpeed's FusedAdam, JIT-built at a first start),
steps interleaved: the whole step's and the optimizer's own seconds (its step() timed on the device), each as a
ratio to the default, ds_configs/' torch_adam + fused."""
import json
import statistics
import time
from pathlib import Path

from harness import TrainerSteps, ds_config_file, interleaved_seconds, print_row, trainer_settings
from gpt.runtime.accelerator import get_accelerator

TITLE = ("which Adam: the trainer's step and the optimizer's own step with each, against the default (torch's fused "
         "AdamW), steps interleaved")
COLUMNS = [("model", "{}"), ("dtype", "{}"), ("optimizer", "{}"), ("step_s", "{:.4f}"), ("optimizer_s", "{:.4f}"),
           ("step_ratio", "{:.3f}"), ("optimizer_ratio", "{:.2f}")]
# name: what replaces the default's torch_adam/fused pair in the optimizer's params (the default first)
VARIANTS = {
    "torch fused (default)": {"torch_adam": True, "fused": True},
    "torch foreach": {"torch_adam": True, "foreach": True},
    "torch per-tensor loop": {"torch_adam": True, "foreach": False},
    "DeepSpeed FusedAdam": {},
}


def config_file(tmp, dtype, index, choice):
    """The bench's DeepSpeed JSON for dtype with VARIANTS' index-th optimizer choice."""
    path = Path(ds_config_file(tmp, dtype))
    config = json.loads(path.read_text())
    params = config["optimizer"]["params"]
    for key in ("torch_adam", "fused", "foreach"):
        params.pop(key, None)
    params.update(choice)
    variant = path.with_name(f"optimizer_{dtype}_{index}.json")
    variant.write_text(json.dumps(config))
    return str(variant)


def timed_optimizer(trainer):
    """The seconds of each step() of the trainer's basic optimizer, appended as they are taken (torch's step hooks;
    the device synchronized at both ends)."""
    seconds, started = [], []

    def before(*_):
        get_accelerator().synchronize()
        started.append(time.perf_counter())

    def after(*_):
        get_accelerator().synchronize()
        seconds.append(time.perf_counter() - started.pop())
    trainer.engine.basic_optimizer.register_step_pre_hook(before)
    trainer.engine.basic_optimizer.register_step_post_hook(after)
    return seconds


def per_step(seconds, steps):
    """The optimizer's seconds in each trainer step: DeepSpeed's ZeRO optimizer steps it once per parameter group,
    BF16_Optimizer once."""
    calls = len(seconds) // steps
    return [sum(seconds[i:i + calls]) for i in range(0, calls * steps, calls)]


def measure(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    rows = []
    for dtype in dtypes:
        trainers = [TrainerSteps(trainer_settings(data, Path(tmp) / f"optimizer_{dtype}_{i}",
                                                  config_file(tmp, dtype, i, choice), model, seq_len, micro_batch, 1))
                    for i, choice in enumerate(VARIANTS.values())]
        optimizer_seconds = [timed_optimizer(trainer) for trainer in trainers]
        step_seconds = interleaved_seconds(trainers, repeats)
        optimizer_median = [statistics.median(per_step(s, trainer.steps)[1:])  # past the warm-up step
                            for s, trainer in zip(optimizer_seconds, trainers)]
        for name, step_s, optimizer_s in zip(VARIANTS, step_seconds, optimizer_median):
            rows.append(dict(model=model, dtype=dtype, optimizer=name, step_s=step_s, optimizer_s=optimizer_s,
                             step_ratio=step_s / step_seconds[0], optimizer_ratio=optimizer_s / optimizer_median[0]))
            print_row(rows[-1], COLUMNS)
        for trainer in trainers:
            trainer.close()
    return rows
