"""The container image's verdict in the preflight: every node of a run has the image, and the
same one (its image id, the digest of its configuration, which names the same content on every
node whichever registry or archive it came from), and what the ranks need inside it: its python3,
the modules the run imports, a torch new enough for the flags distrun gives torchrun (where the
image's torchrun starts the ranks), where the node's mpirun starts the ranks in it an Open MPI of
the node's major version, and the shared folder the same inside its containers as on the node
(rootless podman's pause process keeps the mounts it first saw). A name no node has is one line
for every node, with the names the nodes do hold that come close. The storage driver is said
where it costs every start a copy of the image (vfs). Pure and standard library only, like the
judge."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any

Finding = tuple[bool, str, str]  # ok, detail, fix

# The oldest torch whose torchrun takes the options distrun gives it (--nproc-per-node and the
# other hyphenated spellings, --local-addr): 2.0. Debian 12's python3-torch is 1.13.
MIN_TORCH = (2, 0)


def _short(image_id: str) -> str:
    return image_id[:19]  # sha256: and 12 hex digits, as the runtimes show an id


def verdict(probes: Mapping[str, Mapping[str, Any]], *, head: str,
            reference: Callable[[Mapping[str, str], str], str]) -> dict[str, Finding]:
    """Per node that probed an image (the probe's ``image``: ref, runtime, user, id or error, and
    ``pushed``, the id 'distrun push-image' put on the nodes): missing, not the pushed id,
    different from the id most nodes have (the head breaks ties: ``reference``), or ok."""
    found = {h: p["image"] for h, p in probes.items() if isinstance(p.get("image"), Mapping)}
    out: dict[str, Finding] = {}
    ids = {h: str(i.get("id") or "") for h, i in found.items() if i.get("id")}
    want = reference(ids, head) if ids else ""
    agree = sorted(h for h, i in ids.items() if i == want)
    for h, info in found.items():
        ref, runtime, user = str(info.get("ref", "")), str(info.get("runtime", "")), str(info.get("user", ""))
        got = ids.get(h, "")
        if not got:
            out[h] = _missing(info, agree, found)
        elif info.get("pushed") and got != info["pushed"]:
            pushed = str(info["pushed"])
            out[h] = (False, f"image {ref} on {h} is {_short(got)}, not the {_short(pushed)} 'distrun push-image' put "
                             f"there (the training user's store is every job's: one can tag its own image {ref})",
                      f"push it again from where it was built: 'distrun push-image {ref}', or name it by digest "
                      f"({ref.split('@')[0]}@sha256:...)")
        elif got != want:
            out[h] = (False, f"image {ref} on {h} is {_short(got)} but {_short(want)} on {','.join(agree)}",
                      f"give {h} the same image: 'distrun push-image {ref} --from {agree[0]}', or "
                      f"'{runtime} pull {ref}' there as {user}")
        else:
            node_mpi = str(((probes[h].get("versions") or {}).get("openmpi")) or "")
            out[h] = inside(info, node_mpi) or (True, f"{ref} {_short(got)}, the same on every node{_seen(info)}", "")
    return out


def _missing(info: Mapping[str, Any], agree: list[str], found: Mapping[str, Mapping[str, Any]]) -> Finding:
    """A node without the image: the same words for every such node (the refusal names them
    together), and the names close to it that the nodes' stores hold."""
    ref, runtime, user = str(info.get("ref", "")), str(info.get("runtime", "")), str(info.get("user", ""))
    error = str(info.get("error") or "")
    known = re.search(r"image not known|no such image|not found|does not exist", error, re.I)
    why = "" if not error or known else f" ({error[:120]})"
    names = sorted({str(n) for i in found.values() for n in (i.get("names") or [])})
    close = difflib.get_close_matches(ref, names, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    source = f"'distrun push-image {ref} --from {agree[0]}'" if agree else \
        f"'distrun push-image {ref}' from the machine that built or pulled it"
    return (False, f"image {ref} is not in {runtime}'s images of {user}{why}{hint}",
            f"give it the image: {source}, or '{runtime} pull {ref}' there as {user}")


def _seen(info: Mapping[str, Any]) -> str:
    """What the look inside found that a user wants to know: python3's and torch's versions, and
    a storage driver that copies the whole image at every container start."""
    found = info.get("contents")
    contents: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    parts = [f"python {contents['python']}"] if contents.get("python") else []
    if contents.get("torch"):
        parts.append(f"torch {contents['torch']}")
    driver = str(info.get("driver") or "")
    if driver == "vfs":
        parts.append("storage vfs: every container start copies the whole image (a storage.conf with overlay "
                     "and fuse-overlayfs avoids it; docs/guide/containers.md)")
    elif driver:
        parts.append(f"storage {driver}")
    return f"; {', '.join(parts)}" if parts else ""


def _version(text: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def _major(version: str) -> str:
    m = re.search(r"(\d+)\.\d+", version)
    return m.group(1) if m else ""


def inside(info: Mapping[str, Any], node_mpi: str) -> Finding | None:
    """What a rank would lack inside the image on a node (the probe's ``contents``: python3's
    version, the modules it cannot find, mpi4py's MPI library), or None when nothing is lacking
    or nothing was looked at."""
    contents = info.get("contents")
    if not isinstance(contents, Mapping):
        return None
    ref, runtime, user = str(info.get("ref", "")), str(info.get("runtime", "")), str(info.get("user", ""))
    stale = _stale_folder(contents)
    if stale:
        return (False, f"image {ref}: its containers do not see the shared folder the node has ({stale}): rootless "
                       f"podman's pause process of {user} keeps the mounts it saw when it started, and the folder was "
                       "mounted again since; the ranks would fail with 'cannot chdir'",
                f"run 'podman system migrate' as {user} on the node, then run again")
    if contents.get("error") or not contents.get("python"):
        return (False, f"image {ref}: its python3 did not run ({contents.get('error') or 'no answer'})",
                f"build the image with python3 on its PATH, and check that '{runtime} run --rm {ref} python3 -V' "
                f"works there as {user}")
    missing = [str(m) for m in contents.get("missing") or []]
    if missing:
        return (False, f"image {ref}: its python3 {contents['python']} cannot import {', '.join(missing)}",
                f"install {' '.join(missing)} in the image (e.g. 'RUN python3 -m pip install {' '.join(missing)}' "
                "in its Containerfile) and load it on every node again")
    torch = str(contents.get("torch") or "")
    if info.get("torchrun") and torch and _version(torch) and _version(torch) < MIN_TORCH:
        least = ".".join(map(str, MIN_TORCH))
        return (False, f"image {ref}: its torch is {torch}, older than the {least} distrun's torchrun flags need "
                       "(--nproc-per-node, --local-addr): every agent would exit 2 at launch",
                f"build the image with torch {least} or newer (pip's torch, not Debian's python3-torch 1.13), or use "
                "--launcher mpirun or ssh")
    if "mpi" in contents or "mpi_error" in contents:
        image_mpi = str(contents.get("mpi") or "")
        if not image_mpi:
            return (False, f"image {ref}: mpi4py finds no MPI library ({contents.get('mpi_error')})",
                    "install Open MPI in the image, the same major version as the nodes'")
        if "open mpi" not in image_mpi.lower() or (_major(node_mpi) and _major(image_mpi) != _major(node_mpi)):
            return (False, f"image {ref}: its MPI is {image_mpi[:60]}, the node's mpirun is Open MPI "
                           f"{node_mpi}: the node's mpirun starts each rank in the image, so the major versions must match",
                    f"build the image with Open MPI {_major(node_mpi) or 'of the nodes'}.x, or use --launcher torchrun")
    return None


def _stale_folder(contents: Mapping[str, Any]) -> str:
    """How the shared folder differs inside the image's containers from the node's ("" when it
    does not): entering it failed, or it is another folder (device and inode)."""
    error = str(contents.get("error") or "")
    if re.search(r"chdir|transport endpoint is not connected|stale file handle", error, re.I):
        return error[:160]
    if contents.get("folder_error"):
        return str(contents["folder_error"])[:160]
    inside, here = str(contents.get("folder") or ""), str(contents.get("folder_here") or "")
    if inside and here and inside != here:
        return f"device:inode {inside} inside, {here} on the node"
    return ""
