"""Which image id 'distrun push-image' put on an inventory's nodes under each name.

The nodes' image stores belong to the training user, which every job runs as: a job can tag an
image of its own with a name a later run uses. A run's image is therefore pinned to the id the
last push of that name put on the nodes (planning/containers.Container.image_id), and the
preflight refuses a node that holds another id under the name. Kept per inventory in this
machine's private state (paths.pushed_images_file); an image never pushed is not pinned (the
nodes must only agree with each other).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from distrun import paths

_ID = re.compile(r"sha256:[0-9a-f]{64}")


def _read(inventory: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(paths.pushed_images_file(inventory).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pushed_id(inventory: Path, ref: str, runtime: str) -> str:
    """The id (sha256:...) the last push put on the nodes under ref with this runtime, or ""."""
    entry = _read(inventory).get(f"{runtime} {ref}")
    image_id = str(entry.get("id", "")) if isinstance(entry, dict) else ""
    return image_id if _ID.fullmatch(image_id) else ""


def record_push(inventory: Path, ref: str, runtime: str, image_id: str) -> None:
    """Remember that every node holds image_id (sha256:...) under ref now (written whole)."""
    if not _ID.fullmatch(image_id):
        raise ValueError(f"not an image id: {image_id!r}")
    data = _read(inventory)
    data[f"{runtime} {ref}"] = {"ref": ref, "runtime": runtime, "id": image_id}
    dest = paths.pushed_images_file(inventory)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".pushed-")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
