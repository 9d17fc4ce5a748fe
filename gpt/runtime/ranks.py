"""Ranks and the process group: what the launcher set, joining the group (NCCL on GPUs, gloo on CPU, with the
host fixes of gpt/runtime/host.py applied around it), a mean over ranks, a flag every rank holds, a lost rank told
apart, a step timed on the device, a free port."""
import base64
import binascii
import datetime
import errno
import json
import os
import re
import socket
import time

import torch
import torch.distributed as dist

from gpt.console import exit_with
from gpt.runtime.accelerator import enable_cpu_fp16, get_accelerator  # first: DeepSpeed, its logs on stderr
from gpt.runtime.host import handle_stale_jit_locks, keep_freed_memory_in_heap

import deepspeed  # noqa: E402


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier():
    """Wait for every rank; a no-op without a process group."""
    if dist.is_initialized():
        dist.barrier()


def leave_process_group():
    """Destroy the process group, after a run that ended normally: without it NCCL warns at the exit of every GPU
    run that resources may leak. Not on the error paths: they exit at once, and a peer may be gone."""
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_port_problem(environ=os.environ):
    """Why MASTER_PORT (the launcher's --master_port) is no port number, or None. Every rank asks (rank 0 says it):
    the rank that hosts the store found it, and every other rank ended in torch's `ValueError: port must have value
    from 0 to 65535` traceback."""
    port = environ.get("MASTER_PORT")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return f"MASTER_PORT={port!r}: not a port number (1-65535)"
    return None


def store_port_problem(environ=os.environ):
    """Why the rank that will host the process group's store (RANK 0; under torchrun its agent hosts it) cannot listen
    on MASTER_PORT, or None: a port in use failed only inside torch's rendezvous, as a traceback (EADDRINUSE)."""
    if (environ.get("RANK") != "0" or environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            or "MASTER_PORT" not in environ or dist.is_initialized()):  # a group joined before (tests): its store's
        return None
    port = environ["MASTER_PORT"]
    if master_port_problem(environ):
        return None  # said by master_port_problem
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds: a closed run's port is free
        try:
            s.bind(("", int(port)))  # every address, as the store listens
        except OSError as e:
            return port_in_use(port) + ("" if e.errno == errno.EADDRINUSE else f" ({e.strerror})")
    return None


def port_in_use(port):
    return (f"MASTER_PORT={port}: the process group's port is in use on this machine (another run, or another "
            f"program, holds it): launch with a free one, --master_port N (deepspeed, torchrun)")


def threads_per_rank():
    """A CPU rank's thread count: OMP_NUM_THREADS where it is set (by the user, or by DeepSpeed's
    --bind_cores_to_rank), else this machine's cores shared among the ranks on it (one thread per core each
    would oversubscribe). The count is part of the arithmetic: some CPU kernels sum per-thread partials
    (LayerNorm's weight and bias gradients), so runs are bit-equal only with equal threads per rank
    (docs/multinode.md)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))
    return max(1, (os.cpu_count() or 1) // local_ranks)


def setup_distributed(allow_cpu_fp16=False, timeout_s=600):
    """Join the process group (NCCL on GPUs, gloo on CPU) and return this rank's device. A plain
    `python train_ds.py` becomes a one-rank group, so the same code path serves every launch. A collective
    that waits longer than timeout_s for another rank (one that died) fails instead of hanging."""
    if "RANK" not in os.environ:  # no launcher: a single local process
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    accelerator = get_accelerator()
    if allow_cpu_fp16:
        enable_cpu_fp16()
    handle_stale_jit_locks()  # before DeepSpeed loads an op: a killed build's lock would hang it
    if accelerator.device_name() == "cpu":
        if os.environ.get("DSGPT_MALLOC_CACHE", "1") != "0":  # 0: glibc's defaults (bench/train.py's baseline)
            keep_freed_memory_in_heap()
        torch.set_num_threads(threads_per_rank())
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for fp32 matmuls on Ampere and newer
        torch.backends.cudnn.allow_tf32 = True
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    accelerator.set_device(local_rank)  # before the group: NCCL's communicator is made on the current device
    try:
        deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name(),
                                   timeout=datetime.timedelta(seconds=timeout_s))
    except dist.DistError as e:
        if "EADDRINUSE" in str(e):
            exit_with(port_in_use(os.environ.get("MASTER_PORT")), 2)  # taken since store_port_problem looked
        problem = rendezvous_problem(e, timeout_s)
        if problem is None:
            raise
        exit_with(problem, 1, every_rank=not isinstance(e, dist.DistStoreError))  # a node without the store: each says
    return torch.device(accelerator.device_name(local_rank))


def launch_nodes():
    """The nodes of this launch in node-rank order, as DeepSpeed's runner gave them to this rank's launcher (its
    --world_info, base64 JSON {host: [slots]}); [] under another launcher."""
    import psutil

    try:
        cmdline = psutil.Process().parent().cmdline()
    except (psutil.Error, AttributeError):  # AttributeError: no parent
        return []
    encoded = next((arg.split("=", 1)[1] for arg in cmdline if arg.startswith("--world_info=")), None)
    try:
        return list(json.loads(base64.urlsafe_b64decode(encoded))) if encoded else []
    except (binascii.Error, ValueError):
        return []


def rendezvous_problem(error, timeout_s, environ=os.environ, nodes=None):
    """One line for a process group that did not form within timeout_s (--collective_timeout), or None: on the node
    that hosts the store, which nodes did not join (torch: `DistStoreError: Timed out after 21 seconds waiting for
    clients. 1/2 clients joined.`, a traceback); on another node, that the store did not answer. nodes: launch_nodes()."""
    nodes = launch_nodes() if nodes is None else nodes
    here = environ.get("CROSS_RANK", "0")  # DeepSpeed's launcher's node rank
    store = f"MASTER_ADDR:MASTER_PORT {environ.get('MASTER_ADDR')}:{environ.get('MASTER_PORT')}"
    joined = re.search(r"(\d+)/(\d+) clients joined", str(error))
    if joined:
        others = [f"{host} (node {i})" for i, host in enumerate(nodes) if str(i) != here]
        missing = ("; not joined: " + (others[0] if len(others) == 1 else "some of " + ", ".join(others))
                   if others else "")
        return (f"the process group did not form within {timeout_s:g} s (--collective_timeout): {joined[1]} of "
                f"{joined[2]} ranks joined{missing}. Start every node's command (NODE_RANK=0, 1, ...), each able to "
                f"reach {store}")
    if isinstance(error, dist.DistNetworkError) and "timed out" in str(error):
        master = f" on {nodes[0]} (node 0)" if nodes else ""
        return (f"the process group's store{master} did not answer within {timeout_s:g} s (--collective_timeout) at "
                f"{store}: start node 0's command too, and check that this node reaches that address")
    return None


def lost_a_rank(error):
    """Whether a collective failed because another rank is gone or stuck: torch's distributed errors
    (NCCL, the store, timeouts), and gloo's RuntimeErrors when a peer's connection closed."""
    text = str(error)
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and (
        "gloo" in text and ("Connection" in text or "Timed out" in text or "timed out" in text)))


def timed_on_device(work):
    """(work(), the seconds it took on the device): a GPU runs kernels asynchronously, so the clock is read
    only after the device has finished (the trainer's one host sync, the loss .item(), comes before its last
    backward and optimizer step); the work queued before it is finished first. No-ops on CPU."""
    get_accelerator().synchronize()
    start = time.perf_counter()
    result = work()
    get_accelerator().synchronize()
    return result, time.perf_counter() - start


def mean_over_ranks(tensor):
    if dist.is_initialized() and dist.get_world_size() > 1:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return tensor


def on_every_rank(flag, device):
    """Whether flag holds on every rank."""
    return mean_over_ranks(torch.tensor(float(flag), device=device)).item() == 1.0
