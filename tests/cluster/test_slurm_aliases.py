"""The same 3 nodes described by an INI inventory whose names are not the machines' hostnames
(alpha, w2, w3 for node1, node2, node3), logged into as a non-root admin (``ops``, with become):
Slurm knows each node by its inventory name (NodeName, with NodeHostname and NodeAddr from facts),
`distrun train --launcher slurm` runs to COMPLETED in both modes and names a failing rank's node
as the inventory does, and this inventory's row of the launcher x shared folder matrix
(tests/harness/matrix.py) runs every launcher in every shared folder mode.

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

from tests.harness import matrix

from .conftest import REPO, CliResult, distrun, rank_headers

pytestmark = pytest.mark.phase(3)

NAMES = {"alpha": "node1", "w2": "node2", "w3": "node3"}  # inventory name -> machine hostname
ADMIN = "ops"  # the account Ansible and distrun log in with: not root, passwordless sudo
INVENTORY_KIND = "ini-alias-ops"
# The admin account a site gives: a home, the controller's key, sudo without a password.
ADD_ADMIN = (f"id {ADMIN} >/dev/null 2>&1 || useradd -m -s /bin/bash {ADMIN}; "
             f"install -d -m 0700 -o {ADMIN} -g {ADMIN} /home/{ADMIN}/.ssh && "
             f"install -m 0600 -o {ADMIN} -g {ADMIN} /root/.ssh/authorized_keys /home/{ADMIN}/.ssh/authorized_keys && "
             f"echo '{ADMIN} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{ADMIN} && chmod 0440 /etc/sudoers.d/{ADMIN}")
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
    for k in (1, 2, 3):
        provisioned.exec(k, ADD_ADMIN)
    inv_dir = tmp_path_factory.mktemp("aliased-inventory")
    shutil.copytree(REPO / "inventory" / "test" / "group_vars", inv_dir / "group_vars")
    harness = yaml.safe_load(provisioned.inventory.read_text())["all"]
    group_vars = inv_dir / "group_vars" / "all.yml"
    ours = yaml.safe_load(group_vars.read_text())
    connection = {k: v for k, v in harness["vars"].items() if k not in ours and k != "ansible_user"}
    with group_vars.open("a") as f:
        f.write("\n# This controller's ssh settings for these nodes, as a non-root admin with sudo.\n"
                + yaml.safe_dump({**connection, "ansible_become": True}))
    ips = {name: harness["hosts"][machine]["ansible_host"] for name, machine in NAMES.items()}
    (inv_dir / "hosts.ini").write_text(
        "[head]\nalpha\n\n[workers]\n"
        + "".join(f"{n} ansible_host={ip} ansible_user={ADMIN} slots=1\n" for n, ip in ips.items()))
    setup = distrun("setup", "--inventory", str(inv_dir))
    assert setup.rc == 0, _show(setup)
    return provisioned, inv_dir


@pytest.fixture(scope="module")
def modes_b(aliased, tmp_path_factory):
    """The aliased inventory's shared folder switched between modes, back to sync at the end."""
    _, inv_dir = aliased
    inventories = matrix.inventories_by_mode(str(inv_dir), inv_dir / "hosts.ini", inv_dir / "group_vars",
                                             tmp_path_factory.mktemp, "B")
    with matrix.ModeSwitch(distrun, inventories, "sync", "B") as switch:
        yield switch


@pytest.fixture(scope="module")
def cell_script_b(tmp_path_factory):
    path = tmp_path_factory.mktemp("cell-b") / "cell.py"
    path.write_text(matrix.CELL_SCRIPT)
    return path


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


@pytest.mark.parametrize("launcher", matrix.LAUNCHERS)
@pytest.mark.parametrize("mode", ["sync", "sshfs", "external"])
def test_matrix_cell(modes_b, distrun_home, cell_script_b, launcher, mode):
    """One cell of this inventory's row: a 3-rank torch DDP job with a DistributedSampler, a
    snapshot in its working directory and a file in the run directory read back by 'distrun logs'."""
    inventory = modes_b.to(mode)
    matrix.run_cell(distrun, inventory, launcher, mode, INVENTORY_KIND, distrun_home, cell_script_b, NAMES)
