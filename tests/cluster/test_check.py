"""'distrun check' on the 3-node cluster: healthy, then one thing broken at a time.

Each test breaks something cheap on one node, expects the report to name that node, what is
wrong and the fix, and restores it in ``finally`` (no setup run needed in between).
"""

from __future__ import annotations

import json
import time

import pytest

from .conftest import distrun

SITE = "/opt/distrun/venv/lib/python3.11/site-packages"


def check_json(*options: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    res = distrun("check", "--inventory", "test", "--json", *options, timeout=180)
    elapsed = time.monotonic() - started
    try:
        report = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"check printed no JSON (rc {res.rc}):\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
    return res.rc, report, elapsed


def failed(report: dict) -> dict[tuple[str, str], dict]:
    return {(c, h): it for c, items in report["checks"].items() for h, it in items.items() if not it["ok"]}


def test_healthy_cluster_passes_every_check(provisioned):
    rc, report, elapsed = check_json("--ssh-logins")
    assert rc == 0, json.dumps(report, indent=1)[-4000:]
    assert report["ok"] is True
    assert failed(report) == {}
    for check in ("reach", "env", "mpi4py", "versions", "ssh", "names", "shared folder", "gpus vs slots"):
        assert set(report["checks"][check]) == {"node1", "node2", "node3"}, check
    assert set(report["checks"]["ports"]) == {"node1"}
    # sync: each node's own copy, which every run's stage step copies into with the run's
    # certificate (the ssh row proves those logins); no check starts a copy as the training user.
    assert report["checks"]["shared folder"]["node3"]["detail"] == "/srv/distrun writable (sync: this node's own copy)"
    assert report["checks"]["ssh"]["node2"]["detail"] == "reaches node1,node3"  # pairwise, not only from the head
    assert "mpi4py " in report["checks"]["versions"]["node1"]["detail"]
    assert "jittor " in report["checks"]["versions"]["node1"]["detail"]  # a version or "absent"
    assert report["hosts"] == {h: {"state": "ok", "error": ""} for h in ("node1", "node2", "node3")}
    print(f"distrun check on the healthy 3-node cluster: {elapsed:.1f}s wall, {report['elapsed_s']}s in check")
    # The probe file is gone from every node again.
    for k in (1, 2, 3):
        left = provisioned.exec(k, "ls -a /srv/distrun | grep -c '^.distrun-preflight-' || true").stdout.strip()
        assert left == "0", f"node{k} still has the probe file"
    # Nothing a login depends on changed since: every node checks the others' sshd banners.
    rc, again, _ = check_json()
    assert rc == 0 and again["checks"]["ssh"]["node2"]["detail"] == (
        "sshd answers on node1,node3 (login verified earlier, nothing changed since)")
    human = distrun("check", "--inventory", "test", timeout=180)
    assert human.rc == 0
    assert "✓" in human.stdout and "✗" not in human.stdout
    assert "all checks passed" in human.stdout


def test_a_different_package_version_on_node3_is_named_and_train_refuses(provisioned, tmp_path):
    # Fake another mpi4py on node3: its METADATA's Version line is what the probe reads.
    meta = provisioned.exec(3, f"ls -d {SITE}/mpi4py-*.dist-info").stdout.strip() + "/METADATA"
    want = provisioned.exec(3, f"sed -n 's/^Version: //p' {meta}").stdout.strip()
    provisioned.exec(3, f"cp {meta} /tmp/mpi4py.METADATA && sed -i 's/^Version: .*/Version: 0.0.1/' {meta}")
    try:
        rc, report, _ = check_json()
        assert rc == 1
        bad = failed(report)
        assert list(bad) == [("versions", "node3")], bad
        detail = bad[("versions", "node3")]["detail"]
        assert f"mpi4py {want} on node1,node2 but 0.0.1 on node3" in detail
        assert "env lock sha256:" in detail
        assert bad[("versions", "node3")]["fix"].startswith("run 'distrun setup --inventory test' (mpi_env)")

        script = tmp_path / "noop.py"
        script.write_text("print('should not run')\n")
        train = distrun("train", "--inventory", "test", "--script", str(script), timeout=180)
        err = " ".join(train.stderr.split())
        assert train.rc == 3, train.stdout[-2000:] + train.stderr
        assert "preflight failed on node3" in err and "versions differ" in err
        assert f"mpi4py {want} on node1,node2 but 0.0.1 on node3" in err  # check's words
        assert "nothing was started" in err
    finally:
        provisioned.exec(3, f"cp /tmp/mpi4py.METADATA {meta}")


def test_a_busy_rendezvous_port_on_the_head_names_port_and_process(provisioned):
    provisioned.exec(1, "cd /tmp && (nohup python3 -m http.server 29500 >/dev/null 2>&1 & echo $! > /tmp/busy.pid)")
    try:
        for _ in range(50):
            if provisioned.exec(1, "ss -Hltn 'sport = :29500'").stdout.strip():
                break
            time.sleep(0.1)
        rc, report, _ = check_json()
        assert rc == 1
        bad = failed(report)
        assert list(bad) == [("ports", "node1")], bad
        assert bad[("ports", "node1")]["detail"].startswith("port 29500 in use by python3 (pid ")
        assert "--port" in bad[("ports", "node1")]["fix"]
    finally:
        provisioned.exec(1, "kill $(cat /tmp/busy.pid); rm -f /tmp/busy.pid", check=False)


def test_a_wrong_address_for_a_name_on_one_node_is_named(provisioned):
    # The first /etc/hosts line for a name wins. The file is bind-mounted by podman: rewrite it
    # in place, never by rename.
    provisioned.exec(2, "cp /etc/hosts /tmp/hosts.bak && { echo '127.0.0.2 node3'; cat /tmp/hosts.bak; } > /etc/hosts")
    try:
        rc, report, _ = check_json()
        assert rc == 1
        bad = failed(report)
        assert ("names", "node2") in bad, bad
        # node2 has both addresses for node3 (/etc/host.conf "multi on"), the stray one first
        detail = bad[("names", "node2")]["detail"]
        assert detail.startswith("node2 resolves node3 to 127.0.0.2,") and " but node1,node3 to " in detail, detail
        assert "/etc/hosts" in bad[("names", "node2")]["fix"]
        # ssh from node2 to "node3" now reaches the wrong host: reported on node2 as well.
        assert set(bad) <= {("names", "node2"), ("ssh", "node2")}, bad
    finally:
        provisioned.exec(2, "cat /tmp/hosts.bak > /etc/hosts")


def test_a_shared_folder_the_user_cannot_write_gets_its_cause_and_fix(provisioned):
    provisioned.exec(3, "chown root:root /srv/distrun")
    try:
        rc, report, _ = check_json()
        assert rc == 1
        item = failed(report)[("shared folder", "node3")]
        assert item["detail"] == "/srv/distrun is not writable by distrun (owner root, mode 0755)"
        assert item["fix"] == "run 'distrun setup --inventory test --tags shared_fs'"
    finally:
        provisioned.exec(3, "chown distrun:distrun /srv/distrun")


def test_ssh_between_workers_is_checked_pairwise(provisioned):
    # root's file of the certificate principals sshd takes for the training user on node3
    keys = "/etc/ssh/distrun_principals/distrun"
    check_json()  # the mesh proved: the check below logs in again because node3 changed
    provisioned.exec(3, f"mv {keys} {keys}.off")
    try:
        rc, report, _ = check_json()
        assert rc == 1
        bad = failed(report)
        for src in ("node1", "node2"):
            assert f"{src} -> node3: " in bad[("ssh", src)]["detail"], bad
            assert "Permission denied" in bad[("ssh", src)]["detail"]
            assert "--tags ssh_mesh" in bad[("ssh", src)]["fix"]
    finally:
        provisioned.exec(3, f"mv {keys}.off {keys}")
    rc, report, _ = check_json()
    assert rc == 0, failed(report)
