"""Slurm on the same 3 nodes described by an INI inventory whose names are not the machines'
hostnames (alpha, w2, w3 for node1, node2, node3): Slurm knows each node by its inventory name
(NodeName, with NodeHostname and NodeAddr from facts), and `distrun train --launcher slurm` runs
to COMPLETED in both modes and names a failing rank's node as the inventory does.

Setup through this inventory renames the nodes in /etc/hosts and slurm.conf, which the other
cluster tests' inventory no longer matches, so this module runs last (``phase(3)``).
"""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, CliResult, distrun, rank_headers

pytestmark = pytest.mark.phase(3)

NAMES = {"alpha": "node1", "w2": "node2", "w3": "node3"}  # inventory name -> machine hostname
FAIL_SCRIPT = textwrap.dedent("""
    import os, sys
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == int(os.environ.get("FAIL_RANK", "-1")):
        sys.exit(3)
    comm.Barrier()
""")


@pytest.fixture(scope="module")
def aliased(provisioned, tmp_path_factory):
    inv_dir = tmp_path_factory.mktemp("aliased-inventory")
    shutil.copytree(REPO / "inventory" / "test" / "group_vars", inv_dir / "group_vars")
    harness = yaml.safe_load(provisioned.inventory.read_text())["all"]
    group_vars = inv_dir / "group_vars" / "all.yml"
    ours = yaml.safe_load(group_vars.read_text())
    with group_vars.open("a") as f:
        f.write("\n# This controller's ssh settings for these nodes.\n"
                + yaml.safe_dump({k: v for k, v in harness["vars"].items() if k not in ours}))
    ips = {name: harness["hosts"][machine]["ansible_host"] for name, machine in NAMES.items()}
    (inv_dir / "hosts.ini").write_text(
        "[head]\nalpha\n\n[workers]\n" + "".join(f"{n} ansible_host={ip} slots=1\n" for n, ip in ips.items()))
    setup = distrun("setup", "--inventory", str(inv_dir))
    assert setup.rc == 0, _show(setup)
    return provisioned, inv_dir


def _show(result: CliResult) -> str:
    return result.stdout[-5000:] + result.stderr[-2000:]


def _latest(home: Path) -> Path:
    return sorted((home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)[-1]


def test_slurm_knows_the_nodes_by_their_inventory_names(aliased):
    cluster, _ = aliased
    sinfo = cluster.exec(1, "sinfo --noheader --Node --format='%N %t'").stdout.split("\n")
    states = {line.split()[0]: line.split()[1] for line in sinfo if line.strip()}
    assert states == dict.fromkeys(NAMES, "idle"), sinfo
    for name, machine in NAMES.items():
        node = cluster.exec(1, f"scontrol show node {name}").stdout
        assert f"NodeHostName={machine}" in node, node


def test_train_ddp_under_slurm_completes_with_one_rank_per_node(aliased, distrun_home):
    _, inv = aliased
    result = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--workload", "ddp", "--epochs", "3")
    assert result.rc == 0, _show(result)
    assert "DISTRUN_SLURM_RESULT state=COMPLETED" in result.stdout, _show(result)
    expected = {r: (3, n, m) for r, (n, m) in enumerate(NAMES.items())}
    assert rank_headers(_latest(distrun_home)) == expected


def test_multi_job_mode_completes_with_the_first_node_as_master_by_its_inventory_name(aliased, distrun_home):
    cluster, inv = aliased
    result = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--slurm-mode", "multi-job",
                     "--workload", "ddp", "--epochs", "3")
    assert result.rc == 0, _show(result)
    assert "DISTRUN_SLURM_RESULT state=COMPLETED" in result.stdout, _show(result)
    run = _latest(distrun_home)
    expected = {r: (3, n, m) for r, (n, m) in enumerate(NAMES.items())}
    assert rank_headers(run) == expected
    assert cluster.exec(1, "squeue --noheader").stdout.strip() == ""


def test_a_failing_rank_is_named_by_its_nodes_inventory_name(aliased, tmp_path):
    cluster, inv = aliased
    script = tmp_path / "fail.py"
    script.write_text(FAIL_SCRIPT)
    result = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--skip-preflight",
                     "--script", str(script), "--env", "FAIL_RANK=1")
    assert result.rc == 1, _show(result)
    assert "DISTRUN_SLURM_RESULT state=FAILED" in result.stdout, _show(result)
    said = " ".join(result.stdout.split())
    assert re.search(r"failed \(launcher exit 1\).*\bw2\b", said), _show(result)
    assert "on node2" not in said, _show(result)  # the machine's hostname is not how the user knows it
    assert cluster.exec(1, "squeue --noheader").stdout.strip() == ""
