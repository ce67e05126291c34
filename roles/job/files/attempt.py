"""distrun's node program for one attempt's launcher on one node, once started (role job's
files/launch.py starts it): follow it to its end, say its state.

``python3 -I -c <nodecommon.py + distrun_fsuser.py + this file> VERB '<config JSON>'``: as root
with the training user's filesystem identity (no process of that user's, which a job could trace
and make say anything, speaks for the run), else as that user. Standard library only; Python 3.9
or newer. Every verb prints one JSON object as its last line, ``{"verb": VERB, ...}``; a bad call
prints one line on stderr and exits 2 (nodecommon.py: the protocol, the names and the config's
checks). The config names the attempt: ``run``, ``host``, ``attempt`` (its number), ``dir`` (the
attempt's folder), ``script``, ``log`` and ``exit_file`` (names in it), ``user`` (the training user).

  follow  ({"log": true} also prints the launcher's log, each line as "| <line>") wait for the
          launcher's end: {"exit": rc} or {"error": why}
  state   the attempt here now: {"dir", "launcher", "rc", "signal", "procs", "started", "supervisor"}
          (state's docstring; "supervisor": the head supervisor's record of its tries, or null)

A launcher that launch.py started in a systemd unit ended as root's record for the unit says
(``/run/distrun/<unit>.exit``, in a folder only root writes), never as a file in the run
directory says; without a unit, it ended with the exit code the script wrote into its attempt's
folder, which the job can write too (the limits in docs/guide/security.md).
"""
import os
import pwd
import re
import stat
import sys
import time

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): the head and the switch of identity
    _HERE = os.path.dirname(os.path.abspath(__file__))
    for _part in (f"{_HERE}/nodecommon.py", f"{_HERE}/../../distrun/module_utils/distrun_fsuser.py"):
        with open(_part, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _part, "exec"))  # the same one namespace as the composed source on a node

UNIT_LOOK_S = 3  # how often a follower without the unit's exit record asks systemd whether it has the unit
START_WAIT_S = 60  # a launcher with neither a record nor a pid file after this did not start
LINE_MAX = 64 << 10  # bytes of the launcher's log per line printed; a longer one is cut
PUMP_MAX = 1 << 20  # bytes of the log read between two looks at the launcher's end
CLOSE_MAX = 256 << 20  # bytes of the log read at most once the launcher ended


def _no_record(cfg: dict, unit: str) -> dict:
    """The follower's answer for a unit that systemd no longer runs and that left no exit record."""
    why = unit_failure(unit)
    return {"error": f"{cfg['host']}: systemd ended the launcher's unit {unit} without running its script to an end"
                     + (f": {why}" if why else f"; see 'journalctl -u {unit}' on {cfg['host']}")}


class Log:
    """The launcher's log followed as it grows; each line printed as '| <line>', valid UTF-8.

    What the job writes is data: a line ends at "\n", "\r\n" or "\r" (a progress bar's
    update is a line, and nothing after a "\r" reaches the controller unframed), and one longer
    than LINE_MAX bytes is cut. Each look reads at most PUMP_MAX bytes, so a log fed without end
    (a FIFO, another process appending) never keeps the follower from the launcher's end; once
    that came, only what the log held then is read."""

    def __init__(self, path: str) -> None:
        self.path, self.rest, self.cr = path, b"", False
        self.fd: int | None = None

    def pump(self, limit: int = PUMP_MAX) -> None:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                return
        fd = self.fd
        while limit > 0:
            try:
                chunk = os.read(fd, min(1 << 16, limit))
            except OSError:  # a FIFO with nothing in it now, or not a file at all
                break
            if not chunk:
                break
            limit -= len(chunk)
            self._frame(chunk)

    def _frame(self, chunk: bytes) -> None:
        data = self.rest + chunk
        if self.cr and data.startswith(b"\n"):
            data = data[1:]  # the rest of a "\r\n" whose "\r" ended the last line
        self.cr = data.endswith(b"\r")
        parts = re.split(rb"\r\n|\r|\n", data)
        self.rest = parts.pop()
        lines = [p[i:i + LINE_MAX] for p in parts for i in range(0, max(len(p), 1), LINE_MAX)]
        while len(self.rest) > LINE_MAX:
            lines.append(self.rest[:LINE_MAX])
            self.rest = self.rest[LINE_MAX:]
        self._write(lines)

    @staticmethod
    def _write(lines: list[bytes]) -> None:
        if lines:
            sys.stdout.flush()
            sys.stdout.buffer.write(b"".join(LOG_PREFIX.encode() + ln.decode(errors="replace").encode() + b"\n" for ln in lines))
            sys.stdout.buffer.flush()

    def close(self) -> None:
        """Read what the log holds now (a regular file: up to its present size), then its last line."""
        self.pump()
        if self.fd is not None:
            try:
                st = os.fstat(self.fd)
                left = st.st_size - os.lseek(self.fd, 0, os.SEEK_CUR) if stat.S_ISREG(st.st_mode) else 0
            except OSError:
                left = 0
            self.pump(min(left, CLOSE_MAX))
            os.close(self.fd)
        if self.rest:
            self._write([self.rest])


def _alive(pid: int, script: str) -> bool:
    """Whether pid is still the shell running script (not ended, not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return False
    return line[line.rindex(b")") + 2:][:1] not in (b"Z", b"X") and script.encode() in argv


def _read_small(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, 64).decode(errors="replace").strip()
    finally:
        os.close(fd)


def follow(cfg: dict) -> dict:
    unit = unit_name(cfg)
    where = cfg["dir"]
    log = Log(os.path.join(where, cfg["log"])) if cfg.get("log") else None
    exit_file, pid_file = os.path.join(where, cfg["exit_file"]), os.path.join(where, cfg["pid_file"])
    contained = root_file(record_path(unit, "launched")) is not None
    started, pid, looked = time.monotonic(), None, 0.0

    def ended() -> dict | None:
        nonlocal pid, looked
        if contained:
            said = root_file(record_path(unit, "exit"))
            if said is None:
                # systemd writes it after the unit's last process ended: until then the unit runs,
                # unless systemd no longer has the unit (asked every few seconds), and then no
                # record ever comes. (Where cgroups lie differs between machines and containers:
                # not read here.)
                if time.monotonic() - looked < UNIT_LOOK_S:
                    return None
                looked = time.monotonic()
                if not unit_gone(unit):
                    return None
                if root_file(record_path(unit, "exit")) is not None:
                    return ended()  # written as the unit ended
                return _no_record(cfg, unit)
            code = record_status(said.decode(errors="replace"))
            if code is None:
                return {"error": f"{cfg['host']}: the launcher's unit {unit} ended without an exit code "
                                 f"({said.decode(errors='replace').strip()[:80]})"}
            return {"exit": code}
        text = _read_small(exit_file)
        if text is not None:
            return {"exit": int(text)} if re.fullmatch(r"-?\d{1,4}", text) else {
                "error": f"{cfg['host']}: {exit_file} holds no exit code"}
        if pid is None:
            written = _read_small(pid_file) or ""
            pid = int(written) if written.isdigit() else None
            wait_s = cfg.get("start_wait_s", START_WAIT_S)
            if pid is None and time.monotonic() - started > wait_s:
                return {"error": f"{cfg['host']}: the launcher did not start: no {pid_file} after {wait_s} s"}
        elif not _alive(pid, cfg["script"]):
            time.sleep(0.5)  # its exit code is written as it ends
            if _read_small(exit_file) is None:
                return {"error": f"{cfg['host']}: the launcher ended without writing {exit_file}"}
            return ended()
        return None

    me = pwd.getpwuid(os.getuid()).pw_name
    run_dir = str(cfg.get("run_dir") or where)
    if not os.access(run_dir, os.R_OK | os.X_OK):
        return {"verb": "follow", "error": f"{cfg['host']}: cannot enter the run directory {run_dir} as user {me} "
                                           "(is the shared folder mounted, and is it the training user's?)"}
    if not os.access(where, os.R_OK | os.X_OK):
        return {"verb": "follow", "error": f"{cfg['host']}: cannot enter {where} as user {me} (the attempt was not staged there)"}
    while True:
        if log is not None:
            log.pump()
        # An unreadable folder (a dropped mount, the job) fails the attempt: never a success.
        if not os.access(where, os.R_OK | os.X_OK):
            return {"verb": "follow", "error": f"{cfg['host']}: the run directory {run_dir} is no longer readable "
                                               f"as user {me} (is the shared folder still mounted?)"}
        end = ended()
        if end is not None:
            if log is not None:
                time.sleep(0.1)
                log.close()
            return {"verb": "follow", **end}
        time.sleep(0.05)


def _tagged(run: str, user: str) -> int:
    """How many live processes of the training user (of the caller, where it is not root) carry
    the run's tag in their environment: a run without a unit has no better evidence."""
    tag, n, uid = f"{TAG}={run}".encode(), 0, os.getuid() or pwd.getpwnam(user).pw_uid  # as_the_user found it
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                n += tag in f.read().split(b"\0")
        except OSError:
            continue
    return n


def state(cfg: dict) -> dict:
    """What this node says of the attempt now: {"dir", "launcher": one of LAUNCHER_STATES, "rc",
    "signal" (the signal's name where root's record says one ended the launcher, else null),
    "procs", "started": [ranks]}; a launcher in a unit is judged by its unit and its record only,
    and its processes are the unit's (the kernel's cgroup of each, whatever their uid)."""
    said: dict = {"verb": "state", "dir": False, "launcher": "none", "rc": None, "signal": None, "procs": 0, "started": []}
    unit = unit_name(cfg)
    contained = root_file(record_path(unit, "launched")) is not None
    said["procs"] = unit_processes(unit) if contained else _tagged(cfg["run"], cfg["user"])
    if contained:  # whatever became of the run directory, which the job may move or lock
        record = root_file(record_path(unit, "exit"))
        if record is not None:
            text = record.decode(errors="replace")
            code = record_status(text)
            said.update(launcher="exited" if code is not None else "gone", rc=code)
            if code is not None and text.split()[1] in ("killed", "dumped"):
                said["signal"] = text.split()[2]  # a signal ended it (a stop of its unit): no exit of its own
        elif unit_gone(unit) and root_file(record_path(unit, "exit")) is None:
            said["launcher"] = "gone"  # systemd no longer has the unit, and it never wrote the record
        else:
            said["launcher"] = "running"  # no record yet: systemd writes it when the unit has ended
    if not os.access(str(cfg.get("run_dir") or cfg["dir"]), os.R_OK | os.X_OK):
        return said
    said["dir"] = True
    if not os.access(cfg["dir"], os.R_OK | os.X_OK):
        return said  # not staged here: no launcher, no rank
    try:
        names = os.listdir(os.path.join(cfg["dir"], str(cfg.get("started", "started"))))
    except OSError:
        names = []
    said["started"] = sorted({int(n[5:]) for n in names if n.startswith("rank-") and n[5:].isdigit()})
    said["supervisor"] = small_json(os.path.join(cfg["dir"], SUPERVISOR_RECORD))  # the training user's file, as it is
    if contained:
        return said
    where = cfg["dir"]
    text = _read_small(os.path.join(where, cfg["exit_file"]))
    if text is not None:
        ok = re.fullmatch(r"-?\d{1,4}", text)
        said.update(launcher="exited" if ok else "gone", rc=int(text) if ok else None)
        return said
    pid = _read_small(os.path.join(where, cfg["pid_file"]))
    if pid:
        alive = pid.isdigit() and _alive(int(pid), cfg["script"])
        try:
            alive = alive and os.readlink(f"/proc/{pid}/cwd") == os.path.realpath(where)
        except OSError:
            alive = False
        said["launcher"] = "running" if alive else "gone"
    return said


def as_the_user(verb):
    """The verb with the training user's filesystem identity where this program is root."""
    def run(cfg: dict) -> dict:
        if os.geteuid() == 0 and cfg.get("user") != "root":
            try:
                become(cfg["user"])  # noqa: F821 - distrun_fsuser.py, sent in front of this program
            except FsUserError as exc:  # noqa: F821
                return {"verb": verb.__name__, "error": str(exc)}
        return verb(cfg)
    return run


VERBS = {"follow": as_the_user(follow), "state": as_the_user(state)}


def main(argv: list[str]) -> int:
    return serve("attempt.py", VERBS, argv, check_attempt)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
