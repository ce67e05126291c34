"""The shared folder's mount shares no uid with jobs, and no node step of stop or check waits for
ever on a node that hangs.

In sshfs mode the mount is root's on both ends: root finds, on every node, the processes that
serve the shared folder (the mount's ``sshfs`` and its ``ssh`` on the nodes that mount it, distrun's
file server and the sudo and login shell that started it on the head), none of them the training
user's. A job is given their ids (its /proc does not show them) and tries to trace and to stop
each one: the kernel refuses both ("Operation not permitted"), every one still runs afterwards,
and the next ``distrun check`` ends and passes. Then a node's mount is made to hang by root (its
sshfs process stopped): ``distrun check`` and ``distrun stop`` end within their bound and name that
node as hung. Each attack is tallied in tests/cluster/hostile.py."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.harness import matrix

from .conftest import REPO, distrun, new_train_run
from .hostile import TALLY, TRY_TRACE

SHARED_DIR = "/srv/distrun"

# The job is given, per node, the processes that serve the mount there (root found them: the
# run's /proc shows it no other account's processes, so a job learns their ids only by guessing,
# which this saves it), and tries to trace and to stop each.
STOP_THE_MOUNT = TRY_TRACE + textwrap.dedent(r'''
    import json, os, signal, socket, sys
    host = socket.gethostname().split(".")[0]
    said = {}
    if os.environ.get("LOCAL_RANK", "0") == "0":
        for pid in json.loads(sys.argv[1]).get(host, []):
            rec = {"visible": os.path.exists(f"/proc/{pid}")}
            rec["traced"] = try_trace(pid)
            try:
                os.kill(pid, signal.SIGSTOP)
                rec["stopped"] = True
                os.kill(pid, signal.SIGCONT)  # the run's own files are on the mount: it goes on
            except OSError as e:
                rec["stopped"] = e.strerror
            said[str(pid)] = rec
    sys.stdout.write("MOUNT " + json.dumps({host: said}) + "\n")
''')

SLEEPER = "import time\ntime.sleep(900)\n"


@pytest.fixture(scope="module")
def sshfs_mode(provisioned, tmp_path_factory):
    inventories = matrix.inventories_by_mode("test", provisioned.inventory, REPO / "inventory" / "test" / "group_vars",
                                             tmp_path_factory.mktemp, "M")
    with matrix.ModeSwitch(distrun, inventories, "sync", "M") as switch:
        yield switch.to("sshfs")


def _said(res) -> dict:
    found: dict = {}
    for chunk in (res.stdout + res.stderr).split("MOUNT ")[1:]:
        found.update(json.JSONDecoder().raw_decode(chunk)[0])
    return found


def _bounded(*args: str, limit: int):
    """distrun with a limit: its result, or None when it was still running after limit seconds."""
    try:
        return distrun(*args, timeout=limit)
    except subprocess.TimeoutExpired:
        return None


def _continue_all(cluster) -> None:
    for k in (1, 2, 3):
        cluster.exec(k, "pkill -CONT -x sshfs; pkill -CONT -x ssh; pkill -CONT -f 'fileserver.py serve'; true",
                     check=False)


def _serving(cluster) -> dict:
    """Per node, the processes that serve the shared folder, as root sees them: the mount's sshfs
    and its ssh on the nodes that mount the head's folder, and distrun's file server (with the
    sudo and the login's shell that started it) on the head. {node: {pid: {uid, comm, state}}}."""
    found: dict = {}
    for k in (1, 2, 3):
        out = cluster.exec(k, "ps -eo pid=,uid=,stat=,comm=,args=").stdout
        procs = {}
        for line in out.splitlines():
            pid, uid, state, comm, *args = line.split(None, 4) + [""]
            cmd = args[0]
            if comm == "sshfs" or (comm == "ssh" and "sftp" in cmd) or ("fileserver.py serve" in cmd and comm != "ps"):
                procs[int(pid)] = {"uid": int(uid), "comm": comm, "state": state}
        found[f"node{k}"] = procs
    return found


@pytest.mark.phase(1)
def test_a_job_can_neither_trace_nor_stop_what_serves_the_shared_folder(sshfs_mode, provisioned, tmp_path):
    serving = _serving(provisioned)
    print(f"\nthe mount's processes, as root sees them: {json.dumps(serving)}")
    # The mount is root's on both ends: sshfs (and its ssh) on the nodes, the file server on the head.
    assert all(any(p["comm"] == "sshfs" for p in serving[h].values()) for h in ("node2", "node3")), serving
    assert any(p["comm"].startswith("python") for p in serving["node1"].values()), serving
    user_uid = int(provisioned.exec(1, "id -u distrun").stdout)
    assert not [p for ps in serving.values() for p in ps.values() if p["uid"] == user_uid], serving
    script = tmp_path / "stop_the_mount.py"
    script.write_text(STOP_THE_MOUNT)
    pids = {h: sorted(ps) for h, ps in serving.items()}
    try:
        res = distrun("train", "--inventory", sshfs_mode, "--launcher", "mpirun", "--script", str(script), "--",
                      json.dumps(pids), timeout=600)
        said = _said(res)
        assert res.rc == 0 and set(said) == {"node1", "node2", "node3"}, res.stdout[-3000:] + res.stderr[-2000:]
        print(f"what the job did to them: {json.dumps(said)}")
        assert {h: sorted(int(p) for p in s) for h, s in said.items()} == pids, said  # every one was tried
        after = _serving(provisioned)
        started = time.monotonic()
        check = _bounded("check", "--inventory", sshfs_mode, limit=420)
        took = time.monotonic() - started
        print(f"the next check: {'still running' if check is None else f'exit {check.rc}'} after {took:.0f}s")
        mounts = {h: s for h, s in said.items() if h != "node1"}
        found = [TALLY.record("a job traces the sshfs mount's process",
                              any(p["traced"] is True for ps in mounts.values() for p in ps.values())),
                 TALLY.record("a job stops the sshfs mount's process",
                              any(p["stopped"] is True for ps in mounts.values() for p in ps.values())),
                 TALLY.record("a job stops or traces the head's file server",
                              any(p["traced"] is True or p["stopped"] is True for p in said["node1"].values())),
                 TALLY.record("the next check hangs or fails after the job", check is None or check.rc != 0)]
        assert not any(found), (said, None if check is None else check.stdout[-3000:])
        # Refused for the right reason: the kernel's, as for any other account's process (not that
        # the process had gone), and each one still there, running, after the job.
        reasons = {(p["traced"], p["stopped"]) for ps in said.values() for p in ps.values()}
        assert reasons == {("Operation not permitted", "Operation not permitted")}, said
        assert {h: sorted(ps) for h, ps in after.items()} == pids, (serving, after)
        assert not [p for ps in after.values() for p in ps.values() if p["state"].startswith(("T", "t"))], after
    finally:
        _continue_all(provisioned)


@pytest.mark.phase(1)
def test_check_and_stop_end_and_name_a_node_whose_mount_hangs(sshfs_mode, provisioned, distrun_home, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    # The sshfs inventory with the bounds an admin may lower: each node's probe may take 12 s and
    # its stop step 15 s here (120 s, and the grace and a minute, by default): check and stop each
    # wait about that long for node3, whose steps hang; the sleeper ends at SIGTERM elsewhere.
    inventory = str(matrix.mode_inventory(Path(sshfs_mode) / provisioned.inventory.name, Path(sshfs_mode) / "group_vars",
                                          tmp_path / "inventory", None, preflight_probe_timeout=12, job_stop_timeout=15))
    before = set((distrun_home / "runs").glob("*-train-*"))
    started = distrun("train", "--inventory", inventory, "--launcher", "mpirun", "--detach", "--script", str(script),
                      timeout=600)
    run = new_train_run(distrun_home, before)
    assert started.rc == 0 and run is not None, started.stdout[-3000:] + started.stderr[-2000:]
    try:
        provisioned.exec(3, "pkill -STOP -x sshfs")  # node3's shared folder hangs: any access to it waits
        t0 = time.monotonic()
        check = _bounded("check", "--inventory", inventory, "--json", limit=600)
        t1 = time.monotonic()
        stop = _bounded("stop", run.name, limit=600)
        t2 = time.monotonic()
        print(f"\ncheck: {'still running' if check is None else f'exit {check.rc}'} after {t1 - t0:.0f}s; "
              f"stop: {'still running' if stop is None else f'exit {stop.rc}'} after {t2 - t1:.0f}s")
        assert check is not None and stop is not None, "a node step of check or stop did not end"
        assert check.rc == 1, check.stdout[-3000:] + check.stderr[-2000:]
        hung = [f"{name} on {host}" for name, hosts in json.loads(check.stdout)["checks"].items()
                for host, item in hosts.items() if not item["ok"] and "hung" in item["detail"]]
        assert any(h.endswith("node3") for h in hung), check.stdout[-3000:]
        assert stop.rc == 1 and "node3" in stop.stderr and "hung" in stop.stderr, stop.stdout[-2000:] + stop.stderr
    finally:
        _continue_all(provisioned)
        distrun("stop", run.name, timeout=600)
