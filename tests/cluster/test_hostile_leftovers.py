"""What a run leaves behind it, outside its unit and on the controller: a job that fills shared
memory, SysV IPC and /tmp and then succeeds; a job that runs rootless podman and reaches for the
training user's processes outside its run (the user's systemd manager, its bus, podman's pause
process) and asks that manager for a unit of its own; and a job whose run directory is a few files
at the end of very deep folder chains, and names no terminal should print. Each attack is tallied
in tests/cluster/hostile.py."""

from __future__ import annotations

import json
import os
import textwrap
import uuid

from .conftest import distrun, new_train_run, outside_runs, train_program
from .hostile import TALLY, TRY_TRACE

# Rank 0 of every node: a file in /dev/shm, a SysV shared memory segment, a file in /tmp, all
# left on purpose; then the run ends well.
LEAVE = textwrap.dedent(r'''
    import ctypes, os, socket, sys
    tag = "TAG"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        with open(f"/dev/shm/leak-{tag}", "wb") as f:
            f.write(b"x" * (1 << 20))
        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(int(tag[:7], 16), 1 << 20, 0o1000 | 0o600)  # IPC_CREAT
        with open(f"/tmp/leak-{tag}", "w") as f:
            f.write("left\n")
        sys.stdout.write(f"LEFT {socket.gethostname()} shm={shmid}\n")
''')

# Rank 0 of every node: rootless podman (its pause process), a unit of the user's own systemd
# manager, and every process of its own uid outside its run's unit: signalled (0) and traced.
OUTSIDE = TRY_TRACE + textwrap.dedent(r'''
    import json, os, socket, subprocess, sys
    tag = "TAG"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        said = {}
        def sh(cmd):
            p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
            return [p.returncode, (p.stdout + p.stderr)[-300:]]
        said["podman"] = sh("podman unshare true")
        said["systemd-run"] = sh(f"systemd-run --user --collect -- bash -c 'exec -a leftover-{tag} sleep 600'")
        mine = open("/proc/self/cgroup").read()
        reached = []
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                if os.stat(f"/proc/{pid}").st_uid != os.getuid() or open(f"/proc/{pid}/cgroup").read() == mine:
                    continue
                where = [ln.split(":", 2)[2] for ln in open(f"/proc/{pid}/cgroup").read().splitlines()
                         if ln.split(":")[1] in ("", "name=systemd")][0]
                comm = open(f"/proc/{pid}/comm").read().strip()
                os.kill(pid, 0)
            except (OSError, IndexError):
                continue
            reached.append([comm, where, try_trace(pid) is True])
        said["reached"] = reached
        sys.stdout.write("OUTSIDE " + json.dumps({socket.gethostname().split(".")[0]: said}) + "\n")
''')


def test_no_process_of_the_training_user_outlives_a_run_or_lives_outside_it(provisioned, distrun_home, tmp_path):
    tag = uuid.uuid4().hex[:8]
    script = tmp_path / "outside.py"
    script.write_text(OUTSIDE.replace("TAG", tag))
    # torchrun: every node's agent starts in that node's unit, with no login (mpirun's daemons'
    # ssh logins are logins of the user's, with their own session: docs/guide/security.md).
    before = set((distrun_home / "runs").glob("*-train-*"))
    res = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(script), timeout=600)
    try:
        run = new_train_run(distrun_home, before)
        assert run is not None, res.stdout[-3000:] + res.stderr[-2000:]
        # Every node's rank log, collected into the record (the head's output is live besides).
        out = res.stdout + res.stderr + "".join(f.read_text(errors="replace") for f in (run / "nodes").rglob("*")
                                                if f.is_file() and f.name in ("stdout", "stdout.log"))
        said: dict = {}
        for chunk in out.split("OUTSIDE ")[1:]:
            said.update(json.JSONDecoder().raw_decode(chunk)[0])
        assert res.rc == 0 and set(said) == {"node1", "node2", "node3"}, out[-3000:]
        assert all(s["podman"][0] == 0 for s in said.values()), said  # rootless podman works in a run
        # A login of the user's (the harness's su) has its own scope, and the user's manager while it
        # lasts: those are a login's, not distrun's.
        logins = {f"node{k}": provisioned.exec(k, "loginctl list-sessions --no-legend | awk '$3 == \"distrun\"' | wc -l",
                                                check=False).stdout.strip() not in ("", "0") for k in (1, 2, 3)}
        reached = {n: [r for r in s["reached"] if "/session-" not in r[1]
                       and not (logins.get(n) and r[1].endswith("/init.scope"))] for n, s in said.items()}
        left = outside_runs(provisioned)
        print(f"\nreached from the run: {reached}\nleft after the run: {left}")
        unit = {k: provisioned.exec(k, f"pgrep -f -- '[l]eftover-{tag}' || true", check=False).stdout.split()
                for k in (1, 2, 3)}
        found = [TALLY.record("a job signals and traces a process of its uid outside its run (the user's manager, "
                              "its bus, podman's pause process)", any(any(r[2] for r in v) for v in reached.values())),
                 TALLY.record("systemd-run --user from a job starts a unit outside its run",
                              any(unit.values()) or any(s["systemd-run"][0] == 0 for s in said.values())),
                 TALLY.record("a process of the training user outlives a run that ran rootless podman",
                              any(left.values()))]
        assert not any(found), (reached, unit, left, {n: s["systemd-run"] for n, s in said.items()})
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"pkill -f -- '[l]eftover-{tag}'; true", check=False)


# Rank 0 of the head: CHAINS files, each at the end of a chain of DEPTH folders, and two files
# whose names are not text.
DEEP = textwrap.dedent(r'''
    import os
    tag = "TAG"
    if os.environ.get("RANK", "0") == "0":
        top = os.path.join(os.environ["DISTRUN_RUN_DIR"], "deep")
        for c in range(CHAINS):
            path = os.path.join(top, f"c{c}", *["d"] * DEPTH)
            os.makedirs(path, exist_ok=True)
            open(os.path.join(path, "f"), "w").close()
        base = os.fsencode(os.environ["DISTRUN_RUN_DIR"])
        for name in (b"ctl-\x1b[2J\x07-" + tag.encode(), b"bad-\xff\xfe-" + tag.encode()):
            open(os.path.join(base, name), "w").close()
''').replace("CHAINS", "200").replace("DEPTH", "200")


def test_a_run_leaves_nothing_in_shared_memory_ipc_or_tmp(provisioned, distrun_home, tmp_path):
    tag = uuid.uuid4().hex[:8]
    res, _ = train_program(distrun_home, tmp_path / "leave.py", LEAVE.replace("TAG", tag), {})
    try:
        assert res.rc == 0 and res.stdout.count("LEFT ") == 3, res.stdout[-3000:] + res.stderr[-2000:]
        key = f"0x{int(tag[:7], 16):08x}"
        shm = {k: provisioned.exec(k, f"test -e /dev/shm/leak-{tag}", check=False).returncode == 0 for k in (1, 2, 3)}
        ipc = {k: key in provisioned.exec(k, "ipcs -m", check=False).stdout for k in (1, 2, 3)}
        tmp = {k: provisioned.exec(k, f"test -e /tmp/leak-{tag}", check=False).returncode == 0 for k in (1, 2, 3)}
        print(f"\nafter the run: /dev/shm {shm}, SysV segment {key} {ipc}, /tmp {tmp}")
        found = [TALLY.record("a finished run leaves a file in /dev/shm", any(shm.values())),
                 TALLY.record("a finished run leaves a SysV shared memory segment", any(ipc.values())),
                 TALLY.record("a finished run leaves a file in /tmp", any(tmp.values()))]
        assert not any(found), (shm, ipc, tmp)
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"rm -f /dev/shm/leak-{tag} /tmp/leak-{tag}; ipcrm -M 0x{int(tag[:7], 16):08x} "
                                "2>/dev/null; true", check=False)


def _entries(root: bytes) -> tuple[int, int, list[bytes]]:
    """Folders, deepest path (in folders) and names that are not printable text, below root."""
    folders, deepest, odd = 0, 0, []
    for top, dirs, files in os.walk(root):
        folders += len(dirs)
        deepest = max(deepest, top[len(root):].count(b"/"))
        for name in dirs + files:
            try:
                text = name.decode("utf-8")
            except UnicodeDecodeError:
                odd.append(name)
                continue
            if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
                odd.append(name)
    return folders, deepest, odd


def test_collect_brings_no_deep_folder_chains_and_no_names_that_are_not_text(provisioned, distrun_home, tmp_path):
    tag = uuid.uuid4().hex[:8]
    res, run = train_program(distrun_home, tmp_path / "deep.py", DEEP.replace("TAG", tag), {})
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]  # the job's own exit code is kept
    folders, deepest, odd = _entries(os.fsencode(run / "nodes"))
    print(f"\nthe record holds {folders} folders, {deepest} deep; names that are not text: {odd[:4]}")
    print("collect said: " + " | ".join(ln for ln in res.stderr.splitlines() if ln.startswith("collect")))
    found = [TALLY.record("collect makes thousands of folders on the controller for a few hundred files",
                          folders > 2000),
             TALLY.record("collect stores a name with control bytes or bytes that are not UTF-8 on the controller",
                          bool(odd))]
    assert not any(found), (folders, deepest, odd[:4])
