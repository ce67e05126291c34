"""The container image's verdict in the preflight: every node of a run has the image, and the
same one (its image id, the digest of its configuration, which names the same content on every
node whichever registry or archive it came from). Pure and standard library only, like the judge."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Finding = tuple[bool, str, str]  # ok, detail, fix


def _short(image_id: str) -> str:
    return image_id[:19]  # sha256: and 12 hex digits, as the runtimes show an id


def verdict(probes: Mapping[str, Mapping[str, Any]], *, head: str,
            reference: Callable[[Mapping[str, str], str], str]) -> dict[str, Finding]:
    """Per node that probed an image (the probe's ``image``: ref, runtime, user, id or error):
    missing, different from the id most nodes have (the head breaks ties: ``reference``), or ok."""
    found = {h: p["image"] for h, p in probes.items() if isinstance(p.get("image"), Mapping)}
    out: dict[str, Finding] = {}
    ids = {h: str(i.get("id") or "") for h, i in found.items() if i.get("id")}
    want = reference(ids, head) if ids else ""
    agree = sorted(h for h, i in ids.items() if i == want)
    for h, info in found.items():
        ref, runtime, user = str(info.get("ref", "")), str(info.get("runtime", "")), str(info.get("user", ""))
        got = ids.get(h, "")
        if not got:
            out[h] = (False, f"image {ref} is not in {runtime}'s images of {user} on {h} ({info.get('error') or 'not found'})",
                      f"pull or load it there as {user}: '{runtime} pull {ref}' (or '{runtime} load -i FILE' "
                      "with the archive the other nodes loaded)")
        elif got != want:
            out[h] = (False, f"image {ref} on {h} is {_short(got)} but {_short(want)} on {','.join(agree)}",
                      f"give {h} the same image: '{runtime} pull {ref}' there as {user}, or load the other nodes' "
                      f"archive ('{runtime} save {ref}' on {agree[0]})")
        else:
            out[h] = (True, f"{ref} {_short(got)}, the same on every node", "")
    return out
