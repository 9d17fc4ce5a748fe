"""The launcher's variables read once and checked before anything is planned for them (gpt/console.py
launch_problem; a stale WORLD_SIZE in a plain shell: tests/integration/test_bad_input.py)."""
import pytest

from gpt.console import launch_problem, launched_rank, launched_world_size


@pytest.mark.parametrize("environ", [{}, {"RANK": "0", "WORLD_SIZE": "1"}, {"RANK": "3", "WORLD_SIZE": "8"},
                                     {"WORLD_SIZE": "1"}, {"LOCAL_RANK": "0"}])
def test_a_launchers_variables_or_none_are_one_launch(environ):
    assert launch_problem(environ) is None


@pytest.mark.parametrize("environ, problem", [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but RANK is not, and a launcher sets both: left in this shell, it would "
                          "plan the batch for 2 ranks while 1 trains. Unset WORLD_SIZE, or launch with deepspeed or "
                          "torchrun"),
    ({"RANK": "0"}, "RANK=0 is set but WORLD_SIZE is not, and a launcher sets both: unset RANK for a one-process run, "
                    "or launch with deepspeed or torchrun"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK='2' is not a rank of WORLD_SIZE=2 (0 to 1)"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is not a rank of WORLD_SIZE=2 (0 to 1)"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a number of ranks (a whole number, 1 or more)"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a number of ranks (a whole number, 1 or more)"),
])
def test_one_variable_without_the_other_or_a_value_out_of_range_is_one_line(environ, problem):
    assert launch_problem(environ) == problem


def test_a_value_that_is_no_rank_still_lets_the_error_be_said(monkeypatch):
    """exit_with reads the rank to decide who speaks: junk there must not raise before the line is said."""
    monkeypatch.setenv("RANK", "x")
    monkeypatch.setenv("WORLD_SIZE", "y")
    assert (launched_rank(), launched_world_size()) == (0, 1)


def test_the_store_hosts_port_is_checked_before_anything_is_written(monkeypatch):
    """RANK 0 hosts the process group's store on MASTER_PORT (torch's rendezvous failed there with EADDRINUSE, a
    traceback); under torchrun its agent hosts it, and a group joined before (the tests') has its store."""
    import socket

    from gpt.runtime import ranks

    monkeypatch.setattr(ranks.dist, "is_initialized", lambda: False)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        environ = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        assert ranks.store_port_problem(environ) == (
            f"MASTER_PORT={port}: the process group's port is in use on this machine (another run, or another "
            f"program, holds it): launch with a free one, --master_port N (deepspeed, torchrun)")
        assert ranks.store_port_problem({**environ, "RANK": "1"}) is None  # a client of rank 0's store
        assert ranks.store_port_problem({**environ, "TORCHELASTIC_USE_AGENT_STORE": "True"}) is None
        monkeypatch.setattr(ranks.dist, "is_initialized", lambda: True)
        assert ranks.store_port_problem(environ) is None
    monkeypatch.setattr(ranks.dist, "is_initialized", lambda: False)
    assert ranks.store_port_problem(environ) is None  # released
    assert ranks.store_port_problem({**environ, "MASTER_PORT": "70000"}) is None  # master_port_problem's to say


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_master_port_that_is_no_port_is_one_line_on_every_rank(rank):
    """deepspeed --master_port 296114: rank 0 said so in one line, rank 1 printed torch's `ValueError: port must have
    value from 0 to 65535` traceback. Every rank asks now (exit_with lets rank 0 alone say it)."""
    from gpt.runtime import ranks

    environ = {"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    assert ranks.master_port_problem({**environ, "MASTER_PORT": "296114"}) == \
        "MASTER_PORT='296114': not a port number (1-65535)"
    assert ranks.master_port_problem({**environ, "MASTER_PORT": "0"}) == "MASTER_PORT='0': not a port number (1-65535)"
    assert ranks.master_port_problem({**environ, "MASTER_PORT": "29500"}) is None
    assert ranks.master_port_problem(environ) is None  # no launcher's port: a plain `python` run picks its own


@pytest.mark.parametrize("rank, hard, waited", [(0, False, []), (1, False, [5.0]), (1, True, [])])
def test_a_rank_that_leaves_the_saying_to_rank_0_waits_for_it(monkeypatch, capsys, rank, hard, waited):
    """The launcher ends every rank once one exits non-zero: a silent rank that exited first cut rank 0 off before
    its line (a refused out_dir on 2 ranks said `stopped by SIGTERM during start-up` instead). It waits for
    SILENT_RANK_WAIT_S, in which rank 0 says the line and exits; a hard exit (ranks already apart) does not."""
    import os

    from gpt import console
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    slept = []
    monkeypatch.setattr(console.time, "sleep", slept.append)
    monkeypatch.setattr(os, "_exit", lambda status: (_ for _ in ()).throw(SystemExit(status)))
    with pytest.raises(SystemExit) as exit_info:
        console.exit_with("--out_dir x holds an earlier run", 2, hard=hard)
    assert exit_info.value.code == 2 and slept == waited
    assert capsys.readouterr().err == ("error: --out_dir x holds an earlier run\n" if rank == 0 else "")


def test_a_process_group_that_did_not_form_names_the_nodes_that_did_not_join():
    """torch's `DistStoreError: Timed out after 21 seconds waiting for clients. 1/2 clients joined.` on node 0 (the
    store's), and its connect timeout on a node whose store never came: one line each, naming the nodes (DeepSpeed's
    launcher's --world_info, in node-rank order; CROSS_RANK is this node's)."""
    import torch.distributed as dist

    from gpt.runtime import ranks

    environ = {"CROSS_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    store = dist.DistStoreError("Timed out after 21 seconds waiting for clients. 1/2 clients joined.")
    assert ranks.rendezvous_problem(store, 20.0, environ, nodes=["a", "b"]) == (
        "the process group did not form within 20 s (--collective_timeout): 1 of 2 ranks joined; not joined: b (node 1). "
        "Start every node's command (NODE_RANK=0, 1, ...), each able to reach MASTER_ADDR:MASTER_PORT 10.0.0.1:29500")
    three = dist.DistStoreError("Timed out after 21 seconds waiting for clients. 2/3 clients joined.")
    assert "2 of 3 ranks joined; not joined: some of b (node 1), c (node 2). " in ranks.rendezvous_problem(
        three, 20.0, environ, nodes=["a", "b", "c"])
    connect = dist.DistNetworkError("The client socket has timed out after 20000ms while trying to connect to "
                                    "(10.0.0.1, 29500).")
    assert ranks.rendezvous_problem(connect, 20.0, {**environ, "CROSS_RANK": "1"}, nodes=["a", "b"]) == (
        "the process group's store on a (node 0) did not answer within 20 s (--collective_timeout) at "
        "MASTER_ADDR:MASTER_PORT 10.0.0.1:29500: start node 0's command too, and check that this node reaches that "
        "address")
    assert ranks.rendezvous_problem(dist.DistNetworkError("Connection reset by peer"), 20.0, environ, nodes=[]) is None
