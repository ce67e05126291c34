"""Where setup writes a file the training user owns, in a folder its jobs can write: never through
a temporary folder root hands to that user (copy and template do so where setfacl is missing, and
root removes that folder afterwards, wherever a job's link sent it), never through a link."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.modules import load_file

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
    return load_file(REPO / "roles" / "distrun" / "library" / "distrun_user_file.py")


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


# The task files of the roles setup and check run. A module run as the training user (become_user)
# is a process of that user's uid: any job of that user can trace it, or feed it through a file it
# wrote (~/.local/.../usercustomize.py runs in every Python of that user), and make it answer
# anything, ansible_facts included, which Ansible merges into the host's facts and the fact cache.
SETUP_AND_CHECK = ("base", "distrun", "hostfile", "mpi_env", "preflight", "shared_fs", "slurm", "ssh_mesh")
# Role job's steps of a run, as the run's own user: what they answer is that run's own business
# (they decide nothing root keeps, and a run's playbooks leave no facts in the cache setup reads:
# distrun.transport.ansible_bridge.KEEPS_FACTS). Each is named, so a new one is a decision.
RUN_STEPS_AS_THE_USER = {
    ("stage_steps.yml", "Partition the graph on the head node"),
    ("stage_steps.yml", "Pull this node's parts of the partition from the head node"),
    ("stage_steps.yml", "Pull the run's checkpoints from the head node"),
    ("stage_steps.yml", "Pull the workdir from the head node to {{ inventory_hostname }}"),
    ("stage_steps.yml", "Compile Jittor's core once per node and Jittor version, here {{ inventory_hostname }}"),
    ("collect.yml", "Check the run directory is not a link, on {{ inventory_hostname }}"),
    ("collect.yml", "Find the run's files on {{ inventory_hostname }}"),
    ("collect.yml", "Fetch the run's files from {{ inventory_hostname }}"),
    ("stop.yml", "Remove the run's containers on {{ inventory_hostname }}"),
}


def test_no_module_of_setup_or_check_runs_as_the_training_user():
    found = []
    for role in SETUP_AND_CHECK:
        for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
            for task, scope in _tasks(yaml.safe_load(path.read_text()), {}):
                if scope.get("become_user") and scope.get("become_user") != "root":
                    found.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert found == []
    job = set()
    for path in sorted((REPO / "roles" / "job" / "tasks").glob("*.yml")):
        for task, scope in _tasks(yaml.safe_load(path.read_text()), {}):
            if scope.get("become_user"):
                job.add((path.name, task.get("name")))
    assert job <= RUN_STEPS_AS_THE_USER, job - RUN_STEPS_AS_THE_USER


def _fsuser():
    return load_file(REPO / "roles" / "distrun" / "module_utils" / "distrun_fsuser.py", "fsuser")


def _ids() -> dict:
    """This process's uids (real, effective, saved, filesystem) as the kernel has them."""
    for line in open("/proc/self/status"):
        if line.startswith("Uid:"):
            return dict(zip(("real", "effective", "saved", "fs"), map(int, line.split()[1:5]), strict=True))
    return {}


@pytest.fixture
def request_cleanup():
    folders: list[Path] = []
    yield folders
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def test_root_writes_a_users_file_with_that_users_rights_and_stays_root(request_cleanup):
    """The primitive: a forked root process that took only the user's filesystem identity. The
    kernel checks its paths as that user's (a link to root's file is replaced, a root folder is not
    writable), what it makes is the user's, and it stays uid 0 (no process of that user's: nothing
    a job of that user could trace or signal)."""
    if os.geteuid() != 0:
        raise AssertionError("this test switches a root process's filesystem identity: run it as root")
    import pwd
    import tempfile

    nobody = pwd.getpwnam("nobody")
    fsuser, m = _fsuser(), _module()
    tmp_path = Path(tempfile.mkdtemp(prefix="distrun-fsuser-"))  # pytest's folders are root's 0700: nobody could not enter
    request_cleanup.append(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, nobody.pw_uid, nobody.pw_gid)
    tmp_path.chmod(0o755)
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o644)
    (shared / "hostfile").symlink_to(victim)

    def write_and_say(path: str) -> dict:
        m.write(path, b"node1 slots=2\n", 0o644)
        return _ids()

    ids = fsuser.as_user_fs("nobody", write_and_say, str(shared / "hostfile"))
    assert ids == {"real": 0, "effective": 0, "saved": 0, "fs": nobody.pw_uid}
    assert victim.read_text() == "root's\n" and (shared / "hostfile").read_text() == "node1 slots=2\n"
    assert (shared / "hostfile").stat().st_uid == nobody.pw_uid and _ids()["fs"] == 0  # the caller unchanged
    try:
        fsuser.as_user_fs("nobody", m.write, str(tmp_path / "root-only"), b"x", 0o644)
    except fsuser.FsUserError as exc:
        assert "Permission denied" in str(exc)
    else:
        raise AssertionError("a root folder was writable with the user's rights")
    assert not (tmp_path / "root-only").exists()
