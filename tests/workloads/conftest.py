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


def cora_candidates() -> list[Path]:
    """Where the tests look for Cora's Planetoid files, in order: $DISTRUN_TEST_CORA, the
    checkout's sibling ../shared/datasets/cora, and the loader's own download folder."""
    import datasets

    out = [Path(os.environ["DISTRUN_TEST_CORA"])] if os.environ.get("DISTRUN_TEST_CORA") else []
    out.append(REPO.parent / "shared" / "datasets" / "cora")
    out.append(datasets.default_data_dir("cora"))
    return out


@pytest.fixture(scope="session")
def cora_raw() -> Path:
    """Cora's eight Planetoid files, digests verified. Missing data fails the test (never skips):
    a suite that silently skips its dataset tests reports a pass it did not earn."""
    import datasets
    from datasets import DatasetError

    tried = []
    for base in cora_candidates():
        raw = datasets.cora_dir(base)
        tried.append(str(raw))
        if (raw / "ind.cora.x").is_file():
            try:
                datasets.verified_cora_digests(raw)
            except DatasetError as exc:
                pytest.fail(f"Cora's files at {raw} are damaged: {exc}")
            return raw
    try:
        # Last resort: the loader's verified download into its default folder.
        raw = datasets.ensure_cora(None, download=True)
        datasets.verified_cora_digests(raw)
        return raw
    except DatasetError as exc:
        pytest.fail(f"Cora's Planetoid files were not found (looked in {', '.join(tried)}) and could not be "
                    f"downloaded ({exc}); put the eight ind.cora.* files in one of those folders or name "
                    f"the folder with DISTRUN_TEST_CORA")


@pytest.fixture(scope="session", autouse=True)
def digest_memo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workloads memoise file digests in the user's cache; tests keep theirs private."""
    path = tmp_path_factory.mktemp("cache")
    os.environ["DISTRUN_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def work_env(digest_memo: Path) -> dict[str, str]:
    """Environment for every workload subprocess: the keyed Jittor cache, quiet Jittor."""
    env = jittor_env()
    env.pop("DISTRUN_RUN_DIR", None)
    env["DISTRUN_CACHE_DIR"] = str(digest_memo)
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
        pytest.fail("mpirun (Open MPI) is not installed; scripts/bootstrap installs it (openmpi-bin)")
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


@pytest.fixture(scope="session")
def cora_parts(tmp_path_factory: pytest.TempPathFactory, cora_raw: Path, work_env: dict[str, str]):  # noqa: ANN201
    """Cora partitioned into n parts (with GDC on request), each made once per session."""
    root = tmp_path_factory.mktemp("cora-parts")
    made: dict[tuple[int, bool], Path] = {}

    def get(n: int, gdc: bool = False) -> Path:
        if (n, gdc) not in made:
            out = root / f"cora-{n}{'-gdc' if gdc else ''}"
            args = ["--dataset", "cora", "--data-dir", str(cora_raw), "--num-parts", str(n), "--out", str(out)]
            r = run_workload("partition.py", args + (["--use-gdc"] if gdc else []), work_env)
            assert r.rc == 0, r.stderr
            made[(n, gdc)] = out
        return made[(n, gdc)]

    return get


# A small synthetic graph whose features (16) are no wider than the trainers' default hidden layer.
NARROW_GRAPH = ["--dataset", "synthetic", "--syn-nodes", "3000", "--syn-edges", "30000", "--syn-features", "16",
                "--syn-classes", "4"]


@pytest.fixture(scope="session")
def narrow_parts(tmp_path_factory: pytest.TempPathFactory, work_env: dict[str, str]):  # noqa: ANN201
    """NARROW_GRAPH partitioned into n parts, each made once per session."""
    root = tmp_path_factory.mktemp("narrow-parts")

    def get(n: int) -> Path:
        out = root / f"narrow-{n}"
        if not out.exists():
            r = run_workload("partition.py", [*NARROW_GRAPH, "--num-parts", str(n), "--out", str(out)], work_env)
            assert r.rc == 0, r.stderr
        return out

    return get


@pytest.fixture(scope="session")
def cora_gdc(cora_parts) -> Path:  # noqa: ANN001
    """Cora in 2 parts of its GDC diffusion (alpha 0.05, top-128: the defaults)."""
    return cora_parts(2, gdc=True)
