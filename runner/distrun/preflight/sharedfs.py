"""The shared folder's verdict: is ``distrun_shared_dir`` one folder that every node sees?

Per mode: ``nfs`` and ``sshfs`` (distrun mounts the head's folder: the mount must be there, a file
the head writes is seen at once), ``external`` (the site's own filesystem: distrun mounts nothing,
so every node must see the same filesystem there, and the head's file at once) and ``sync`` (each
node has its own copy, refreshed by rsync from the head). The preflight's judge calls ``verdict``
for 'distrun check' and 'distrun train'; role shared_fs calls ``external_setup`` in external mode
at setup (both through role distrun's filter plugin). Pure and standard library only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

MODES = ("nfs", "sshfs", "sync", "external")

Finding = tuple[bool, str, str]  # ok, detail, fix


def mount_of(path: str, mounts: str | Sequence[str]) -> tuple[str, str]:
    """(mount point, fs type) of the mount that holds ``path``, from /proc/self/mounts lines: the
    longest mount point that is the path or one of its parents; the last one mounted there wins.
    Nothing is looked up on disk: a FUSE mount of another user is not stat-able by root."""
    lines = mounts.splitlines() if isinstance(mounts, str) else list(mounts)
    want = "/" + "/".join(p for p in str(path).split("/") if p and p != ".")
    best = ("", "")
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        target = fields[1].replace("\\040", " ")
        inside = target == "/" or want == target or want.startswith(target.rstrip("/") + "/")
        if inside and len(target) >= len(best[0]):
            best = (target, fields[2])
    return best


def _reference(values: Mapping[str, Any], head: str) -> Any:
    """The value most nodes have; on a tie the head's."""
    counts = Counter(values.values())
    top = max(counts.values())
    tied = [v for v, c in counts.items() if c == top]
    if len(tied) > 1 and values.get(head) in tied:
        return values[head]
    return tied[0]


def _fs(where: tuple[str, str]) -> str:
    return f"{where[0]} ({where[1]})" if where[0] else "no mount"


def external_fix(host: str, shared_dir: str) -> str:
    return (f"mount the shared filesystem at {shared_dir} on {host} as on the other nodes "
            "(distrun_shared_fs_mode external: distrun mounts nothing), then 'distrun check'")


def same_filesystem(found: Mapping[str, tuple[str, str]], head: str, shared_dir: str) -> dict[str, Finding]:
    """Per node: the shared folder lies on the same mount (mount point and fs type) as on most
    nodes; ``found`` is host -> mount_of(shared_dir) there."""
    if not found:
        return {}
    ref = _reference(found, head)
    agree = sorted(h for h, v in found.items() if v == ref)
    out: dict[str, Finding] = {}
    for h, where in found.items():
        if where == ref:
            out[h] = (True, f"{shared_dir} is on {_fs(where)}", "")
        else:
            out[h] = (False, f"{shared_dir} is on {_fs(where)} on {h} but on {_fs(ref)} on {','.join(agree)}: "
                             "not the shared filesystem", external_fix(h, shared_dir))
    return out


def external_setup(findings: Mapping[str, Mapping[str, Any]], *, head: str, shared_dir: str, token: str,
                   setup: str) -> dict[str, str]:
    """What setup finds wrong per node in external mode (host -> one line with the fix).

    ``findings``: host -> ``mounts`` (the text of /proc/self/mounts), ``writable`` (whether the
    training user may write the folder) and ``seen`` (what that user read from the head's probe file).
    """
    problems: dict[str, str] = {}
    fs = same_filesystem({h: mount_of(shared_dir, str(f.get("mounts", ""))) for h, f in findings.items()},
                         head, shared_dir)
    for h, f in sorted(findings.items()):
        ok, detail, fix = fs.get(h, (True, "", ""))
        if not ok:
            problems[h] = f"{detail}; fix: {fix}"
        elif not f.get("writable"):
            problems[h] = (f"{shared_dir} is not writable by the training user on {h}; fix: make it that user's "
                           f"on the shared filesystem (setup makes it on {head} where root may), then '{setup}'")
        elif h != head and token not in str(f.get("seen", "")):
            problems[h] = (f"a file written in {shared_dir} on {head} is not visible on {h}: not the same "
                           f"filesystem; fix: {external_fix(h, shared_dir)}")
    return problems


def verdict(probes: Mapping[str, Mapping[str, Any]], seen: Mapping[str, str], *, head: str, mode: str,
            shared_dir: str, setup: str) -> dict[str, Finding]:
    """The preflight's shared-folder check per node (host -> ok, detail, fix); ``seen`` (full set):
    host -> what the search for the head's probe file printed there."""
    fix = f"run '{setup} --tags shared_fs'"
    out: dict[str, Finding] = {}
    head_probe = probes.get(head, {})
    fs = same_filesystem({h: mount_of(shared_dir, p["shared_fs_mounts"]) for h, p in probes.items()
                          if "shared_fs_mounts" in p}, head, shared_dir) if mode == "external" else {}
    for h, p in probes.items():
        w = p.get("shared_writable") or {}
        mount = p.get("shared_mount") or {"ok": True}
        if not mount.get("ok"):
            # Before writability: an empty mount point is writable, and nothing there is shared.
            out[h] = (False, str(mount.get("detail")), fix)
            continue
        if h in fs and not fs[h][0]:
            out[h] = fs[h]
            continue
        if not w.get("ok"):
            out[h] = (False, str(w.get("detail", f"{shared_dir} not writable")), fix)
            continue
        if h == head:
            sp = head_probe.get("shared_probe")
            if sp is not None and not sp.get("ok"):
                out[h] = (False, str(sp.get("detail")), fix)
            else:
                out[h] = (True, f"{shared_dir} writable" + (", probe file written" if sp else ""), "")
            continue
        if mode == "sync":
            # Each node keeps its own copy, which every run stages its files into: writable is all
            # it needs (the runs' copies between nodes use the run's certificate; the ssh check
            # proves the logins).
            out[h] = (True, f"{shared_dir} writable (sync: this node's own copy)", "")
            continue
        if "shared_probe" not in head_probe:
            out[h] = (True, f"{shared_dir} writable", "")
            continue
        if seen.get(h, "").strip():
            out[h] = (True, f"seen: a file written on {head} is visible at once ({mode})", "")
        elif mode == "external":
            out[h] = (False, f"a file written in {shared_dir} on {head} is not visible on {h}: not the same filesystem",
                      external_fix(h, shared_dir))
        else:
            out[h] = (False, f"a file written in {shared_dir} on {head} is not visible on {h}: "
                             f"is the {mode} mount there?", fix)
    return out
