"""Where Jittor's compiled core lives for tests: a cache keyed by what the build depends on.

Jittor compiles its core on first import (about 6 minutes on 2 cores). The result depends on
the Jittor version, the Python version and the C++ compiler, so the directory name is a digest
of those three: CI can cache ``~/.cache/distrun`` and a change to any of them starts a fresh
directory instead of loading a stale build.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path


def compiler_version(cxx: str | None = None) -> str:
    exe = cxx or os.environ.get("cc_path") or shutil.which("g++") or "g++"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return f"{exe}: missing"
    return out.stdout.splitlines()[0] if out.stdout else f"{exe}: unknown"


def jittor_cache_dir() -> Path:
    try:
        jt_version = importlib.metadata.version("jittor")
    except importlib.metadata.PackageNotFoundError:
        jt_version = "absent"
    key = "|".join([jt_version, sys.version, compiler_version()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "distrun" / f"jittor-{digest}"


def jittor_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess that imports Jittor on a machine without a usable GPU."""
    env = dict(os.environ if base is None else base)
    env.setdefault("JITTOR_HOME", str(jittor_cache_dir()))
    # A CUDA nvcc without its runtime is present on some images; Jittor would try to use it.
    env.setdefault("nvcc_path", "")
    # Without this Jittor downloads oneDNN at import, and the network may not reach it.
    env.setdefault("use_mkl", "0")
    return env


def warm() -> int:
    """Compile Jittor's core into the keyed cache now (scripts/test starts this beside the node
    image build, so the workload tests find it compiled); Jittor's own lock makes a test that
    imports Jittor meanwhile wait for this build instead of starting a second one."""
    return subprocess.run([sys.executable, "-c", "import jittor"], env=jittor_env(), check=False).returncode


if __name__ == "__main__":
    if sys.argv[1:] == ["--warm"]:
        sys.exit(warm())
    print(jittor_cache_dir())
