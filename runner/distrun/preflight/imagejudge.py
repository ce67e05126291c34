"""The container image's verdict in the preflight: every node of a run has the image, and the
same one (its image id, the digest of its configuration, which names the same content on every
node whichever registry or archive it came from), and what the ranks need inside it: its python3,
the modules the run imports and, where the node's mpirun starts the ranks in it, an Open MPI of
the node's major version. Pure and standard library only, like the judge."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Finding = tuple[bool, str, str]  # ok, detail, fix


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
            source = f"'distrun push-image {ref} --from {agree[0]}'" if agree else \
                f"'distrun push-image {ref}' from the machine that built or pulled it"
            out[h] = (False, f"image {ref} is not in {runtime}'s images of {user} on {h} ({info.get('error') or 'not found'})",
                      f"give it the image: {source}, or '{runtime} pull {ref}' there as {user}")
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
            out[h] = inside(info, node_mpi) or (True, f"{ref} {_short(got)}, the same on every node", "")
    return out


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
    if contents.get("error") or not contents.get("python"):
        return (False, f"image {ref}: its python3 did not run ({contents.get('error') or 'no answer'})",
                f"build the image with python3 on its PATH, and check that '{runtime} run --rm {ref} python3 -V' "
                f"works there as {user}")
    missing = [str(m) for m in contents.get("missing") or []]
    if missing:
        return (False, f"image {ref}: its python3 {contents['python']} cannot import {', '.join(missing)}",
                f"install {' '.join(missing)} in the image (e.g. 'RUN python3 -m pip install {' '.join(missing)}' "
                "in its Containerfile) and load it on every node again")
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
