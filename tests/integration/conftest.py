"""The integration tests' machinery: real training runs through train_ds.py, one rank in this process (train();
in_process.py), 2 CPU ranks under the deepspeed launcher, every 2-rank run the selected tests declare in one shared
launch (two_rank_runs; two_rank_runs.py), other launchers (torchrun, several nodes) as real processes, and commands
that need no test's hand (the bench, torchrun) in a background lane once that launch ends (background_runs); a
trained tiny checkpoint and the Shakespeare shards in a small vocabulary for bf16/fp16 runs. Tests that read the launch
or the lane run last, and are slow. The tests here import these helpers as `conftest` (tests/conftest.py says why
that is this file)."""
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from common import REPO, SMALL_VOCAB, join_single_rank_group  # before DeepSpeed: it pins the CPU accelerator
from gpt.data.shards import find_shards, load_shard, write_shard
from gpt.runtime.ranks import free_port
from in_process import run_main

FP32_CONFIG = "ds_configs/zero2_fp32.json"
# A tiny model and batch that keep each run to seconds on 2 CPU cores, in fp32: fast on every CPU. Tests
# about another precision or config pass their own --ds_config after these (argparse keeps the last). Its data is
# small_vocab_dir: with GPT-2's 50304 ids the logits and the loss were ~75% of a step (tests/common.py); a test
# about GPT-2's own tokens (text, HellaSwag, the stored loss curve) adds GPT2_VOCAB and reads shakespeare_dir, and
# so does a drill whose signal must land before the run's last step (steps of ~0.25 s, not ~0.03 s).
TINY = ["--model", "tiny", "--seq_len", "64", "--micro_batch", "4", "--warmup_steps", "2",
        "--val_every", "0", "--sample_every", "0", "--seed", "1234", "--ds_config", FP32_CONFIG,
        "--vocab_size", str(SMALL_VOCAB)]
GPT2_VOCAB = ["--vocab_size", "50304"]  # the tiny preset's own: GPT-2's 50257 tokens padded to a multiple of 64
# DeepSpeed's FusedAdam (JIT-built at a first start), the optimizer block ds_configs/ had before torch's AdamW
# (torch_adam): write_ds_config(..., optimizer=FUSED_ADAM) for a run that checkpoints with it
FUSED_ADAM = {"type": "AdamW", "params": {"betas": [0.9, 0.95], "eps": 1e-08}}
# Bounds on the largest relative difference of a loss from the uninterrupted run's after a resume on another world
# size, ZeRO stage or micro-batch (test_resume_anywhere.py): the sums of a step's gradients go in another
# order. Measured (2026-11-24, AMD EPYC with AVX512-BF16), fp32: 2 -> 1 rank 9.1e-8 (ZeRO 1), 9.3e-8 (ZeRO 2), 0.0
# (ZeRO 0); 1 -> 2 ranks 0.0; micro_batch 4 -> 2 1.8e-7 (with GPT-2's vocabulary; TINY's 512 ids since 2026-11-28,
# within the same bounds). bf16 (BF16_Optimizer <-> ZeRO 2): 2 -> 1 1.1e-5, 1 -> 2 6.3e-6.
RELATIVE_TOLERANCE = {"fp32": 1e-6, "bf16": 2e-4}
# Emulates a CPU without bf16 units (an AVX2-only AMD EPYC) on any x86 CPU: oneDNN and ATen stop at AVX2,
# so bf16 matmuls are converted in software, 50-100x slower than fp32.
NO_BF16_UNITS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory, shakespeare_dir):
    """The checkpoints/ directory of a 3-step tiny run on Shakespeare (trained once per session)."""
    out = tmp_path_factory.mktemp("trained")
    train(out, shakespeare_dir, *TINY, *GPT2_VOCAB, "--max_steps", "3", "--total_batch_tokens", "512", "--lr", "3e-3")
    return out / "checkpoints"


@pytest.fixture(scope="session")
def small_vocab_dir(shakespeare_dir, tmp_path_factory):
    """The Shakespeare shards in a SMALL_VOCAB-token vocabulary: the most frequent GPT-2 tokens of the
    train split get ids 0, 1, ... by rank, and every rarer token the last id. Still English to learn."""
    out = tmp_path_factory.mktemp("shakespeare_small_vocab")
    train_tokens = np.concatenate([np.asarray(load_shard(p)) for p in find_shards(shakespeare_dir, "train")])
    by_frequency = np.argsort(-np.bincount(train_tokens, minlength=2**16), kind="stable")
    new_id = np.full(2**16, SMALL_VOCAB - 1, dtype=np.uint16)
    new_id[by_frequency[:SMALL_VOCAB - 1]] = np.arange(SMALL_VOCAB - 1)
    for split in ("train", "val"):
        for path in find_shards(shakespeare_dir, split):
            write_shard(out / path.name, new_id[np.asarray(load_shard(path))])
    return out


def default_signals():
    """preexec_fn for a child that a test signals: its stop signals at their defaults, whatever this process's own
    (nohup ignores SIGHUP, a non-interactive shell's `cmd &` SIGINT)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def plain_shell_env():
    """The environment of a new shell: without DS_ACCELERATOR=cpu (set above), with the project importable."""
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    return {**env, "PYTHONPATH": str(REPO)}


def write_ds_config(path, base="zero1_bf16.json", stage=None, precision=None, **extra):
    """A DeepSpeed JSON derived from one of ds_configs/: another ZeRO stage, precision or extra keys."""
    config = json.loads((REPO / "ds_configs" / base).read_text())
    if stage is not None:
        config["zero_optimization"]["stage"] = stage
    if precision is not None:
        config.pop("bf16", None), config.pop("fp16", None)
        if precision != "fp32":
            config[precision] = {"enabled": True}
    config.update(extra)
    Path(path).write_text(json.dumps(config))
    return str(path)


def train(out_dir, data_dir, *args, ranks=1, launcher=None, check=True, extra=(), port=None):
    """Run train_ds.py; return (records from metrics.jsonl, completed process). One CPU rank under `python`
    runs in this process (in_process.py): what a launch costs before the first step (imports, DeepSpeed's op
    loading) is paid once per session instead of once per run. launcher="subprocess" forces a process."""
    port = port or free_port()
    launcher = launcher or ("python" if ranks == 1 else "deepspeed")
    script = [str(REPO / "train_ds.py"), "--data", str(data_dir), "--out_dir", str(out_dir), *args, *extra]
    if launcher == "python" and os.environ.get("DS_ACCELERATOR") == "cpu":
        join_single_rank_group()
        proc = subprocess.CompletedProcess(script, *run_main(script[1:]))
    else:
        cmd = [*launcher_argv(launcher, ranks, port), *script]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert_exit_0(proc)
    return read_metrics(out_dir), proc


def launcher_argv(launcher, ranks=1, port=None):
    """The command line before the script's for `python` ("python", "subprocess"), deepspeed or torchrun."""
    if launcher in ("python", "subprocess"):
        return [sys.executable]
    if launcher == "deepspeed":
        return ["deepspeed", "--num_gpus", str(ranks), "--master_port", str(port)]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(port)]


def read_metrics(out_dir):
    """The records of a run's metrics.jsonl; none if it wrote none."""
    metrics = Path(out_dir) / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def assert_exit_0(proc):
    assert proc.returncode == 0, (f"{' '.join(map(str, proc.args))} failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")


def two_rank_run(*args, ds_config=None, script="train_ds.py", ranks=2):
    """A 2-rank run for @pytest.mark.two_rank_runs({name: two_rank_run(...)}): the script's flags but --out_dir,
    where '{runs}' is the directory that holds every such run's out_dir (a run named NAME writes to {runs}/NAME)
    and '{FIXTURE}' a session fixture's path (e.g. {small_vocab_dir}). ds_config: write_ds_config's arguments
    for a derived DeepSpeed JSON, passed last. script: train_ds.py or another of two_rank_runs.py's MAINS (by file
    name). ranks=1: a train_ds.py run on one rank, in the test process before the launch (one that a 2-rank run
    resumes from)."""
    return {"args": list(args), "ds_config": ds_config, "script": script, "ranks": ranks}


def background_run(*argv, env=None):
    """A command for @pytest.mark.background_runs({name: background_run(...)}): argv run from the repository
    root with these extra environment variables, where '{out}' is a directory of its own, '{port}' a free port
    and '{FIXTURE}' a session fixture's path (e.g. {small_vocab_dir})."""
    return {"argv": list(argv), "env": env or {}}


class FixturePaths(dict):
    """str.format_map's mapping for '{FIXTURE}' in a command: the session fixture's path, set up on first use."""

    def __init__(self, request, **paths):
        super().__init__(paths)
        self.request = request

    def __missing__(self, fixture):
        return str(self.request.getfixturevalue(fixture))


def skipped(item):
    """Whether a skip or a true skipif marker skips item: the runs it declares are then not started."""
    return item.get_closest_marker("skip") is not None or any(any(m.args) for m in item.iter_markers("skipif"))


def declared(session, marker_name):
    """{name: run} of every run that the session's selected tests, but those skipped, declare with marker_name."""
    return {name: run for item in session.items if not skipped(item) for marker in item.iter_markers(marker_name)
            for name, run in marker.args[0].items()}


def readers(item):
    """0 for a test that reads no background work, 1 for one that reads background_runs, 2 for two_rank_runs."""
    return 2 if item.get_closest_marker("two_rank_runs") else 1 if item.get_closest_marker("background_runs") else 0


def pytest_collection_modifyitems(items):
    """A test that reads background work (the shared 2-rank launch, background_runs) is an integration test
    (slow), and runs last: that work starts with the session and goes on while the other tests run."""
    for item in items:
        if readers(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=readers)  # stable: order kept


@pytest.fixture(scope="session", autouse=True)
def two_rank_launch(request, tmp_path_factory):
    """Starts the shared 2-rank launch (two_rank_runs.py) at the first integration test (they run first), in the
    background: the tests before the first one that reads it run meanwhile. None when no selected test declares
    a run."""
    runs = declared(request.session, "two_rank_runs")
    if not runs:
        yield None
        return
    root = tmp_path_factory.mktemp("two_rank_runs")
    paths = FixturePaths(request, runs=str(root))
    argvs = {name: ["--out_dir", str(root / name), *(arg.format_map(paths) for arg in run["args"]),
                    *(["--ds_config", write_ds_config(root / f"{name}.json", **run["ds_config"])] if run["ds_config"]
                      else [])] for name, run in runs.items()}
    join_single_rank_group()
    one_rank = {name: run_main(argv) for name, argv in argvs.items() if runs[name]["ranks"] == 1}
    (root / "runs.json").write_text(json.dumps({name: [runs[name]["script"], argv] for name, argv in argvs.items()
                                                if name not in one_rank}))
    with open(root / "launch.out", "w") as out, open(root / "launch.err", "w") as err:
        launch = subprocess.Popen(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()),
                                   "tests/integration/two_rank_runs.py", str(root / "runs.json")],
                                  cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=err)
    try:
        yield root, argvs, one_rank, launch
    finally:
        if launch.poll() is None:  # the session ended (or was interrupted) before a test read the runs
            launch.kill()


@pytest.fixture(scope="session")
def two_rank_runs(two_rank_launch):
    """{name: (records, completed process)} of every 2-rank run that the selected tests declare with
    @pytest.mark.two_rank_runs, all in one deepspeed launch (two_rank_runs.py), in the order declared.
    The process's stdout and stderr are rank 0's then rank 1's; its exit status the first non-zero one."""
    root, argvs, one_rank, launch = two_rank_launch
    launch.wait(timeout=1800)
    results = {}
    for name, argv in argvs.items():
        paths = [root / f"{name}.rank{rank}.json" for rank in (0, 1)]
        if name in one_rank:
            proc = subprocess.CompletedProcess(argv, *one_rank[name])
        elif not all(path.exists() for path in paths):  # the launch died before this run
            proc = subprocess.CompletedProcess(argv, launch.returncode or 1, (root / "launch.out").read_text(),
                                               (root / "launch.err").read_text())
        else:
            ranks = [json.loads(path.read_text()) for path in paths]
            proc = subprocess.CompletedProcess(argv, next((r["returncode"] for r in ranks if r["returncode"]), 0),
                                               "".join(r["stdout"] for r in ranks), "".join(r["stderr"] for r in ranks))
        results[name] = (read_metrics(root / name), proc)
    return results


class BackgroundRuns(threading.Thread):
    """The commands that the selected tests declare with @pytest.mark.background_runs, one after another
    once the shared 2-rank launch has ended: a second lane of work beside the tests that run in this process."""

    def __init__(self, runs, root, launch, fixtures):
        super().__init__(daemon=True)
        self.runs, self.root, self.launch = runs, root, launch
        self.results, self.current, self.stopped = {}, None, False
        # the fixtures' paths now, in the main thread (fixtures are not thread-safe); {out} and {port} later
        self.argvs = {name: [arg.format_map(fixtures) for arg in run["argv"]] for name, run in runs.items()}

    def run(self):
        if self.launch is not None:
            self.launch.wait()
        for name, run in self.runs.items():
            if self.stopped:
                return
            out = self.root / name
            out.mkdir()
            port = free_port()
            argv = [arg.format(out=out, port=port) for arg in self.argvs[name]]
            with open(out / "stdout", "w+") as stdout, open(out / "stderr", "w+") as stderr:
                env = {**os.environ, "PYTHONPATH": str(REPO), **run["env"]}
                self.current = subprocess.Popen(argv, cwd=REPO, env=env, stdout=stdout, stderr=stderr)
                code = self.current.wait()
                stdout.seek(0), stderr.seek(0)
                self.results[name] = subprocess.CompletedProcess(argv, code, stdout.read(), stderr.read())

    def stop(self):
        self.stopped = True
        if self.current is not None and self.current.poll() is None:
            self.current.kill()


@pytest.fixture(scope="session", autouse=True)
def background_lane(request, tmp_path_factory, two_rank_launch):
    """Starts the background_runs of the selected tests with the first integration test; None if they declare none."""
    runs = declared(request.session, "background_runs")
    if not runs:
        yield None
        return
    lane = BackgroundRuns(runs, tmp_path_factory.mktemp("background_runs"), two_rank_launch and two_rank_launch[3],
                          FixturePaths(request, out="{out}", port="{port}"))
    lane.start()
    try:
        yield lane
    finally:
        lane.stop()


@pytest.fixture(scope="session")
def background_runs(background_lane):
    """{name: completed process} of every background_run the selected tests declare."""
    background_lane.join(timeout=1800)
    return background_lane.results


STARTED_EARLY = pytest.StashKey[set]()  # (module, fixture) of each started_early already started


def started_early(work, *fixtures, name):
    """The fixtures of a module's drills that mostly wait on processes: work(*the fixtures' values, this process's
    environment, a directory of its own) runs in a thread from the module's first test on, beside its other tests,
    and the fixture `name` returns what it returned; not started when no selected test of the module asks for `name`.
    The environment is read in the main thread: a run in this process changes it while it runs. Once per session: a
    module whose tests are split (those that read the shared 2-rank launch run last) sets its fixtures up again. Assign
    the pair to module-level names (pytest finds fixtures there)."""
    @pytest.fixture(scope="module", autouse=True, name=f"{name}_started")
    def started(request, tmp_path_factory):
        done, key = request.config.stash.setdefault(STARTED_EARLY, set()), (request.module.__name__, name)
        if key in done or not any(item.module is request.module and name in item.fixturenames
                                  for item in request.session.items):
            yield None
            return
        done.add(key)
        values = [request.getfixturevalue(fixture) for fixture in fixtures]
        with ThreadPoolExecutor(1) as pool:
            yield pool.submit(work, *values, dict(os.environ), tmp_path_factory.mktemp(name))

    @pytest.fixture(scope="module", name=name)
    def result(request):
        return request.getfixturevalue(f"{name}_started").result()
    return started, result


def saved_tensors(step_dir):
    """{file and key path: tensor} of every tensor in a checkpoint's .pt files (weights, fp32 master weights,
    Adam's moments, RNG states)."""
    found = {}

    def walk(value, name):
        if torch.is_tensor(value):
            found[name] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{name}/{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{name}[{i}]")
    for file in sorted(step_dir.glob("*.pt")):
        walk(torch.load(file, map_location="cpu", weights_only=False), file.name)
    return found


def reseal(step_dir, checksums=True):
    """complete.json made to describe step_dir's files as they are now, so that a test's deliberate edit meets the
    reader behind the size and checksum checks; checksums=False: as saved before checkpoints recorded them."""
    from gpt.train import checkpoint
    marker = json.loads((Path(step_dir) / checkpoint.COMPLETE).read_text())
    marker["files"] = checkpoint.file_sizes(step_dir)
    if checksums:
        marker["crc32"] = checkpoint.checksums(step_dir, list(marker["files"]))
    else:
        marker.pop("crc32", None)
    (Path(step_dir) / checkpoint.COMPLETE).write_text(json.dumps(marker))


def out_dir_of(proc):
    return Path(proc.args[proc.args.index("--out_dir") + 1])


def succeeded(run):
    """(records, proc) of a run from two_rank_runs, which must have exited 0."""
    assert_exit_0(run[1])
    return run


def train_losses(records):
    return [r["loss"] for r in records if "loss" in r]
