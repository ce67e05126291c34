"""A host-side cache of the test nodes' compiled Jittor, keyed by what the build depends on.

Jittor compiles its core on a node's first import (about 8 minutes on 2 cores, plus about a
minute of kernels per node). The cluster tests run on fresh containers every time, so the
training user's ``~/.cache/jittor`` of every node is saved after the first successful run and
put back before the next; distrun's stage step then finds Jittor warm on every node. Jittor
keys its build by host name, and the harness names its nodes node1..nodeN every time, so a
saved build fits the same node of the next cluster.

The key is a digest of the node image, the node's C++ compiler, its Python and the installed
Jittor version: a change to any of them starts a new cache instead of loading a stale build.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tests.harness import podcluster

CACHE_ROOT = Path(os.environ.get("DISTRUN_TEST_CACHE", Path.home() / ".cache" / "distrun"))
USER = "distrun"
ENV_PYTHON = "/opt/distrun/venv/bin/python"


def cache_key(cluster: podcluster.Cluster, k: int = 1) -> str:
    probe = (
        "g++ --version | head -n 1; python3 -V; "
        f"{ENV_PYTHON} -c 'import importlib.metadata as m; print(m.version(\"jittor\"))'"
    )
    out = cluster.exec(k, probe).stdout
    digest = hashlib.sha256(f"{cluster.image}\n{out}".encode()).hexdigest()[:16]
    return digest


def cache_files(cluster: podcluster.Cluster) -> dict[int, Path]:
    """Node number -> its build's file (one key for the cluster: every node runs the same image)."""
    key = cache_key(cluster)
    return {k: CACHE_ROOT / f"jittor-node-{key}-node{k}.tar" for k in range(1, len(cluster.nodes) + 1)}


def _home(cluster: podcluster.Cluster, k: int) -> str:
    return cluster.exec(k, f"getent passwd {USER} | cut -d: -f6").stdout.strip()


def restore(cluster: podcluster.Cluster) -> bool:
    """Put every node's cached build back; False (nothing touched) unless all nodes have one."""
    tars = cache_files(cluster)
    if not all(t.is_file() for t in tars.values()):
        return False
    for k, tar in tars.items():
        home = _home(cluster, k)
        cluster.exec(k, f"mkdir -p {home}/.cache && rm -rf {home}/.cache/jittor")
        with tar.open("rb") as fh:
            subprocess.run(["podman", "exec", "-i", cluster.node(k).container, "tar", "-x", "-C", f"{home}/.cache"],
                           stdin=fh, check=True, timeout=600)
        cluster.exec(k, f"chown -R {USER}: {home}/.cache")
    return True


def save(cluster: podcluster.Cluster) -> list[Path]:
    """Keep every node's compiled Jittor for the next session (each written whole, then renamed)."""
    kept = []
    for k, tar in cache_files(cluster).items():
        tar.parent.mkdir(parents=True, exist_ok=True)
        tmp = tar.with_suffix(f".tmp{os.getpid()}")
        with tmp.open("wb") as fh:
            subprocess.run(["podman", "exec", cluster.node(k).container, "tar", "-c", "-C", f"{_home(cluster, k)}/.cache",
                            "jittor"], stdout=fh, check=True, timeout=600)
        os.replace(tmp, tar)
        kept.append(tar)
    for old in CACHE_ROOT.glob("jittor-node-*.tar"):
        if old not in kept:
            old.unlink()  # builds for an older image or Jittor only take space
    return kept
