"""Role slurm's epilog (roles/slurm/files/epilog.py), run as slurmd runs it: its own process, the
job's variables, `squeue` found on PATH (here a script that answers as told and keeps its
arguments), and /proc and /run/user under DISTRUN_EPILOG_ROOT. The fake /proc holds real
processes of this test: an entry names a live `sleep`, and leaves when that process ends, as the
kernel's would; so what the epilog ends is really ended."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

EPILOG = Path(__file__).resolve().parents[2] / "roles" / "slurm" / "files" / "epilog.py"
UID = "1234"
JOB = "7"
SLURMD_CGROUP = "0::/system.slice/slurmd.service\n"
OTHER_CGROUP = "0::/user.slice/user-1234.slice/session-3.scope\n"


class Node:
    """A node's /proc and /run/user under one folder, and the squeue on its PATH."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = root / "proc"
        self.proc.mkdir(parents=True)
        self._entry("self", UID, SLURMD_CGROUP)
        self.runtime = root / "run" / "user" / UID
        self.runtime.mkdir(parents=True)
        (self.runtime / "podman").mkdir()
        self.bin = root / "bin"
        self.bin.mkdir()
        self.children: list[subprocess.Popen[bytes]] = []

    def _entry(self, name: str, uid: str, cgroup: str) -> Path:
        entry = self.proc / name
        entry.mkdir()
        (entry / "status").write_text(f"Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\n"
                                      f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (entry / "cgroup").write_text(cgroup)
        return entry

    def process(self, uid: str = UID, cgroup: str = SLURMD_CGROUP,
                argv: tuple[str, ...] = ("sleep", "60")) -> subprocess.Popen[bytes]:
        """A live process the fake /proc lists with this uid and cgroup, until it ends; one with
        output is listed once it printed its first line (its signal handlers are set by then)."""
        child = subprocess.Popen(argv, stdout=subprocess.PIPE)
        self.children.append(child)
        if argv[0] != "sleep":
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        entry = self._entry(str(child.pid), uid, cgroup)

        def reap() -> None:
            child.wait()
            shutil.rmtree(entry)

        threading.Thread(target=reap, daemon=True).start()
        return child

    def squeue(self, *answers: str, fail: bool = False) -> None:
        """squeue answers these job lists in turn (the last one from then on), or fails."""
        for i, answer in enumerate(answers):
            (self.root / f"answer{i}").write_text(answer)
        (self.bin / "squeue").write_text(f"""#!/bin/sh
echo "$@" >> {self.root}/squeue-calls
{'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1' if fail else ''}
n=$(wc -l < {self.root}/squeue-calls)
i=$((n - 1)); [ "$i" -lt {len(answers)} ] || i={len(answers) - 1}
cat {self.root}/answer$i
""")
        (self.bin / "squeue").chmod(0o755)

    def calls(self) -> list[str]:
        path = self.root / "squeue-calls"
        return path.read_text().splitlines() if path.exists() else []

    def epilog(self, **env: str) -> subprocess.CompletedProcess[str]:
        variables = {"PATH": f"{self.bin}:{os.environ['PATH']}", "SLURM_JOB_UID": UID, "SLURM_JOB_ID": JOB,
                     "SLURMD_NODENAME": "node2", "DISTRUN_EPILOG_ROOT": str(self.root), **env}
        return subprocess.run([sys.executable, "-I", str(EPILOG)], env=variables, capture_output=True, text=True,
                              timeout=30)

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path / "node")
    yield n
    n.stop()


def _ended(child: subprocess.Popen[bytes], within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return child.poll() is not None


def test_a_leftover_in_slurmds_cgroup_is_ended_and_the_runtime_folder_removed(node):
    node.squeue(f"{JOB}\n")
    leftover = node.process()
    done = node.epilog()
    assert (done.returncode, done.stderr) == (0, "")
    assert _ended(leftover) and leftover.returncode == -15  # TERM was enough
    assert not node.runtime.exists()
    # asked for this uid on this node, and again right before the folder went
    assert node.calls() == [f"--noheader --format=%A --user={UID} --nodelist=node2"] * 2


def test_another_job_of_the_uid_on_the_node_leaves_everything(node):
    node.squeue(f"{JOB}\n8\n")
    leftover = node.process()
    assert node.epilog().returncode == 0
    assert leftover.poll() is None
    assert (node.runtime / "podman").is_dir()


def test_squeue_failing_leaves_everything(node):
    node.squeue("", fail=True)
    leftover = node.process()
    done = node.epilog()
    assert done.returncode == 0
    assert leftover.poll() is None
    assert (node.runtime / "podman").is_dir()


def test_a_process_of_the_uid_outside_slurmds_cgroup_is_untouched_and_keeps_the_folder(node):
    node.squeue("")
    login = node.process(cgroup=OTHER_CGROUP)
    leftover = node.process()
    assert node.epilog().returncode == 0
    assert _ended(leftover)
    assert login.poll() is None
    assert (node.runtime / "podman").is_dir()


def test_another_uids_process_in_slurmds_cgroup_is_untouched(node):
    node.squeue("")
    other = node.process(uid="1235")
    assert node.epilog().returncode == 0
    assert other.poll() is None
    assert not node.runtime.exists()


def test_a_job_of_the_user_that_started_meanwhile_keeps_its_runtime_folder(node):
    # the first answer shows no other job; the one right before the removal shows job 9
    node.squeue(f"{JOB}\n", f"{JOB}\n9\n")
    leftover = node.process()
    assert node.epilog().returncode == 0
    assert _ended(leftover)
    assert (node.runtime / "podman").is_dir()


def test_a_leftover_that_ignores_term_is_killed(node):
    node.squeue("")
    stubborn = node.process(argv=(sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                                  "time.sleep(60)"))
    started = time.monotonic()
    assert node.epilog().returncode == 0
    assert _ended(stubborn) and stubborn.returncode == -9
    assert 4.5 < time.monotonic() - started < 15
    assert not node.runtime.exists()


@pytest.mark.parametrize("env", [{"SLURM_JOB_UID": "999"}, {"SLURM_JOB_UID": "12a"}, {"SLURM_JOB_ID": ""},
                                 {"SLURM_JOB_UID": "１２３４"}])
def test_a_system_uid_or_a_variable_that_is_not_a_number_does_nothing(node, env):
    node.squeue("")
    leftover = node.process()
    assert node.epilog(**env).returncode == 0
    assert leftover.poll() is None and node.calls() == []


def test_a_link_in_place_of_the_runtime_folder_is_left_and_its_target_kept(node, tmp_path):
    node.squeue("")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    shutil.rmtree(node.runtime)
    node.runtime.symlink_to(target)
    assert node.epilog().returncode == 0
    assert node.runtime.is_symlink() and (target / "keep").exists()
