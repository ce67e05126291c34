"""The probe's side of the head's ssh check, run for real: each node's ssh fingerprint (read
under a folder standing in for /) and the banner check against a local TCP server that answers
as sshd, as something else, or not at all."""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from distrun.transport.remote import USER_SSH

from .probe_text import probe_text

PROBE = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files" / "probe.py"
HOME = pwd.getpwnam("root").pw_dir.strip("/")  # the probes below check as root: its home, under the folder


def run_probe(**cfg) -> dict:
    base = {"host": "here", "user": "root", "env_prefix": "/nonexistent", "mpi_prefix": "", "shared_dir": "/tmp",
            "ssh_timeout": 2, "user_ssh": list(USER_SSH)}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps({**base, **cfg})], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# The fingerprint: what a login as the training user depends on, read under a folder standing in for /.

@pytest.fixture()
def node(tmp_path) -> Path:
    root = tmp_path / "node"
    for path, text in {f"{HOME}/.ssh/authorized_keys": "ssh-ed25519 AAAA head\n", f"{HOME}/.ssh/id_ed25519": "PRIVATE-1\n",
                       f"{HOME}/.ssh/id_ed25519.pub": "ssh-ed25519 AAAA head\n", f"{HOME}/.ssh/known_hosts": "node2 ssh-ed25519 BBBB\n",
                       "etc/ssh/ssh_host_ed25519_key.pub": "ssh-ed25519 HOST1\n", "etc/ssh/sshd_config": "Port 22\n",
                       "proc/sys/kernel/random/boot_id": "boot-1\n"}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def fingerprint(root: Path) -> str:
    found = run_probe(ssh_fingerprint_root=str(root))
    assert found["setup"]["ok"] is False  # the probe stops at the missing env; the fingerprint comes first
    return found["ssh_fingerprint"]


def test_the_fingerprint_is_stable_while_nothing_changes(node):
    first = fingerprint(node)
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 64
    assert fingerprint(node) == first


@pytest.mark.parametrize("path,text", [(f"{HOME}/.ssh/authorized_keys", "ssh-ed25519 OTHER head\n"),
                                       ("etc/ssh/ssh_host_ed25519_key.pub", "ssh-ed25519 HOST2\n"),
                                       ("proc/sys/kernel/random/boot_id", "boot-2\n"),
                                       ("etc/ssh/sshd_config.d/10-local.conf", "PubkeyAuthentication no\n"),
                                       (f"{HOME}/.ssh/config", "Host node2\n  Port 2222\n")])
def test_the_fingerprint_changes_with_what_a_login_depends_on(node, path, text):
    before = fingerprint(node)
    (node / path).parent.mkdir(parents=True, exist_ok=True)
    (node / path).write_text(text)
    assert fingerprint(node) != before


def test_a_missing_authorized_keys_and_an_open_ssh_folder_change_the_fingerprint(node):
    before = fingerprint(node)
    (node / f"{HOME}/.ssh/authorized_keys").unlink()
    assert fingerprint(node) != before
    (node / f"{HOME}/.ssh/authorized_keys").write_text("ssh-ed25519 AAAA head\n")
    assert fingerprint(node) == before
    (node / f"{HOME}/.ssh").chmod(0o777)  # sshd's StrictModes refuses the keys then
    assert fingerprint(node) != before


def test_a_private_keys_contents_are_never_read(node):
    key = node / f"{HOME}/.ssh/id_ed25519"
    before, st = fingerprint(node), key.stat()
    key.write_text("PRIVATE-2\n")  # same size, same time: only the contents differ
    os.utime(key, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint(node) == before
    key.write_text("PRIVATE-22\n")  # a new key is noticed by its size and time
    assert fingerprint(node) != before


# The banner check: a local server answers as sshd, as something else, or not at all.

@pytest.fixture()
def server() -> Iterator:
    servers: list[socket.socket] = []
    heard: list[bytes] = []

    def start(greeting: bytes) -> int:
        sock = socket.create_server(("127.0.0.1", 0))
        servers.append(sock)

        def serve() -> None:
            conn, _ = sock.accept()
            with conn:
                conn.sendall(greeting)
                conn.settimeout(2)
                try:
                    heard.append(conn.recv(100))
                except OSError:
                    pass

        threading.Thread(target=serve, daemon=True).start()
        return sock.getsockname()[1]

    start.heard = heard  # type: ignore[attr-defined]
    yield start
    for s in servers:
        s.close()


def banner(target: str) -> dict:
    found = run_probe(env_prefix=sys.prefix, ssh_mode="banner", ssh_targets=[target])
    return found["ssh"][target]


def test_an_sshd_banner_passes_and_the_probe_says_who_it_is(server):
    port = server(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
    assert banner(f"ssh://127.0.0.1:{port}") == {"ok": True, "check": "banner", "detail": "sshd answers"}
    assert server.heard == [b"SSH-2.0-distrun-preflight\r\n"]


def test_something_else_on_the_port_fails_the_banner_check(server):
    port = server(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert banner(f"ssh://127.0.0.1:{port}") == {
        "ok": False, "check": "banner", "detail": f"127.0.0.1:{port} answers 'HTTP/1.1 400 Bad Request', not an SSH banner"}


def test_a_closed_port_fails_the_banner_check():
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    found = banner(f"ssh://127.0.0.1:{port}")
    assert found == {"ok": False, "check": "banner", "detail": f"sshd does not answer on 127.0.0.1:{port}: Connection refused"}


def test_without_a_baseline_the_head_logs_in():
    found = run_probe(env_prefix=sys.prefix, ssh_targets=["ssh://127.0.0.1:1"])
    assert found["ssh"]["ssh://127.0.0.1:1"]["check"] == "login"


def test_the_probe_running_as_root_never_follows_a_link_or_waits_on_a_fifo_in_the_users_home(node, tmp_path):
    """A job runs as the training user and may plant anything in its home: a link to a root-only
    file is fingerprinted as a link (its target's contents never read), a FIFO does not hang the
    probe, and ~/.ssh itself replaced by a link is not followed either."""
    secret = tmp_path / "root-only"
    secret.write_text("first\n")
    (node / f"{HOME}/.ssh/config").symlink_to(secret)
    os.mkfifo(node / f"{HOME}/.ssh/known_hosts2")
    (node / f"{HOME}/.ssh/authorized_keys").unlink()
    os.mkfifo(node / f"{HOME}/.ssh/authorized_keys")
    before = fingerprint(node)  # returns: the FIFO was not opened for a blocking read
    secret.write_text("second\n")
    assert fingerprint(node) == before, "the link's target was read"
    elsewhere = tmp_path / "elsewhere"
    (node / f"{HOME}/.ssh").rename(elsewhere)
    (node / f"{HOME}/.ssh").symlink_to(elsewhere)
    linked = fingerprint(node)
    (elsewhere / "id_ed25519.pub").write_text("ssh-ed25519 CHANGED head\n")
    assert fingerprint(node) == linked, "~/.ssh as a link was followed"


# The mesh of logins: every node logs in to every other at once in 'distrun check'. On a dozen
# nodes and more, a target's sshd drops pending connections past MaxStartups (10 by default).

FAKE_SSH = r"""#!/bin/sh
# ssh as the probe calls it: ... -N ... -- USER@TARGET. Logs start and end; 'busy' drops the first try.
eval "target=\${$#}"
target="${target#*@}"
SSH_LOG="$(dirname "$0")/../ssh.log"  # the probe runs ssh with an environment of its own
echo "start $target $(date +%s.%N)" >> "$SSH_LOG"
echo "$*" >> "$SSH_LOG.argv"
sleep 0.3
echo "end $target $(date +%s.%N)" >> "$SSH_LOG"
if [ "$target" = busy ] && [ ! -e "$SSH_LOG.busy" ]; then
    touch "$SSH_LOG.busy"
    echo "kex_exchange_identification: Connection closed by remote host" >&2
    exit 255
fi
[ "$target" != down ] || { echo "ssh: connect to host down port 22: Connection refused" >&2; exit 255; }
exit 0
"""


def test_the_mesh_logs_in_to_a_ring_of_the_others_a_few_at_a_time_and_retries_a_busy_sshd(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    log = tmp_path / "ssh.log"
    targets = [f"n{i:02d}" for i in range(1, 13) if i != 5] + ["busy", "down"]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SSH_LOG": str(log)}
    base = {"host": "n05", "user": "root", "env_prefix": sys.prefix, "mpi_prefix": "", "shared_dir": str(tmp_path),
            "ssh_timeout": 2, "user_ssh": list(USER_SSH), "ssh_targets": targets}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps(base)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    ssh = json.loads(out.stdout.strip().splitlines()[-1])["ssh"]
    # A dropped pending connection is tried again; a refused one is reported as it is.
    assert ssh["busy"]["ok"] and all(ssh[t]["ok"] for t in targets if t != "down"), ssh
    assert ssh["down"] == {"ok": False, "check": "login", "detail": "ssh: connect to host down port 22: Connection refused"}
    events = [line.split() for line in log.read_text().splitlines()]
    starts = [t for kind, t, _ in events if kind == "start"]
    # The ring starts after this node (n05): every node of a mesh begins with a different target.
    # (The first four start together: their order in the log is the processes' race.)
    assert sorted(starts[:4]) == ["n06", "n07", "n08", "n09"], starts
    running, most = 0, 0
    for kind, _, _ in sorted(events, key=lambda e: float(e[2])):
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert most <= 4, f"{most} logins at once"
    # Every login is root's, with root's node key and known hosts, reads the system's client
    # configuration only (never a ~/.ssh/config a job wrote) and runs nothing on the target (-N):
    # no process of the training user's answers for it, here or there.
    argvs = (tmp_path / "ssh.log.argv").read_text().splitlines()
    assert len(argvs) == len(targets) + 1, argvs  # 'busy' twice
    assert all(a.startswith("-F /etc/ssh/ssh_config -o BatchMode=yes -o IdentitiesOnly=yes -i /etc/distrun/node_key "
                            "-o UserKnownHostsFile=/etc/distrun/known_hosts -o StrictHostKeyChecking=yes "
                            "-o ConnectTimeout=2 -N -f -o ControlMaster=yes ") for a in argvs), argvs
    assert all(a.split(" -- ")[1].startswith("root@") and len(a.split(" -- ")[1].split()) == 1 for a in argvs), argvs
