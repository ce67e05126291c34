"""Cluster A's cells of the launcher x shared folder x inventory matrix (tests/harness/matrix.py):
the YAML inventory whose names are the hostnames, root as the admin, every launcher in every
shared folder mode this kernel can run, then the site-filesystem mode's own checks.

The sync cells run with the other tests; the modes that replace the shared folder run after the
tests that need it as it is (``phase(1)``, with the node failure tests), and leave the cluster in
a mode whose folder is not /srv/distrun, so the sync folder the other tests read stays as it was.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.harness import matrix

from . import jittor_nodes
from .conftest import REPO, distrun

HOSTS = {"node1": "node1", "node2": "node2", "node3": "node3"}  # inventory name -> hostname


@pytest.fixture(scope="session")
def modes_a(provisioned, tmp_path_factory) -> matrix.ModeSwitch:
    group_vars = REPO / "inventory" / "test" / "group_vars"
    inventories = {"sync": "test"}
    for mode in ("sshfs", "external"):
        dest = tmp_path_factory.mktemp(f"inventory-a-{mode}")
        inventories[mode] = str(matrix.mode_inventory(provisioned.inventory, group_vars, dest, mode))
    return matrix.ModeSwitch(distrun, inventories, "sync", "A")


@pytest.fixture(scope="session")
def cell_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("cell") / "cell.py"
    path.write_text(matrix.CELL_SCRIPT)
    return path


def _cell(modes_a, distrun_home, cell_script, launcher: str, mode: str) -> None:
    inventory = modes_a.to(mode)
    matrix.run_cell(distrun, inventory, launcher, mode, "yaml-root", distrun_home, cell_script, HOSTS)


@pytest.mark.parametrize("launcher", matrix.LAUNCHERS)
def test_sync_cell(modes_a, distrun_home, cell_script, launcher):
    _cell(modes_a, distrun_home, cell_script, launcher, "sync")


@pytest.mark.phase(1)
@pytest.mark.parametrize("launcher", matrix.LAUNCHERS)
def test_sshfs_cell(modes_a, distrun_home, cell_script, launcher):
    _cell(modes_a, distrun_home, cell_script, launcher, "sshfs")


@pytest.mark.phase(1)
def test_a_site_filesystem_passes_setup_and_check(modes_a, provisioned):
    """external: one host folder bound at /mnt/site in every node stands for the site's filesystem;
    setup makes the folder and checks it is one filesystem, check agrees, and nothing is mounted."""
    inventory = modes_a.to("external")
    check = distrun("check", "--inventory", inventory, "--json", timeout=300)
    report = json.loads(check.stdout)
    assert check.rc == 0 and report["ok"], json.dumps(report["checks"].get("shared folder"), indent=1)
    for k, name in enumerate(HOSTS, 1):
        assert report["checks"]["shared folder"][name]["ok"]
        # distrun mounted nothing there and left no sshfs unit from the mode before.
        mounts = provisioned.exec(k, f"findmnt -n -o FSTYPE --target {matrix.SITE_SHARED_DIR}").stdout.split()
        assert mounts and mounts[0] != "fuse.sshfs", mounts
        unit = provisioned.exec(k, "systemctl is-enabled distrun-shared-sshfs.service", check=False).stdout.strip()
        assert unit in ("", "not-found"), f"node{k}: the sshfs unit of the mode before is {unit}"
    owner = provisioned.exec(1, f"stat -c '%U %a' {matrix.SITE_SHARED_DIR}").stdout.split()
    assert owner == ["distrun", "755"], owner


@pytest.mark.phase(1)
@pytest.mark.parametrize("launcher", matrix.LAUNCHERS)
def test_external_cell(modes_a, distrun_home, cell_script, launcher):
    _cell(modes_a, distrun_home, cell_script, launcher, "external")


@pytest.mark.phase(1)
def test_the_reference_gcn_trains_on_a_site_filesystem(modes_a, provisioned, distrun_home):
    jittor_nodes.wait(provisioned)
    inventory = modes_a.to("external")
    result = distrun("train", "--inventory", inventory, "--workload", "gcn", "--epochs", "3", timeout=1800)
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = matrix.latest_run(distrun_home)
    plan = json.loads((run / "plan.json").read_text())
    assert plan["shared_dir"] == matrix.SITE_SHARED_DIR
    assert json.loads((run / "result.json").read_text())["ranks"] == 3
    # One run directory for every node: the head holds every rank's output.
    listing = provisioned.exec(3, f"ls {matrix.SITE_SHARED_DIR}/runs/{run.name}").stdout.split()
    assert "result.json" in listing, listing


@pytest.mark.phase(1)
def test_a_node_without_the_site_filesystem_is_named_by_check_and_train(modes_a, provisioned, tmp_path):
    inventory = modes_a.to("external")
    script = tmp_path / "noop.py"
    script.write_text("print('should not run')\n")
    runs = f"ls -1 {matrix.SITE_SHARED_DIR}/runs 2>/dev/null || true"
    before = provisioned.exec(1, runs).stdout.split()
    # Keep the bind reachable at another path, so the node gets its filesystem back afterwards.
    provisioned.exec(3, f"mkdir -p /mnt/.site-kept && mount --bind {matrix.SITE_MOUNT} /mnt/.site-kept "
                        f"&& umount {matrix.SITE_MOUNT}")
    try:
        check = distrun("check", "--inventory", inventory, "--json", timeout=300)
        assert check.rc != 0
        item = json.loads(check.stdout)["checks"]["shared folder"]["node3"]
        assert not item["ok"]
        assert re.fullmatch(rf"{matrix.SITE_SHARED_DIR} is on / \(\S+\) on node3 but on {matrix.SITE_MOUNT} "
                            r"\(\S+\) on node1,node2: not the shared filesystem", item["detail"]), item
        assert "distrun mounts nothing" in item["fix"], item
        train = distrun("train", "--inventory", inventory, "--script", str(script), timeout=300)
        err = " ".join(train.stderr.split())
        assert train.rc == 3, train.stdout[-3000:] + train.stderr
        # train says what check says, in one line, and starts nothing
        assert f"shared folder: {item['detail']} on node3: {item['fix']}" in err, (err, item)
        assert err.count("\n") == 0 and "Traceback" not in train.stdout + train.stderr
        assert "nothing was started" in err
        assert provisioned.exec(1, runs).stdout.split() == before
    finally:
        provisioned.exec(3, f"mount --bind /mnt/.site-kept {matrix.SITE_MOUNT} && umount /mnt/.site-kept")
