"""distrun's node program: what one node knows of a run's processes, as one JSON line.

``python3 -I -c <nodecommon.py + this file> VERB '<config JSON>'``, as the training user or as
root (below). Standard library only; Python 3.9 or newer.
Every verb prints exactly one JSON object on stdout, ``{"verb": VERB, ...}``; a bad call prints
one line on stderr and exits 2 (nodecommon.py: the protocol, the names and the unit's).

  scan   {"run": R, "run_dir": D}  the processes of run R here; without "run", of every run:
         {"runs": {run: [{"pid", "ppid", "pgid", "sid", "comm", "why"}, ...]}}
  stop   {"run": R, "run_dir": D, "grace_s": N}  TERM every process of R, KILL what is left
         after N s: {"units": n, "stopped": n, "killed": n, "survived": [{"pid", "comm", "why"}]}
  claim  {"host": H, "run": R, "hold_s": N, "gpu_ids": [i, ...], "total": G}  take this host (or
         only GPUs i, ... of its G) for run R: {"claimed": true, "gpu_ids": [...]}, held while a
         line arrives on stdin at least every N s; or {"claimed": false, "held": bool, "runs":
         [...], "gpu_ids": [...], "free": [...], "owners": {run: name}}: the run whose controller
         holds it, or the runs with processes here, and the GPUs they hold of those asked; with
         "ask": true, only which GPUs are free. By root, in root's /run/distrun/claims: no job
         can hold, trace or stop it (claim's docstring: the rules)
"proc" in any config names another /proc (a test's view of chosen processes).

Called by root (``"user"`` in the config names the training user), stop first stops the run's
units (roles/job/files/launch.py starts every launcher in one), and both verbs look at that
user's processes; otherwise at the caller's own (the kernel keeps its kill to them anyway).
Which processes are a run's, by this evidence:
  0. the unit: a process in the cgroup of the system manager's unit ``distrun:<run>:<attempt>:
     <host>.service`` is that run's, whatever else it did (the training user cannot leave it);
and for processes outside any run's unit (mpirun's daemons started over ssh, runs launched
where there is no root or no systemd), the oldest first:
  1. ancestry: a process whose parent (or its parent, ...) belongs to a run belongs to it;
  2. session and process group: a member of a session or group whose leader (pid = sid or
     pgid) belongs to a run belongs to it; processes join a session or group only by fork or
     inside their own session, so no other run's process can enter one;
  3. the launch script: ``bash launch-<host>.sh`` working in its attempt's folder
     D/attempts/<n> and leading a session that holds a process tagged R (stop and scan of one
     run): the job owns D's path and may point it at another run's folder, but cannot put a
     process into another run's session;
  4. the tag: DISTRUN_RUN_ID=<run> in the environment the process was started with.
A scan (and so a claim) counts no process that an ended Slurm job left behind: one in slurmd's
cgroup (where proctrack/linuxproc keeps a job's processes) with no slurmstepd of root's among its
ancestors, such as rootless podman's pause process, which leaves its job's tree and keeps the
job's environment, its tag too (_left_by_slurm); stop still ends it, and slurmd's epilog (role
slurm) does when the job ends.
A process of R that forges another run's tag stays R's while it has an ancestor or a session
leader of R. The job writes the run's ``launcher-*.pgid`` files (those of the last attempt's
folder count), so one only adds a group whose leader is gone and that holds a process of R
(every member then); a forged pgid names nothing.
Stop signals by pidfd after reading the start time again: a reused pid is never hit.

Limits: every run shares one account, so a job may ptrace, or stop, another run's processes
itself. Outside a unit, a process that drops its tag (env -i), leaves its session (setsid) and
outlives its parents (re-parented to init) carries no evidence left, and one that keeps a forged
tag of another run after the same escape is counted as that run's.
"""

import errno
import os
import pwd
import re
import signal
import subprocess
import sys
import time

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): nodecommon.py from beside it
    _HEAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nodecommon.py")
    with open(_HEAD, encoding="utf-8") as _head:
        exec(compile(_head.read(), _HEAD, "exec"))  # the same one namespace as the composed source on a node
    _PART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "claim.py")
    with open(_PART, encoding="utf-8") as _part:
        exec(compile(_part.read(), _PART, "exec"))  # claim.py, the part before this program

LAUNCH_SCRIPT = re.compile(r"launch-[^/]+\.sh")
SLURMD = "slurmd.service"  # slurmd's unit: a Slurm job's processes live in its cgroup under proctrack/linuxproc
STEPD = "slurmstepd"  # root's process of a job's step on a node: it lives while the step runs


def _read(path: str, limit: int = 4 << 20) -> bytes | None:
    """Up to limit bytes of a file; never a link's target, never waiting on a FIFO a job made."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    chunks: list[bytes] = []
    try:
        while sum(map(len, chunks)) < limit and (chunk := os.read(fd, 1 << 16)):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)[:limit]


class Proc:
    """One process as /proc shows it: pid, parent, group, session, start time, uid, tag."""

    def __init__(self, root: str, pid: int, stat: bytes, units: str = "/system.slice/") -> None:
        self.root, self.pid = root, pid
        comm_end = stat.rindex(b")")
        self.comm = stat[stat.index(b"(") + 1:comm_end].decode(errors="replace")[:32]
        fields = stat[comm_end + 2:].split()
        self.state = fields[0].decode()
        self.ppid, self.pgid, self.sid = int(fields[1]), int(fields[2]), int(fields[3])
        self.start = int(fields[19])
        self.uid = next((int(ln.split()[1]) for ln in (_read(f"{root}/{pid}/status") or b"").splitlines()
                         if ln.startswith(b"Uid:")), -1)
        self.tag: str | None = None
        tag = f"{TAG}=".encode()
        for kv in (_read(f"{root}/{pid}/environ") or b"").split(b"\0"):
            if kv.startswith(tag):
                value = kv[len(tag):].decode(errors="replace")
                self.tag = value if NAME.fullmatch(value) else ""
                break
        # The unit a process runs in (launch.py starts each launcher as one): a cgroup no process
        # of the training user can leave, of the system manager's (the user's own names any).
        cgroup = (_read(f"{root}/{pid}/cgroup", 4096) or b"").decode(errors="replace")
        m = unit_in(cgroup, units)
        self.unit_run = m.group(1) if m else None
        # slurmd's own cgroup: where proctrack/linuxproc keeps a Slurm job's processes (scan: _left_by_slurm)
        self.in_slurmd = (cgroup.strip().splitlines() or [""])[-1].split(":", 2)[-1].removeprefix(units) == SLURMD
        self.owner: str | None = None
        self.why = ""

    def launches_in(self, run_dir: str) -> bool:
        """Whether this is a launch script's shell working in run_dir (cwd and argv)."""
        argv = (_read(f"{self.root}/{self.pid}/cmdline") or b"").split(b"\0")
        if len(argv) < 3 or not LAUNCH_SCRIPT.fullmatch(os.path.basename(argv[-2].decode(errors="replace"))):
            return False
        try:
            cwd = os.readlink(f"{self.root}/{self.pid}/cwd")
        except OSError:
            return False
        # its attempt's folder, attempts/<n>/
        return os.path.dirname(cwd) == os.path.join(run_dir, ATTEMPTS) and os.path.basename(cwd).isdigit()


def processes(root: str) -> dict[int, Proc]:
    """Every live process (zombies are gone already) that /proc shows."""
    found: dict[int, Proc] = {}
    units = system_units(root)
    for name in os.listdir(root):
        if name.isdigit() and (stat := _read(f"{root}/{name}/stat")):
            try:
                p = Proc(root, int(name), stat, units)
            except (ValueError, IndexError):
                continue
            if p.state not in ("Z", "X"):
                found[p.pid] = p
    return found


def _last_attempt(run_dir: str) -> str | None:
    """The folder of the run's last attempt (attempts/<n>/, the highest n), if any: an earlier
    attempt was stopped before the next began, so its recorded groups may be others' by now."""
    try:
        numbers = [int(n) for n in os.listdir(os.path.join(run_dir, ATTEMPTS)) if n.isdigit() and len(n) < 10]
    except OSError:
        return None
    return os.path.join(run_dir, ATTEMPTS, str(max(numbers))) if numbers else None


def _pgid_files(run_dir: str) -> set[int]:
    """The groups the run's launch scripts recorded (regular files only; the job can write them)
    in the last attempt's folder."""
    groups: set[int] = set()
    folder = _last_attempt(run_dir)
    try:
        names = os.listdir(folder) if folder else []
    except OSError:
        return groups
    for name in names:
        if name.startswith("launcher-") and name.endswith(".pgid"):
            text = (_read(os.path.join(folder, name), 32) or b"").strip()
            if text.isdigit() and int(text) > 1:
                groups.add(int(text))
    return groups


def attribute(procs: dict[int, Proc], run: str | None = None, run_dir: str | None = None) -> None:
    """Set each process's owner (a run id) and why, by the evidence in the module's docstring."""
    real_dir = os.path.realpath(run_dir) if run_dir else None
    # A launch script's session counts only while it holds a process tagged with the run: the
    # job can re-point its run directory's path at another run's, never enter that run's session.
    tagged = {p.sid for p in procs.values() if run and p.tag == run}
    direct: dict[int, tuple[str, str]] = {}
    for p in procs.values():
        if real_dir and p.pid == p.sid and p.pid in tagged and p.launches_in(real_dir):
            direct[p.pid] = (str(run), "launcher")
        elif p.tag:
            direct[p.pid] = (p.tag, "tag")
    prev: dict[int, str | None] = {}
    for _ in range(4):  # a leader's owner may come from its own session: settle in a few passes
        cur: dict[int, tuple[str | None, str]] = {}
        for pid in procs:
            _settle(pid, procs, direct, prev, cur)
        owners = {pid: o for pid, (o, _) in cur.items()}
        if owners == prev:
            break
        prev = owners
    for pid, (owner, why) in cur.items():
        procs[pid].owner, procs[pid].why = owner, why
    for p in procs.values():
        if p.unit_run:
            p.owner, p.why = p.unit_run, "unit"
    if run and run_dir:
        for g in _pgid_files(run_dir):
            members = [p for p in procs.values() if g in (p.pgid, p.sid)]
            if g in procs or not members:
                continue  # its leader lives: the evidence above said whose it is
            if any(p.owner == run for p in members):
                for p in members:
                    if p.owner != run:
                        p.owner, p.why = run, "group"


def _settle(pid: int, procs: dict[int, Proc], direct: dict[int, tuple[str, str]],
            prev: dict[int, str | None], cur: dict[int, tuple[str | None, str]]) -> None:
    """The owner of pid and of its ancestors not settled yet, the oldest first (no recursion:
    a job may build a chain of any depth)."""
    chain: list[Proc] = []
    seen: set[int] = set()
    q = procs.get(pid)
    while q is not None and q.pid not in cur and q.pid not in seen:
        chain.append(q)
        seen.add(q.pid)
        q = procs.get(q.ppid)
    for q in reversed(chain):
        parent = cur.get(q.ppid, (None, ""))[0] if q.ppid != q.pid else None
        if parent:
            cur[q.pid] = (parent, "descendant")
            continue
        for leader, why in ((q.sid, "session"), (q.pgid, "group")):
            owner = cur[leader][0] if leader in cur else prev.get(leader)
            if leader != q.pid and leader in procs and owner:
                cur[q.pid] = (owner, why)
                break
        else:
            cur[q.pid] = direct.get(q.pid, (None, ""))


def _uid(cfg: dict) -> int:
    """The uid whose processes a verb looks at: the caller's, or, called by root, the training
    user's (cfg "user"): root's own processes are never a run's."""
    if os.getuid() != 0 or cfg.get("user") is None:
        return os.getuid()
    try:
        uid = pwd.getpwnam(str(cfg.get("user", ""))).pw_uid
    except KeyError:
        raise CallError(f"called by root: user {cfg.get('user')!r} is not an account here") from None
    return uid


def _mine(procs: dict[int, Proc], uid: int) -> dict[int, Proc]:
    """uid's processes, less this program and its ancestors: a stop never ends its caller."""
    spared: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in spared:
        spared.add(pid)
        stat = _read(f"/proc/{pid}/stat") or b") X 0"
        pid = int(stat[stat.rindex(b")") + 2:].split()[1])
    return {p.pid: p for p in procs.values() if p.uid == uid and p.pid not in spared}


def _left_by_slurm(p: Proc, procs: dict[int, Proc]) -> bool:
    """Whether p is what a Slurm job left behind when it ended: a process in slurmd's cgroup (a
    job's, under proctrack/linuxproc) with no slurmstepd of root's among its ancestors. A job's
    steps run under their slurmstepd for as long as the job runs, and no process of the job can
    leave a live ancestor's line but by leaving the job (re-parented to init, as rootless podman's
    pause process is): a job cannot make its running steps look ended, and what it left outside
    them (its environment still tagged with the run) makes no run look alive. slurmd's epilog
    (role slurm) ends such processes; until it has, they count for no run. Under proctrack/cgroup
    a job's processes are in the job's own cgroup, which Slurm empties at the job's end."""
    if not p.in_slurmd:
        return False
    seen: set[int] = set()
    q = procs.get(p.ppid)
    while q is not None and q.pid not in seen:
        if q.comm == STEPD and q.uid == 0:
            return False
        seen.add(q.pid)
        q = procs.get(q.ppid) if q.ppid != q.pid else None
    return True


def scan(cfg: dict) -> dict:
    run, run_dir = cfg.get("run") or None, cfg.get("run_dir") or None
    procs = processes(cfg.get("proc") or "/proc")
    attribute(procs, run, run_dir)
    runs: dict[str, list[dict]] = {}
    for p in sorted(_mine(procs, _uid(cfg)).values(), key=lambda p: p.pid):
        if p.owner is not None and (run is None or p.owner == run) and not _left_by_slurm(p, procs):
            runs.setdefault(p.owner, []).append(
                {"pid": p.pid, "ppid": p.ppid, "pgid": p.pgid, "sid": p.sid, "comm": p.comm, "why": p.why})
    return {"verb": "scan", "runs": runs}


def _signal(root: str, pid: int, start: int, sig: int) -> bool:
    """Send sig to pid only while it is the process that started at start; True when it was sent.
    A pidfd holds the process while its start time is read: its pid cannot be reused meanwhile."""
    fd = None
    try:
        try:
            fd = os.pidfd_open(pid) if root == "/proc" and hasattr(os, "pidfd_open") else None
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return False  # gone already; any other error (no pidfds here): by pid below
        stat = _read(f"{root}/{pid}/stat")
        if not stat or int(stat[stat.rindex(b")") + 2:].split()[19]) != start:
            return False
        signal.pidfd_send_signal(fd, sig) if fd is not None else os.kill(pid, sig)
        return True
    except (OSError, ValueError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _stop_units(run: str, grace: float) -> int:
    """Called by root: stop the run's units here (systemd ends every process in each, TERM then
    KILL); how many there were."""
    if os.getuid() != 0 or not os.path.isdir("/run/systemd/system"):
        return 0
    try:
        listed = subprocess.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--type=service",
                                 f"distrun:{run}:*"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    units = [w[0] for w in (ln.split() for ln in listed.stdout.splitlines()) if w and UNIT.fullmatch(w[0])]
    units = [u for u in units if UNIT.fullmatch(u).group(1) == run]
    if units:
        subprocess.run(["systemctl", "stop", *units], capture_output=True, timeout=grace + 30, check=False)
    return len(units)


def stop(cfg: dict) -> dict:
    run, run_dir, root = cfg["run"], cfg.get("run_dir") or None, cfg.get("proc") or "/proc"
    grace = float(cfg.get("grace_s", 10))
    uid = _uid(cfg)
    procs = processes(root)
    attribute(procs, run, run_dir)
    found = {(p.pid, p.start) for p in _mine(procs, uid).values() if p.owner == run}  # counted if a unit's stop ends them
    units = _stop_units(run, grace) if root == "/proc" else 0
    seen: dict[tuple[int, int], Proc] = {}  # (pid, start time): what was signalled, with its evidence
    killed: set[tuple[int, int]] = set()
    deadline = time.monotonic() + grace
    kill_until = deadline + 5
    while True:
        now = time.monotonic()
        procs = processes(root)
        attribute(procs, run, run_dir)
        live = {(p.pid, p.start): p for p in _mine(procs, uid).values()}
        ours = {k: p for k, p in live.items() if p.owner == run}
        # Once stopped, a process stays the run's whoever its parents are now (an orphan of a
        # killed rank); new ones need evidence of their own.
        ours.update({k: live[k] for k in seen if k in live})
        if not ours or now >= kill_until:
            break
        sig = signal.SIGKILL if now >= deadline else signal.SIGTERM
        for key, p in ours.items():
            if key not in seen or (sig == signal.SIGKILL and key not in killed):
                if _signal(root, p.pid, p.start, sig):
                    seen.setdefault(key, p)
                    if sig == signal.SIGKILL:
                        killed.add(key)
        time.sleep(0.1)
    survived = [{"pid": p.pid, "comm": p.comm, "why": p.why or "stopped"} for p in ours.values()] if ours else []
    return {"verb": "stop", "run": run, "units": units, "stopped": len(found | set(seen)), "killed": len(killed), "survived": survived}


VERBS = {"scan": scan, "stop": stop, "claim": claim}


def _check(verb: str, cfg: dict) -> None:
    """A run id (scan may go without one: every run), seconds in range, an absolute run_dir."""
    run = cfg.get("run")
    if (verb != "scan" or run) and not plain_name(run):
        raise CallError(f"{verb}: run {run!r} is empty or not a run id")
    for key in ("grace_s", "hold_s"):
        value = cfg.get(key, 10)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3600:
            raise CallError(f"{verb}: {key} {value!r} is not a number of seconds from 0 to 3600")
    if cfg.get("run_dir") is not None and not os.path.isabs(str(cfg["run_dir"])):
        raise CallError(f"{verb}: run_dir {cfg['run_dir']!r} is not an absolute path")


def main(argv: list[str]) -> int:
    return serve("node.py", VERBS, argv, _check, errors=(KeyError, TypeError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
