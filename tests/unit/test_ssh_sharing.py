"""distrun's own ssh sessions ride on the master connections Ansible keeps open: both name the
socket alike (ssh's %C in one folder), only masters opened on purpose persist, and a session on
a master notices a lost node as fast as a session of its own would. ``ssh -G`` prints the options
ssh would use, so these are checked as ssh reads them, without a node."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from distrun import paths
from distrun.inventory.cluster import Node
from distrun.transport.ansible_bridge import ansible_env
from distrun.transport.remote import KEEPALIVE_COUNT, KEEPALIVE_S, shell_argv

REPO = Path(__file__).resolve().parents[2]
# The test cluster's inventory asks for masters as well, as a site's may.
COMMON = "-o UserKnownHostsFile=/tmp/kh -o StrictHostKeyChecking=yes -o ControlMaster=auto -o ControlPersist=60s"

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client (ssh -G)")


def node(**hostvars: str) -> Node:
    return Node(name="node2", address="10.0.0.12", slots=1, slots_source="inventory", gpus=0, is_head=False,
                is_worker=True, hostvars={"ansible_user": "root", **hostvars})


def resolved(argv: list[str]) -> dict[str, str]:
    """What ssh would use for this argv, by option name (lowercase), as ``ssh -G`` prints it."""
    i = argv.index("--")
    out = subprocess.run(["ssh", "-G", *argv[1:i], argv[i + 1]], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def ansible_ssh_argv(target: str, common: str) -> list[str]:
    """The options Ansible's ssh connection puts in front of the inventory's, from ansible.cfg."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "ansible.cfg")
    section = cfg["ssh_connection"]
    control_path = section["control_path"].replace("%(directory)s", str(paths.ssh_control_dir())).replace("%%", "%")
    return ["ssh", *shlex.split(section["ssh_args"]), "-o", f"ControlPath={control_path}", *shlex.split(common),
            "-o", "User=root", "--", target.split("@")[-1], "true"]


def test_a_session_uses_ansibles_master_socket_and_never_becomes_a_master(monkeypatch, tmp_path):
    monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(tmp_path / "cp"))
    mine = resolved(shell_argv(node(ansible_ssh_common_args=COMMON), "true"))
    ansible = resolved(ansible_ssh_argv("root@10.0.0.12", COMMON))
    assert mine["controlpath"] == ansible["controlpath"]
    assert mine["controlpath"].startswith(str(tmp_path / "cp") + "/")
    # The inventory's ControlMaster=auto does not make a follower a master: ssh keeps the first value.
    assert mine["controlmaster"] == "false" and ansible["controlmaster"] == "auto"
    # Another node, another socket.
    other = resolved(shell_argv(Node(name="node3", address="10.0.0.13", slots=1, slots_source="inventory", gpus=0,
                                     is_head=False, is_worker=True, hostvars={"ansible_user": "root"}), "true"))
    assert other["controlpath"] != mine["controlpath"]


def test_a_master_keeps_the_followers_keepalives(monkeypatch, tmp_path):
    """A lost node ends the sessions on its master within KEEPALIVE_S x KEEPALIVE_COUNT seconds,
    whichever side opened the master: distrun (before the claim) or Ansible (ansible.cfg)."""
    monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(tmp_path / "cp"))
    for argv in (shell_argv(node(), "true", master=True), ansible_ssh_argv("root@10.0.0.12", "")):
        opts = resolved(argv)
        assert (opts["serveraliveinterval"], opts["serveralivecountmax"]) == (str(KEEPALIVE_S), str(KEEPALIVE_COUNT))
        assert opts["controlmaster"] == "auto" and opts["controlpersist"] == "60"


def test_an_inventory_that_names_its_own_socket_keeps_it(monkeypatch, tmp_path):
    monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(tmp_path / "cp"))
    for own in ("-o ControlPath=/tmp/site-%r@%h", "-S /tmp/site-%r@%h"):
        opts = resolved(shell_argv(node(ansible_ssh_common_args=own), "true"))
        assert opts["controlpath"] == "/tmp/site-root@10.0.0.12", own


def test_ansible_gets_the_folder_distrun_looks_in(monkeypatch, tmp_path):
    monkeypatch.delenv("ANSIBLE_SSH_CONTROL_PATH_DIR", raising=False)
    monkeypatch.setenv("ANSIBLE_HOME", str(tmp_path / "ah"))
    assert ansible_env()["ANSIBLE_SSH_CONTROL_PATH_DIR"] == str(tmp_path / "ah" / "cp")
    monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(tmp_path / "elsewhere"))
    assert ansible_env()["ANSIBLE_SSH_CONTROL_PATH_DIR"] == str(tmp_path / "elsewhere")
