"""Which inventory plugin a run's ansible-playbook is told to use (ansible_bridge.inventory_plugins):
only where the file says which, and the plugin chosen really reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distrun.transport.ansible_bridge import inventory_plugins

YAML = "all:\n  children:\n    head:\n      hosts:\n        node1:\n    workers:\n      hosts:\n        node2:\n"
INI = "[head]\nnode1\n\n[workers]\nnode2\n"


@pytest.mark.parametrize(("name", "text", "mode", "plugin"), [
    ("hosts.yml", YAML, 0o644, "ansible.builtin.yaml"),
    ("hosts.yaml", YAML, 0o644, "ansible.builtin.yaml"),
    ("hosts.ini", INI, 0o644, "ansible.builtin.ini"),
    # A plugin's own configuration (a cloud inventory): Ansible's list, whose auto plugin reads it.
    ("aws_ec2.yml", "plugin: amazon.aws.aws_ec2\nregions: [eu-west-1]\n", 0o644, None),
    ("hosts", INI, 0o644, None),  # no suffix: ini or a script, Ansible tells
    ("hosts.yml", YAML, 0o755, None),  # executable: the script plugin's
    ("hosts.toml", "[head]\n", 0o644, None),
])
def test_the_plugin_is_named_only_where_the_file_says_which(tmp_path, name, text, mode, plugin):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    assert inventory_plugins(path) == plugin


def test_a_folder_or_a_missing_file_keeps_ansibles_list(tmp_path):
    assert inventory_plugins(tmp_path) is None
    assert inventory_plugins(tmp_path / "absent.yml") is None


@pytest.mark.parametrize(("name", "text"), [("hosts.yml", YAML), ("hosts.ini", INI)])
def test_the_plugin_named_reads_the_inventory(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    env = {**os.environ, "ANSIBLE_INVENTORY_ENABLED": str(inventory_plugins(path)),
           "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(path), "--list"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    groups = json.loads(proc.stdout)
    assert groups["head"]["hosts"] == ["node1"] and groups["workers"]["hosts"] == ["node2"]
