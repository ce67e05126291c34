"""The CLI as a user meets it: exit codes, one-line errors, stable dry-run output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from distrun.transport import nodeprog

from .conftest import REPO, as_golden, distrun_bin

GOLDEN = REPO / "tests" / "golden"


def run(args: list[str], env: dict, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([distrun_bin(), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_help_lists_every_verb(cli_env):
    out = run(["--help"], cli_env).stdout
    for verb in ("setup", "check", "partition", "train", "logs", "runs", "hostfile", "stop"):
        assert f"  {verb} " in out


def test_dry_run_is_stable_and_matches_the_golden_file(cli_env):
    args = ["train", "-i", "tests/golden/inventories/two-nodes", "--dry-run", "--epochs", "5",
            "--env", "NCCL_DEBUG=INFO"]
    first = run(args, cli_env)
    second = run(args, cli_env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    golden = GOLDEN / "dry-run-two-nodes.txt"
    shown = as_golden(first.stdout)
    assert nodeprog.installed("relay") in first.stdout
    if os.environ.get("DISTRUN_UPDATE_GOLDEN"):
        golden.write_text(shown)
    assert shown == golden.read_text()


def test_dry_run_touches_no_node_and_records_no_run(cli_env, private_state):
    # The inventory points at an address nothing listens on: a dry run must not care.
    result = run(["train", "-i", "tests/golden/inventories/two-nodes", "--dry-run"], cli_env)
    assert result.returncode == 0
    assert not (private_state / "runs").exists() or not any((private_state / "runs").iterdir())


def test_hostfile_verb_prints_head_first(cli_env):
    result = run(["hostfile", "-i", "tests/golden/inventories/two-nodes"], cli_env)
    assert result.returncode == 0
    assert result.stdout.splitlines()[1:] == ["w1 slots=2", "w2 slots=1"]
