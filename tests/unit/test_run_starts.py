"""A self-restarting run read back: 'distrun show' lists how many times each node's ranks were
started (the job's own report, from the collected started/starts-* files, bounded and parsed
strictly), and a launcher that a stop of its unit ended leaves the run lost, with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.run import liveness, starts
from distrun.store.runs import new_run

from .conftest import REPO
from .plans import plan_for
from .test_long_runs import local_cluster

TWO = str(REPO / "tests" / "golden" / "inventories" / "two-nodes")


def _starts(nodes: Path, host_copy: str, attempt: int, files: dict[str, str]) -> None:
    folder = nodes / host_copy / "attempts" / str(attempt) / "started"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_the_starts_of_the_last_attempt_are_counted_once_per_file(tmp_path):
    nodes = tmp_path / "nodes"
    _starts(nodes, "node1", 0, {"starts-node1-0": "11\n"})  # an earlier attempt: not this one's
    shared = {"starts-node1-0": "101\n202\n", "starts-node2-0": "303\n404\n", "starts-node2-1": "505\n606\n",
              "rank-0": "node1 101\n"}
    _starts(nodes, "node1", 1, shared)  # a shared folder: every node's copy holds every file
    _starts(nodes, "node2", 1, shared)
    said = starts.collected(nodes)
    assert said is not None
    assert said.as_dict() == {"reported_by": "the job", "attempt": 1, "ended_on_restart": 2, "unreadable_files": 0,
                              "hosts": {"node1": {"starts": 2, "local_ranks": {"0": 2}},
                                        "node2": {"starts": 2, "local_ranks": {"0": 2, "1": 2}}}}
    assert starts.collected(tmp_path / "none") is None


def test_what_the_job_wrote_instead_is_left_out_and_counted(tmp_path):
    nodes = tmp_path / "nodes"
    _starts(nodes, "node1", 0, {"starts-node1-0": "12\n34\n", "starts-node1-1": "12\nrestart=99\n",
                                "starts-node1-x": "1\n", "starts-node1-2": "1\n" * (starts.MAX_BYTES // 2 + 1),
                                "starts-node1-3": ""})
    os.symlink("/etc/hostname", nodes / "node1/attempts/0/started/starts-node1-4")
    os.mkfifo(nodes / "node1/attempts/0/started/starts-node1-5")  # never read: it would block
    said = starts.collected(nodes)
    assert said is not None and said.hosts == {"node1": {0: 2}} and said.unreadable == 6
    assert said.ended_on == 1


def test_show_lists_the_starts_as_the_jobs_report(private_state):
    run = new_run("train", Path(TWO))
    _starts(run.dir / "nodes", "node1", 0, {"starts-node1-0": "1\n2\n", "starts-node2-0": "3\n4\n"})
    result = CliRunner().invoke(main, ["show", run.id], prog_name="distrun", env={"DISTRUN_INVENTORY": None})
    assert result.exit_code == 0, result.output
    assert ("starts:     node1 2 time(s); node2 2 time(s) (in attempt 0, as the job's rank wrapper reported them)\n"
            "ended on:   restart 1 (DISTRUN_RESTART of the last start, as reported)\n") in result.stdout
    shown = json.loads(CliRunner().invoke(main, ["show", run.id, "--json"], prog_name="distrun",
                                          env={"DISTRUN_INVENTORY": None}).stdout)
    assert shown["starts"]["reported_by"] == "the job" and shown["starts"]["ended_on_restart"] == 1
    bare = new_run("train", Path(TWO))
    assert "starts:" not in CliRunner().invoke(main, ["show", bare.id], prog_name="distrun",
                                               env={"DISTRUN_INVENTORY": None}).stdout


def _answer(launcher: str, rc: int | None = None, signal: object = None) -> str:
    return "noise\n" + json.dumps({"verb": "state", "dir": True, "launcher": launcher, "rc": rc, "signal": signal,
                                   "procs": 1, "started": [0]}) + "\n"


STOPPED = _answer("exited", 143, "TERM")


@pytest.mark.parametrize(("launcher", "answers", "state", "rc", "said"), [
    # The first launch host's unit stopped: lost at once, though the others still run.
    ("torchrun", {"n1": STOPPED, "n2": _answer("running")}, "lost", None,
     ["the launcher on n1 was stopped by signal TERM before the job ended", "its launchers on n2 still run: "
      "'distrun stop R' ends them"]),
    ("torchrun", {"n1": STOPPED, "n2": _answer("exited", 1)}, "lost", None, ["the job's own end will never be written"]),
    ("mpirun", {"n1": _answer("exited", 137, "KILL"), "n2": _answer("none")}, "lost", None, ["signal KILL"]),
    # Another node's unit stopped while the first runs a group that needs every node: lost too
    # (the ranks left wait for the stopped node's, and nothing starts its agent again).
    ("torchrun", {"n1": _answer("running"), "n2": STOPPED}, "lost", None,
     ["the launcher on n2 was stopped by signal TERM", "its launchers on n1 still run"]),
    # The first launch host's own end decides: the stop came after it.
    ("torchrun", {"n1": _answer("exited", 1), "n2": STOPPED}, "failed", 1,
     ["the launcher exited 1 on n1; the launcher on n2 was stopped by signal TERM"]),
    ("torchrun", {"n1": _answer("exited", 0), "n2": STOPPED}, "succeeded", 0, ["the launcher on n2 was stopped"]),
    # A launcher's own exit 143 (no signal in root's record) is an exit like any other.
    ("torchrun", {"n1": _answer("exited", 143), "n2": _answer("exited", 0)}, "failed", 143, ["the launcher exited 143"]),
])
def test_a_launcher_a_signal_ended_decides_the_state_as_the_first_launch_host_goes(launcher, answers, state, rc, said):
    plan = plan_for(local_cluster(("n1", "n2")), run_id="R", launcher=launcher, workload="ddp")
    judged = liveness.judge(plan, {h: liveness.parse_probe(h, a) for h, a in answers.items()})
    assert (judged.state, judged.rc) == (state, rc), judged
    assert all(s in judged.reason for s in said), judged.reason


def test_a_group_that_goes_on_without_a_node_runs_on_when_that_nodes_launcher_is_stopped():
    plan = plan_for(local_cluster(("n1", "n2")), run_id="R", launcher="torchrun", workload="ddp", detach=True,
                    max_restarts=1, exclude_failed=True)
    assert plan.attempt.min_nodes == 1
    judged = liveness.judge(plan, {"n1": liveness.parse_probe("n1", _answer("running")), "n2": liveness.parse_probe("n2", STOPPED)})
    assert judged.state == "running" and "the launcher on n2 was stopped by signal TERM, while the launchers on n1 run on" \
        in judged.reason, judged.reason


@pytest.mark.parametrize("signal", ["TERM; rm -rf /", "term", 15, True, "X" * 13])
def test_a_signal_name_a_node_sends_is_read_strictly(signal):
    state = liveness.parse_probe("n1", _answer("exited", 143, signal))
    assert state.signal == "" and state.text().startswith("launcher exited 143")
    assert liveness.parse_probe("n1", STOPPED).text().startswith("launcher stopped by signal TERM")
