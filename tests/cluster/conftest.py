"""A provisioned 3-node cluster: the harness's containers after `distrun setup --inventory test`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pytest

from tests.harness import matrix, podcluster

from . import jittor_nodes

REPO = Path(__file__).resolve().parents[2]
# The header the rank wrapper prints first into every rank's log.
RANK_HEADER = re.compile(r"DISTRUN_RANK rank=(\d+) \S+ world_size=(\d+) host=(\S+) machine=(\S+)")
RECAP = re.compile(r"PLAY RECAP (\S+): hosts=(\d+) changed=(\d+) failed=(\d+) unreachable=(\d+) rc=(-?\d+)")


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    def recap(self) -> dict[str, int]:
        m = RECAP.search(self.stdout)
        assert m, f"no PLAY RECAP line in:\n{self.stdout[-3000:]}\n{self.stderr[-2000:]}"
        return {"hosts": int(m[2]), "changed": int(m[3]), "failed": int(m[4]), "unreachable": int(m[5]), "rc": int(m[6])}


def distrun(*args: str, env_extra: dict | None = None, timeout: int = 1500) -> CliResult:
    env = dict(os.environ)
    env["COLUMNS"] = "200"
    env.update(env_extra or {})
    proc = subprocess.run([str(Path(sys.executable).parent / "distrun"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def new_train_run(home: Path, before: set[Path]) -> Path | None:
    """The newest train record in ``home`` that is not in ``before`` (None when there is none)."""
    runs = sorted(set((home / "runs").glob("*-train-*")) - before, key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def train_program(home: Path, program: Path, text: str, env_extra: dict[str, str]) -> tuple[CliResult, Path]:
    """`distrun train --script` of ``text`` (written to ``program``) on the test inventory, with
    ``env_extra`` in distrun's environment: its result and the run record it made."""
    program.write_text(text)
    before = set((home / "runs").glob("*-train-*"))
    result = distrun("train", "--inventory", "test", "--script", str(program), env_extra=env_extra, timeout=600)
    run = new_train_run(home, before)
    assert run is not None, result.stdout[-3000:] + result.stderr[-2000:]
    return result, run


def bring_back(cluster, k: int, inventory: str = "test") -> None:
    """Start node ``k`` again and clear the drain a run that lost it left ('distrun check --clear'),
    so the tests after this one run on every node again."""
    cluster.start_node(k)
    cleared = distrun("check", "--inventory", inventory, "--clear", f"node{k}", timeout=120)
    assert cleared.rc == 0, cleared.stdout + cleared.stderr


def start_distrun(*args: str, log: TextIO) -> subprocess.Popen:
    """distrun started in the background, its output to ``log``, with SIGINT at its default
    (a shell's background jobs, as in CI, start with it ignored): for tests that interrupt it."""
    return subprocess.Popen([str(Path(sys.executable).parent / "distrun"), *args], cwd=REPO,
                            env={**os.environ, "COLUMNS": "200"}, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.fixture(scope="session")
def distrun_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("distrun-home")
    os.environ["DISTRUN_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def first_setup(cluster3, cluster3_provisioning, distrun_home) -> CliResult:
    """The first converge of setup.yml through the real CLI, on fresh containers; or, where an
    earlier session kept the result of that same converge (a snapshot, keyed by the roles, the
    inventory, the runner and the node image: tests/harness/podcluster.py), on containers
    started from it, which this session's new keys and addresses still make a real converge.
    The first converge on fresh nodes is then still run in this session, by the quickstart test
    (setup.yml, venv) and molecule's conda scenario (setup.yml, conda)."""
    t0 = time.monotonic()
    result = distrun("setup", "--inventory", "test")
    prov = cluster3_provisioning
    # The suite's closing report says which of the two this session ran (tests/harness/matrix.py).
    if prov.from_snapshot:
        matrix.record_step(f"cluster A: setup of the nodes started from snapshot {prov.key}", time.monotonic() - t0)
    else:
        matrix.record_step("cluster A: first setup of fresh nodes", time.monotonic() - t0)
        if result.rc == 0 and prov.key:
            t0 = time.monotonic()
            podcluster.snapshot(cluster3, prov.key, log=lambda msg: None)
            matrix.record_step(f"cluster A: snapshot {prov.key} kept (podman commit)", time.monotonic() - t0)
    return result


@pytest.fixture(scope="session")
def provisioned(first_setup, cluster3):
    assert first_setup.rc == 0, first_setup.stdout[-4000:] + first_setup.stderr[-2000:]
    # Jittor's build (minutes, on node1 only) overlaps the tests before the one that needs it.
    jittor_nodes.start(cluster3)
    return cluster3


@pytest.fixture(scope="session")
def cell_script(tmp_path_factory):
    """The matrix cells' torch program (tests/harness/matrix.py)."""
    path = tmp_path_factory.mktemp("cell") / "cell.py"
    path.write_text(matrix.CELL_SCRIPT)
    return path


def run_processes(cluster, run_id: str, nodes: tuple[int, ...] = (1, 2, 3), over_ssh: bool = False) -> list[str]:
    """Processes whose environment carries DISTRUN_RUN_ID=<run_id> (the tag 'distrun stop'
    kills by), still alive on the given nodes: 'node<k>:/proc/<pid>/environ' each. ``over_ssh``:
    not through podman exec, whose lock another session's podman commit can hold for minutes."""
    alive = []
    for k in nodes:
        find = (f"for f in /proc/[0-9]*/environ; do grep -qzxF 'DISTRUN_RUN_ID={run_id}' $f 2>/dev/null "
                f"&& echo $f; done; true")
        out = cluster.ssh(k, find, check=False) if over_ssh else cluster.exec(k, find, check=False)
        alive += [f"node{k}:{line}" for line in out.stdout.split()]
    return alive


# Every process of the training user on a node: "pid comm cgroup" per line (systemd's hierarchy).
_USER_PROCESSES = ("u=$(id -u distrun); for d in /proc/[0-9]*; do [ \"$(stat -c %u $d 2>/dev/null)\" = \"$u\" ] || continue; "
                   "c=$(sed -n 's/^[0-9]*:\\(name=systemd\\)\\{0,1\\}:\\(\\/.*\\)/\\2/p' $d/cgroup 2>/dev/null | head -1); "
                   "echo \"${d#/proc/} $(cat $d/comm 2>/dev/null) $c\"; done; "
                   "echo SESSIONS $(loginctl list-sessions --no-legend 2>/dev/null | awk '$3 == \"distrun\"' | wc -l)")


def outside_runs(cluster, nodes: tuple[int, ...] = (1, 2, 3), wait_s: float = 20) -> dict[int, list[str]]:
    """Node -> the processes of the training user there that live outside every run's unit and
    outside every login of that user: 'comm cgroup' each. A login's own processes (its session's
    scope; the user's systemd manager while a login of the user is open, and for logind's
    UserStopDelaySec, 10 s, after the last one ends: mpirun's daemons' ssh logins, the harness's
    su) are a login's, not distrun's: the look is repeated for ``wait_s`` while any is left."""
    deadline = time.monotonic() + wait_s
    while True:
        found = {k: _outside_runs(cluster, k) for k in nodes}
        if not any(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(2)


def _outside_runs(cluster, k: int) -> list[str]:
    out = cluster.exec(k, _USER_PROCESSES, check=False).stdout.splitlines()
    sessions = int(out[-1].split()[1]) if out and out[-1].startswith("SESSIONS ") else 0
    left = []
    for line in out[:-1]:
        _, comm, cgroup = (line.split(" ", 2) + ["", ""])[:3]
        if "/session-" in cgroup and cgroup.endswith(".scope"):
            continue  # a login's
        if sessions and cgroup.endswith("/init.scope") and "/user@" in cgroup:
            continue  # the manager a login started, for as long as it lasts
        if "/system.slice/distrun" in cgroup.replace("\\x3a", ":"):
            continue  # a run's unit (another run's, still running)
        left.append(f"{comm} {cgroup}")
    return left


def rank_headers(run: Path) -> dict[int, tuple[int, str, str]]:
    """Rank -> (world size, inventory name, machine hostname), from the header of every rank log
    collected into the run record."""
    found: dict[int, tuple[int, str, str]] = {}
    for f in (run / "nodes").rglob("*"):
        if f.is_file() and f.name in ("stdout", "stdout.log"):
            m = RANK_HEADER.search(f.read_text(errors="replace"))
            if m:
                found[int(m[1])] = (int(m[2]), m[3], m[4])
    return found


def pytest_terminal_summary(terminalreporter) -> None:
    """The hostile-job suite's one line (tests/cluster/hostile.py), when any attack was tried."""
    from .hostile import TALLY
    for line in TALLY.lines():
        terminalreporter.write_line(line)
