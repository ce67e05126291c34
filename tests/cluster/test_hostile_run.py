"""Jobs that attack distrun, on the provisioned cluster: each attack must fail, and each
refusal is one clear line. The last test prints how many were tried and how many succeeded.

A job runs as the training user, like any user of a shared cluster: it can replace its own run
dir, fill it, pass any --env, and leave processes behind. What it must not get: files outside
its run dir on the controller, another run's or another user's processes stopped, its --env
secret readable by other local users, or a 'distrun stop' that reports success it did not have.
"""

from __future__ import annotations

import json
import re
import secrets
import textwrap
import threading
import time

from .conftest import distrun, new_train_run, run_processes, train_program
from .hostile import TALLY

ATTACKS: list[tuple[str, bool]] = []
EXPECTED_ATTACKS = 19


def attack(name: str, succeeded: bool, detail: str = "") -> None:
    ATTACKS.append((name, succeeded))
    TALLY.record(name, succeeded)
    assert not succeeded, f"attack succeeded: {name}: {detail}"


# Rank 0 (node1, the head) fills its run dir past the cap with logs (collected whatever their
# size) and leaves a big output (which stays on the node); the ranks on node2 and node3 replace
# theirs with a link to / once their output is written.
LINK_AND_FILL = textwrap.dedent("""
    import os, socket
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    run_dir = os.environ["DISTRUN_RUN_DIR"]
    host = socket.gethostname()
    if comm.Get_rank() == 0:
        for i in range(3):
            with open(os.path.join(run_dir, f"fill-{i}.log"), "wb") as f:
                f.write(os.urandom(1 << 20))
        with open(os.path.join(run_dir, "big.bin"), "wb") as f:
            f.write(os.urandom(3 << 20))
    print(f"SCRIPT rank={comm.Get_rank()} host={host}", flush=True)
    comm.Barrier()
    if host != "node1":
        os.rename(run_dir, run_dir + ".moved")
        os.symlink("/", run_dir)
    comm.Barrier()
""")

# Each rank also leaves a child that drops the run's tag and leaves the rank's session (setsid).
SLEEPER = textwrap.dedent("""
    import os, socket, subprocess, time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    escapee = subprocess.Popen(["env", "-u", "DISTRUN_RUN_ID", "sleep", "600"], start_new_session=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"ESCAPEE host={socket.gethostname()} pid={escapee.pid}", flush=True)
    print(f"SCRIPT rank={comm.Get_rank()} host={socket.gethostname()} token_len={len(os.environ['TOKEN'])}", flush=True)
    time.sleep(600)
""")


def test_a_run_dir_replaced_by_a_link_or_over_the_cap_is_not_followed(provisioned, distrun_home, tmp_path):
    result, run = train_program(distrun_home, tmp_path / "link_and_fill.py", LINK_AND_FILL, {"DISTRUN_COLLECT_MAX_MB": "1"})
    run_dir = f"/srv/distrun/runs/{run.name}"
    try:
        # The job's own exit code is kept: collect's refusals do not change it.
        assert result.rc == 0, result.stdout[-3000:] + result.stderr[-2000:]
        assert json.loads((run / "meta.json").read_text())["rc"] == 0
        nodes = run / "nodes"
        for host in ("node2", "node3"):
            fetched = [p for p in (nodes / host).rglob("*") if p.is_file()] if (nodes / host).exists() else []
            attack(f"collect follows {host}'s run dir linked to /", bool(fetched), str(fetched[:5]))
            refusals = [line for line in result.stderr.splitlines() if line.startswith(f"collect from {host} refused:")]
            assert refusals == [f"collect from {host} refused: {run_dir} is a link or not a folder inside "
                                "/srv/distrun/runs"], result.stderr
        outside = [p for p in nodes.rglob("*") if p.name in ("passwd", "shadow", "authorized_keys")]
        attack("collect brings files from outside the run dir", bool(outside), str(outside))
        # node1 filled its run dir past the 1 MiB cap: collect stops there and says so.
        capped = [line for line in result.stderr.splitlines() if line.startswith("collect from node1 incomplete:")]
        assert len(capped) == 1 and "stopped at the cap of 1.0 MiB" in capped[0], result.stderr
        assert f"the rest stays in {run_dir} on node1" in capped[0]
        brought = sum(p.stat().st_size for p in (nodes / "node1").rglob("*") if p.is_file())
        attack("a run dir over the cap is collected whole", brought > 1 << 20, f"{brought} bytes")
        # The big output never travelled: it stays on node1, listed in the record.
        left = json.loads((run / "left-on-nodes.json").read_text())["hosts"]
        assert left["node1"]["files"] == [{"path": "big.bin", "size": 3 << 20}], left
        assert not (nodes / "node1" / "big.bin").exists()
    finally:
        for k in (2, 3):
            provisioned.exec(k, f"rm -f {run_dir} && rm -rf {run_dir}.moved", check=False)


def test_env_cannot_set_a_reserved_key(provisioned, distrun_home):
    other = "20260101-000000-train-ffff"
    result = distrun("train", "--inventory", "test", "--env", f"DISTRUN_RUN_ID={other}", timeout=120)
    lines = result.stderr.strip().splitlines()
    attack("--env DISTRUN_RUN_ID=<other run>", result.rc == 0, result.stdout[-1000:])
    assert result.rc == 2 and len(lines) == 1, result.stderr
    assert lines[0] == ("distrun: error: train: --env: DISTRUN_RUN_ID: DISTRUN_* variables are set by distrun itself; "
                        "choose another name")


def test_secret_stays_private_and_stop_stops_exactly_this_run(provisioned, distrun_home, tmp_path):
    token = "tok-" + secrets.token_hex(12)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    box: dict = {}
    before = set((distrun_home / "runs").glob("*-train-*"))

    def train() -> None:
        box["train"] = distrun("train", "--inventory", "test", "--script", str(script), "--env", f"TOKEN={token}",
                               timeout=600)

    worker = threading.Thread(target=train)
    worker.start()
    decoys: list[tuple[int, str]] = []
    escapees: list[tuple[int, int]] = []  # (node, pid)
    try:
        run = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run is None:
            r = new_train_run(distrun_home, before)
            log = r / "launcher.log" if r else None
            if log and log.is_file() and len(re.findall(r"SCRIPT rank=\d", log.read_text(errors="replace"))) == 3:
                run = r
            time.sleep(0.3)
        assert run is not None, "the job never started on every rank"

        # (f) the secret, while the job runs: no world-readable file (read as 'nobody'), no argv,
        # no log on any node; in the run record only in the 0600 env file.
        # The token reaches each node's commands on stdin, never in their own argv.
        for k in (1, 2, 3):
            readable = provisioned.exec(k, "runuser -u nobody -- grep -rlF -f - /srv /tmp /var/tmp /home /etc /run "
                                           "/var/log 2>/dev/null; true", input=token, timeout=120).stdout.split()
            attack(f"secret in a world-readable file on node{k}", bool(readable), str(readable))
            argv = provisioned.exec(k, "read -r t; for f in /proc/[0-9]*/cmdline; do "
                                       "tr '\\0' ' ' < $f 2>/dev/null | grep -qF -- \"$t\" && echo $f; done; true",
                                    input=token + "\n").stdout.split()
            attack(f"secret in a process argv on node{k}", bool(argv), str(argv))
            logs = provisioned.exec(k, "read -r t; grep -rlF -- \"$t\" /var/log 2>/dev/null; "
                                       "journalctl --no-pager 2>/dev/null | grep -cF -- \"$t\"; true",
                                    input=token + "\n").stdout.split()
            assert logs in ([], ["0"]), f"node{k}: secret in the system log: {logs}"
            mode = provisioned.exec(k, f"stat -c '%a %U' /srv/distrun/runs/{run.name}/env.sh "
                                       f"/srv/distrun/runs/{run.name}", check=False).stdout.splitlines()
            assert mode == ["600 distrun", "750 distrun"], f"node{k}: {mode}"
        in_record = [str(p.relative_to(run)) for p in run.rglob("*")
                     if p.is_file() and p.name != "env.sh" and token.encode() in p.read_bytes()]
        attack("secret in the run record outside env.sh", bool(in_record), str(in_record))
        assert oct((run / "env.sh").stat().st_mode & 0o777) == "0o600"

        escapees += [(int(h[-1]), int(pid)) for h, pid in
                    re.findall(r"ESCAPEE host=(node\d) pid=(\d+)", (run / "launcher.log").read_text(errors="replace"))]
        assert len(escapees) == 3, escapees
        # (d) decoys: the training user's process of another run, root's process with this run's tag.
        for cmd, label in ((f"runuser -u distrun -- env DISTRUN_RUN_ID=20260101-000000-train-ffff sleep 300", "other run"),
                           (f"env DISTRUN_RUN_ID={run.name} sleep 300", "other user")):
            pid = provisioned.exec(2, f"setsid {cmd} > /dev/null 2>&1 < /dev/null & echo $!").stdout.strip()
            decoys.append((int(pid), label))
        # The job writes the other run's process group into its attempt's launcher file on node2.
        provisioned.exec(2, f"runuser -u distrun -- sh -c 'echo {decoys[0][0]} > /srv/distrun/runs/{run.name}/attempts/0/launcher-node2.pgid'")
        stop = distrun("stop", run.name, timeout=300)
        assert stop.rc == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
        counts = dict(re.findall(r"^\s+(node\d): stopped (\d+) process", stop.stdout, re.M))
        # Every node reports a count. Nodes are stopped side by side, so a node whose ranks
        # mpirun already tore down (another node's stop ended a peer first) truly stops 0.
        assert sorted(counts) == ["node1", "node2", "node3"] and sum(int(n) for n in counts.values()) > 0, stop.stdout
        assert f"run {run.name}: stopped {sum(int(n) for n in counts.values())} process(es) on 3 node(s)" in stop.stdout
        worker.join(timeout=300)
        # (g) the run has ended: its --env values are gone from every node (another run of the
        # same account could read them there).
        for k in (1, 2, 3):
            kept = provisioned.exec(k, f"test -e /srv/distrun/runs/{run.name}/env.sh", check=False).returncode == 0
            attack(f"a finished run's env.sh stays on node{k}", kept)
        left = [p for p in run_processes(provisioned, run.name)
                if not any(p == f"node2:/proc/{pid}/environ" for pid, _ in decoys)]
        attack("'distrun stop' leaves processes of the run", bool(left), str(left))
        for k, pid in escapees:
            alive = provisioned.exec(k, f"kill -0 {pid}", check=False).returncode == 0
            attack(f"a rank's child without the tag, in a session of its own, outlives 'distrun stop' on node{k}", alive)
        for pid, label in decoys:
            alive = provisioned.exec(2, f"kill -0 {pid}", check=False).returncode == 0
            attack(f"'distrun stop' kills a process of {label}", not alive)
    finally:
        for pid, _ in decoys:
            provisioned.exec(2, f"kill -9 {pid}", check=False)
        for k, pid in escapees:
            provisioned.exec(k, f"kill -9 {pid}", check=False)
        # runuser forks: the decoy's own process carries the tag, not the pid '$!' named. Left
        # alive, it would keep node2 busy for later runs.
        provisioned.exec(2, "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null "
                            "| grep -qx 'DISTRUN_RUN_ID=20260101-000000-train-ffff' && kill -9 ${p#/proc/}; done; true",
                         check=False)
        worker.join(timeout=300)


def test_stop_with_a_node_down_fails_and_names_it(provisioned, distrun_home):
    runs = sorted((distrun_home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)
    assert runs
    provisioned.stop_node(3)
    try:
        stop = distrun("stop", runs[-1].name, timeout=300)
    finally:
        provisioned.start_node(3)
    attack("'distrun stop' reports success with node3 down", stop.rc == 0, stop.stdout[-1000:])
    assert stop.rc == 1
    errors = [line for line in stop.stderr.splitlines() if line.startswith("distrun: error:")]
    assert len(errors) == 1 and "could not stop it on node3" in errors[0], stop.stderr
    assert "stopped on every node" not in stop.stdout


def test_hostile_run_count():
    tried = len(ATTACKS)
    succeeded = sum(ok for _, ok in ATTACKS)
    print(f"hostile run: attacks tried {tried}, succeeded {succeeded}")
    assert succeeded == 0
    assert tried >= EXPECTED_ATTACKS, f"only {tried} attacks ran: an earlier test of this file failed"
