"""'distrun logs RUN --rank N --follow' of a running run whose node cannot be reached fails (exit 6
or 1, one line naming the node and why), where it used to end quietly with exit 0."""

from __future__ import annotations

import json
from types import SimpleNamespace

from click.testing import CliRunner

from distrun.cli.main import main
from distrun.errors import ExitCode
from distrun.run import logs
from distrun.run.liveness import ClusterState
from distrun.store.runs import new_run

PLAN = {"launcher": "mpirun", "world_size": 2, "shared_dir": "/srv/distrun", "user": "distrun",
        "hosts": [{"name": "w1", "address": "192.0.2.1", "slots": 1}, {"name": "w2", "address": "192.0.2.2", "slots": 1}]}


def _running_run(tmp_path):
    run = new_run("train", tmp_path / "hosts.ini")
    run.meta.controller = None  # running, and no distrun process follows it
    run.save()
    (run.dir / "plan.json").write_text(json.dumps({**PLAN, "run_id": run.id}))
    return run


def _invoke(args):
    result = CliRunner().invoke(main, args, prog_name="distrun")
    return result.exit_code, result.stderr.strip().splitlines()


def test_follow_of_a_rank_whose_node_ssh_cannot_reach_fails(private_state, tmp_path, monkeypatch):
    run = _running_run(tmp_path)
    nodes = (SimpleNamespace(name="w1"), SimpleNamespace(name="w2"))
    monkeypatch.setattr(logs, "_cluster", lambda r: SimpleNamespace(nodes=nodes))
    monkeypatch.setattr(logs, "shell_argv", lambda node, command: [
        "bash", "-c", "echo 'ssh: connect to host 192.0.2.2 port 22: Connection timed out' >&2; exit 255"])
    monkeypatch.setattr(logs, "live_state", lambda r: ClusterState("running"))
    code, err = _invoke(["logs", run.id, "--rank", "1", "--follow"])
    assert code == ExitCode.CONTACT_LOST and len(err) == 1
    assert "rank 1's log on w2 cannot be followed" in err[0] and "Connection timed out" in err[0]


def test_follow_while_no_node_of_the_run_answers_fails(private_state, tmp_path, monkeypatch):
    run = _running_run(tmp_path)
    nodes = (SimpleNamespace(name="w1"), SimpleNamespace(name="w2"))
    monkeypatch.setattr(logs, "_cluster", lambda r: SimpleNamespace(nodes=nodes))
    monkeypatch.setattr(logs, "shell_argv", lambda node, command: ["sleep", "30"])  # tail waits, printing nothing
    monkeypatch.setattr(logs, "live_state", lambda r: ClusterState("unreachable", reason="no launch host answers"))
    code, err = _invoke(["logs", run.id, "--rank", "1", "--follow"])
    assert code == ExitCode.CONTACT_LOST and len(err) == 1
    assert "no launch host answers" in err[0] and f"distrun status {run.id}" in err[0]
