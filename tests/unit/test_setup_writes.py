"""Where setup writes a file the training user owns, in a folder its jobs can write: never through
a temporary folder root hands to that user (copy and template do so where setfacl is missing, and
root removes that folder afterwards, wherever a job's link sent it), never through a link."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# Modules whose action plugin sends a file to the node through a temporary folder.
TRANSFERS = {"copy", "template", "unarchive", "script", "assemble", "uri"}


def _tasks(items, inherited: dict):
    for task in items or []:
        if not isinstance(task, dict):
            continue
        scope = {**inherited, **{k: task[k] for k in ("become", "become_user") if k in task}}
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key), scope)
        yield task, scope


def test_no_file_reaches_the_training_user_through_a_temporary_folder_of_roots():
    found = []
    for path in sorted((REPO / "roles").glob("*/tasks/*.yml")):
        for task, scope in _tasks(yaml.safe_load(path.read_text()), {}):
            modules = {k.rsplit(".", 1)[-1] for k in task if k.startswith("ansible.builtin.") or k in TRANSFERS}
            if scope.get("become_user") and modules & TRANSFERS:
                found.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert found == []


PLAY = """
- name: Run one module as another user
  hosts: localhost
  connection: local
  gather_facts: false
  become: true
  tasks:
    - name: Ask who runs the module
      ansible.builtin.command: {argv: [id, -un]}
      become_user: nobody
      changed_when: false
"""


def test_a_module_run_as_the_training_user_never_passes_through_a_temporary_folder_of_roots(tmp_path):
    """Without pipelining, a local connection (a one-node inventory) put each become_user module in
    a folder root chowned to that user and then removed with 'rm -rf DIR/': a job that swapped the
    folder for a link had root empty the folder it pointed to. The project's ansible.cfg sends
    every connection's modules on stdin instead."""
    if os.geteuid() != 0 or not shutil.which("sudo"):
        raise AssertionError("this test runs a module as 'nobody' through sudo: run it as root with sudo installed")
    (tmp_path / "play.yml").write_text(PLAY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "local")}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-vvv", "-e", "ansible_python_interpreter=/usr/bin/python3",
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert '"stdout": "nobody"' in done.stdout
    assert "ansible-tmp-" not in done.stdout + done.stderr, "a module went through a temporary folder"


def _module():
    spec = importlib.util.spec_from_file_location(
        "distrun_write_file", REPO / "roles" / "distrun" / "library" / "distrun_write_file.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_planted_link_at_the_destination_is_replaced_never_written_through(tmp_path):
    m = _module()
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    dest = tmp_path / "shared" / "hostfile"
    dest.parent.mkdir()
    dest.symlink_to(victim)
    assert m.current(str(dest)) is None  # a link is never read as the file either
    m.write(str(dest), b"node1 slots=2\n", 0o644)
    assert not dest.is_symlink() and dest.read_text() == "node1 slots=2\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644 and victim.read_text() == "root's\n"
    assert m.current(str(dest)) == (b"node1 slots=2\n", 0o644)  # converged: the module reports no change
    assert [p.name for p in dest.parent.iterdir()] == ["hostfile"]  # no temporary file left behind
