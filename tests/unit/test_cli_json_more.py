"""The JSON of 'check --json', 'status --json' and 'train --dry-run --json' against the published
schema (docs/guide/distrun-json.schema.json), and 'status' of a run no node answers: the state
'unreachable' in its JSON and exit 6."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.errors import ExitCode
from distrun.preflight.report import report_json
from distrun.run import reconcile
from distrun.run.liveness import ClusterState, HostState
from distrun.run.reconcile import RunView
from distrun.store.runs import new_run
from distrun.transport.nodeprog import LauncherState

from .conftest import REPO
from .test_check import NODES, healthy, probe, report

SCHEMA = json.loads((REPO / "docs" / "guide" / "distrun-json.schema.json").read_text())
TWO = str(REPO / "tests" / "golden" / "inventories" / "two-nodes")


def valid(instance: Any, definition: str) -> None:
    jsonschema.validate(instance, {**SCHEMA, "$ref": f"#/$defs/{definition}"})


def test_check_json_follows_the_schema_healthy_and_failing():
    hosts = {h: {"state": "ok", "error": ""} for h in NODES}
    valid(report_json(report(healthy()), hosts, 4.2), "check")
    probes = healthy()
    probes["node3"] = probe("node3", mpi4py={"ok": False, "detail": "ImportError: libmpi.so.40"})
    out = report_json(report(probes), hosts, 4.2)
    valid(out, "check")
    assert out["ok"] is False


def test_dry_run_json_follows_the_schema(private_state, monkeypatch):
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, ["train", "-i", TWO, "--dry-run", "--json"], prog_name="distrun")
    assert result.exit_code == 0, result.output
    valid(json.loads(result.stdout), "dry_run")


def _status(monkeypatch, run, state: ClusterState) -> tuple[int, dict[str, Any]]:
    monkeypatch.setattr(reconcile, "view", lambda r, ask_nodes=True: RunView(
        r, state.state if state.state != "failed" else "failed", state.reason, False, state))
    result = CliRunner().invoke(main, ["status", run.id, "--json"], prog_name="distrun")
    return result.exit_code, json.loads(result.stdout)


def test_status_json_follows_the_schema_and_an_unreachable_run_exits_6(private_state, tmp_path, monkeypatch):
    run = new_run("train", tmp_path / "hosts.ini")
    running = ClusterState("running", hosts={"w1": HostState("w1", launcher=LauncherState.RUNNING, procs=3, started=(0, 1))},
                           world_size=2)
    code, out = _status(monkeypatch, run, running)
    assert code == 0 and out["state"] == "running"
    valid(out, "state")
    away = ClusterState("unreachable", reason="no launch host answers (w1: ssh: connect timed out)",
                        hosts={"w1": HostState("w1", reached=False, error="ssh: connect timed out")}, world_size=2)
    code, out = _status(monkeypatch, run, away)
    assert code == ExitCode.CONTACT_LOST and out["state"] == "unreachable"
    valid(out, "state")
