"""Stopping cleanly at any moment: a SIGTERM/SIGINT (or SIGHUP, SIGUSR1) to a rank, or a launcher of this rank that
is gone.

Why watch the launchers: Kubernetes, Docker and `kill PID` signal only the top process. DeepSpeed 0.19's
runner (`deepspeed ...`) forwards signals only for multi-node pdsh runs: a SIGTERM to it kills it alone,
and `deepspeed.launcher.launch` and the ranks would train on, orphaned, holding the port. So each rank
remembers its launcher processes (the `deepspeed` runner, `deepspeed.launcher.launch`, torchrun) and
treats the death of any of them as a stop request. torchrun forwards SIGTERM to its ranks by itself.

Two phases. Start-up (from train_ds.py's first line to the first step: imports, JIT builds, the rendezvous,
reading shards; minutes on a GPU cluster): there is nothing to save, so a stop ends the rank at once with
one line and exit status 1, and a watchdog thread watches the launchers and ends a main thread stuck in
C code (a rendezvous with a rank that is gone). Training (fit): finish the current step, save, exit 0, on
every rank; the rank says so at once (a CPU step can take minutes), and a second signal, AT_ONCE_AFTER_S
or more later, ends it at once without saving. The watchdog thread reads every signal as it arrives, in both
phases: a Python handler runs only when the main thread is back in Python, on a slow CPU seconds late. This module
imports no torch: train_ds.py starts it before torch and DeepSpeed load."""
import os
import select
import signal
import threading
import time

import psutil

from gpt.console import importing

LAUNCHER_MARKS = ("deepspeed.launcher.launch", "torch.distributed.run", "torchrun")
DEEPSPEED_LAUNCH = "deepspeed.launcher.launch"
DEEPSPEED_RUNNER = "deepspeed.launcher.runner"
RUNNER_NAMES = ("deepspeed", "ds", "deepspeed.pt")  # the console scripts of DeepSpeed's runner
POLL_S = 1.0  # how often the start-up watchdog looks at the launchers
# A Python signal handler runs only when the main thread is back in Python: a rendezvous with a rank that is
# gone, or a collective waiting on a dead peer, never returns. Exit hard after this long.
HARD_EXIT_AFTER_S = 10.0
# In training a second stop signal this long after the first ends the rank at once. Sooner, it is the same request:
# a terminal's Ctrl-C reaches the ranks and `deepspeed.launcher.launch`, which then sends each rank a SIGTERM.
AT_ONCE_AFTER_S = 2.0


def is_launcher(cmdline):
    """Whether a process's command line is one of the launchers that start ranks."""
    return any(mark in arg for arg in cmdline[:4] for mark in LAUNCHER_MARKS) or is_deepspeed_runner(cmdline)


def is_deepspeed_runner(cmdline):
    """`deepspeed ...` (or its other names, ds and deepspeed.pt), or `python -m deepspeed.launcher.runner`."""
    return any(os.path.basename(arg) in RUNNER_NAMES for arg in cmdline[:2]) or any(
        DEEPSPEED_RUNNER in arg for arg in cmdline[:4])


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


def cut_off_launch(launchers):
    """The `deepspeed.launcher.launch` among launchers whose own launcher was already gone when this rank
    looked (None if there is none). No ancestor can say that it was there once, so: DeepSpeed 0.19's runner is
    the only one that starts launch without --node_rank (pdsh and --no_ssh pass one), so such a launch's parent
    must be the runner; and a launch whose parent is init (PID 1) and no runner (the runner may be a
    container's PID 1) was adopted."""
    for process in launchers:
        try:
            cmdline = process.cmdline()
            if not any(DEEPSPEED_LAUNCH in arg for arg in cmdline[:4]):
                continue
            parent = psutil.Process(process.ppid())
            if is_deepspeed_runner(parent.cmdline()):
                continue
            if parent.pid == 1 or not any(arg.startswith("--node_rank") for arg in cmdline):
                return process
        except psutil.Error:
            return process  # it exited while we looked
    return None


def gone(process):
    """Whether a remembered process has exited (a zombie its parent has not reaped yet counts)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


class StoppedDuringStartUp(SystemExit):
    """Raised in the main thread by a stop before the first step: the interpreter prints the message (local
    rank 0's only: one line per machine) and exits with status 1; finally blocks on the way run (torch's JIT
    build lock is released, its ninja killed)."""


class StopRequest:
    """Created first thing in a run. Until started(): a stop ends the rank now (StoppedDuringStartUp). After:
    SIGTERM/SIGINT/SIGHUP/SIGUSR1, or a launcher gone, finishes the current step, saves, exits 0; any rank's request
    stops every rank; a signal again, AT_ONCE_AFTER_S or more later, ends the rank at once. close() puts the signal
    handlers back (runs in a test process end this way)."""

    def __init__(self):
        self.requested = False
        self.starting = True
        self._leaving = False
        self._first_signal_at = None  # in training
        self._launchers_seen_at = float("-inf")  # when asked() last looked at them
        self.checkpoint_stands = False  # whether a complete checkpoint of this run exists: what a stop at once leaves
        self.launchers = launcher_processes()
        cut = cut_off_launch(self.launchers)
        if cut is not None:
            self.requested = (f"the deepspeed runner exiting before this rank started ({DEEPSPEED_LAUNCH} pid "
                              f"{cut.pid} was orphaned)")
            raise self._start_up_stop()
        self._main_thread = threading.main_thread().ident
        # SIGTERM, SIGINT and SIGUSR1 are handled even where they were ignored from the start: a non-interactive shell
        # starts its background jobs (`cmd &` in a script, CI) with SIGINT ignored, and a `kill -INT` meant to stop such
        # a run gracefully was lost (the run trained on to its last step and exited 0); SIGUSR1 (Slurm's
        # `--signal=USR1@N`, its warning N seconds before a job's time limit, which ended the run without a line or a
        # save) is ignored by launch/slurm.sbatch for the launcher processes, which it would end, and reaches the ranks
        # so. A stop here only ever saves and exits. SIGHUP (the terminal closed) is a stop too: its default ended the
        # run without a save. Not where it was ignored from the start: nohup's promise that the run goes on.
        hangup = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
        self._handlers = {sig: signal.signal(sig, self._handle)
                          for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, *hangup)}
        # Signals also wake the watchdog (a pipe as the wakeup fd): it must know of one whose handler cannot run.
        self._wakeup_read, self._wakeup_write = os.pipe()
        os.set_blocking(self._wakeup_write, False)
        self._previous_wakeup = signal.set_wakeup_fd(self._wakeup_write, warn_on_full_buffer=False)
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="stop-watchdog", daemon=True)
        self._watchdog.start()

    def message(self):
        return (f"error: stopped by {self.requested} during start-up, before the first step: nothing to save. "
                f"Relaunch to train")

    def _start_up_stop(self):
        speaks = os.environ.get("LOCAL_RANK", "0") == "0"
        return StoppedDuringStartUp(self.message() if speaks else 1)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if not self.starting:
            # in training the watchdog acts on the signal, timed by its arrival: this handler runs only once the main
            # thread is back in Python (after a C call of seconds on a slow CPU), too late to tell a second from a first
            return
        self.requested = self.requested or name
        if not self._leaving:  # once: a second signal must not interrupt the way out
            if importing(frame):  # an exception there can be swallowed and leave a half-imported module behind
                self._exit_now(self.message())
            self._leaving = True
            raise self._start_up_stop()

    def _signal_in_training(self, name, now):
        """A signal that arrived at `now` (the watchdog's clock, read as it arrives). The first: the step ends, a
        checkpoint is saved (fit asks agreed() after each step); said at once. The same again, AT_ONCE_AFTER_S or
        more after the first arrived: exit now, without saving (a user who will not wait)."""
        if self._first_signal_at is None:
            self._first_signal_at = now
            self.requested = self.requested or name
            self._say(f"{name}: finishing this step, then saving and exiting ({name} again, {AT_ONCE_AFTER_S:.0f} s "
                      f"or more from now, stops at once without saving)")
        elif now - self._first_signal_at >= AT_ONCE_AFTER_S:
            left = ("the last complete checkpoint stands (--resume auto continues from it)" if self.checkpoint_stands
                    else "this run has no checkpoint yet (a relaunch starts it from step 0)")
            self._exit_now(f"error: stopped at once by a second {name}, without saving: {left}")

    @staticmethod
    def _say(line):
        """One line on stderr from local rank 0, safe in a signal handler (no Python buffer to re-enter)."""
        if os.environ.get("LOCAL_RANK", "0") == "0":
            os.write(2, (line + "\n").encode())

    def _watch(self):
        """Every signal as it arrives (the wakeup pipe), whatever the main thread is doing. In start-up: noted (if its
        handler cannot run), a launcher gone stops the main thread as a signal would, and a stop the main thread has
        not acted on within HARD_EXIT_AFTER_S ends the process. In training: _signal_in_training."""
        stop_seen = None
        while not self._closed.is_set():
            ready, _, _ = select.select([self._wakeup_read], [], [], POLL_S)
            if self._closed.is_set():
                return
            now = time.monotonic()
            for number in os.read(self._wakeup_read, 512) if ready else b"":
                # 0: close() waking us. The pipe also carries every signal another Python handler catches (torch's
                # DataLoader sets one for SIGCHLD): only ours are stops.
                if number not in self._handlers:
                    continue
                name = signal.Signals(number).name
                if self.starting:
                    self.requested = self.requested or name
                    stop_seen = stop_seen or now
                else:
                    self._signal_in_training(name, now)
            if not self.starting:
                continue  # launchers are checked at each step (agreed) and in evaluation (asked)
            if not self.requested:
                self.check_launchers()
                if self.requested:
                    stop_seen = time.monotonic()
                    signal.pthread_kill(self._main_thread, signal.SIGTERM)  # the handler sees self.requested
            if stop_seen and time.monotonic() - stop_seen > HARD_EXIT_AFTER_S:
                # if the handler ran, the interpreter says the message on the way out
                self._exit_now(None if self._leaving else
                               f"{self.message()} (the main thread did not respond in {HARD_EXIT_AFTER_S:.0f} s)")

    def _exit_now(self, line):
        """The main thread is stuck where no Python runs, inside an import, or asked twice in training (from the
        watchdog thread): say line (None: said already), exit 1."""
        try:
            if line:
                self._say(line)
        finally:
            os._exit(1)

    def started(self, resumed=False):
        """The first step begins: from now on a stop finishes the step and saves. A start-up stop that is still
        pending here had its exception swallowed on the way (a library catching everything around its call): it
        ends the run now, as it would have, and is never taken for a stop in training (exit 0 after a step).
        resumed: the run continues a checkpoint, which a stop at once leaves standing."""
        if self.starting and self.requested:
            self._leaving = True
            raise self._start_up_stop()
        self.checkpoint_stands = self.checkpoint_stands or resumed
        self.starting = False

    def saved(self):
        """A checkpoint of this run is complete (a stop at once from now on leaves it standing)."""
        self.checkpoint_stands = True

    def _end_watchdog(self):
        self._closed.set()
        try:
            os.write(self._wakeup_write, b"\0")  # out of its select now
        except BlockingIOError:
            pass
        self._watchdog.join()

    def close(self):
        self._end_watchdog()
        signal.set_wakeup_fd(self._previous_wakeup)
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        for fd in (self._wakeup_read, self._wakeup_write):
            os.close(fd)

    def check_launchers(self):
        if not self.requested:
            dead = next((p for p in self.launchers if gone(p)), None)
            if dead is not None:
                self.requested = f"its launcher exiting (pid {dead.pid})"

    def asked(self):
        """Whether this rank was asked to stop: a signal, or a launcher gone (looked at every POLL_S at most). What an
        evaluation or a sample asks between its batches or tokens, where the step's agreed() may be minutes away: a
        runner killed alone (`docker stop` signals PID 1) leaves the launcher and the ranks running."""
        now = time.monotonic()
        if now - self._launchers_seen_at >= POLL_S:
            self._launchers_seen_at = now
            self.check_launchers()
        return bool(self.requested)

    def agreed(self, device):
        """Whether any rank was asked to stop (a collective: every rank calls it once per step)."""
        import torch  # here, not above: see the module's docstring

        from gpt.runtime import ranks
        self.check_launchers()
        flag = torch.tensor(float(bool(self.requested)), device=device)
        stopping = ranks.mean_over_ranks(flag).item() > 0
        if stopping:  # a shared launcher may have gone just after this rank looked: say so, not 'another rank'
            self.check_launchers()
        return stopping
