"""The CLI as a user meets it: exit codes, one-line errors, stable dry-run output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from distrun import paths

from .conftest import REPO, distrun_bin

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
    if os.environ.get("DISTRUN_UPDATE_GOLDEN"):
        golden.write_text(first.stdout)
    assert first.stdout == golden.read_text()


def test_dry_run_touches_no_node_and_records_no_run(cli_env, private_state):
    # The inventory points at an address nothing listens on: a dry run must not care.
    result = run(["train", "-i", "tests/golden/inventories/two-nodes", "--dry-run"], cli_env)
    assert result.returncode == 0
    assert not (private_state / "runs").exists() or not any((private_state / "runs").iterdir())


def test_hostfile_verb_prints_head_first(cli_env):
    result = run(["hostfile", "-i", "tests/golden/inventories/two-nodes"], cli_env)
    assert result.returncode == 0
    assert result.stdout.splitlines()[1:] == ["w1 slots=2", "w2 slots=1"]


def _bad_inventory(tmp: Path, text: str) -> str:
    p = tmp / "bad.ini"
    p.write_text(text)
    return str(p)


def _gpu_inventory(tmp: Path) -> str:
    """g2 has 4 GPUs in the fact cache (cli_env's DISTRUN_HOME is tmp/state) but slots=2."""
    inventory = _bad_inventory(tmp, "[head]\ng1\n[workers]\ng1\ng2 slots=2\n")
    saved = os.environ.get("DISTRUN_HOME")
    os.environ["DISTRUN_HOME"] = str(tmp / "state")
    try:
        facts = paths.fact_cache_dir(Path(inventory))  # this inventory's own fact folder
    finally:
        if saved is None:
            os.environ.pop("DISTRUN_HOME")
        else:
            os.environ["DISTRUN_HOME"] = saved
    (facts / "g2").write_text('{"ansible_local": {"distrun": {"gpus": 4}}}')
    return inventory


# (label, argv builder, expected fragment of the one-line error)
BAD_INPUTS = [
    ("unknown inventory name", lambda t: ["train", "-i", "nosuch", "--dry-run"], "--inventory 'nosuch': no such inventory (known: "),
    ("malformed inventory", lambda t: ["train", "-i", _bad_inventory(t, "[head\nx"), "--dry-run"], "Ansible cannot parse it"),
    ("missing workers group", lambda t: ["train", "-i", _bad_inventory(t, "[head]\na\n[gpus]\na\n"), "--dry-run"], "no host in group 'workers'"),
    ("zero slots", lambda t: ["train", "-i", _bad_inventory(t, "[head]\na\n[workers]\na slots=0\n"), "--dry-run"], "host a has slots=0"),
    ("world size larger than slots", lambda t: ["train", "-i", "tests/golden/inventories/two-nodes", "--np", "9", "--dry-run"], "--np 9 is more than the 3 slots"),
    ("script that does not exist", lambda t: ["train", "-i", "tests/golden/inventories/two-nodes", "--script", str(t / "nope.py"), "--dry-run"], "nope.py: no such file"),
    ("bad --env", lambda t: ["train", "-i", "tests/golden/inventories/two-nodes", "--env", "NOEQUALS", "--dry-run"], "--env 'NOEQUALS': write it as KEY=VALUE"),
    ("gpu/slot mismatch", lambda t: ["train", "-i", _gpu_inventory(t), "--dry-run"],
     "g2 has slots=2 but 4 GPU(s) detected; set slots=4 for g2 in "),
    ("unknown run for logs", lambda t: ["logs", "20990101-000000-train-ffff"], "not found"),
]


@pytest.mark.parametrize("label,argv,expected", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gives_one_clear_line_and_non_zero_exit(cli_env, tmp_path, label, argv, expected):
    result = run(argv(tmp_path), cli_env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("distrun: error: ")
    assert expected in lines[0]
