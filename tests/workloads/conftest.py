"""Fixtures for the workload tests: paths, the Jittor cache, and launching real MPI jobs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from jittor_cache import jittor_env  # noqa: E402

REPO = HERE.parents[1]
WORKLOADS = REPO / "workloads"
sys.path.insert(0, str(WORKLOADS))
PYTHON = sys.executable


def _cora_raw() -> Path | None:
    for base in (REPO.parent / "shared" / "datasets" / "cora", Path("/work/shared/datasets/cora")):
        if (base / "raw" / "ind.cora.x").is_file():
            return base / "raw"
    return None


@pytest.fixture(scope="session")
def cora_raw() -> Path:
    path = _cora_raw()
    if path is None:
        pytest.skip("Cora's Planetoid files are not at ../shared/datasets/cora/raw")
    return path


@pytest.fixture(scope="session")
def work_env() -> dict[str, str]:
    """Environment for every workload subprocess: the keyed Jittor cache, quiet Jittor."""
    env = jittor_env()
    env.pop("DISTRUN_RUN_DIR", None)
    # Two cores shared by up to three ranks: one BLAS thread each avoids thrashing.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    def lines(self, tag: str) -> list[dict]:
        return [json.loads(l.split(" ", 1)[1]) for l in self.stdout.splitlines() if l.startswith(tag + " ")]

    @property
    def result(self) -> dict:
        res = self.lines("DISTRUN_RESULT")
        assert len(res) == 1, self.stdout[-2000:] + self.stderr[-2000:]
        return res[0]


def mpirun_prefix(n: int, extra_env: dict[str, str] | None = None) -> list[str]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun (Open MPI) is not installed")
    cmd = [mpirun, "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key, value in (extra_env or {}).items():
        cmd += ["-x", f"{key}={value}"]
    return cmd


def run_workload(script: str, args: list[str], env: dict[str, str], ranks: int | None = None,
                 cwd: Path | None = None, extra_env: dict[str, str] | None = None, timeout: int = 600) -> Run:
    """Run a workload program, under the real mpirun when ``ranks`` is given."""
    cmd = [PYTHON, str(WORKLOADS / script), *args]
    if ranks is not None:
        cmd = mpirun_prefix(ranks, extra_env) + cmd
    full_env = {**env, **(extra_env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
