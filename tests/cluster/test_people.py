"""People on the real cluster: `distrun setup` makes one account per person of distrun_users on
every node, each logs in with their own key only, and a person taken off the list loses every
way in and every process at the next setup, while their files stay."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from distrun.transport import nodeprog

from .conftest import REPO, distrun

pytestmark = pytest.mark.cluster

PEOPLE = (("alice", 2101), ("bob", 2102))


def _keys(folder: Path) -> dict[str, Path]:
    keys = {}
    for name, _ in PEOPLE:
        key = folder / f"id_{name}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@laptop", "-f", str(key)], check=True)
        keys[name] = key
    return keys


def _inventory(folder: Path, keys: dict[str, Path], names: tuple[str, ...], admins: tuple[str, ...] = ("alice",)) -> Path:
    """The test inventory (the same nodes and settings) with distrun_users listing ``names``, the
    admins among them."""
    inv = folder / f"people-{'-'.join(names) or 'none'}"
    shutil.rmtree(inv, ignore_errors=True)
    shutil.copytree(REPO / "inventory" / "test", inv)
    users = [{"name": n, "uid": uid, "ssh_keys": [keys[n].with_suffix(".pub").read_text().strip()]}
             for n, uid in PEOPLE if n in names]
    with (inv / "group_vars" / "all.yml").open("a") as f:  # JSON is YAML's flow style
        f.write(f"\ndistrun_users: {json.dumps(users)}\ndistrun_admins: {json.dumps([n for n in names if n in admins])}\n")
    return inv


def _login(cluster, key: Path, user: str, k: int, command: str = "id -un") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "IdentitiesOnly=yes",
                           "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-i", str(key), "--",
                           f"{user}@{cluster.ip(k)}", command], capture_output=True, text=True, timeout=60)


@pytest.mark.phase(1)
def test_setup_makes_each_person_and_locks_out_who_left(provisioned, tmp_path):
    cluster = provisioned
    keys = _keys(tmp_path)
    both = _inventory(tmp_path, keys, ("alice", "bob"), admins=("bob",))
    # Setup's steps that people touch: the accounts and sshd's view of whose keys it reads.
    first = distrun("setup", "--inventory", str(both), "--tags", "people,ssh_mesh")
    assert first.rc == 0, first.stdout[-4000:] + first.stderr[-2000:]
    again = distrun("setup", "--inventory", str(both), "--tags", "people,ssh_mesh")
    assert again.rc == 0 and again.recap()["changed"] == 0, again.stdout[-4000:]

    for k in (1, 2, 3):
        for name, uid in PEOPLE:
            assert _login(cluster, keys[name], name, k).stdout.strip() == name
            ids = cluster.exec(k, f"id -u {name}; id -nG {name}; stat -c %a /home/{name}").stdout.split("\n")
            assert ids[0] == str(uid)
            assert "distrun-users" in ids[1].split() and ("distrun-admins" in ids[1].split()) == (name == "bob")
            assert ids[2] == "700"
    # A key only logs in as its own person, and a key a person adds to their home logs in nowhere.
    assert _login(cluster, keys["alice"], "bob", 2).returncode != 0
    cluster.exec(2, "install -d -o bob -m 0700 /home/bob/.ssh && cat > /home/bob/.ssh/authorized_keys "
                    "&& chown bob /home/bob/.ssh/authorized_keys", input=keys["alice"].with_suffix(".pub").read_text())
    assert _login(cluster, keys["alice"], "bob", 2).returncode != 0
    _the_root_entry_point_acts_for_its_caller_alone(cluster)

    # bob leaves the list while a process of his runs on node2; his home holds a file.
    cluster.exec(2, "runuser -u bob -- bash -c 'echo mine > ~/kept; setsid sleep 600 < /dev/null > /dev/null 2>&1 &'")
    assert cluster.exec(2, "pgrep -u bob -x sleep", check=False).returncode == 0
    only_alice = _inventory(tmp_path, keys, ("alice",))
    left = distrun("setup", "--inventory", str(only_alice), "--tags", "people,ssh_mesh")
    assert left.rc == 0, left.stdout[-4000:] + left.stderr[-2000:]
    for k in (1, 2, 3):
        gone = _login(cluster, keys["bob"], "bob", k)
        assert gone.returncode != 0 and "Permission denied" in gone.stderr
        assert _login(cluster, keys["alice"], "alice", k).stdout.strip() == "alice"
        status = cluster.exec(k, "chage -l bob | grep '^Account expires'; getent passwd bob; id -nG bob").stdout
        assert "never" not in status.splitlines()[0] and status.splitlines()[1].endswith(":/usr/sbin/nologin")
        assert "distrun-users" not in status.splitlines()[2].split()
    assert cluster.exec(2, "pgrep -u bob", check=False).returncode == 1, "a process of bob's outlived his removal"
    assert cluster.exec(2, "cat /home/bob/kept").stdout.strip() == "mine"

    # Listed again, bob gets his account back with the keys listed now.
    back = distrun("setup", "--inventory", str(both), "--tags", "people,ssh_mesh")
    assert back.rc == 0, back.stdout[-4000:]
    assert _login(cluster, keys["bob"], "bob", 3).stdout.strip() == "bob"

    # The inventory without people again: both are locked out, and a setup after that changes nothing.
    without = distrun("setup", "--inventory", "test", "--tags", "people,ssh_mesh")
    assert without.rc == 0, without.stdout[-4000:]
    for k in (1, 2, 3):
        assert _login(cluster, keys["alice"], "alice", k).returncode != 0
        assert cluster.exec(k, "ls /etc/sudoers.d/distrun-entry /etc/distrun/admins", check=False).returncode != 0
    settled = distrun("setup", "--inventory", "test", "--tags", "people,ssh_mesh")
    assert settled.rc == 0 and settled.recap()["changed"] == 0, settled.stdout[-4000:]


def _the_root_entry_point_acts_for_its_caller_alone(cluster) -> None:
    """alice (no admin) reaches root only through the installed entry point, which takes her name
    from sudo: her scan is answered, her launch or stop as bob is refused in one line, a SUDO_UID
    she sets changes nothing, and no other command runs as root; bob (admin) acts on her runs,
    recorded in the journal. Without people the rule goes."""
    entry = nodeprog.installed("entry")
    rule = cluster.exec(1, "stat -c '%U %G %a' /etc/sudoers.d/distrun-entry; cat /etc/sudoers.d/distrun-entry").stdout
    owner, *text = rule.splitlines()
    assert owner == "root root 440"
    named = {w.removeprefix("Defaults!") for ln in text if not ln.startswith("#") for w in ln.replace(",", " ").split() if "/" in w}
    assert named == {entry} and "*" not in "".join(text), text

    def as_alice(command: str, env: str = "") -> subprocess.CompletedProcess[str]:
        return cluster.exec(1, f"runuser -u alice -- {env} {command}", check=False)

    def entry_call(program: str, verb: str, cfg: dict, env: str = "") -> subprocess.CompletedProcess[str]:
        return as_alice(f"sudo -n {entry} {program} {verb} {shlex.quote(json.dumps(cfg))}", env)

    scan = entry_call("node", "scan", {"user": "alice"})
    assert scan.returncode == 0 and json.loads(scan.stdout.splitlines()[-1]) == {"verb": "scan", "runs": {}}, scan
    bob_uid = dict(PEOPLE)["bob"]
    launch = {"user": "bob", "run": "r-bob", "host": "node1", "attempt": "0", "dir": "/home/bob", "script": "x.sh"}
    for asked, cfg, env in (("launch launch as 'bob'", launch, ""),
                            ("node stop as 'bob'", {"user": "bob", "run": "r-bob", "grace_s": 1}, ""),
                            ("node stop as 'bob'", {"user": "bob", "run": "r-bob", "grace_s": 1}, f"env SUDO_UID={bob_uid}")):
        program, verb = asked.split()[:2]
        said = entry_call(program, verb, cfg, env)
        lines = said.stderr.strip().splitlines()
        assert said.returncode == 2 and len(lines) == 1, said
        assert asked in lines[0] and "alice called, who is not an admin" in lines[0], lines
    # sudo takes no variable from alice's command line for it, and no other command at all.
    forged = as_alice(f"sudo -n SUDO_UID={bob_uid} {entry} node scan {shlex.quote(json.dumps({'user': 'bob'}))}")
    assert forged.returncode != 0 and "verb" not in forged.stdout, forged
    mine = shlex.quote(json.dumps({"user": "alice"}))
    for other in ("id -u", "/bin/sh -c id", f"/usr/bin/python3 -I {entry} node scan {mine}", "-u bob id",
                  f"-E {entry} node scan {mine}", f"-u bob {entry} node scan {mine}"):
        denied = as_alice(f"sudo -n {other}")
        assert denied.returncode != 0 and denied.stdout == "", (other, denied)
    # bob, an admin, acts on alice's runs, and the node's journal says so.
    admin = cluster.exec(1, f"runuser -u bob -- sudo -n {entry} node scan {shlex.quote(json.dumps({'user': 'alice'}))}",
                         check=False)
    assert admin.returncode == 0 and json.loads(admin.stdout.splitlines()[-1])["verb"] == "scan", admin
    journal = cluster.exec(1, "journalctl -t distrun --no-pager -o cat -n 20", check=False).stdout
    assert "admin bob ran node scan as alice" in journal, journal[-2000:]



PROGRAM = """import os, socket, time
time.sleep(1)
print(f"PERSON uid={os.getuid()} host={socket.gethostname()}", flush=True)
"""


@pytest.mark.phase(1)
def test_a_person_drives_distrun_as_themself_and_their_run_runs_as_them(provisioned, tmp_path):
    """Two controller accounts (a state folder each, DISTRUN_USER and a key of their own): alice's
    run connects as alice and runs as uid 2101 on every node, in her own folder; status and logs
    answer her; bob has no record of her run to stop; a name not in the list is refused in one line."""
    cluster = provisioned
    keys = _keys(tmp_path)
    both = _inventory(tmp_path, keys, ("alice", "bob"), admins=("bob",))
    made = distrun("setup", "--inventory", str(both), "--tags", "people,ssh_mesh")
    try:
        assert made.rc == 0, made.stdout[-4000:] + made.stderr[-2000:]
        for k in (1, 2, 3):  # each person's own folder, theirs alone
            owners = cluster.exec(k, "stat -c '%U %a' /srv/distrun/people/alice /srv/distrun/people/bob").stdout.split()
            assert owners == ["alice", "700", "bob", "700"], (k, owners)

        def env(name: str) -> dict[str, str]:
            home = tmp_path / f"{name}-state"
            return {"DISTRUN_HOME": str(home), "DISTRUN_USER": name, "DISTRUN_SSH_KEY": str(keys[name])}

        program = tmp_path / "whoami.py"
        program.write_text(PROGRAM)
        ran = distrun("train", "--inventory", str(both), "--launcher", "torchrun", "--script", str(program),
                      env_extra=env("alice"), timeout=600)
        said = ran.stdout + ran.stderr
        assert ran.rc == 0, said[-5000:]
        (run,) = (tmp_path / "alice-state" / "runs").glob("*-train-*")
        # What the ranks printed: followed live, and in the logs collected into the record.
        text = said + "".join(f.read_text(errors="replace") for f in run.rglob("*") if f.is_file() and f.suffix in (".log", ""))
        seen = {host: uid for uid, host in re.findall(r"PERSON uid=(\d+) host=(\S+)", text)}
        assert seen == {f"node{k}": "2101" for k in (1, 2, 3)}, said[-5000:]
        for k in (1, 2, 3):  # the run's folder is alice's, in her own folder
            assert cluster.exec(k, f"stat -c %U /srv/distrun/people/alice/runs/{run.name}").stdout.strip() == "alice"
            assert cluster.exec(k, f"test -e /srv/distrun/runs/{run.name}", check=False).returncode != 0

        status = distrun("status", run.name, "--json", env_extra=env("alice"), timeout=120)
        assert status.rc == 0 and json.loads(status.stdout)["state"] == "succeeded", status.stdout + status.stderr
        logs = distrun("logs", run.name, env_extra=env("alice"), timeout=120)
        assert logs.rc == 0 and "PERSON uid=2101" in logs.stdout, logs.stdout[-3000:] + logs.stderr

        # bob, at a controller account of his own, has no record of alice's run to stop.
        stop = distrun("stop", run.name, env_extra=env("bob"), timeout=120)
        lines = [ln for ln in (stop.stdout + stop.stderr).splitlines() if ln.strip()]
        assert stop.rc != 0 and len(lines) == 1, lines
        assert f"run {run.name!r} not found in {tmp_path / 'bob-state' / 'runs'}" in lines[0], lines

        # A name the list does not hold is refused in one line, before any connection.
        carol = distrun("train", "--inventory", str(both), "--launcher", "torchrun", "--script", str(program),
                        env_extra={**env("alice"), "DISTRUN_USER": "carol"}, timeout=120)
        lines = [ln for ln in (carol.stdout + carol.stderr).splitlines() if ln.strip()]
        assert carol.rc != 0 and len(lines) == 1 and "DISTRUN_USER=carol is not in distrun_users" in lines[0], lines
    finally:
        # The inventory without people again: the suite's other tests see the cluster as before.
        assert distrun("setup", "--inventory", "test", "--tags", "people,ssh_mesh").rc == 0
