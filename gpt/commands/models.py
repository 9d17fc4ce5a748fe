"""What gpt-eval and gpt-sample share: the model they run (--checkpoint or --hf, its shape read before its
weights), the device (--device) and the precision they run it in."""
import contextlib
from pathlib import Path

import torch

from gpt.checkpoint import find_checkpoint, read_run_config
from gpt.universal import read_weights
from gpt.hf import config_from_hf, load_hf_weights, read_hf_config
from gpt.model import GPT, GPTConfig

DEVICES = ("auto", "cpu", "cuda")


def model_source(args):
    """(the model's GPTConfig, a function returning the model in eval mode) from --checkpoint or --hf: the
    shape is read without the weights, so that the input can be checked against it first."""
    if args.checkpoint:
        path = find_checkpoint(args.checkpoint, None)  # once: a damaged newer one is warned about once
        config = GPTConfig(**read_run_config(path)["model"])
        weights = lambda: read_weights(path)[0]  # noqa: E731
    else:
        config = config_from_hf(read_hf_config(args.hf))
        weights = lambda: load_hf_weights(args.hf, config)  # noqa: E731

    def load(device):
        state = weights()  # first: it refuses weights that do not fit the config before a model is built from it
        model = GPT(config)
        model.load_state_dict(state)
        return model.to(device).eval()
    return config, load


def add_model_arguments(parser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="one of our checkpoints (or its checkpoints/ directory: the newest)")
    source.add_argument("--hf", help="a Hugging Face GPT-2 directory (config.json + weights)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where the model runs: auto (the default) is cuda when torch sees a GPU, else cpu")


def model_problems(args):
    """The model's path and the device, checked before anything is loaded."""
    flag, path = ("--checkpoint", args.checkpoint) if args.checkpoint else ("--hf", args.hf)
    return [None if Path(path).exists() else f"{flag} {path}: not found",
            "--device cuda: torch sees no CUDA GPU here; use --device auto or cpu"
            if args.device == "cuda" and not torch.cuda.is_available() else None]


def choose_device(name):
    """The torch.device for --device: auto is cuda when torch sees a GPU, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def evaluation_precision(device):
    """(name, context to run the model in): bf16 autocast on a CUDA GPU with bf16 units, else fp32. The trainer's
    GPU runs are bf16, so a checkpoint is scored in the precision it trained in, at tensor-core speed. CPUs stay
    in fp32, their results exactly as before (many only emulate bf16, slowly); so do GPUs that only emulate it
    (V100)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16", torch.autocast("cuda", dtype=torch.bfloat16)
    return "fp32", contextlib.nullcontext()
