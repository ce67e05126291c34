"""The inventory's people (distrun_users, distrun_admins): read through Ansible, every mistake
named in its own line with the entry and the fix, and no people meaning one training account."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from distrun.errors import InventoryError
from distrun.inventory import people
from distrun.inventory.cluster import load_cluster


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, str]:
    """Real public keys, as ssh-keygen writes them."""
    folder = tmp_path_factory.mktemp("keys")
    out = {}
    for kind, extra in (("ed25519", []), ("rsa", ["-b", "2048"]), ("ecdsa", ["-b", "256"])):
        path = folder / kind
        subprocess.run(["ssh-keygen", "-q", "-t", kind, *extra, "-N", "", "-C", f"someone@{kind}", "-f", str(path)], check=True)
        out[kind] = (path.with_suffix(".pub")).read_text().strip()
    return out


def inventory(users: str, extra: str = "") -> str:
    return f"""
all:
  vars:
    distrun_shared_fs_mode: sync
{extra}
    distrun_users:
{users}
  children:
    head: {{hosts: {{n1: {{ansible_host: 10.0.0.1}}}}}}
    workers: {{hosts: {{n1: , n2: {{ansible_host: 10.0.0.2}}}}}}
"""


def test_people_are_read_with_their_keys_uids_and_admins(write_inventory, keys):
    inv = write_inventory(inventory(
        f'      - {{name: alice, uid: 2001, ssh_keys: ["{keys["ed25519"]}", "{keys["rsa"]}"]}}\n'
        f'      - {{name: bob, ssh_keys: ["{keys["ecdsa"]}"]}}',
        "    distrun_admins: [alice]"))
    cluster = load_cluster(inv, admin=True)  # as setup reads it
    assert cluster.people is not None
    assert cluster.people.names == ("alice", "bob")
    assert cluster.people.admins == ("alice",)
    alice = cluster.people.get("alice")
    assert alice is not None and alice.uid == 2001 and len(alice.ssh_keys) == 2
    bob = cluster.people.get("bob")
    assert bob is not None and bob.uid is None
    assert cluster.people.get("carol") is None


def test_without_people_the_cluster_has_one_training_account(write_inventory):
    cluster = load_cluster(write_inventory(inventory("      []")))
    assert cluster.people is None


def test_every_problem_gets_a_line_of_its_own(write_inventory, keys):
    inv = write_inventory(inventory(
        f'      - {{name: alice, uid: 2001, ssh_keys: ["{keys["ed25519"]}"]}}\n'
        f'      - {{name: alice, uid: 2002, ssh_keys: ["{keys["rsa"]}"]}}\n'
        f'      - {{name: Bob, ssh_keys: ["{keys["rsa"]}"]}}\n'
        f'      - {{name: carol, uid: 2001, ssh_keys: ["command=\\"sh\\" {keys["rsa"]}"]}}\n'
        f'      - {{name: dave, uid: 99, ssh_keys: ["ssh-ed25519 bm90IGEga2V5"]}}\n'
        f'      - {{name: root, ssh_keys: ["{keys["rsa"]}"], shell: /bin/sh}}',
        "    distrun_admins: [alice, mallory]"))
    with pytest.raises(InventoryError) as err:
        load_cluster(inv)
    lines = str(err.value).splitlines()
    assert all(line.startswith(f"inventory {inv}: ") for line in lines)
    text = "\n".join(lines)
    assert "names alice twice" in text
    assert "[2]: name 'Bob' is not an account name" in text
    assert "gives uid 2001 to both alice and carol" in text
    assert "(carol) ssh_keys[0]: has type 'command=\"sh\"'" in text
    assert "(dave): uid 99 is outside 1000-60000" in text
    assert "(dave) ssh_keys[0]: has a key part that is not an ssh-ed25519 key" in text
    assert "(root): is a name the system or distrun keeps" in text
    assert "(root): has shell; a person takes name, ssh_keys and uid only" in text
    assert "distrun_admins: 'mallory' is not in distrun_users" in text
    assert len(lines) == 9


@pytest.mark.parametrize("mode", ["nfs", "external"])
def test_shared_folders_that_keep_owners_by_number_need_fixed_uids(write_inventory, keys, mode):
    inv = write_inventory(inventory(f'      - {{name: alice, ssh_keys: ["{keys["ed25519"]}"]}}').replace(
        "distrun_shared_fs_mode: sync", f"distrun_shared_fs_mode: {mode}"))
    with pytest.raises(InventoryError, match=rf"\(alice\): has no uid; distrun_shared_fs_mode {mode} keeps owners by number"):
        load_cluster(inv)


def test_sshfs_cannot_keep_people_apart_and_says_what_can(write_inventory, keys):
    inv = write_inventory(inventory(f'      - {{name: alice, uid: 2001, ssh_keys: ["{keys["ed25519"]}"]}}').replace(
        "distrun_shared_fs_mode: sync", "distrun_shared_fs_mode: sshfs"))
    with pytest.raises(InventoryError, match="sshfs: one FUSE mount per node .* use nfs, external or sync"):
        load_cluster(inv)


def test_admins_without_people_and_the_training_account_as_a_person_are_refused(write_inventory, keys):
    with pytest.raises(InventoryError, match="distrun_admins is set but distrun_users is not"):
        load_cluster(write_inventory(inventory("      []", "    distrun_admins: [alice]")))
    with pytest.raises(InventoryError, match=r"\(distrun\): is the training account"):
        load_cluster(write_inventory(inventory(f'      - {{name: distrun, ssh_keys: ["{keys["rsa"]}"]}}')))


@pytest.mark.parametrize("text,why", [
    ("", "is not '<type> <base64> [comment]'"),
    ("ssh-ed25519", "is not '<type> <base64> [comment]'"),
    ("ssh-ed25519 AAAA\nssh-ed25519 AAAA", "is not one line"),
    ("ssh-dss AAAAB3NzaC1kc3M=", "has type 'ssh-dss'"),
    ("ssh-ed25519 !!!", "has a key part that is not base64"),
    ("from=\"*\" ssh-ed25519 AAAA", "has type 'from=\"*\"'"),
])
def test_a_key_is_exactly_one_public_key_line(text, why):
    assert (people.key_problem(text) or "").startswith(why)


def test_real_keys_of_every_type_pass(keys):
    assert [people.key_problem(k) for k in keys.values()] == [None, None, None]
    # A key whose payload is of another type than its line says.
    kind, blob, _ = keys["rsa"].split(" ", 2)
    assert people.key_problem(f"ssh-ed25519 {blob}") == "has a key part that is not an ssh-ed25519 key"


def test_people_need_no_playbook_to_be_checked(tmp_path: Path, keys):
    """The checks are the runner's own: a wrong list is refused before any node is contacted."""
    problems, found = people.problems_and_people({"distrun_users": "not a list"}, "sync", "distrun")
    assert problems == ["distrun_users is not a list; write a list of {name, ssh_keys, uid} entries"] and found is None
