"""Who drives distrun on a cluster with people (distrun_users): DISTRUN_USER, else the login
name, checked against the list before anything connects; their key (DISTRUN_SSH_KEY) or ssh's
defaults, never the admin's login of the inventory; their run theirs (its user, its folder), every
playbook of theirs without become; what cannot run as them yet refused in one line."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from distrun.errors import InventoryError, PlanError
from distrun.inventory import identity
from distrun.inventory.cluster import load_cluster
from distrun.transport import ansible_bridge

from .conftest import distrun_bin
from .plans import plan_for

PUB = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGuvTVt4B5Xdeq6tQ9o2MbFMqwYpQm8FJkqoA6Myd1l5 a@laptop")


def _inventory(people: bool = True) -> str:
    users = (f'    distrun_users: [{{name: alice, uid: 2101, ssh_keys: ["{PUB}"]}}, '
             f'{{name: bob, uid: 2102, ssh_keys: ["{PUB}"]}}]\n    distrun_admins: [bob]\n') if people else ""
    return f"""
all:
  vars:
    ansible_user: root
    ansible_ssh_private_key_file: /admin/id_ed25519
    distrun_shared_fs_mode: sync
    distrun_shared_dir: /srv/shared
{users}  children:
    head: {{hosts: {{n1: {{ansible_host: 10.0.0.1}}}}}}
    workers: {{hosts: {{n1: , n2: {{ansible_host: 10.0.0.2, ansible_user: admin2}}}}}}
"""


def test_a_person_connects_as_themself_with_their_key_and_their_run_is_theirs(write_inventory, monkeypatch, tmp_path):
    key = tmp_path / "id_alice"
    key.write_text("private\n")
    monkeypatch.setenv("DISTRUN_USER", "alice")
    monkeypatch.setenv("DISTRUN_SSH_KEY", str(key))
    c = load_cluster(write_inventory(_inventory()))
    assert c.user == "alice" and c.shared_dir == "/srv/shared/people/alice"
    for node in c.nodes:
        assert node.hostvars["ansible_user"] == "alice", node.name
        assert node.hostvars["ansible_ssh_private_key_file"] == str(key)
        assert "ansible_ssh_user" not in node.hostvars
    # Without DISTRUN_SSH_KEY: ssh's own defaults, never the admin's key of the inventory.
    monkeypatch.delenv("DISTRUN_SSH_KEY")
    c = load_cluster(write_inventory(_inventory()))
    assert all("ansible_ssh_private_key_file" not in n.hostvars for n in c.nodes)
    assert c.person.extravars()["ansible_ssh_private_key_file"] == ""
    # Setup (an admin's) reads the inventory's own login.
    admin = load_cluster(write_inventory(_inventory()), admin=True)
    assert admin.user == "distrun" and admin.head.hostvars["ansible_user"] == "root" and admin.person is None


def test_the_login_name_is_the_person_where_distrun_user_is_unset(write_inventory, monkeypatch):
    monkeypatch.delenv("DISTRUN_USER", raising=False)
    monkeypatch.setattr(identity, "login_name", lambda: "bob")
    assert load_cluster(write_inventory(_inventory())).user == "bob"


@pytest.mark.parametrize(("env", "said"), [({"DISTRUN_USER": "mallory"}, "DISTRUN_USER=mallory is not in distrun_users"),
                                           ({}, "your login name 'carol' (DISTRUN_USER is not set) is not in distrun_users")])
def test_a_name_not_in_the_list_is_refused_in_one_line(write_inventory, monkeypatch, env, said):
    monkeypatch.delenv("DISTRUN_USER", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(identity, "login_name", lambda: "carol")
    inv = write_inventory(_inventory())
    with pytest.raises(InventoryError) as refused:
        load_cluster(inv)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"inventory {inv}: ") and said in line, line
    assert "(alice, bob)" in line and "set DISTRUN_USER" in line


def test_a_missing_key_file_is_refused(write_inventory, monkeypatch, tmp_path):
    monkeypatch.setenv("DISTRUN_USER", "alice")
    monkeypatch.setenv("DISTRUN_SSH_KEY", str(tmp_path / "nope"))
    with pytest.raises(InventoryError, match="DISTRUN_SSH_KEY=.*nope is not a file"):
        load_cluster(write_inventory(_inventory()))


def test_without_people_nothing_changes(write_inventory, monkeypatch):
    monkeypatch.setenv("DISTRUN_USER", "mallory")
    inv = write_inventory(_inventory(people=False))
    c = load_cluster(inv)
    assert c.user == "distrun" and c.shared_dir == "/srv/shared" and c.person is None
    assert c.head.hostvars["ansible_user"] == "root" and c.workers[1].hostvars["ansible_user"] == "admin2"
    assert identity.playbook_vars(inv, "playbooks/run.yml") == {}


@pytest.mark.parametrize("playbook", ["playbooks/run.yml", "playbooks/preflight.yml", "playbooks/stop.yml",
                                      "playbooks/collect.yml", "playbooks/stage.yml"])
def test_every_playbook_of_a_person_runs_as_them_without_become(write_inventory, monkeypatch, tmp_path, playbook):
    """Whatever a run verb passes, the person's login, no become, their user and folder win."""
    monkeypatch.setenv("DISTRUN_USER", "alice")
    monkeypatch.delenv("DISTRUN_SSH_KEY", raising=False)
    inv = write_inventory(_inventory())
    load_cluster(inv)
    seen: dict = {}

    def run(**kwargs):
        seen.update(kwargs)
        return types.SimpleNamespace(rc=0, status="successful", config=types.SimpleNamespace(artifact_dir=str(tmp_path / "a")))

    monkeypatch.setitem(sys.modules, "ansible_runner", types.SimpleNamespace(run=run))
    ansible_bridge.run_playbook(playbook, inv, tmp_path, extravars={"ansible_become": True, "distrun_user": "distrun", "x": 1})
    got = seen["extravars"]
    assert got["ansible_become"] is False and got["ansible_user"] == "alice" and got["ansible_ssh_private_key_file"] == ""
    assert got["preflight_check_ssh_mesh"] is False and got["distrun_user"] == "alice" and got["distrun_shared_dir"] == "/srv/shared/people/alice" and got["x"] == 1
    # Setup is an admin's: the inventory's own login and become.
    assert identity.playbook_vars(inv, "setup.yml") == {}


def test_what_cannot_run_as_the_person_yet_is_refused_in_one_line(write_inventory, monkeypatch):
    monkeypatch.setenv("DISTRUN_USER", "alice")
    c = load_cluster(write_inventory(_inventory()))
    for launcher in ("mpirun", "slurm"):
        with pytest.raises(PlanError) as refused:
            plan_for(c, run_id="r1", launcher=launcher, script="/tmp/x.py")
        assert str(refused.value).startswith(f"--launcher {launcher} on a cluster with people (distrun_users)")
        assert "use --launcher torchrun or --launcher ssh" in str(refused.value)
    with pytest.raises(PlanError, match=r"^--image .* on a cluster with people"):
        plan_for(c, run_id="r1", launcher="torchrun", script="/tmp/x.py", image="docker.io/library/python:3.11")
    for launcher in identity.USABLE_LAUNCHERS:
        plan = plan_for(c, run_id="r1", launcher=launcher, script="/tmp/x.py")
        assert plan.launch.user == "alice" and plan.launch.people
        assert plan.run_dir == "/srv/shared/people/alice/runs/r1"


def test_the_cli_refuses_a_name_not_in_the_list_before_any_connection(write_inventory, cli_env, tmp_path):
    inv = write_inventory(_inventory())
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    env = {**cli_env, "DISTRUN_USER": "mallory"}
    for argv in (["train", "--inventory", str(inv), "--launcher", "torchrun", "--script", str(script)],
                 ["check", "--inventory", str(inv)]):
        done = subprocess.run([distrun_bin(), *argv], env=env, capture_output=True, text=True, timeout=120)
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        assert done.returncode != 0 and len(lines) == 1, (argv, lines)
        assert f"inventory {inv}: DISTRUN_USER=mallory is not in distrun_users" in lines[0], lines

