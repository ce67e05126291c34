# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The ssh check: this node's logins as the training user to the others (root's node key, certified
by the user CA), or their sshd's banner once a login was proved; and the node's ssh fingerprint, a
digest of what a login depends on here (judged by runner/distrun/preflight/sshmesh.py)."""

import contextlib
import hashlib
import os
import pwd
import re
import socket
import stat
import time

# What a target's sshd says when it drops a connection that has not authenticated yet because
# too many are pending (MaxStartups, 10 by default): every node of a large cluster logging in to
# every other at once sees it, and it says nothing about the target.
SSH_BUSY = re.compile(r"Connection reset by|Connection closed by|kex_exchange_identification")
SSH_TRIES = 3


def probe_ssh(target: str, cfg: ProbeConfig) -> dict:
    for attempt in range(SSH_TRIES):
        proc = run(cfg, login_argv(cfg, target), timeout=cfg.ssh_timeout + 10)
        if proc.returncode == 0:
            return {"ok": True, "check": "login", "detail": "ssh in batch mode works"}
        if attempt + 1 < SSH_TRIES and proc.returncode == 255 and SSH_BUSY.search(proc.stderr or ""):
            time.sleep(0.3 + 0.7 * int.from_bytes(os.urandom(1), "big") / 255)
            continue
        break
    return {"ok": False, "check": "login", "detail": last_line(proc.stderr) or f"ssh exited {proc.returncode}"}


def ssh_order(targets: list[str], me: str) -> list[str]:
    """The targets in the order this node logs in to them: the sorted ring of nodes, starting after
    this one, so that nodes logging in to every other at once each begin with a different one."""
    ring = sorted(set(targets) | {me})
    start = ring.index(me) + 1
    return [t for t in ring[start:] + ring[:start] if t != me and t in targets]


def probe_banner(target: str, cfg: ProbeConfig) -> dict:
    """The cheap check, once a login from here to target was verified and nothing it depends on
    changed: target's sshd answers with its SSH banner where the system's ssh configuration connects
    (``ssh -G`` resolves the host and port from the system's config without connecting). A target
    reached through a proxy, or whose config ssh cannot read, gets the full login instead."""
    timeout = cfg.ssh_timeout
    conf: dict[str, str] = {}
    proc = run(cfg, [*cfg.user_ssh, "-G", "--", target], timeout=timeout + 10)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        conf.setdefault(key.lower(), value.strip())
    if (proc.returncode != 0 or "hostname" not in conf or not conf.get("port", "22").isdigit()
            or conf.get("proxycommand", "none") != "none" or conf.get("proxyjump", "none") != "none"):
        return probe_ssh(target, cfg)
    host, port = conf["hostname"], int(conf.get("port", "22"))
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            first = sock.makefile("rb").readline(256)
            if first.startswith(b"SSH-"):
                # A client's identification before closing: sshd logs a closed connection, not a
                # missing identification string (which intrusion filters may count against the head).
                with contextlib.suppress(OSError):
                    sock.sendall(b"SSH-2.0-distrun-preflight\r\n")
    except socket.timeout:
        return {"ok": False, "check": "banner", "detail": f"sshd does not answer on {host}:{port} within {timeout}s"}
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        return {"ok": False, "check": "banner", "detail": f"sshd does not answer on {host}:{port}: {why}"}
    if not first.startswith(b"SSH-"):
        shown = first.decode("ascii", "replace").strip()[:40] or "nothing"
        return {"ok": False, "check": "banner", "detail": f"{host}:{port} answers {shown!r}, not an SSH banner"}
    return {"ok": True, "check": "banner", "detail": "sshd answers"}


# At most this much of each file counts: a file a job made huge costs the probe nothing.
FINGERPRINT_READ = 1 << 20


def _plain(name: str, dir_fd: int | None = None) -> bytes:
    """What a file is, for the fingerprint: its bytes if it is a regular file (at most
    FINGERPRINT_READ), else a marker. Never through a link, and never blocking on a FIFO: the
    probe runs as root, and the training user's files are a job's to plant."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return b"missing"
    except OSError as exc:  # ELOOP: a link
        return f"unreadable {exc.errno}".encode()
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"not a file {stat.S_IFMT(st.st_mode):o}".encode()
        chunks, left = [], FINGERPRINT_READ
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"file " + f"{st.st_uid} {st.st_mode:o} ".encode() + b"".join(chunks)
    except OSError as exc:
        return f"unreadable {exc.errno}".encode()
    finally:
        os.close(fd)


def _meta(name: str, dir_fd: int | None = None, size: bool = False) -> str:
    """Owner and mode (and size and time) of a path itself, never of what a link points at."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "missing"
    line = f"{st.st_uid} {st.st_mode:o}"
    return f"{line} {st.st_size} {st.st_mtime_ns}" if size else line


def _user_ssh(h: hashlib._Hash, home: str) -> None:
    """The training user's side, read from a descriptor of ~/.ssh opened without following a link:
    authorized keys, known hosts, config and public keys by content, private keys by name, size
    and time only (their contents are never read), and the owner and mode of home, ~/.ssh and
    authorized_keys (sshd refuses keys others may write to)."""
    h.update(f"home {_meta(home)}\0".encode())
    try:
        ssh_fd = os.open(os.path.join(home, ".ssh"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        h.update(f"no .ssh {exc.errno}\0".encode())
        return
    try:
        h.update(f".ssh {_meta(os.path.join(home, '.ssh'))}\0".encode())
        names = sorted(os.listdir(ssh_fd))
        for name in ("authorized_keys", "authorized_keys2", "known_hosts", "config"):
            h.update(f"file {name}\0".encode() + _plain(name, ssh_fd) + b"\0")
        for name in names:
            if name.startswith("id_") and name.endswith(".pub"):
                h.update(f"public {name}\0".encode() + _plain(name, ssh_fd) + b"\0")
            elif name.startswith("id_"):
                h.update(f"key {name} {_meta(name, ssh_fd, size=True)}\0".encode())
    finally:
        os.close(ssh_fd)


def ssh_fingerprint(cfg: ProbeConfig) -> str:
    """A digest of everything on this node a login as the training user depends on (the user's
    passwd entry, ssh files, the system's ssh configuration, root's keys and principals files of the
    user, the user CA sshd trusts, root's node key's certificate and known_hosts, host keys,
    /etc/hosts, and the boot: a reboot counts as a change). Missing or unreadable files
    count as such. Local reads only, no process started."""
    root = cfg.fingerprint_root
    pw = pwd.getpwnam(cfg.user)
    h = hashlib.sha256(f"user {pw.pw_uid} {pw.pw_gid} {pw.pw_dir} {pw.pw_shell}\0".encode())
    _user_ssh(h, os.path.join(root, pw.pw_dir.lstrip("/")))
    system = ["/etc/ssh/sshd_config", "/etc/ssh/ssh_config", "/etc/ssh/ssh_known_hosts", "/etc/hosts",
              "/proc/sys/kernel/random/boot_id", "/etc/ssh/distrun_user_ca.pub",
              f"{NODE_KEY}-cert.pub", ROOT_KNOWN_HOSTS]
    system += [p for d in ("/etc/ssh/sshd_config.d", "/etc/ssh/ssh_config.d", "/etc/ssh/distrun_keys",
                           "/etc/ssh/distrun_principals") for p in _listed(root, d)]
    system += [p for p in _listed(root, "/etc/ssh") if p.rsplit("/", 1)[-1].startswith("ssh_host_") and p.endswith("_key.pub")]
    for path in sorted(set(system)):
        h.update(f"system {path}\0".encode() + _plain(os.path.join(root, path.lstrip("/"))) + b"\0")
    return "sha256:" + h.hexdigest()


def _listed(root: str, folder: str) -> list[str]:
    """The paths of a system folder's entries (as seen from /), sorted; none when it is missing."""
    try:
        return sorted(f"{folder}/{n}" for n in os.listdir(os.path.join(root, folder.lstrip("/"))))
    except OSError:
        return []
