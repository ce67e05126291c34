"""Jittor compiled once per node image for the cluster tests, and kept on the host.

Jittor compiles its core on a node's first import (minutes on 2 cores). Every node of a test
cluster runs the same image, so the build is the same on every node except for one thing:
Jittor puts the host name into its cache path (a short digest of ``platform.node()``) and
writes that path into its cache keys (``*.key``) and a few object files. Three nodes compiling
at once on a 2-core machine cost three builds; this module compiles on node 1 only and gives
every other node that build, moved to the path Jittor computes on that node. The moved path has
the same length (Jittor shortens the host part to a fixed width), so the rewrite is a
same-length byte replacement that keeps object files valid. A node whose path differs in length
or in more than that one component gets nothing and compiles for itself.

The build is also kept on the host, keyed by a digest of the node image, the node's C++
compiler, its Python and the installed Jittor version, so a later session starts warm; a change
to any of them starts a new cache instead of loading a stale build. What warm() compiles is the
core alone; a node that then ran the GCN under mpirun has also compiled Jittor's MPI extension
and the job's kernels (minutes on every node that lacks them), and ``keep_richer`` keeps that
build instead, so the next session's nodes start with all of it.

distrun's own stage step still imports Jittor on every node before a run (its warm-up); with
the build in place that costs seconds instead of minutes.
"""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import subprocess
import tarfile
import threading
from pathlib import Path

from tests.harness import podcluster

CACHE_ROOT = Path(os.environ.get("DISTRUN_TEST_CACHE", Path.home() / ".cache" / "distrun"))
USER = "distrun"
ENV_PYTHON = "/opt/distrun/venv/bin/python"
# What distrun's stage step exports for Jittor on these CPU-only nodes (roles/job defaults).
JITTOR_ENV = "nvcc_path= use_mkl=0"


def _as_user(cmd: str) -> str:
    return f"su -s /bin/sh {USER} -c {shlex.quote(f'cd ~ && {JITTOR_ENV} {cmd}')}"


def cache_key(cluster: podcluster.Cluster, k: int = 1) -> str:
    probe = (
        "g++ --version | head -n 1; python3 -V; "
        f"{ENV_PYTHON} -c 'import importlib.metadata as m; print(m.version(\"jittor\"))'"
    )
    out = cluster.exec(k, probe).stdout
    return hashlib.sha256(f"{cluster.image}\n{out}".encode()).hexdigest()[:16]


def cache_path(cluster: podcluster.Cluster, k: int) -> str:
    """The folder Jittor compiles into on node k, as Jittor itself computes it (cheap: no build)."""
    out = cluster.exec(k, _as_user(f"{ENV_PYTHON} -c 'import jittor_utils as u; print(u.cache_path)'")).stdout
    return out.strip().splitlines()[-1]


def _home(cluster: podcluster.Cluster, k: int) -> str:
    return cluster.exec(k, f"getent passwd {USER} | cut -d: -f6").stdout.strip()


def _host_part(src: str, dst: str) -> tuple[str, str] | None:
    """The path prefixes that differ between two nodes' cache paths, up to and including the one
    component that differs (the host part), or None when more than that differs."""
    a, b = src.split("/"), dst.split("/")
    if len(a) != len(b):
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diff) != 1 or len(a[diff[0]]) != len(b[diff[0]]):
        return None
    i = diff[0]
    return "/".join(a[: i + 1]), "/".join(b[: i + 1])


def _moved(tar_bytes: bytes, old: str, new: str, home: str) -> bytes:
    """The tar of ``~/.cache/jittor`` with every path and every byte naming ``old`` renamed to ``new``."""
    rel_old = os.path.relpath(old, f"{home}/.cache")
    rel_new = os.path.relpath(new, f"{home}/.cache")
    src, out = io.BytesIO(tar_bytes), io.BytesIO()
    with tarfile.open(fileobj=src) as tin, tarfile.open(fileobj=out, mode="w") as tout:
        for member in tin.getmembers():
            data = tin.extractfile(member).read() if member.isfile() else None
            member.name = member.name.replace(rel_old, rel_new, 1)
            if member.issym() or member.islnk():
                member.linkname = member.linkname.replace(old, new)
            if data is not None:
                data = data.replace(old.encode(), new.encode())
                member.size = len(data)
            tout.addfile(member, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


# distrun's stage step marks a node's warm-up done in ~/.cache/jittor, by host name; a node that
# receives a build runs its own warm-up all the same, so no marker travels with a build.
WARM_MARKER = ".distrun-warm-jittor-*"


def _tar_of(cluster: podcluster.Cluster, k: int, home: str) -> bytes:
    return subprocess.run(["podman", "exec", cluster.node(k).container, "tar", "-c", "-C", f"{home}/.cache",
                           f"--exclude=jittor/{WARM_MARKER}", "jittor"],
                          capture_output=True, check=True, timeout=600).stdout


def _kept(key: str) -> tuple[Path, Path]:
    """The kept build's tar and the file naming the path it was compiled at."""
    tar = CACHE_ROOT / f"jittor-node-{key}.tar"
    return tar, tar.with_suffix(".path")


def _keep(key: str, data: bytes, built_at: str, image: str) -> None:
    """Keep a build on the host as the one for ``key``; builds for other keys only take space."""
    tar, path = _kept(key)
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    for target, body in ((path, (built_at + "\n").encode()), (tar.with_suffix(".image"), (image + "\n").encode()),
                         (tar, data)):
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(body)
        os.replace(tmp, target)  # written whole, then renamed: a killed run leaves no half file
    for old in CACHE_ROOT.glob("jittor-node-*"):
        if old.stem != tar.stem and not old.name.startswith(f"{tar.stem}."):
            old.unlink()


def kept_for_image(image: str) -> tuple[Path, str] | None:
    """The kept build made on a node of ``image`` and the path it was compiled at, if any. The
    key also covers the node's compiler, Python and Jittor version; a build whose path Jittor
    does not compute on another machine is never read there (the path names all three)."""
    for sidecar in sorted(CACHE_ROOT.glob("jittor-node-*.image")):
        tar, path = sidecar.with_suffix(".tar"), sidecar.with_suffix(".path")
        if sidecar.read_text().strip() == image and tar.is_file() and path.is_file():
            return tar, path.read_text().strip()
    return None


def _names(data: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return set(tar.getnames())


def keep_richer(cluster: podcluster.Cluster, k: int = 1) -> bool:
    """Keep node k's build when it holds more than the kept one (the MPI extension and the job's
    kernels besides the core): True when it was kept."""
    key = cache_key(cluster, k)
    tar, _ = _kept(key)
    data = _tar_of(cluster, k, _home(cluster, k))
    if tar.is_file() and not _names(tar.read_bytes()) < _names(data):
        return False
    _keep(key, data, cache_path(cluster, k), cluster.image)
    return True


def _untar_into(cluster: podcluster.Cluster, k: int, home: str, data: bytes) -> None:
    cluster.exec(k, f"install -d -o {USER} -g {USER} {home}/.cache && rm -rf {home}/.cache/jittor")
    subprocess.run(["podman", "exec", "-i", cluster.node(k).container, "tar", "-x", "-C", f"{home}/.cache"],
                   input=data, check=True, timeout=600)
    cluster.exec(k, f"chown -R {USER}: {home}/.cache/jittor")


def warm(cluster: podcluster.Cluster) -> str:
    """Give every node a compiled Jittor: from the host's cache, else compiled on node 1 (and kept).
    Returns how ('cached', 'compiled on node1'), plus the nodes that had to compile for themselves."""
    key = cache_key(cluster)
    kept, kept_path = _kept(key)
    home = _home(cluster, 1)
    how = "cached"
    if kept.is_file() and kept_path.is_file():
        data, built_at = kept.read_bytes(), kept_path.read_text().strip()
    else:
        cluster.exec(1, _as_user(f"{ENV_PYTHON} -c 'import jittor'"), timeout=2400)
        data, built_at = _tar_of(cluster, 1, home), cache_path(cluster, 1)
        _keep(key, data, built_at, cluster.image)
        how = "compiled on node1"
    own_build = []
    for k in range(1, len(cluster.nodes) + 1):
        if _home(cluster, k) != home:
            own_build.append(f"node{k}")
            continue
        target = cache_path(cluster, k)
        if target == built_at:
            _untar_into(cluster, k, home, data)
            continue
        parts = _host_part(built_at, target)
        if parts is None:
            own_build.append(f"node{k}")
            continue
        _untar_into(cluster, k, home, _moved(data, parts[0], parts[1], home))
    return how + (f"; compiling for themselves: {', '.join(own_build)}" if own_build else "")


_started: dict[str, tuple[threading.Thread, dict]] = {}


def start(cluster: podcluster.Cluster) -> None:
    """Begin warm() in the background, so the build overlaps the tests that only wait on ssh."""
    if cluster.name in _started:
        return
    box: dict = {}

    def work() -> None:
        try:
            box["how"] = warm(cluster)
        except BaseException as exc:  # noqa: BLE001 - handed to the test that waits for it
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"jittor-warm-{cluster.name}", daemon=True)
    thread.start()
    _started[cluster.name] = (thread, box)


def wait(cluster: podcluster.Cluster) -> str:
    """warm()'s result, started by start() or now."""
    if cluster.name not in _started:
        return warm(cluster)
    thread, box = _started[cluster.name]
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["how"]
