"""DeepSpeed, imported once and quietly, and the accelerator it picked. Every gpt module that uses DeepSpeed imports
this module first (gpt.runtime.ranks does): DeepSpeed's logger writes to the sys.stdout it finds when deepspeed is
first imported, and there, on a machine without DS_ACCELERATOR, says which accelerator it picked. stdout is ours
(the trainer's lines, the console scripts' output: gpt-plan --json), so DeepSpeed logs to stderr."""
import contextlib
import importlib
import os
import sys
import warnings

import torch

from gpt.console import exit_with
from gpt.runtime.host import answer_cpuinfo_fast

try:
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: F401
except ValueError as error:  # DeepSpeed picks its accelerator while it is imported, and raises on an unknown one
    known = getattr(sys.modules.get("deepspeed.accelerator.real_accelerator"), "SUPPORTED_ACCELERATOR_LIST", None)
    asked = os.environ.get("DS_ACCELERATOR")
    if known is None or asked is None:
        raise
    if "DS_ACCELERATOR" in str(error):
        exit_with(f"DS_ACCELERATOR={asked!r} is not an accelerator DeepSpeed knows: one of {', '.join(known)}, or unset "
                  f"to let DeepSpeed detect the device", status=2)
    # one it knows, whose PyTorch support is not installed here (xpu, npu, mps, hpu, ...): DeepSpeed's reason
    exit_with(f"DS_ACCELERATOR={asked!r}: {str(error).rstrip('.')}; unset it to let DeepSpeed detect the device", status=2)
from deepspeed.accelerator import get_accelerator  # noqa: E402


def _import_deepspeeds_muon_uncompiled():
    """DeepSpeed 0.19 imports its Muon optimizer while it builds every ZeRO engine (to ask whether ours is one), and
    that module's @torch.compile decorators import Inductor: ~1.3 CPU-s of every rank's start on a 2-core EPYC (15% of
    a tiny run's process), for kernels this trainer never runs (it trains with AdamW). So it is imported here with
    torch.compile a no-op; a run that compiles its model imports Inductor anyway."""
    compile_ = torch.compile
    torch.compile = lambda model=None, **options: model if model is not None else (lambda function: function)
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    finally:
        torch.compile = compile_


_import_deepspeeds_muon_uncompiled()
answer_cpuinfo_fast()  # for DeepSpeed's op builders, in every gpt process

# DeepSpeed 0.19's torch backend JIT-builds its shared-memory allreduce op on every CPU rank as it joins the group
# (44 s of g++ on 2 cores at a fresh start), for inference_all_reduce alone: training's collectives go through gloo
# and never call it (deepspeed/comm/torch.py). DeepSpeed gives no switch, so the build is skipped here: no op is
# built, and no 66 MB /dev/shm buffer per rank made. (By import_module: the attribute deepspeed.comm.torch is torch.)
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None

# DeepSpeed 0.19's ZeRO calls torch.distributed.all_gather_into_tensor, deprecated from torch 2.13: a FutureWarning on
# every rank of every run, about DeepSpeed's code, which a user can do nothing about
warnings.filterwarnings("ignore", message="`torch.distributed.all_gather_into_tensor` is deprecated",
                        category=FutureWarning)
# A one-GPU NCCL group is not bound to its GPU (DeepSpeed binds only larger ones, DeepSpeed #8248), so torch warns
# at the first barrier, DeepSpeed's or ours, that it uses the current device: the one setup_distributed sets first
warnings.filterwarnings("ignore", message=r"barrier\(\): using the device under current context", category=UserWarning)


def accelerator_problem():
    """Why the accelerator DS_ACCELERATOR names cannot train here, or None: DeepSpeed takes 'cuda' on trust, and a
    machine without CUDA failed in the first CUDA call (`Torch not compiled with CUDA enabled`, from the memory check)."""
    if os.environ.get("DS_ACCELERATOR") == "cuda" and not torch.cuda.is_available():
        return (f"DS_ACCELERATOR='cuda': torch {torch.__version__} here "
                + ("is built without CUDA" if torch.version.cuda is None else "finds no CUDA device")
                + "; unset it to let DeepSpeed detect the device")
    return None


def device_type():
    """'cuda' or 'cpu': the accelerator DeepSpeed picked (DS_ACCELERATOR, else what it detects)."""
    return get_accelerator().device_name()


def enable_cpu_fp16():
    """Let DeepSpeed run fp16 configs on its CPU accelerator, which refuses fp16 where oneDNN lacks fp16
    kernels. Only for exercising the fp16 loss-scaling path without a GPU; refused on anything else."""
    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        exit_with(f"--cpu_fp16 is only for the CPU accelerator, not {accelerator.device_name()}")
    accelerator.is_fp16_supported = lambda: True
