"""Stopping cleanly: a SIGTERM/SIGINT to a rank, or a launcher of this rank that is gone, ends the run after
the current step with a checkpoint, on every rank.

Why watch the launchers: Kubernetes, Docker and `kill PID` signal only the top process. DeepSpeed 0.19's
runner (`deepspeed ...`) forwards signals only for multi-node pdsh runs: a SIGTERM to it kills it alone,
and `deepspeed.launcher.launch` and the ranks would train on, orphaned, holding the port. So each rank
remembers its launcher processes (the `deepspeed` runner, `deepspeed.launcher.launch`, torchrun) and
treats the death of any of them as a stop request. torchrun forwards SIGTERM to its ranks by itself."""
import os
import signal

import psutil
import torch

from gpt import dist

LAUNCHER_MARKS = ("deepspeed.launcher.launch", "torch.distributed.run", "torchrun")


def is_launcher(cmdline):
    """Whether a process's command line is one of the launchers that start ranks."""
    return any(mark in arg for arg in cmdline[:4] for mark in LAUNCHER_MARKS) or any(
        os.path.basename(arg) == "deepspeed" for arg in cmdline[:2])


def launcher_processes():
    """This rank's launcher ancestors, nearest first: none for a plain `python train_ds.py`."""
    found = []
    try:
        process = psutil.Process().parent()
        while process is not None and is_launcher(process.cmdline()):
            found.append(process)
            process = process.parent()
    except psutil.Error:
        pass
    return found


def gone(process):
    """Whether a remembered process has exited (a zombie its parent has not reaped yet counts)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


class StopRequest:
    """SIGTERM/SIGINT, or a launcher gone: finish the current step, save, exit 0. Any rank's request
    stops every rank."""

    def __init__(self):
        self.requested = False
        self.launchers = launcher_processes()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.requested = signal.Signals(signum).name

    def check_launchers(self):
        if not self.requested:
            dead = next((p for p in self.launchers if gone(p)), None)
            if dead is not None:
                self.requested = f"its launcher exiting (pid {dead.pid})"

    def agreed(self, device):
        """Whether any rank was asked to stop (a collective: every rank calls it once per step)."""
        self.check_launchers()
        flag = torch.tensor(float(bool(self.requested)), device=device)
        stopping = dist.mean_over_ranks(flag).item() > 0
        if stopping:  # a shared launcher may have gone just after this rank looked: say so, not 'another rank'
            self.check_launchers()
        return stopping
