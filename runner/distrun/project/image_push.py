"""``distrun push-image``: one image into the training user's image store on every node, by id.

The image comes from this machine's own store (what ``podman build`` or ``podman pull`` made
here) or from a node that has it (``--from``). Every node is asked for the image's id first; a
node that already holds that id gets nothing (the id is the digest of the image's configuration:
the same content has the same id whichever store, registry or archive it came from). The others
get one archive, saved once into this machine's cache under the id's name (a second push of the
same image saves nothing) and streamed to all of them at once over their ssh connections,
loaded as the training user (rootless podman keeps images per user). Each node is asked again
afterwards: a node that does not then hold the id fails the push, naming it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from distrun import paths
from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import Cluster, Node
from distrun.planning import containers
from distrun.store import images
from distrun.transport import remote

LOAD_TIMEOUT_S = 3600.0  # an archive of tens of GiB over a slow link
_ID = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


@dataclass
class NodeResult:
    host: str
    before: str  # the id the node held under the name ("" none)
    after: str = ""
    moved: int = 0  # bytes sent
    seconds: float = 0.0
    error: str = ""


@dataclass
class Push:
    ref: str
    runtime: str
    source: str  # "this machine" or a node's name
    image_id: str
    archive: str = ""  # the cached archive, when one was needed
    saved: bool = False  # whether this push wrote the archive (False: it was cached)
    nodes: list[NodeResult] = field(default_factory=list)

    @property
    def moved(self) -> int:
        return sum(n.moved for n in self.nodes)

    @property
    def failed(self) -> list[NodeResult]:
        return [n for n in self.nodes if n.error]


def image_id_of(text: str) -> str:
    """The 64 hex digits of the image id a runtime printed on a line of its own ("" where none):
    the runtime's warnings share the stream (a node's shell merges its stderr into it)."""
    found = [m[1] for m in map(_ID.fullmatch, (line.strip() for line in text.splitlines())) if m]
    return found[-1] if found else ""


def _as_user(user: str, argv: list[str], max_s: float, people: bool) -> str:
    """argv as the training user on a node, in a unit of that user's own that ends with it (its
    runtime's pause process too): planning/containers.in_user_unit, started by root (a person's
    own, with people: remote.root_or_person)."""
    return remote.root_or_person(user, shlex.join(containers.in_user_unit(user, argv, int(max_s))), people=people)


def _inspect(runtime: str, ref: str) -> list[str]:
    return [runtime, "image", "inspect", "--format", "{{.Id}}", ref]


def node_ids(cluster: Cluster, runtime: str, ref: str) -> dict[str, tuple[str, str]]:
    """Host -> (the image id its training user holds under ref, or "", why not when unreachable)."""
    nodes = {n.name: n for n in cluster.nodes}
    done = remote.run_each(nodes, {h: _as_user(cluster.user, _inspect(runtime, ref), 120, cluster.has_people) for h in nodes}, 120)
    out = {}
    for h, d in done.items():
        got = image_id_of(d.out) if d.rc == 0 else ""
        # An image that is not there is an answer; a node that did not answer is not.
        unreachable = d.rc is None or d.rc == 255
        out[h] = (got, f"no answer ({d.last_line()})" if unreachable else "")
    return out


def _local_id(runtime: str, ref: str) -> str:
    try:
        proc = subprocess.run(_inspect(runtime, ref), capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return image_id_of(proc.stdout) if proc.returncode == 0 else ""


def archive_path(image_id: str) -> Path:
    """This machine's copy of an image as an archive, named by its id (private to the user)."""
    folder = paths.state_dir() / "images"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder / f"{image_id}.tar"


def _save(runtime: str, ref: str, source: Node | None, user: str, dest: Path, people: bool) -> None:
    """The image into dest, whole or not at all (written beside it, renamed when complete)."""
    save = [runtime, "save", ref]
    argv = remote.shell_argv(source, _as_user(user, save, LOAD_TIMEOUT_S, people)) if source else save
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".saving-")
    try:
        with os.fdopen(fd, "wb") as fh:
            proc = subprocess.run(argv, stdout=fh, stderr=subprocess.PIPE, timeout=LOAD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            why = proc.stderr.decode(errors="replace").strip().splitlines()
            where = f"on {source.name}" if source else "on this machine"
            raise UserError(f"'{runtime} save {ref}' {where} failed: {why[-1] if why else f'exit {proc.returncode}'}",
                            exit_code=ExitCode.FAILED)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(node: Node, user: str, runtime: str, archive: Path, people: bool) -> tuple[int, float, str]:
    """Stream the archive into the node's store: (bytes sent, seconds, why it failed or "")."""
    started = time.monotonic()
    argv = remote.shell_argv(node, _as_user(user, [runtime, "load", "-q"], LOAD_TIMEOUT_S, people))
    with archive.open("rb") as fh:
        try:
            proc = subprocess.run(argv, stdin=fh, capture_output=True, timeout=LOAD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return 0, time.monotonic() - started, f"'{runtime} load' did not end in {LOAD_TIMEOUT_S:.0f} s"
    took = time.monotonic() - started
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        return 0, took, f"'{runtime} load' as {user} failed: {lines[-1] if lines else f'exit {proc.returncode}'}"
    return archive.stat().st_size, took, ""


def push(cluster: Cluster, ref: str, from_node: str | None = None) -> Push:
    """Every node of the cluster holds ref with the source's id afterwards, or the push names
    the nodes that do not. Nothing moves to a node that already holds it."""
    containers.check_image(ref, "push-image: IMAGE")
    runtime = containers.choose(cluster.source, cluster.group_vars, ref, None)
    assert runtime is not None
    rt = runtime.runtime
    nodes = {n.name: n for n in cluster.nodes}
    if from_node is not None and from_node not in nodes:
        raise UserError(f"--from {from_node}: no such node in inventory {cluster.source}; "
                        f"name one of {', '.join(nodes)}")
    before = node_ids(cluster, rt, ref)
    unreachable = {h: why for h, (_, why) in before.items() if why}
    if unreachable:
        raise UserError("; ".join(f"{h}: {why}" for h, why in sorted(unreachable.items()))
                        + ": nothing was pushed; bring the node back or leave it out of the inventory",
                        exit_code=ExitCode.FAILED)
    if from_node:
        want = before[from_node][0]
        if not want:
            raise UserError(f"image {ref} is not in {rt}'s images of {cluster.user} on {from_node}: "
                            f"'{rt} pull {ref}' or build it there first, or push it from this machine")
        source = from_node
    else:
        want = _local_id(rt, ref)
        if not want:
            raise UserError(f"image {ref} is not in this machine's {rt} images: build or pull it here "
                            f"('{rt} build -t {ref} .', '{rt} pull {ref}'), or name a node that has it with --from NODE")
        source = "this machine"
    result = Push(ref, rt, source, want)
    targets = [h for h, (got, _) in before.items() if got != want]
    for h, (got, _) in before.items():
        if h not in targets:
            result.nodes.append(NodeResult(h, got, got))
    if not targets:
        images.record_push(cluster.source, ref, rt, f"sha256:{want}")
        return result
    archive = archive_path(want)
    result.archive = str(archive)
    if not archive.is_file():
        _save(rt, ref, nodes[from_node] if from_node else None, cluster.user, archive, cluster.has_people)
        result.saved = True
    with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
        loads = {h: pool.submit(_load, nodes[h], cluster.user, rt, archive, cluster.has_people) for h in targets}
    after = node_ids(cluster, rt, ref)
    for h in targets:
        moved, took, error = loads[h].result()
        got = after[h][0]
        if not error and got != want:
            error = f"holds {got[:12] or 'nothing'} under {ref} after the load, not {want[:12]}"
        result.nodes.append(NodeResult(h, before[h][0], got, moved, round(took, 1), error))
    result.nodes.sort(key=lambda n: list(nodes).index(n.host))
    if not result.failed:  # every node holds it now: runs of this name want this id (store/images.py)
        images.record_push(cluster.source, ref, rt, f"sha256:{want}")
    return result
