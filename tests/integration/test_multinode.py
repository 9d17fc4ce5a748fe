"""Several nodes on one machine: two launchers of launch/multinode.sh (DeepSpeed's launcher without ssh,
one command per node), one CPU rank each, each node in its own network namespace joined to the other by a
veth pair where the test may create them (root; else over loopback), and launch/slurm.sbatch under a faked
Slurm. One run holds every drill (each launch of two nodes costs ~15 s of start-up on 2 cores): a SIGKILLed node
makes the survivor exit with one line; the relaunch through launch/slurm.sbatch continues from the last complete
checkpoint, never from one left half-written; a SIGTERM to one launcher's PID saves and stops both nodes, every
step with one node's losses; the stop's checkpoint goes on on one rank. And launch/multinode.sh's own checks,
each one line: a bad hostfile, a node that does not answer over ssh, a node that never starts (the last two,
which wait, start with the module's first test and wait beside its launches)."""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import (GPT2_VOCAB, REPO, RELATIVE_TOLERANCE, TINY, default_signals, free_port, started_early, succeeded,
                      train, two_rank_run)
from gpt.train import resume

# GPT-2's vocabulary: steps long enough (~0.25 s) that the drills' signals land before the run's last step
ARGS = [*TINY, *GPT2_VOCAB, "--total_batch_tokens", "512", "--max_steps", "12", "--save_every", "4",
        "--collective_timeout", "30"]


@pytest.fixture(scope="module")
def network():
    """[(command prefix, address, extra environment) per node; node 0's address is the master]: each node in its
    own network namespace, the two joined by a veth pair (10.231.0.1 and .2, reachable only from inside them), where
    this process may create namespaces; else both on this machine's loopback (127.0.0.1 and .2)."""
    tag = f"dsgpt{os.getpid() % 100000}"
    spaces, links, master = [f"{tag}n0", f"{tag}n1"], [f"{tag}a", f"{tag}b"], "10.231.0.1"
    setup = [["ip", "netns", "add", spaces[0]], ["ip", "netns", "add", spaces[1]],
             ["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]]]
    for i in (0, 1):
        setup += [["ip", "link", "set", links[i], "netns", spaces[i]],
                  ["ip", "-n", spaces[i], "addr", "add", f"10.231.0.{i + 1}/24", "dev", links[i]],
                  ["ip", "-n", spaces[i], "link", "set", links[i], "up"], ["ip", "-n", spaces[i], "link", "set", "lo", "up"]]
    try:
        for command in setup:
            subprocess.run(command, check=True, capture_output=True)
        subprocess.run(["ip", "netns", "exec", spaces[1], "ping", "-c", "1", "-W", "2", master], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        yield [([], "127.0.0.1", {}), ([], "127.0.0.2", {})]
    else:
        yield [(["ip", "netns", "exec", spaces[i]], f"10.231.0.{i + 1}", {"GLOO_SOCKET_IFNAME": links[i]})
               for i in (0, 1)]
    finally:
        for space in spaces:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", space], capture_output=True)


@pytest.fixture(scope="module")
def one_node(two_rank_runs):
    """{step: loss} of the same run on one node with 2 ranks (in the session's shared 2-rank launch)."""
    records, _ = succeeded(two_rank_runs["one_node"])
    return losses(records)


# every test here compares with one_node's run
pytestmark = pytest.mark.two_rank_runs({"one_node": two_rank_run("--data", "{small_vocab_dir}", *ARGS)})


def losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def node_env(tmp_path, data, port, node_rank, hostnames=("node0", "node1"), base=None):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in hostnames))
    # OMP_NUM_THREADS=1: the two nodes share this machine's 2 cores, one each, as one node's 2 ranks do. Each
    # would otherwise take both, and a rank's thread count changes the bits (test_a_ranks_thread_count_...).
    return {**(os.environ if base is None else base), "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu",
            "HOSTFILE": str(hostfile), "OMP_NUM_THREADS": "1",
            "NODE_RANK": str(node_rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DATA": str(data),
            "OUT_DIR": str(tmp_path / "out")}


def start_nodes(tmp_path, data, network, script="launch/multinode.sh", envs=None):
    """Both nodes' launchers, each in its own session (as on two machines) and in its network namespace where
    `network` has them; stdout and stderr merged."""
    port = free_port()
    envs = envs or [{**node_env(tmp_path, data, port, rank), "MASTER_ADDR": network[0][1], **network[rank][2]}
                    for rank in (0, 1)]
    return [subprocess.Popen([*prefix, "bash", script, *ARGS], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for (prefix, _, _), env in zip(network, envs)]


def read_until(node, prefix):
    """Node 0's output up to and including the first line starting with prefix."""
    lines = []
    for line in node.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return "".join(lines)
    raise AssertionError("".join(lines)[-3000:])


def finish(nodes, timeout=180):
    """Each node's (exit code, output, seconds until it exited); any node still running is killed."""
    started, results = time.monotonic(), []
    try:
        for node in nodes:
            output = node.stdout.read()
            results.append((node.wait(timeout=timeout), output, time.monotonic() - started))
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    return results


def metrics(tmp_path):
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def slurm_envs(tmp_path, data, network):
    """Both nodes' environments as srun starts launch/slurm.sbatch's per-node body: SLURM_* variables, and a
    scontrol that expands the node list to the nodes' addresses (the first is the master)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "%s\\n%s\\n"\n'
                                      % (network[0][1], network[1][1]))
    (bin_dir / "scontrol").chmod(0o755)
    port = free_port()
    envs = [{**node_env(tmp_path, data, port, 0), **network[rank][2], "PATH": f"{bin_dir}:{os.environ['PATH']}",
             "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "dsgpt-[01-02]", "SLURM_NNODES": "2",
             "SLURM_NODEID": str(rank), "SLURM_PROCID": str(rank), "SLURM_GPUS_ON_NODE": "1",
             "SLURM_SUBMIT_DIR": str(REPO), "TMPDIR": str(tmp_path)} for rank in (0, 1)]  # its hostfile goes there
    for env in envs:
        for name in ("HOSTFILE", "NODE_RANK", "MASTER_ADDR"):  # the script derives these
            env.pop(name)
    return envs


def a_killed_node(tmp_path, data, network):
    """Two nodes through launch/multinode.sh, node 1 SIGKILLed once the checkpoint of step 3 is complete: the
    survivor exits with one line. Then a checkpoint past the newest complete one, left half-written as if being
    written when the node died. The newest complete checkpoint."""
    nodes = start_nodes(tmp_path, data, network)
    before = read_until(nodes[0], "step     6/")  # the checkpoint of step 3 is complete
    os.killpg(nodes[1].pid, signal.SIGKILL)  # node 1: its launcher and its rank
    (code0, out0, seconds), (code1, _, _) = finish(nodes)
    assert code0 != 0 and code1 == -signal.SIGKILL
    assert seconds < 60, f"the survivor took {seconds:.0f} s to exit"  # gloo sees the peer's socket close
    assert "error: [rank 0] lost contact with another rank" in out0 and "Traceback" not in out0, out0[-3000:]
    assert f"--master_addr={network[0][1]}" in before  # over the veth pair where namespaces could be made
    ckpt = tmp_path / "out" / "checkpoints"
    newest = resume.find_checkpoint("auto", tmp_path / "out")
    newest_step = int(newest.name.split("_")[1])
    # a checkpoint that was being written when the node died: files there, no completion marker
    half_written = ckpt / f"step_{newest_step + 4:08d}"
    shutil.copytree(newest, half_written, ignore=shutil.ignore_patterns("complete.json", "rng_rank00001.pt"))
    (ckpt / "latest").write_text(half_written.name)
    assert resume.find_checkpoint("auto", tmp_path / "out") == newest
    return newest


def test_a_killed_node_then_slurms_relaunch_past_a_half_written_checkpoint_a_sigterm_and_one_rank_goes_on(
        tmp_path, small_vocab_dir, one_node, network):
    """Two nodes through launch/multinode.sh, node 1 SIGKILLed: the survivor exits with one line. The relaunch
    through launch/slurm.sbatch's per-node body, as srun starts it (its node rank, master and hostfile from Slurm's
    variables), passes over a checkpoint left half-written and resumes from the last complete one. A SIGTERM to
    node 0's launcher PID alone (as `kill PID` and container runtimes do): both nodes save and stop, every step so
    far with one node's losses step for step (2 nodes = 1 node, and the resume exact). The stop's checkpoint goes
    on, on one node of one rank, through the universal form. ~22 s on a 2-core AVX512-BF16 EPYC, ~35 s on a 2-core
    AVX2 EPYC (~1.6x): two launches of two nodes, four processes each importing torch and DeepSpeed, on steps of
    GPT-2's vocabulary (long enough for the signals to land before the last step); one launch cannot both lose a
    node and stop on a SIGTERM."""
    newest = a_killed_node(tmp_path, small_vocab_dir, network)
    newest_step = int(newest.name.split("_")[1])
    nodes = start_nodes(tmp_path, small_vocab_dir, network, "launch/slurm.sbatch",
                        slurm_envs(tmp_path, small_vocab_dir, network))
    before = read_until(nodes[0], f"step {newest_step + 2:5d}/")
    nodes[0].send_signal(signal.SIGTERM)  # the launcher's PID alone
    (code0, out0, seconds), (code1, out1, _) = finish(nodes)
    assert code0 == -signal.SIGTERM and code1 == 0, out0[-2000:] + out1[-2000:]
    assert f"resumed from {newest}" in before and "2 rank(s) x micro_batch 4" in before
    assert f"--master_addr={network[0][1]}" in before and "nnodes=2, num_local_procs=1, node_rank=1" in out1
    assert "stopped by its launcher exiting" in out0 and seconds < 60
    stopped = resume.find_checkpoint("auto", tmp_path / "out")
    assert {p.name for p in stopped.iterdir()} >= {"rng_rank00000.pt", "rng_rank00001.pt",  # every rank of both nodes
                                                   "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                                   "zero_pp_rank_1_mp_rank_00_optim_states.pt", "complete.json"}
    stopped_at = int(stopped.name.split("_")[1])
    assert newest_step + 2 <= stopped_at < 11  # saved by the stop, not by the last step (11)
    # each step's last record (the launch that kept it) is one node's, across the kill and its relaunch
    assert losses(metrics(tmp_path)) == {step: one_node[step] for step in range(stopped_at + 1)}

    # 2 nodes -> 1 node of 1 rank: the stop's checkpoint goes on with Adam's moments and the next global batch
    records, proc = train(tmp_path / "one_rank", small_vocab_dir, *ARGS, "--resume", str(stopped))
    assert f"converted {stopped} to DeepSpeed's universal form" in proc.stdout
    assert f"at step {stopped_at + 1}" in proc.stdout
    resumed = losses(records)
    assert sorted(resumed) == list(range(stopped_at + 1, 12))
    assert max(abs(resumed[s] / one_node[s] - 1) for s in resumed) < RELATIVE_TOLERANCE["fp32"]


def test_a_hostfile_missing_or_with_a_bad_line_is_one_line_from_the_callers_directory(tmp_path):
    """launch/multinode.sh reads HOSTFILE from the caller's directory: DeepSpeed's launcher trained on one node
    alone when the file was missing, and answered a bad line with its traceback."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "HOSTFILE": "nodes"}

    def launch():
        return subprocess.run(["bash", str(REPO / "launch" / "multinode.sh")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
    proc = launch()
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "error: HOSTFILE=nodes: not a readable file: list every "
                                                                   "node and its GPUs, one per line ('node1 slots=8')\n")
    for text, problem in [
            ("# two nodes\nnode1 slots=8\n\nnode2 slot=8\n", "line 4, 'node2 slot=8', is not 'HOST slots=N'"),
            # DeepSpeed: exit 0 without starting a rank; its ValueError tracebacks
            ("node1 slots=8\nnode2 slots=0\n", "line 2, 'node2 slots=0': slots=0 starts no rank on node2 (1 or more GPUs)"),
            ("node1 slots=8\nnode1 slots=8\n", "line 2: node1 is listed already, on line 1"),
            ("", "lists no node: one line per node and its GPUs ('node1 slots=8')"),
            ("# node1 slots=8\n\n", "lists no node: one line per node and its GPUs ('node1 slots=8')")]:
        (tmp_path / "nodes").write_text(text)
        proc = launch()
        assert (proc.returncode, proc.stderr) == (2, f"error: HOSTFILE=nodes: {problem}\n")
    (tmp_path / "nodes").write_text("localhost slots=2 # main\n")  # as DeepSpeed reads it: one node, a comment
    env["NODE_RANK"] = "1"  # read as that one node: refused here, before anything starts
    proc = launch()
    assert (proc.returncode, proc.stderr) == (2, "error: NODE_RANK=1: not a node of HOSTFILE=nodes (0 to 0, its lines in "
                                                 "order)\n")


def unanswered_ssh(environ, tmp_path):
    """launch/multinode.sh over ssh, from a directory with a hostfile of two nodes and an ssh that never answers for
    node2 (as an address that drops packets), whatever this machine's ssh and network."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\ncase "$*" in *node2*) exec sleep 600;; esac\n')
    (bin_dir / "ssh").chmod(0o755)
    (tmp_path / "nodes").write_text("node1 slots=1\nnode2 slots=1\n")
    env = {"PATH": f"{bin_dir}:{environ['PATH']}", "HOME": str(tmp_path), "DS_ACCELERATOR": "cpu",
           "HOSTFILE": "nodes", "SSH_TIMEOUT": "2"}
    return subprocess.run(["bash", str(REPO / "launch" / "multinode.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def never_joined_node(data, environ, tmp_path):
    """(the completed process, its MASTER_PORT) of NODE_RANK=0 of two nodes started alone, with --collective_timeout
    10 (the least it allows): node 1 never starts."""
    port = free_port()
    return subprocess.run(["bash", "launch/multinode.sh", *ARGS, "--collective_timeout", "10"], cwd=REPO,
                          env=node_env(tmp_path, data, port, 0, base=environ), capture_output=True, text=True,
                          timeout=300, preexec_fn=default_signals), port


# Both spend their time waiting: started with the module's first test, they wait while the launches of two nodes use
# the cores, and their tests read how they ended.
unanswered_ssh_started, unanswered_ssh_check = started_early(unanswered_ssh, name="unanswered_ssh_check")
never_joined_node_started, never_joined_node_run = started_early(never_joined_node, "small_vocab_dir",
                                                                 name="never_joined_node_run")


def test_over_ssh_a_node_that_does_not_answer_is_one_line_within_ssh_timeout(unanswered_ssh_check):
    """DeepSpeed's check asks the first node alone, with no time limit: a hostfile naming an unreachable address said
    nothing for 75 s and more. Each node is asked within SSH_TIMEOUT (2 s here, waited beside the launches above)."""
    proc = unanswered_ssh_check
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", (
        "error: HOSTFILE=nodes: node node2 is not reachable over ssh (no answer within 2 s, SSH_TIMEOUT): every node "
        "needs passwordless ssh from this one; or start one command per node with NODE_RANK (docs/multinode.md)\n"))


def test_a_node_that_never_starts_is_named_in_one_line_after_the_collective_timeout(never_joined_node_run):
    """NODE_RANK=0 started alone, node1 never: torch's `DistStoreError: Timed out after 21 seconds waiting for clients.
    1/2 clients joined.` was a traceback. One line now, naming the node that did not join. Started with the module's
    first test: its launch and the 10 s that --collective_timeout allows at least pass beside the launches above."""
    proc, port = never_joined_node_run
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        f"error: the process group did not form within 10 s (--collective_timeout): 1 of 2 ranks joined; not joined: "
        f"node1 (node 1). Start every node's command (NODE_RANK=0, 1, ...), each able to reach MASTER_ADDR:MASTER_PORT "
        f"127.0.0.1:{port}"], proc.stderr[-3000:]
