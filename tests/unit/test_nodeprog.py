"""Role job's node programs as they travel: their shared head (files/nodecommon.py) in front of
each program, one source, and the protocol's names written once for the programs and once for the
runner that reads their answers, held equal here."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distrun import nodeprog

FILES = Path(__file__).resolve().parents[2] / "roles" / "job" / "files"


def head() -> dict:
    """nodecommon.py's names, as a program sees them."""
    ns: dict = {"__name__": "nodecommon"}
    exec(compile((FILES / "nodecommon.py").read_text(), "nodecommon.py", "exec"), ns)  # noqa: S102 - the shipped code
    return ns


def test_the_runner_reads_the_answers_by_the_names_the_programs_write(capsys):
    ns = head()
    assert (ns["LOG_PREFIX"], ns["LAUNCHER_STATES"], ns["TAG"]) == \
        (nodeprog.LOG_PREFIX, nodeprog.LAUNCHER_STATES, nodeprog.RUN_TAG)
    ns["answer"]({"verb": "state", "launcher": ns["LAUNCHER_STATES"][0], "rc": None})
    line = capsys.readouterr().out
    assert line.count("\n") == 1
    said = nodeprog.answer(f"{ns['LOG_PREFIX']}{line}noise\n{line}", "state")
    assert said == {"verb": "state", "launcher": "running", "rc": None}
    # The unit launch.py names is the one node.py reads a run from, and its records are root's folder's.
    unit = ns["unit_name"]({"run": "20260101-000000-train-ab12", "attempt": "3", "host": "n-1.x"})
    match = ns["UNIT"].fullmatch(unit)
    assert match is not None and match.group(1) == "20260101-000000-train-ab12"
    assert ns["record_path"](unit, "exit") == f"/run/distrun/{unit}.exit"


def test_each_name_of_the_head_has_no_second_home_in_a_program():
    """A program that defined a head's name again would silently replace it for itself."""
    shared = {n for n in head() if not n.startswith("__")} - {"annotations", "json", "os", "re", "sys"}
    for program in nodeprog.PROGRAMS:
        tree = ast.parse((FILES / f"{program}.py").read_text())
        defined = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
        defined |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
        assert not defined & shared, f"{program}.py defines {sorted(defined & shared)} again"


@pytest.mark.parametrize("program", nodeprog.PROGRAMS)
def test_each_composed_program_parses_as_python_3_9_and_a_bad_call_is_its_usage(program):
    text = nodeprog.text(program)
    assert text.startswith((FILES / "nodecommon.py").read_text())
    ast.parse(text, feature_version=(3, 9))  # the oldest Python a node may have
    out = subprocess.run([sys.executable, "-I", "-c", text], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(f"{program}.py: usage: {program}.py ") and out.stderr.endswith(" (got nothing)\n")


def test_the_composed_programs_answer_a_trivial_verb(tmp_path):
    scan = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("node"), "scan", json.dumps({"run": "none-such"})],
                          capture_output=True, text=True, timeout=60)
    assert scan.returncode == 0, scan.stderr
    assert json.loads(scan.stdout) == {"verb": "scan", "runs": {}}
    cfg = {"run": "none-such", "host": "h1", "attempt": "0", "user": "nobody", "script": "launch-h1.sh",
           "dir": str(tmp_path / "missing"), "exit_file": "exitcode-h1", "pid_file": "launcher-h1.pid"}
    state = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("attempt"), "state", json.dumps(cfg)],
                           capture_output=True, text=True, timeout=60)
    assert state.returncode == 0, state.stderr
    assert nodeprog.answer(state.stdout, "state") == {"verb": "state", "dir": False, "launcher": "none", "rc": None,
                                                      "procs": 0, "started": []}
    bad = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("launch"), "launch", json.dumps({**cfg, "attempt": "x"})],
                         capture_output=True, text=True, timeout=60)
    assert (bad.returncode, bad.stdout, bad.stderr) == (2, "", "launch.py: launch: attempt 'x' is not a number\n")


def test_the_stop_task_sends_the_same_source_as_the_runner():
    """Role job's stop step composes the program itself (a raw command): rendered as Ansible
    renders it (its file lookup strips a file's last newline), it runs the runner's source."""
    from jinja2 import Environment

    task = yaml.safe_load((FILES.parent / "tasks" / "stop.yml").read_text())[1]
    jinja = Environment()
    jinja.filters.update(quote=shlex.quote, to_json=json.dumps)
    command = jinja.from_string(task["ansible.builtin.raw"]).render(
        ansible_facts={"python": {"executable": "/usr/bin/python3"}}, job_run_id="r1", job_run_dir="/srv/runs/r1",
        job_stop_grace=3, job_user="train", lookup=lambda kind, name: (FILES / name).read_text().rstrip())
    argv = shlex.split(command)
    assert argv[:3] == ["/usr/bin/python3", "-I", "-c"] and argv[4] == "stop"
    assert argv[3] == nodeprog.text("node").rstrip()
