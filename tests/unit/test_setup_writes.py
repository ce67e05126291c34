"""Where setup writes a file the training user owns, in a folder its jobs can write: never through
a temporary folder root hands to that user (copy and template do so where setfacl is missing, and
root removes that folder afterwards, wherever a job's link sent it), never through a link."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# Modules whose action plugin sends a file to the node through a temporary folder.
TRANSFERS = {"copy", "template", "unarchive", "script", "assemble"}


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
