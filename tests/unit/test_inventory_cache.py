"""ansible-inventory's answer is kept while the inventory's files are unchanged, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

from distrun.inventory import cache as inventory_cache
from distrun.inventory import cluster as inventory
from distrun.inventory import read as inventory_read

HOSTS = """\
head:
  hosts:
    n1: {ansible_host: 10.0.0.1}
workers:
  hosts:
    n1:
    n2: {ansible_host: 10.0.0.2}
"""


@pytest.fixture
def asked(monkeypatch):
    """Count the times Ansible itself is asked (the real ansible-inventory runs each time)."""
    calls: list[Path] = []
    real = inventory_read._ask_ansible

    def counting(path: Path) -> dict:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(inventory_read, "_ask_ansible", counting)
    return calls


def test_an_unchanged_inventory_is_read_once_and_an_edit_is_read_again(write_inventory, asked):
    path = write_inventory(HOSTS)
    (path.parent / "group_vars").mkdir()
    gv = path.parent / "group_vars" / "all.yml"
    gv.write_text("distrun_user: alice\n")
    first = inventory.load_cluster(path)
    again = inventory.load_cluster(path)
    assert len(asked) == 1
    assert first.user == again.user == "alice" and [n.name for n in again.nodes] == ["n1", "n2"]
    gv.write_text("distrun_user: bob\n")  # a group var changed: Ansible is asked again
    assert inventory.load_cluster(path).user == "bob"
    (path.parent / "group_vars" / "workers.yml").write_text("slots: 2\n")  # a new vars file
    assert inventory.load_cluster(path).total_slots == 4
    assert len(asked) == 3


@pytest.mark.parametrize("kind", ["script", "plugin", "vault"])
def test_inventories_whose_answer_comes_from_elsewhere_are_never_kept(write_inventory, kind):
    if kind == "script":
        path = write_inventory("#!/bin/sh\necho '{}'\n", name="hosts.sh")
        path.chmod(0o755)
    elif kind == "plugin":
        path = write_inventory("plugin: ansible.builtin.constructed\nstrict: true\n", name="cloud.yml")
    else:
        path = write_inventory(HOSTS)
        (path.parent / "group_vars").mkdir()
        (path.parent / "group_vars" / "all.yml").write_text("secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n")
    assert inventory_cache.cache_key(path) is None


def test_the_key_follows_the_ansible_settings_that_change_parsing(write_inventory, monkeypatch):
    path = write_inventory(HOSTS)
    key = inventory_cache.cache_key(path)
    monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", "/tmp/elsewhere")  # no effect on parsing
    assert inventory_cache.cache_key(path) == key
    monkeypatch.setenv("ANSIBLE_INVENTORY_ENABLED", "ini")
    assert inventory_cache.cache_key(path) != key


def test_the_kept_answers_are_private(write_inventory, private_state):
    path = write_inventory(HOSTS)
    inventory.load_cluster(path)
    kept = list((private_state / "inventory").glob("*.json"))
    assert len(kept) == 1 and kept[0].stat().st_mode & 0o777 == 0o600
    assert (private_state / "inventory").stat().st_mode & 0o777 == 0o700
