"""Run by tests/integration/test_plan_runs.py on 2 ranks (in the shared launch of conftest's two_rank_runs): for each setting named
on the command line (config:stage:precision, or config:stage:precision:muon for that JSON with DeepSpeed's Muon as
its optimizer, the parameters split between Muon and its Adam as the trainer splits them), build a real engine, take
two steps, and write (as JSON, each rank to <out_dir>/engine_memory_rank<R>.json) the bytes of every tensor the
module and the optimizer own, deduplicated by storage, next to the planner's resident model states for the same
setting."""
import argparse
import json
from pathlib import Path

import torch

from gpt.runtime import ranks
from gpt.train import engine as ds_engine
from gpt.config.ds_config import precision
from gpt.model.model import GPT, GPTConfig
from gpt.memory.footprint import engine_state_bytes
from gpt.memory.muon import muon_matrix_shapes, muon_twin
from gpt.memory.plan import resident_model_state_bytes
from gpt.train.engine import OptimizerSettings


def measure(config_path, stage, fp32, device, muon=False):
    config = json.loads(Path(config_path).read_text())
    config["zero_optimization"]["stage"] = stage
    if fp32:
        config.pop("bf16", None), config.pop("fp16", None), config.pop("data_types", None)
    if muon:
        config = muon_twin(config)
    world = ranks.world_size()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=1024))
    n_params = model.num_params()
    optimizer = OptimizerSettings(lr=1e-3, weight_decay=0.1, warmup_steps=1, max_steps=10, min_lr_ratio=0.1)
    engine = ds_engine.initialize(model, config, micro_batch=2, grad_accum=1, optimizer=optimizer)
    for _ in range(2):
        x = torch.randint(0, 1024, (2, 16), device=device)
        _, loss = engine(x, x)
        engine.backward(loss)
        engine.step()
    planned = resident_model_state_bytes(n_params, precision(config), stage, world, config, model.config)
    report = {"setting": f"{config_path}:{stage}:{'fp32' if fp32 else precision(config)}" + (":muon" if muon else ""),
              "rank": ranks.rank(), "optimizer": type(engine.optimizer).__name__, "owned": engine_state_bytes(engine),
              "planned": planned,
              "muon_shapes": [list(p.shape) for p in model.parameters() if getattr(p, "use_muon", False)],
              "planned_muon_shapes": [list(shape) for shape in muon_matrix_shapes(model.config)]}
    engine.destroy()
    return report


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("settings", nargs="+", help="config:stage:precision")
    args, _ = parser.parse_known_args(argv)  # the launcher adds --local_rank
    device = ranks.setup_distributed(allow_cpu_fp16=True)
    reports = [measure(config_path, int(stage), kind == "fp32", device, muon == ["muon"])
               for config_path, stage, kind, *muon in (setting.split(":") for setting in args.settings)]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"engine_memory_rank{ranks.rank()}.json").write_text(json.dumps(reports))


if __name__ == "__main__":
    main()
