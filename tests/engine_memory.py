"""Run by tests/test_plan.py under the deepspeed launcher: for each setting named on the command line
(config:stage:precision), build a real engine, take two steps, and print (as JSON, from each rank) the bytes
of every tensor the module and the optimizer own, deduplicated by storage, next to the planner's resident
model states for the same setting. One launch for all settings: a launch costs more than an engine."""
import json
import sys
from pathlib import Path

import torch

from gpt import dist as gpt_dist
from gpt import engine as ds_engine
from gpt.ds_config import precision
from gpt.model import GPT, GPTConfig
from gpt.memory import engine_state_bytes
from gpt.optim import OptimizerSettings
from gpt.plan import resident_model_state_bytes


def measure(config_path, stage, fp32, device):
    config = json.loads(Path(config_path).read_text())
    config["zero_optimization"]["stage"] = stage
    if fp32:
        config.pop("bf16", None), config.pop("fp16", None), config.pop("data_types", None)
    world = gpt_dist.world_size()
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
    planned = resident_model_state_bytes(n_params, precision(config), stage, world, config)
    report = {"setting": f"{config_path}:{stage}:{'fp32' if fp32 else precision(config)}", "rank": gpt_dist.rank(),
              "optimizer": type(engine.optimizer).__name__, "owned": engine_state_bytes(engine), "planned": planned}
    engine.destroy()
    return report


def main():
    settings = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds it
    device = gpt_dist.setup_distributed(allow_cpu_fp16=True)
    for setting in settings:
        config_path, stage, kind = setting.split(":")
        print("ENGINE_MEMORY " + json.dumps(measure(config_path, int(stage), kind == "fp32", device)), flush=True)


if __name__ == "__main__":
    main()
