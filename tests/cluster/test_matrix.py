"""Cluster A's cells of the launcher x shared folder x inventory matrix (tests/harness/matrix.py):
the YAML inventory whose names are the hostnames, root as the admin, every launcher in every
shared folder mode this kernel can run, then the site-filesystem mode's own checks.

The sync cells run with the other tests; the modes that replace the shared folder run with the
node failure tests (``phase(1)``), and each block of this module's tests ends by switching the
cluster back to sync mode, so every other test finds the shared folder as the inventory says.
In sshfs mode, around the cells: a node whose mount is gone is refused by the preflight of
``train`` with the words of ``check``, and a restarted node mounts its folder again by itself.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from tests.harness import matrix

from . import jittor_nodes
from .conftest import REPO, distrun

HOSTS = {"node1": "node1", "node2": "node2", "node3": "node3"}  # inventory name -> hostname
SSHFS_UNIT = "distrun-shared-sshfs.service"
SHARED_DIR = "/srv/distrun"


@pytest.fixture(scope="session")
def mode_inventories(provisioned, tmp_path_factory) -> dict[str, str]:
    return matrix.inventories_by_mode("test", provisioned.inventory, REPO / "inventory" / "test" / "group_vars",
                                      tmp_path_factory.mktemp, "A")


@pytest.fixture(scope="module")
def modes_a(mode_inventories):
    """The cluster's shared folder switched between modes; back to sync when the module's block of
    tests ends (the phases split this module in two blocks)."""
    with matrix.ModeSwitch(distrun, mode_inventories, "sync", "A") as switch:
        yield switch


def _cell(modes_a, distrun_home, cell_script, launcher: str, mode: str) -> None:
    inventory = modes_a.to(mode)
    matrix.run_cell(distrun, inventory, launcher, mode, "yaml-root", distrun_home, cell_script, HOSTS)


@pytest.mark.parametrize("launcher", (*matrix.LAUNCHERS, "ssh", *matrix.OUTSIDE))
def test_sync_cell(modes_a, distrun_home, cell_script, launcher):
    _cell(modes_a, distrun_home, cell_script, launcher, "sync")


@pytest.mark.phase(1)
@pytest.mark.parametrize("launcher", (*matrix.LAUNCHERS, "ssh", *matrix.OUTSIDE))
def test_sshfs_cell(modes_a, distrun_home, cell_script, launcher):
    _cell(modes_a, distrun_home, cell_script, launcher, "sshfs")


@pytest.mark.phase(1)
def test_check_twice_in_a_row_on_sshfs_finds_nothing_wrong(modes_a):
    # sshfs keeps a folder's listing for seconds: a second check that looked for the head's new
    # probe file in a listing of the shared folder would miss it while nothing is wrong.
    inventory = modes_a.to("sshfs")
    for attempt in (1, 2):
        res = distrun("check", "--inventory", inventory, timeout=300)
        assert res.rc == 0, f"check {attempt} of 2:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}"


def _fstype(cluster, k: int) -> str:
    """The filesystem type mounted at the shared folder on node k ("" when nothing is)."""
    return cluster.exec(k, f"findmnt -n -o FSTYPE --mountpoint {SHARED_DIR} || true").stdout.strip()


def _head_runs(cluster) -> list[str]:
    return cluster.exec(1, f"ls -1 {SHARED_DIR}/runs 2>/dev/null || true").stdout.split()


def _wait_for_mount(cluster, k: int, limit_s: float) -> float | None:
    """Seconds until node k has its sshfs mount back, or None after limit_s."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if _fstype(cluster, k) == "fuse.sshfs":
            return time.monotonic() - started
        time.sleep(1)
    return None


@pytest.mark.phase(1)
def test_a_node_whose_sshfs_folder_is_not_mounted_is_refused_by_train_with_checks_words(modes_a, provisioned,
                                                                                       tmp_path):
    inventory = modes_a.to("sshfs")
    script = tmp_path / "noop.py"
    script.write_text("print('should not run')\n")
    before = _head_runs(provisioned)
    # The mount point stays, empty and writable: what a node that came back without its mount has.
    provisioned.exec(3, f"systemctl stop {SSHFS_UNIT}")
    try:
        assert _fstype(provisioned, 3) == "", "node3 still has its shared folder mounted"
        check = distrun("check", "--inventory", inventory, "--json", timeout=300)
        assert check.rc != 0, check.stdout[-3000:]
        item = json.loads(check.stdout)["checks"]["shared folder"]["node3"]
        assert not item["ok"] and "sshfs" in item["detail"], item
        train = distrun("train", "--inventory", inventory, "--script", str(script), timeout=300)
        err = " ".join(train.stderr.split())
        assert train.rc == 3, train.stdout[-3000:] + train.stderr
        # train refuses with the words and the fix check gives, in one line, and starts nothing
        assert "preflight failed on node3:" in err and f"shared folder: {item['detail']}" in err, (err, item)
        assert item["fix"] in err, (err, item)
        assert train.stderr.strip().count("\n") == 0, train.stderr
        assert "nothing was started" in err and "Traceback" not in train.stdout + train.stderr
        assert _head_runs(provisioned) == before
    finally:
        provisioned.exec(3, f"systemctl start {SSHFS_UNIT}")
        assert _wait_for_mount(provisioned, 3, 120) is not None, "node3's sshfs mount did not come back"


@pytest.mark.phase(1)
def test_a_restarted_node_mounts_its_sshfs_folder_again_by_itself_and_a_run_succeeds(modes_a, provisioned,
                                                                                    distrun_home, cell_script):
    modes_a.to("sshfs")
    provisioned.stop_node(3)
    started = time.monotonic()
    provisioned.start_node(3)
    # The unit retries until the head answers; the bound only guards against a hang, the time is printed.
    waited = _wait_for_mount(provisioned, 3, 180)
    took = time.monotonic() - started
    load = os.getloadavg()[0]
    print(f"\nnode3 restarted: its sshfs folder was mounted again {took:.1f}s after 'podman start' "
          f"(load average {load:.1f})")
    assert waited is not None, (
        f"node3's shared folder is not mounted {took:.0f}s after its restart:\n"
        + provisioned.exec(3, f"systemctl status --no-pager {SSHFS_UNIT}", check=False).stdout[-2000:])
    # ... and a run over all three nodes succeeds without 'distrun setup'.
    matrix.run_cell(distrun, modes_a.to("sshfs"), "mpirun", "sshfs-restarted", "yaml-root", distrun_home,
                    cell_script, HOSTS)


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
