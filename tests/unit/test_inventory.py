"""The inventory model: every form Ansible reads, and a clear error for every bad one."""

from __future__ import annotations

import json

import pytest

from distrun.errors import InventoryError
from distrun.inventory.cluster import load_cluster, render_hostfile

TWO_NODE_YAML = """
all:
  vars:
    distrun_user: trainer
  children:
    head:
      hosts:
        w1: {ansible_host: 10.0.0.11, slots: 2}
    workers:
      hosts:
        w2: {ansible_host: 10.0.0.12, slots: 4}
        w1:
"""


def test_yaml_inventory_head_first_and_counted_once(write_inventory):
    cluster = load_cluster(write_inventory(TWO_NODE_YAML))
    assert [n.name for n in cluster.workers] == ["w1", "w2"]
    assert [n.name for n in cluster.nodes] == ["w1", "w2"]
    assert cluster.total_slots == 6
    assert cluster.user == "trainer"
    assert cluster.head.address == "10.0.0.11"
    assert render_hostfile(cluster).splitlines()[1:] == ["w1 slots=2", "w2 slots=4"]


def test_ini_inventory_with_aliases_and_group_vars(write_inventory, tmp_path):
    inv = write_inventory(
        "[head]\nalpha ansible_host=192.168.5.1\n\n[workers]\ngamma ansible_host=192.168.5.3 slots=3\n"
        "beta ansible_host=192.168.5.2\nalpha\n",
        name="hosts.ini",
    )
    gv = inv.parent / "group_vars"
    gv.mkdir()
    (gv / "all.yml").write_text("distrun_shared_dir: /data/shared\ndistrun_mpi_provider: conda\n")
    cluster = load_cluster(inv.parent)
    # Head first, then the others sorted by name; alpha is in both groups but counted once.
    assert [n.name for n in cluster.workers] == ["alpha", "beta", "gamma"]
    assert [n.slots for n in cluster.workers] == [1, 1, 3]
    assert cluster.workers[1].slots_source == "default"
    assert cluster.env_prefix == "/opt/miniforge3/envs/jittor"
    assert cluster.mpi_prefix == "/opt/miniforge3/envs/jittor"


def test_head_not_a_worker_runs_no_rank(write_inventory):
    cluster = load_cluster(write_inventory(
        "[head]\nlogin\n[workers]\ngpu1 slots=8\ngpu2 slots=8\n", name="h.ini"))
    assert [n.name for n in cluster.workers] == ["gpu1", "gpu2"]
    assert [n.name for n in cluster.nodes] == ["login", "gpu1", "gpu2"]
    assert cluster.total_slots == 16


def test_slots_default_to_detected_gpus_from_the_fact_cache(write_inventory, tmp_path):
    cache = tmp_path / "facts"
    cache.mkdir()
    (cache / "s1_g1").write_text(json.dumps({"__payload__": json.dumps({"ansible_local": {"distrun": {"gpus": 4}}})}))
    cluster = load_cluster(write_inventory("[head]\ng1\n[workers]\ng1\ng2\n", name="g.ini"), cache)
    assert [(n.name, n.slots, n.slots_source) for n in cluster.workers] == [("g1", 4, "gpus"), ("g2", 1, "default")]


BAD = [
    ("malformed YAML", "all: [unclosed\n  - x", "hosts.yml", "Ansible cannot parse it"),
    ("no head group", "[workers]\nw1\n", "h.ini", "no host in group 'head'"),
    ("two heads", "[head]\na\nb\n[workers]\na\n", "h.ini", "keep exactly one head node"),
    ("no workers group", "[head]\na\n", "h.ini", "no host in group 'workers'"),
    ("zero slots", "[head]\na\n[workers]\na slots=0\n", "h.ini", "host a has slots=0"),
    ("non-numeric slots", "[head]\na\n[workers]\na slots=many\n", "h.ini", "host a has slots='many'"),
    ("unknown provider", "[head]\na\n[workers]\na\n[all:vars]\ndistrun_mpi_provider=spack\n", "h.ini", "distrun_mpi_provider='spack'"),
    ("relative shared dir", "[head]\na\n[workers]\na\n[all:vars]\ndistrun_shared_dir=shared\n", "h.ini", "must be an absolute path"),
]


@pytest.mark.parametrize("label,text,name,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_inventories_name_the_file_and_the_fix(write_inventory, label, text, name, expected):
    path = write_inventory(text, name=name)
    with pytest.raises(InventoryError) as info:
        load_cluster(path)
    message = str(info.value)
    assert expected in message
    assert str(path) in message
    assert "\n" not in message


def test_a_value_the_contract_refuses_is_named_with_its_host_before_any_playbook_runs(write_inventory):
    """The runner checks the inventory contract with role distrun's own argument spec when it
    reads the inventory (run.yml skips the role's check): one line, the host, the variable and
    what it may be; a value Ansible still templates is left to Ansible."""
    bad = TWO_NODE_YAML.replace("w2: {ansible_host: 10.0.0.12, slots: 4}",
                                "w2: {ansible_host: 10.0.0.12, slots: 4, distrun_shared_fs_mode: nfss}")
    with pytest.raises(InventoryError) as err:
        load_cluster(write_inventory(bad))
    line = str(err.value)
    assert "\n" not in line and "host w2: " in line and "distrun_shared_fs_mode" in line and "nfss" in line
    assert "nfs, sshfs, sync, external" in line and line.endswith("correct it where the inventory sets it")
    templated = TWO_NODE_YAML.replace("distrun_user: trainer", "distrun_user: trainer\n    distrun_shared_fs_mode: \"{{ 'sync' }}\"")
    assert load_cluster(write_inventory(templated)).user == "trainer"
