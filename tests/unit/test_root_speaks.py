"""Root never believes a process of the training user's uid, and no such process speaks for a run.

A process of the training user's uid can be traced by any job of that user (no Yama on many
kernels), signalled (a stopped process under runuser or sudo stops them too, and what waits on
them hangs), and fed through files the user writes. So the commands the runner sends to a node for
a run are root's where the connection can be root, and the node programs take the training user's
filesystem identity themselves (role distrun's distrun_fsuser.py); the few that must run a program
as that user are named here, each a limit the security guide states. The programs are run here
for real, as root with 'nobody''s rights, where the kernel says what they did.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from distrun.run import attempt_shell, busy, collect, collect_rules, liveness, staging
from distrun.transport import nodeprog, remote

from .plans import plan_for
from .test_launchers import MIXED, cluster

ROOT_FIRST = 'if [ "$(id -u)" = 0 ]; then exec bash -c "$c"; '


def _plan():
    return plan_for(cluster(dict(list(MIXED.items())[:3])), run_id="r1", launcher="mpirun")


def test_every_command_that_speaks_for_a_run_starts_as_root_where_the_connection_can_be_root():
    plan = _plan()
    host = plan.placement.head.name
    commands = {
        "launch": attempt_shell.launch_command(plan, host),
        "follow": attempt_shell.tail_command(plan, host),
        "wait": attempt_shell.wait_command(plan, host),
        "stop": attempt_shell.stop_command(plan),
        "state": liveness.probe_command(plan, host),
        "claim": busy.claim_command(host, "r1", "distrun"),
        "upload": staging.upload_command("distrun", "r1"),
        "collect": collect.pack_command(plan.run_dir, "distrun", collect_rules.run_end_selection()),
    }
    for name, command in commands.items():
        assert command.startswith("c=") and ROOT_FIRST in command, f"{name}: {command[:120]}"
        # Nothing runs as the training user before the node program when root can run it.
        head = command.split(ROOT_FIRST)[0]
        assert "runuser" not in head and "sudo -n -u" not in head, name


@pytest.fixture
def nobody_dir():
    """A folder 'nobody' owns, in a folder every user may enter (pytest's are root's 0700)."""
    if os.geteuid() != 0:
        raise AssertionError("these tests switch a root process's filesystem identity: run them as root")
    top = Path(tempfile.mkdtemp(prefix="distrun-root-speaks-"))
    top.chmod(0o755)
    mine = top / "nobody"
    mine.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(mine, nobody.pw_uid, nobody.pw_gid)
    yield top, mine
    shutil.rmtree(top, ignore_errors=True)


def _program(name: str, verb: str, cfg: dict, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", nodeprog.text(name), verb, json.dumps(cfg)], input=stdin,
                          capture_output=True, timeout=60)


def test_the_packer_reads_with_the_users_rights_never_through_a_link_and_keeps_its_caps(nobody_dir):
    top, mine = nobody_dir
    (top / "root-only").write_text("root's secret\n")
    (top / "root-only").chmod(0o600)
    runs = mine / "runs"
    run = runs / "r1"
    (run / "ranks").mkdir(parents=True)
    (run / "ranks" / "rank.0.log").write_text("epoch 1\n")
    (run / "secret.log").symlink_to(top / "root-only")
    (run / "deep" / "a" / "b" / "c").mkdir(parents=True)
    (run / "deep" / "a" / "b" / "c" / "x.log").write_text("deep\n")
    (run / "attempts" / "0").mkdir(parents=True)  # the attempt's ssh key: small, and never brought
    (run / "attempts" / "0" / "mesh-key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    for p in [runs, *runs.rglob("*")]:
        os.lchown(p, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    selection = collect_rules.run_end_selection()
    cfg = {"user": "nobody", "run_dir": str(run), "patterns": selection.regex(), "never": selection.never_regex(),
           "small": 1 << 20, "listed": True, "gzip": False, "max_files": 10, "max_entries": 100, "max_depth": 2}
    done = _program("pack", "pack", cfg)
    assert done.returncode == 0, done.stderr
    tar = done.stdout[done.stdout.index(b"\0") + 1:]
    members = subprocess.run(["tar", "-tf", "-"], input=tar, capture_output=True, check=True).stdout.decode().split()
    assert members == ["ranks/rank.0.log"], members  # the link is no file; the deep one is past the cap
    assert b"root's secret" not in done.stdout
    assert b"PRIVATE KEY" not in done.stdout and b"mesh-key" not in done.stdout  # not sent, not even listed
    # A run dir replaced by a link is refused, exit 3 (collect's protocol), one line.
    shutil.rmtree(run)
    run.symlink_to(top)
    refused = _program("pack", "pack", cfg)
    assert refused.returncode == 3 and b"is a link" in refused.stderr


def test_the_upload_and_its_removal_are_the_users_files_written_by_root(nobody_dir):
    """files.py put and remove, as root with 'nobody''s rights (whose home is the test's folder):
    the run's upload is 0600 and the user's; a link at the folder's place is refused; remove takes
    only what the user could."""
    top, mine = nobody_dir
    text = nodeprog.text("files").replace(
        'if __name__ == "__main__":', f'incoming = lambda user: {str(mine)!r} + "/.cache/distrun/incoming"\n'
                                      'if __name__ == "__main__":')

    def files(verb: str, cfg: dict, stdin: bytes = b"") -> dict:
        done = subprocess.run([sys.executable, "-I", "-c", text, verb, json.dumps(cfg)], input=stdin,
                              capture_output=True, timeout=60)
        said = nodeprog.answer(done.stdout.decode(), verb)
        assert said is not None, done.stderr
        return said

    assert files("put", {"user": "nobody", "run": "r1"}, b'{"bundle": "x"}') == {"verb": "put", "put": 15}
    path = mine / ".cache" / "distrun" / "incoming" / "r1.json"
    assert path.read_bytes() == b'{"bundle": "x"}' and path.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    assert (path.stat().st_mode & 0o777) == 0o600 and (path.parent.stat().st_mode & 0o777) == 0o700
    (top / "root-only").write_text("root's\n")
    said = files("remove", {"user": "nobody", "run": "r1", "paths": [str(top / "root-only")]})
    assert said["removed"] == 1 and said["kept"] == [str(top / "root-only")] and not path.exists()
    assert (top / "root-only").exists()  # root's file, in root's folder: not the user's to remove
    # A link put in the incoming folder's place: refused, and root's folder gets nothing.
    shutil.rmtree(mine / ".cache" / "distrun" / "incoming")
    (mine / ".cache" / "distrun" / "incoming").symlink_to(top)
    said = files("put", {"user": "nobody", "run": "r2"}, b"{}")
    assert "error" in said and not (top / "r2.json").exists()


def test_the_file_server_serves_the_users_files_as_that_user_and_nothing_else(nobody_dir):
    """The sshfs mode's head side, driven by OpenSSH's own sftp client (-D: a local server)."""
    top, mine = nobody_dir
    server = top / "fileserver.py"
    server.write_text(nodeprog.text("fileserver"))  # as role shared_fs installs it: the one recipe's text
    (top / "local.txt").write_text("hello\n")
    (top / "root-only").write_text("root's secret\n")
    (top / "root-only").chmod(0o600)
    batch = "\n".join([
        f"put {top}/local.txt {mine}/a.txt", f"mkdir {mine}/d", f"rename {mine}/a.txt {mine}/d/b.txt",
        f"symlink {top}/root-only {mine}/link", f"get {mine}/d/b.txt {top}/got.txt", f"chmod 600 {mine}/d/b.txt", ""])
    sftp = shutil.which("sftp")
    assert sftp, "this test needs OpenSSH's sftp client (apt install openssh-client)"
    argv = [sftp, "-b", "-", "-D", f"{sys.executable} -I {server} serve nobody {mine}"]
    done = subprocess.run(argv, input=batch, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (top / "got.txt").read_text() == "hello\n"
    b = mine / "d" / "b.txt"
    assert b.stat().st_uid == pwd.getpwnam("nobody").pw_uid and (b.stat().st_mode & 0o777) == 0o600
    # Through a link, or into root's folder: the user's rights, so no.
    for line in (f"get {mine}/link {top}/stolen", f"put {top}/local.txt {top}/planted"):
        refused = subprocess.run(argv, input=line + "\n", capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "Permission denied" in refused.stdout + refused.stderr, line
    assert not (top / "stolen").exists() and not (top / "planted").exists()


def test_the_signer_certifies_the_runs_hosts_addresses_minutes_and_the_relay_only(tmp_path):
    ca = tmp_path / "ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    namespace: dict = {"__name__": "distrun_sign"}
    exec(compile(nodeprog.text("sign"), "sign.py", "exec"), namespace)  # noqa: S102 - the program itself
    cfg = {"run": "r1", "user": "distrun", "attempt": "2", "hosts": ["n1", "n2"], "addresses": ["10.0.0.1", "10.0.0.2"],
           "minutes": 30, "forced": nodeprog.mesh_command()}
    said = namespace["sign"](cfg, ca=str(ca))
    assert said["verb"] == "sign" and "error" not in said, said
    (tmp_path / "k-cert.pub").write_text(said["cert"])
    shown = subprocess.run(["ssh-keygen", "-L", "-f", str(tmp_path / "k-cert.pub")], capture_output=True, text=True,
                           check=True).stdout
    principals = shown.split("Principals:")[1].split("Critical Options:")[0].split()
    assert principals == ["distrun@n1", "distrun@n2"]
    assert f"force-command {nodeprog.mesh_command()}" in shown and "source-address 10.0.0.1,10.0.0.2" in shown
    assert "Extensions: (none)" in shown  # no pty, no forwarding
    valid = shown.split("Valid: from ")[1].split("\n")[0]
    start, end = valid.split(" to ")
    from datetime import datetime
    span = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    assert span.total_seconds() == 35 * 60, valid  # the run's minutes, and 5 back for clocks apart
    # A bad call is one line and exit 2: hosts that are not plain names, a forced command with a comma.
    for bad in ({**cfg, "hosts": ["n1,n9"]}, {**cfg, "forced": "a,b"}, {**cfg, "minutes": 99999}):
        done = _program("sign", "sign", bad)
        assert done.returncode == 2 and done.stderr.count(b"\n") == 1, done.stderr


def test_the_claim_is_roots_where_root_calls(tmp_path):
    assert '"user": "distrun"' in busy.claim_command("n1", "r1", "distrun")
    assert remote.as_root_or_user("u", "x").startswith("c=")
