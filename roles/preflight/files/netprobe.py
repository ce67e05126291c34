"""distrun preflight, network part: the TCP connections ranks will open, tried for real.

One of the preflight probe's parts, composed in front of probe.py into one ``python3 -c`` (the
one recipe: runner/distrun/transport/nodeprog.py; standard library only); probe.py starts it
first, in a thread, so every node listens while the others call. The head listens on the
rendezvous port (torchrun's, and MASTER_PORT of every torch program) and every other node calls
it; in the full set ('distrun check') every node also listens on a port of Open MPI's TCP range
and every node calls every other one there, as Open MPI's TCP transport does between ranks. A
listener greets each caller with the run's nonce, so another program on the port is never taken
for it, and learns the caller's name. Two runs' probes on one node take turns (``take_turn``):
another run's probe listening on the rendezvous port is neither in use by a leftover nor a
foreign program, only a probe whose turn ends in seconds.
"""

import fcntl
import hashlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterable

# Root's folder for the probes' turn (root-owned, writable by root only).
TURN_DIR = "/run/distrun"


def take_turn(folder: str = TURN_DIR, wait_s: float = 60.0) -> None:
    """As root: wait until no other run's probe on this node holds the turn (at most ``wait_s``),
    then hold it until this probe ends (the lock goes with the process). Without a root-owned
    folder to hold it in, the probe goes on at once."""
    try:
        if os.geteuid() != 0:
            return
        os.makedirs(folder, mode=0o755, exist_ok=True)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return
        fd = os.open(os.path.join(folder, "probe.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def range_ports(nonce: str, host: str, low: int, high: int, count: int = 4) -> list[int]:
    """Ports of a range that ``host`` tries to listen on, in order; every node computes the same."""
    out: list[int] = []
    for i in range(64):
        digest = hashlib.sha256(f"{nonce}/{host}/{i}".encode()).digest()
        port = low + int.from_bytes(digest[:4], "big") % (high - low + 1)
        if port not in out:
            out.append(port)
        if len(out) == count:
            break
    return out


def greeting(nonce: str, host: str, port: int | None) -> bytes:
    return f"DISTRUN-NETPROBE {nonce} {host} {port}\n".encode()


class Listener:
    """Listens on the first port of ``ports`` it can bind, greets each caller and notes its name,
    until every expected caller came or the deadline passed and ``busy`` (the node's probe still
    at its other checks) is no longer set."""

    def __init__(self, nonce: str, me: str, ports: list[int], expect: Iterable[str], deadline: float,
                 address: str = "0.0.0.0", busy: threading.Event | None = None) -> None:
        self.nonce, self.me, self.expect, self.deadline = nonce, me, set(expect), deadline
        self.busy = busy or threading.Event()
        self.seen: set[str] = set()
        self.port: int | None = None
        self.error = ""
        self.sock: socket.socket | None = None
        self.greeters: list[threading.Thread] = []
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
                s.listen(64)
            except OSError as exc:
                s.close()
                self.error = f"port {port}: {exc.strerror or exc}"
                continue
            self.sock, self.port = s, port
            break
        self.thread = threading.Thread(target=self._serve, daemon=True)
        if self.sock is not None:
            self.thread.start()

    def _serve(self) -> None:
        assert self.sock is not None  # started only with a socket
        self.sock.settimeout(0.1)
        while (time.monotonic() < self.deadline or self.busy.is_set()) and not self.expect <= self.seen:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            # Each caller in its own thread: every other node calls at once (the head's
            # rendezvous port hears from all of them), and one served after another would keep
            # the last ones waiting for their greeting longer than they wait.
            self.greeters.append(threading.Thread(target=self._greet, args=(conn,), daemon=True))
            self.greeters[-1].start()
        self.sock.close()

    def _greet(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(1.0)
                conn.sendall(greeting(self.nonce, self.me, self.port))
                name = conn.recv(256).decode(errors="replace").strip()
                if name:
                    self.seen.add(name)
                conn.recv(16)  # the caller closes first: no TIME_WAIT is left on this port
            except OSError:
                pass

    def result(self) -> dict:
        if self.sock is None:
            return {"ok": False, "detail": f"could not listen ({self.error})"}
        self.thread.join(max(0.0, self.deadline - time.monotonic()) + 1)
        for t in self.greeters:  # a caller greeted just before the deadline is counted
            t.join(2.5)
        return {"ok": True, "port": self.port, "seen": sorted(self.seen)}


def call(me: str, nonce: str, peer: str, address: str, ports: list[int], deadline: float, late: float | None = None,
         busy: threading.Event | None = None) -> dict:
    """Connect to ``peer``'s listener, retrying until the deadline (it may not listen yet); on
    failure, what went wrong in words the judge turns into a cause. A refused connection is tried
    until ``late`` (default: the deadline): nothing listens there yet while that node's own probe
    has not started, and on many nodes the play starts the probes over several seconds.

    The peer listens on the first of ``ports`` it could bind (a port of the range may be taken by
    one of its own outgoing connections), so a port that refuses is not given up on, but the
    ports are tried in turn until one answers; a port where another program answers is dropped.

    A refusal is also tried again while ``busy`` is set (this node's probe is still at its other
    checks): on loaded nodes the probes start further apart than the deadlines, and both sides
    keep listening and calling as long as either waits anyway."""
    if not address:
        # The peer has no address on the run's network (distrun_network): nothing to call, and
        # an empty address would reach this node itself.
        return {"ok": False, "address": "", "port": ports[0] if ports else 0, "error": "no address", "foreign": False}
    last, foreign = "timeout", False
    todo = list(ports)
    turn = 0
    late = max(deadline, late or deadline)
    while todo and (time.monotonic() < (late if last == "refused" else deadline)
                    or (last == "refused" and busy is not None and busy.is_set())):
        port = todo[turn % len(todo)]
        turn += 1
        left = deadline - time.monotonic()
        try:
            s = socket.create_connection((address, port), timeout=max(0.05, min(1.0, left)))
        except ConnectionRefusedError:
            last = "refused"
            time.sleep(0.05 if time.monotonic() < late else 0.25)
            continue
        except socket.timeout:
            last = "timeout"
            continue
        except OSError as exc:
            last = "unreachable: " + (exc.strerror or str(exc))
            time.sleep(0.2)
            continue
        with s:
            try:
                s.settimeout(max(0.05, min(2.0, deadline - time.monotonic())))
                said = s.recv(256)
            except OSError:
                said = b""
            if said == greeting(nonce, peer, port):
                s.sendall(f"{me}\n".encode())
                return {"ok": True, "address": address, "port": port}
        if not said:
            # Accepted, and no greeting yet: a listener busy with other callers on a loaded
            # node, not another program. Called again until the deadline.
            last = "silent"
            continue
        if said.startswith(b"DISTRUN-NETPROBE "):
            # Another run's probe, whose turn on that node ends within seconds: as a refusal.
            last = "refused"
            time.sleep(0.1)
            continue
        foreign, last = True, "foreign"
        todo.remove(port)
    return {"ok": False, "address": address, "port": ports[0] if ports else 0, "error": last, "foreign": foreign}


class NetworkProbe:
    """Listen as ``cfg`` says and call every peer, in threads; ``result()`` waits for both.

    cfg: nonce, timeout (s), head, peers (name -> address: every node of the run, this one too),
    rendezvous (the head's port, 0: none), mpi_range ("low-high", "": not probed), listen_address.
    """

    def __init__(self, me: str, cfg: dict) -> None:
        timeout = cfg.get("timeout", 8)  # as given: the judge's words quote it
        self.said = {"timeout": timeout, "mpi_range": cfg.get("mpi_range", "")}
        nonce = str(cfg["nonce"])
        deadline = time.monotonic() + float(timeout)
        # How late a peer's probe may start (the play reaches the nodes over seconds): as long
        # again. Listeners wait that long for callers not seen yet; calls retry a refusal as long.
        late = deadline + float(timeout)
        peers = {p: a for p, a in (cfg.get("peers") or {}).items() if p != me}
        head, rendezvous = cfg.get("head", ""), int(cfg.get("rendezvous") or 0)
        address = cfg.get("listen_address") or "0.0.0.0"
        self.listeners: dict[str, Listener] = {}
        jobs: dict[str, tuple[str, str, list[int]]] = {}
        self.busy = threading.Event()  # cleared by result(): the probe's other checks are done
        self.busy.set()
        if rendezvous and me == head:
            self.listeners["rendezvous"] = Listener(nonce, me, [rendezvous], peers, late, address, self.busy)
        elif rendezvous and head in peers:
            jobs[f"rendezvous {head}"] = (head, peers[head], [rendezvous])
        if cfg.get("mpi_range"):
            low, high = (int(x) for x in str(cfg["mpi_range"]).split("-"))
            self.listeners["mpi"] = Listener(nonce, me, range_ports(nonce, me, low, high), peers, late, address, self.busy)
            for peer, peer_address in sorted(peers.items()):
                jobs[f"mpi {peer}"] = (peer, peer_address, range_ports(nonce, peer, low, high))
        self.calls: dict[str, dict] = {}

        def run(key: str, job: tuple[str, str, list[int]]) -> None:
            self.calls[key] = call(me, nonce, job[0], job[1], job[2], deadline, late, self.busy)

        self.threads = [threading.Thread(target=run, args=(k, j), daemon=True) for k, j in jobs.items()]
        for t in self.threads:
            t.start()

    def result(self) -> dict:
        self.busy.clear()
        for t in self.threads:
            t.join()
        return {**self.said, "listen": {k: v.result() for k, v in self.listeners.items()},
                "calls": dict(sorted(self.calls.items()))}
