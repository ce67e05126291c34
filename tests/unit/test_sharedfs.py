"""The shared folder's verdict, mode external in particular: the site's filesystem must be one
filesystem on every node, and the node where it is not is named, with the fix, by 'distrun check',
'distrun train' (the same judge) and 'distrun setup' (role shared_fs through the filter plugin)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from distrun.preflight import sharedfs
from distrun.preflight.judge import verdict
from distrun.preflight.report import build_report, refusal

from .probe_text import probe_text
from .test_check import NODES, SETUP
from .test_preflight_needs import OK_STATES, failed, probe

PROBE = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files" / "probe.py"
SITE = "/dev/vda1 /mnt/site ext4 rw,relatime 0 0"
ROOT = "overlay / overlay rw,relatime 0 0"
SHARED = "/mnt/site/distrun"


def test_the_mount_holding_a_path_is_the_longest_mount_point_above_it():
    mounts = [ROOT, "proc /proc proc rw 0 0", SITE, "tmpfs /mnt/sitex tmpfs rw 0 0"]
    assert sharedfs.mount_of(SHARED, mounts) == ("/mnt/site", "ext4")
    assert sharedfs.mount_of("/mnt/site/", "\n".join(mounts)) == ("/mnt/site", "ext4")
    assert sharedfs.mount_of("/mnt/sitexyz", mounts) == ("/", "overlay")  # a prefix of a name is not a parent
    # The last mount on a mount point is the one in effect.
    assert sharedfs.mount_of(SHARED, [ROOT, SITE, "ceph /mnt/site ceph rw 0 0"]) == ("/mnt/site", "ceph")
    assert sharedfs.mount_of("/srv/my dir/x", [ROOT, "s /srv/my\\040dir fuse.sshfs rw 0 0"]) == ("/srv/my dir", "fuse.sshfs")


def external_probe(host: str, mounts: list[str]) -> dict:
    p = probe(host)
    p["shared_writable"] = {"ok": True, "detail": f"{SHARED} is writable by distrun"}
    p["shared_fs_mounts"] = mounts
    return p


def test_check_and_train_name_the_node_where_the_site_filesystem_is_not_mounted():
    probes = {h: external_probe(h, [ROOT, SITE]) for h in NODES}
    probes["node3"] = external_probe("node3", [ROOT])
    judged = verdict(probes, head="node1", shared_mode="external", shared_dir=SHARED, setup=SETUP)
    item = judged["shared folder"]["node3"]
    assert not item.ok
    assert item.detail == (f"{SHARED} is on / (overlay) on node3 but on /mnt/site (ext4) on node1,node2: "
                           "not the shared filesystem")
    assert item.fix.startswith(f"mount the shared filesystem at {SHARED} on node3 as on the other nodes")
    assert "distrun mounts nothing" in item.fix
    assert judged["shared folder"]["node1"].ok and judged["shared folder"]["node2"].ok
    line = refusal(build_report(nodes=NODES, hosts=failed("node3"), judged=judged))
    assert line.startswith(f"shared folder: {SHARED} is on / (overlay) on node3 but on /mnt/site (ext4)")
    assert line.count("|") == 0


def test_in_the_full_check_a_file_the_head_wrote_must_be_seen_on_every_node():
    probes = {h: external_probe(h, [ROOT, SITE]) for h in NODES}
    probes["node1"]["shared_probe"] = {"ok": True, "file": f"{SHARED}/.p", "detail": "wrote"}
    seen = {"node2": f"{SHARED}/.p\n", "node3": ""}
    judged = verdict(probes, head="node1", shared_mode="external", shared_dir=SHARED, setup=SETUP, seen=seen)
    assert judged["shared folder"]["node2"].ok
    node3 = judged["shared folder"]["node3"]
    assert not node3.ok and node3.detail == (f"a file written in {SHARED} on node1 is not visible on node3: "
                                             "not the same filesystem")
    # The same filesystem is not compared in the other modes (their mount is checked by type).
    assert verdict({h: external_probe(h, [ROOT] if h == "node3" else [ROOT, SITE]) for h in NODES}, head="node1",
                   shared_mode="sync", shared_dir=SHARED, setup=SETUP)["shared folder"]["node3"].ok


def test_a_healthy_external_folder_passes():
    probes = {h: external_probe(h, [ROOT, SITE]) for h in NODES}
    judged = verdict(probes, head="node1", shared_mode="external", shared_dir=SHARED, setup=SETUP)
    assert all(it.ok for it in judged["shared folder"].values())
    assert refusal(build_report(nodes=NODES, hosts=OK_STATES, judged=judged)) == ""


def test_setup_names_each_node_whose_folder_is_not_the_heads():
    token = "distrun setup 2026-01-01T00:00:00 42"
    findings = {
        "node1": {"mounts": f"{ROOT}\n{SITE}\n", "writable": True, "seen": token},
        "node2": {"mounts": f"{ROOT}\n{SITE}\n", "writable": True, "seen": token},
        "node3": {"mounts": f"{ROOT}\n", "writable": True, "seen": ""},
        "node4": {"mounts": f"{ROOT}\n{SITE}\n", "writable": False, "seen": token},
        "node5": {"mounts": f"{ROOT}\n{SITE}\n", "writable": True, "seen": ""},
    }
    problems = sharedfs.external_setup(findings, head="node1", shared_dir=SHARED, token=token, setup="distrun setup")
    assert sorted(problems) == ["node3", "node4", "node5"]
    assert problems["node3"].startswith(f"{SHARED} is on / (overlay) on node3 but on /mnt/site (ext4) on "
                                        "node1,node2,node4,node5: not the shared filesystem; fix: mount the shared")
    assert problems["node4"].startswith(f"{SHARED} is not writable by the training user on node4; fix:")
    assert problems["node5"].startswith(f"a file written in {SHARED} on node1 is not visible on node5:")


def test_the_probe_reports_the_mounts_above_the_shared_folder(tmp_path):
    cfg = {"host": "here", "user": "root", "env_prefix": sys.prefix, "mpi_prefix": "/usr",
           "shared_dir": str(tmp_path / "shared"), "shared_fs_mounts": True}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps(cfg)], capture_output=True, text=True,
                         timeout=120)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    lines = found["shared_fs_mounts"]
    assert lines and all(line.split()[1] in ("/", "/tmp", str(tmp_path)) or str(tmp_path).startswith(line.split()[1])
                         for line in lines)
    here = sharedfs.mount_of(str(tmp_path / "shared"), Path("/proc/self/mounts").read_text())
    assert sharedfs.mount_of(str(tmp_path / "shared"), lines) == here
