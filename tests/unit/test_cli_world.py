"""Invocations as the world makes them (cli_cases_world.py): valid inventories admins write are
read; the environment (a locale that is not UTF-8, an ASCII stdout, COLUMNS=0 on a terminal, a
removed working folder, tab completion) and a closed or full stdout through the real executable,
each with the exit code cli.md's table gives; a train whose reader goes away ends its record as
its run ended; the inventory cache sees a file behind a symlinked group_vars/all."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.inventory import cluster as inventory

from .cli_cases_world import ACCEPTED, PROCESS
from .conftest import REPO, distrun_bin
from .sample_runs import make_sample_runs

SCHEMA = json.loads((REPO / "docs" / "guide" / "distrun-json.schema.json").read_text())


def test_valid_inventories_and_arguments_are_read(tmp_path, private_state, monkeypatch):
    monkeypatch.chdir(REPO)
    problems = []
    for i, (label, argv, env, out) in enumerate(ACCEPTED):
        work = tmp_path / f"case{i}"
        (work / "home").mkdir(parents=True)
        full = {"DISTRUN_INVENTORY": None, "COLUMNS": "80",
                **{k: (v.replace("HOMEDIR", str(work / "home")) if v else v) for k, v in env.items()}}
        result = CliRunner().invoke(main, argv(work), env=full, prog_name="distrun")
        missing = [f for f in out if f not in result.stdout]
        if result.exit_code != 0 or missing or result.exception and not isinstance(result.exception, SystemExit):
            problems.append(f"{label}: exit {result.exit_code}, missing {missing}; stderr {result.stderr.strip()!r}")
    assert len(ACCEPTED) >= 12
    assert not problems, "\n".join(problems)


def _run(argv: list[str], env: dict[str, str], kind: str, cwd: Path, tmp: Path) -> tuple[int, str, str]:
    """distrun with ``argv`` and stdout as ``kind`` says (see cli_cases_world.PROCESS)."""
    if argv and argv[0] == "__complete__":
        env = {**env, "_DISTRUN_COMPLETE": "bash_complete", "COMP_WORDS": " ".join(["distrun", *argv[1:]]),
               "COMP_CWORD": str(len(argv) - 1)}
        argv = []
    command = [distrun_bin(), *argv]
    if kind == "tty":
        leader, follower = pty.openpty()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env, cwd=cwd)
        os.close(follower)
        chunks = []
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            try:
                chunk = os.read(leader, 65536) if ready else b""
            except OSError:
                chunk = b""
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        text = b"".join(chunks).decode("utf-8", "replace")
        return proc.wait(timeout=60), text, text
    if kind == "gone-cwd":
        gone = tmp / "gone"
        gone.mkdir()
        # The shell enters the folder, which is then removed under it: distrun starts there.
        done = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone), *command],
                              capture_output=True, env=env, timeout=120)
        return done.returncode, done.stdout.decode(), done.stderr.decode()
    if kind == "closed":
        read_end, write_end = os.pipe()
        os.close(read_end)
        done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, env=env, cwd=cwd, timeout=180)
        os.close(write_end)
        return done.returncode, "", done.stderr.decode()
    if kind == "full":
        with open("/dev/full", "w") as full:
            done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, env=env, cwd=cwd, timeout=180)
        return done.returncode, "", done.stderr.decode()
    done = subprocess.run(command, capture_output=True, env=env, cwd=cwd, timeout=180)
    return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")


@pytest.mark.parametrize("case", PROCESS, ids=[c[0] for c in PROCESS])
def test_the_environment_and_stdout_through_the_real_executable(case, cli_env, private_state, tmp_path):
    label, argv, env, kind, code, err_has, out_has = case
    make_sample_runs(private_state)
    full = {k: v for k, v in cli_env.items() if k not in ("DISTRUN_INVENTORY", "LC_ALL", "LANG", "LC_CTYPE", "COLUMNS")}
    full.update({"LANG": "C.UTF-8", **env})
    got, out, err = _run(argv(tmp_path), full, kind, REPO, tmp_path)
    assert "Traceback" not in out + err, f"{label}: a traceback\n{err}"
    assert got == code, f"{label}: exit {got}, wanted {code}; stderr {err!r}"
    assert all(f in err for f in err_has), f"{label}: stderr {err!r} lacks {err_has}"
    assert all(f in out for f in out_has), f"{label}: stdout {out[:2000]!r} lacks {out_has}"
    if kind not in ("tty",) and code != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) <= 1 and all(ln.startswith("distrun: error: ") for ln in lines), f"{label}: stderr {err!r}"
    if "--json" in argv(tmp_path) and kind == "pipe":
        json.loads(out)


def test_a_dry_run_json_the_plan_refuses_follows_the_schema(private_state):
    result = CliRunner().invoke(main, ["train", "-i", "tests/golden/inventories/two-nodes", "--dry-run", "--json", "--np", "9"],
                                env={"DISTRUN_INVENTORY": None}, prog_name="distrun")
    obj = json.loads(result.stdout)
    jsonschema.validate(obj, {**SCHEMA, "$ref": "#/$defs/dry_run"})
    assert result.exit_code == obj["exit_code"] == 2 and obj["plan"] is None
    assert result.stderr.strip() == f"distrun: error: {obj['error']}"


DRIVER = r"""
import json, sys, time
from distrun.cli import main as cli_main
from distrun.run import train as train_module
from distrun.run.diagnosis import RunSummary
from distrun.store.runs import new_run

def run_job(request, listener, early=None, t0=None):
    if early is not None:
        early.discard()
    run = new_run("train", request.inventory)
    listener.started(run)
    time.sleep(1)  # head has read its byte and gone: every line from here meets a closed pipe
    for epoch in range(1, 200):  # far more than a pipe holds: the reader is gone long before the end
        listener.line("DISTRUN_EPOCH " + json.dumps({"epoch": epoch, "epochs": 199, "loss": 0.5, "train_acc": 0.9,
                                                     "val_acc": 0.8, "epoch_time_s": 0.1}) + " " + "x" * 400)
    run.finish(0, "ok test_acc=0.8125")
    listener.finished(RunSummary(run.id, 0, 0, 1.0, 3, run.dir / "nodes", 3, {"test_acc": 0.8125}))
    return 0

train_module.run_job = run_job
cli_main.run()
"""


def test_a_train_whose_reader_goes_away_ends_its_record_as_the_run_ended(cli_env, private_state, tmp_path):
    """distrun train ... | head -c1: the run goes on to its end, its record says succeeded (never
    running, which a later 'distrun runs' would call lost), and distrun exits 7."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {k: v for k, v in cli_env.items() if k != "DISTRUN_INVENTORY"}
    head = subprocess.Popen(["head", "-c1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    proc = subprocess.run([sys.executable, str(driver), "train", "-i", "tests/golden/inventories/two-nodes"],
                          stdout=head.stdin, stderr=subprocess.PIPE, env=env, cwd=REPO, timeout=120)
    assert head.stdin is not None
    head.stdin.close()
    head.wait()
    assert proc.returncode == 7, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr and proc.stderr.strip() == b""
    (record,) = [json.loads((d / "meta.json").read_text()) for d in (private_state / "runs").iterdir()]
    assert record["status"] == "succeeded" and record["rc"] == 0 and record["controller"] is None
    listing = subprocess.run([distrun_bin(), "runs", "--json"], capture_output=True, env=env, cwd=REPO, timeout=60)
    assert json.loads(listing.stdout)["runs"][0]["status"] == "succeeded"


def test_the_inventory_cache_sees_a_file_behind_a_symlinked_group_vars_folder(tmp_path, private_state):
    shared = tmp_path / "site-vars"
    shared.mkdir()
    (shared / "main.yml").write_text("slots: 1\n")
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text("[head]\nw1 ansible_host=192.0.2.11\n[workers]\nw1\nw2 ansible_host=192.0.2.12\n")
    (inv / "group_vars" / "all").symlink_to(shared)
    assert inventory.load_cluster(inv).total_slots == 2
    time.sleep(0.01)
    (shared / "main.yml").write_text("slots: 3\n")  # the world size changes behind the link
    assert inventory.load_cluster(inv).total_slots == 6


def test_check_prints_words_where_its_marks_cannot_be_shown(monkeypatch):
    import io

    from distrun.ui import console as ui
    from distrun.ui.check import print_check_report

    buf = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", buf)
    ui.configure()
    print_check_report({"ok": False, "hosts": {"w1": {}}, "elapsed_s": 1.0,
                           "checks": {"reach": {"w1": {"ok": True, "detail": "", "fix": ""}},
                                      "env": {"w1": {"ok": False, "detail": "no python", "fix": "run setup"}}}})
    buf.flush()
    text = buf.buffer.getvalue().decode("ascii")
    ui.configure()
    assert "reach  ok" in text and "env    FAIL" in text and "FAIL env on w1: no python" in text


def test_check_never_calls_a_node_it_did_not_contact_reached(cli_env, tmp_path):
    """A node the play failed on before any probe answered (a connection plugin that does not
    exist, as a mistyped ansible_connection gives) is not 'reached over ssh', in --json neither."""
    inv = tmp_path / "hosts.ini"
    inv.write_text("[head]\nw1 ansible_host=192.0.2.11 ansible_connection=sshh\n[workers]\nw1\n")
    env = {k: v for k, v in cli_env.items() if k != "DISTRUN_INVENTORY"}
    proc = subprocess.run([distrun_bin(), "check", "-i", str(inv), "--json"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["ok"] is False, proc.stderr
    assert "w1" not in report["checks"].get("reach", {}), report["checks"]
    assert "connection plugin 'sshh' was not found" in report["checks"]["preflight"]["w1"]["detail"]
