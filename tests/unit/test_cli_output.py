"""What distrun prints when stdout is not a terminal (a pipe, a file, a CI log): plain lines,
never wrapped or cut, whatever COLUMNS says. Each view is compared with its golden file at every
width from 40 to 200 columns: `runs`, `show`, `train --dry-run` and the end of a run (progress,
the DISTRUN_RESULT line, the summary, a failed playbook's PLAY RECAP).

DISTRUN_UPDATE_GOLDEN=1 rewrites the golden files from the output at 80 columns.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.inventory import read as inventory_read
from distrun.run.diagnosis import RunSummary
from distrun.store.runs import Run, RunMeta
from distrun.transport.playbook_events import HostProgress, PlaybookResult
from distrun.ui import console as ui
from distrun.ui.run import TrainView

from .conftest import REPO, as_golden, distrun_bin
from .sample_runs import HOSTS, TRAIN_FAILED, TRAIN_OK, make_sample_runs

GOLDEN = REPO / "tests" / "golden"
WIDTHS = range(40, 201)
TWO = "tests/golden/inventories/two-nodes"


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _golden(name: str, text: str) -> str:
    path = GOLDEN / name
    if os.environ.get("DISTRUN_UPDATE_GOLDEN"):
        path.write_text(text)
    return path.read_text()


def _same_at_every_width(name: str, produce: Callable[[int], str]) -> None:
    golden = _golden(name, produce(80))
    longest = max(len(line) for line in golden.splitlines())
    assert longest > 120, f"{name}: no line long enough to be wrapped at 40 or cut at 80 columns"
    assert "…" not in golden
    for width in WIDTHS:
        got = produce(width)
        assert got == golden, f"{name} differs at COLUMNS={width}"


def _cli(args: list[str], width: int, home: Path) -> str:
    result = CliRunner().invoke(main, args, env={"COLUMNS": str(width), "DISTRUN_HOME": str(home), "FORCE_COLOR": None,
                                                 "DISTRUN_INVENTORY": None}, prog_name="distrun")
    assert result.exit_code == 0, result.stderr
    return as_golden(result.stdout.replace(str(home), "$DISTRUN_HOME"))


def test_runs_is_never_wrapped_or_cut(private_state, utc):
    make_sample_runs(private_state)
    _same_at_every_width("runs-plain.txt", lambda w: _cli(["runs"], w, private_state))


def test_show_is_never_wrapped_or_cut(private_state, utc):
    make_sample_runs(private_state)
    _same_at_every_width("show-plain.txt", lambda w: _cli(["show", TRAIN_OK], w, private_state)
                         + _cli(["show", TRAIN_FAILED[-4:]], w, private_state))


def test_dry_run_is_never_wrapped_or_cut(private_state, monkeypatch):
    # ansible-inventory is read once; each width then renders the same cluster.
    data = inventory_read.read_inventory_json(REPO / TWO)
    monkeypatch.setattr(inventory_read, "read_inventory_json", lambda path: data)
    monkeypatch.chdir(REPO)
    args = ["train", "-i", TWO, "--dry-run", "--epochs", "5", "--env", "NCCL_DEBUG=INFO"]
    # The same golden file as the dry run at 200 columns through the real executable (test_cli.py).
    _same_at_every_width("dry-run-two-nodes.txt", lambda w: _cli(args, w, private_state))


def _run_end(width: int, home: Path) -> str:
    """What a run prints from its first epoch to its end, and a failed playbook's summary."""
    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            ui.configure()
            view = TrainView()
            run = Run(home / "runs" / TRAIN_OK, RunMeta(TRAIN_OK, "train", "prod", 0.0))
            view.started(run)
            for e in (1, 2):
                view.line("DISTRUN_EPOCH " + json.dumps({"epoch": e, "epochs": 200, "loss": 1.9 + e / 100, "train_acc": 0.3,
                                                         "val_acc": 0.29, "epoch_time_s": 0.4762}))
            view.line("rank 0: " + "x" * 150)
            view.line('DISTRUN_RESULT {"test_acc": 0.812, "val_acc": 0.79, "final_loss": 0.4123, "epochs": 200, '
                      '"epoch_time_s": 0.4762, "world_size": 4, "partition": "/srv/distrun/partitions/cora-4parts"}')
            logs = home / "runs" / TRAIN_OK / "nodes"
            view.finished(RunSummary(TRAIN_OK, 0, 0, 118.68, 4, logs, 4, {"test_acc": 0.812}))
            view.finished(RunSummary(TRAIN_FAILED, 1, 1, 42.0, 4, logs, 3, None,
                                     f"; first failing rank 3 on {HOSTS[1]}",
                                     ["a Python package is missing in the env on a node: add it to mpi_env_packages and "
                                      "run 'distrun setup'"]))
            hosts = {h: HostProgress(h, ok=12, changed=1, failed=1, last_error="[stage] unpack the run bundle: No space left "
                                     "on device: /srv/distrun/runs/x/bundle.tar.gz") for h in HOSTS}
            view.playbook_failed(PlaybookResult("playbooks/run.yml", 2, "failed", hosts, home), 21.4)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
        ui.configure()
    return out.getvalue().replace(str(home), "$DISTRUN_HOME")


def test_end_of_a_run_is_never_wrapped_or_cut(private_state):
    _same_at_every_width("run-end-plain.txt", lambda w: _run_end(w, private_state))
    text = _run_end(40, private_state)
    result = [ln for ln in text.splitlines() if ln.startswith("DISTRUN_RESULT ")]
    assert len(result) == 1 and json.loads(result[0].split(" ", 1)[1])["test_acc"] == 0.812
    assert any(ln.startswith("PLAY RECAP playbooks/run.yml: hosts=2 ") and ln.endswith(" rc=2") for ln in text.splitlines())
    assert "[stage] unpack the run bundle" in text  # brackets from a node are text, not markup


@pytest.mark.parametrize("width", ["40", "200"])
def test_a_real_pipe_gets_the_same_lines(cli_env, private_state, utc, width):
    make_sample_runs(private_state)
    env = {**cli_env, "COLUMNS": width, "TZ": "UTC"}
    env.pop("FORCE_COLOR", None)
    for args, golden in ((["runs"], "runs-plain.txt"), (["train", "-i", TWO, "--dry-run", "--epochs", "5", "--env", "NCCL_DEBUG=INFO"],
                                                         "dry-run-two-nodes.txt")):
        proc = subprocess.run([distrun_bin(), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert as_golden(proc.stdout.replace(str(private_state), "$DISTRUN_HOME")) == (GOLDEN / golden).read_text()
