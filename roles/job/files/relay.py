"""distrun's relay: what a launcher starts on another node over ssh (Open MPI's daemons) runs
inside that node's unit of the run, not in the ssh session that asked for it.

Installed by setup, root-owned, with the programs' head (nodecommon.py) in front of it, as
``/usr/local/lib/distrun/relay-<digest>.py`` (role job's install step; the runner names the file,
transport/nodeprog.installed), never a file of the run directory, which the job can rewrite; run
as ``python3 -I <that file> VERB RUN ATTEMPT ...``; standard library only, Python 3.9 or newer.

``serve RUN ATTEMPT [WAIT_S]``: the launch script of a node the launcher reaches over ssh runs
it, so inside the unit launch.py starts for the attempt there (or, without root or systemd, in
the session launch.py gives it). It listens on the abstract socket ``distrun-relay:RUN:ATTEMPT``
of the node, takes one caller of its own uid, starts the caller's command with the caller's
standard input, output and error (passed over the socket), working folder and environment,
answers how it ended, and exits 0 (a relay that served is not the launcher whose exit code
counts: the head's is). No caller within WAIT_S seconds (default 120): it exits 0. With CALLERS
(a detached mpirun run's supervisor, supervise.py, starts its daemons again at each try) it takes
up to that many callers in turn, each within WAIT_S of the last one's end, and a caller whose
whole command is ``--done`` (the supervisor's end) ends it at once.

``join RUN ATTEMPT COMMAND...``: Open MPI runs it on the node instead of its daemon (mpirun's
launch agent), in the ssh session. It connects to the relay (retrying for JOIN_S seconds while
the unit starts), checks that the relay is the run's: where root's record says launch.py
started a unit of this attempt on the node, the relay's process must be in such a unit (a
process of the same account that took the socket's name first gets nothing), hands over the
command and its three descriptors, and exits as the command did. If the ssh session ends first,
the command runs on in the unit: the daemon ends when mpirun does, and the unit with it.

``mesh``: sshd's forced command for the cluster key (mesh.py, composed in front of this file,
says what it allows): what is allowed runs, a daemon's start through ``join`` in this process.
"""

import glob
import json
import os
import socket
import struct
import sys
import time

if "NODECOMMON" not in globals():  # run as a file beside nodecommon.py and mesh.py (the controller's tests)
    for _part in ("nodecommon.py", "mesh.py"):
        _PART = os.path.join(os.path.dirname(os.path.abspath(__file__)), _part)
        with open(_PART, encoding="utf-8") as _head:
            exec(compile(_head.read(), _PART, "exec"))

JOIN_S = 30.0  # how long a caller waits for the relay to listen
WAIT_S = 120.0  # how long a relay waits for its caller
DONE = "--done"  # a caller's whole command that ends a relay serving more than one (supervise.py's end)
MAX_REQUEST = 1 << 20  # the command, its folder and its environment, as JSON
_LEN = struct.Struct("!I")


def address(run: str, attempt: str) -> str:
    """The relay's abstract socket name on its node (a leading NUL: no file anyone could replace)."""
    return f"\0distrun-relay:{run}:{attempt}"


def _args(argv: list) -> "tuple[str, str]":
    if len(argv) < 2 or not plain_name(argv[0]) or not ATTEMPT.fullmatch(argv[1]):
        raise CallError("relay: give a run id and an attempt number")
    return argv[0], argv[1]


def _peer(conn: socket.socket) -> "tuple[int, int]":
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            raise CallError("relay: the caller went away mid-request")
        data += part
    return data


def _wait_status(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _accept(listener: socket.socket, deadline: float, wait_s: float):
    """The next caller of the relay's own uid and its request (conn, argv, cwd, env, fds), or None
    when nobody came by the deadline."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            print(f"relay: nobody came in {wait_s:.0f} s", file=sys.stderr)
            return None
        listener.settimeout(left)
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(10)
        fds: list = []
        _pid, uid = _peer(conn)
        if uid != os.getuid():  # another account's process: nothing
            conn.close()
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, _LEN.size, 3)
            if not msg or len(fds) != 3:
                raise CallError("relay: a request without its three descriptors")
            msg += _recv_exact(conn, max(0, _LEN.size - len(msg)))
            (size,) = _LEN.unpack(msg[:_LEN.size])
            if size > MAX_REQUEST:
                raise CallError("relay: the request is too large")
            request = json.loads(_recv_exact(conn, size))
            argv, cwd, env = request["argv"], request["cwd"], request["env"]
            if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                    and isinstance(cwd, str) and isinstance(env, dict)
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
                raise CallError("relay: a malformed request")
        except (OSError, ValueError, KeyError, TypeError, CallError) as e:  # a bad caller: the next may come
            print(f"relay: {e}", file=sys.stderr)
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        return conn, argv, cwd, env, fds


def _answer(conn: socket.socket, code: int) -> None:
    try:
        conn.settimeout(5)
        conn.sendall(_LEN.pack(code & 0xFF))
    except OSError:
        pass  # the ssh session ended first: nobody to tell
    conn.close()


def serve_callers(run: str, attempt: str, wait_s: float = WAIT_S, callers: int = 1) -> int:
    """Take up to ``callers`` callers in turn, each within wait_s of the last one's end (the
    first: of the start); start each one's command as it asked, tell it how the command ended.
    More than one: a detached mpirun run's supervisor (supervise.py) starts its daemons again for
    each try; a caller whose command is DONE alone ends the relay (the supervisor is done)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(run, attempt))
    except OSError as e:
        print(f"relay: cannot listen as {address(run, attempt)[1:]}: {e}", file=sys.stderr)
        return 3
    listener.listen(4)
    for _ in range(max(1, int(callers))):
        got = _accept(listener, time.monotonic() + wait_s, wait_s)
        if got is None:
            return 0
        conn, argv, cwd, env, fds = got
        if argv == [DONE]:
            for fd in fds:
                os.close(fd)
            _answer(conn, 0)
            return 0
        child = os.fork()
        if child == 0:
            try:
                listener.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                for fd in fds:
                    if fd > 2:
                        os.close(fd)
                try:
                    os.chdir(cwd)
                except OSError:
                    os.chdir("/")
                os.execvpe(argv[0], argv, env)
            except OSError as e:
                os.write(2, f"relay: cannot start {argv[0]}: {e}\n".encode(errors="replace"))
            os._exit(127)
        for fd in fds:
            os.close(fd)
        _answer(conn, _wait_status(child))
    return 0


def _in_unit(pid: int, run: str, attempt: str) -> bool:
    """Whether pid runs in a unit of this attempt under the system manager."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            m = unit_in(f.read(4096), system_units())
    except OSError:
        return False
    return m is not None and m.group(0).startswith(f"distrun:{run}:{attempt}:")


def join(run: str, attempt: str, argv: list, join_s: float = JOIN_S, env: "dict | None" = None) -> int:
    """Hand argv, with this process's descriptors 0-2 and env (default: this process's), to the
    attempt's relay; its exit code."""
    if not argv:
        raise CallError("relay join: give the command to run")
    deadline = time.monotonic() + join_s
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(address(run, attempt))
            break
        except OSError as e:
            conn.close()
            if time.monotonic() >= deadline:
                print(f"relay join: no relay of run {run} attempt {attempt} on {socket.gethostname()} "
                      f"after {join_s:.0f} s ({e.strerror or e}): was the attempt started there?", file=sys.stderr)
                return 255
            time.sleep(0.2)
    pid, uid = _peer(conn)
    contained = glob.glob(os.path.join(glob.escape(RECORDS), glob.escape(f"distrun:{run}:{attempt}:") + "*.launched"))
    if uid != os.getuid() or (contained and not _in_unit(pid, run, attempt)):
        print(f"relay join: the process listening as the relay of run {run} (pid {pid}, uid {uid}) is not in "
              f"the run's unit: nothing started", file=sys.stderr)
        return 255
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ if env is None else env)}).encode()
    socket.send_fds(conn, [_LEN.pack(len(request))], [0, 1, 2])
    conn.sendall(request)
    try:
        code = _recv_exact(conn, _LEN.size)
    except (OSError, CallError):
        print(f"relay join: the relay of run {run} ended before {argv[0]} did (the run was stopped?)", file=sys.stderr)
        return 255
    return _LEN.unpack(code)[0]


def mesh() -> int:
    """sshd's forced command for the cluster key: do what mesh_plan allows, refuse the rest."""
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    try:
        plan = mesh_plan(command, dict(os.environ), os.path.dirname(os.path.abspath(__file__)))
    except CallError as e:
        shown = "".join(c if c.isprintable() else "?" for c in (command or "").strip())[:80]
        print(f"distrun mesh key on {socket.gethostname()}: refused {shown!r} ({e}): the cluster key runs distrun's "
              f"own transfers and daemons only; start work on other nodes through a distrun launcher",
              file=sys.stderr)
        return 1
    if plan[0] == "exit":
        return plan[1]
    if plan[0] == "exec":
        os.execve(plan[1][0], plan[1], plan[2])
    _, run, attempt, argv, env = plan
    return join(run, attempt, argv, env=env)


def main(argv: list) -> int:
    try:
        if argv[:1] == ["serve"]:
            run, attempt = _args(argv[1:])
            wait = float(argv[3]) if len(argv) > 3 else WAIT_S
            return serve_callers(run, attempt, wait, int(argv[4]) if len(argv) > 4 else 1)
        if argv[:1] == ["join"]:
            run, attempt = _args(argv[1:])
            return join(run, attempt, argv[3:])
        if argv == ["mesh"]:
            return mesh()
        raise CallError("relay: give serve RUN ATTEMPT [WAIT_S [CALLERS]], join RUN ATTEMPT COMMAND... or mesh")
    except CallError as e:
        print(e, file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"relay: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
