"""The ssh mesh's baselines: what the last full ssh logins proved, per inventory.

Before every run the head logs in as the training user to every other node of the run, as
mpirun will (about 0.2 s, on the critical path). Every node's probe also reports a fingerprint of
what such a login depends on there (the user's entry and ssh files, sshd's configuration and host
keys, /etc/hosts, the boot). After a preflight whose logins from the head all passed, the runner
keeps the fingerprints of the head and its targets; a run whose head and targets are all kept is
told so (``preflight_ssh_baseline``) and the head only checks that each sshd answers with its
banner. A node whose fingerprint differs from the kept one is unverified: the runner runs the
preflight again with full logins, which pass (and are kept) or refuse the run on the real login's
error.

'distrun check' does the same for the whole mesh: once every node logged in to every other and
all passed, the runner keeps every node's fingerprint as the mesh; a later check over nodes of
that mesh has every node check the others' banners (N(N-1) TCP connections instead of N(N-1)
logins), and a node whose fingerprint changed sends the check back to full logins from every node.
The role calls the pure functions through role distrun's filter plugin.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from distrun import paths

# What the preflight's judge publishes beside its verdict (``summary``).
FACT = "preflight_ssh_mesh"


def mode(baseline: Mapping[str, str] | None, head: str, targets: Sequence[str]) -> str:
    """How the head checks ssh: 'banner' when the baseline holds the head and every target
    (a login from this head to each was proved), else 'login'."""
    known = set(baseline or {})
    return "banner" if targets and head in known and set(targets) <= known else "login"


def _usable(probe: Mapping[str, Any] | None) -> bool:
    """A probe that ran through (one that broke, or a node never set up, is reported as such)."""
    return probe is not None and "probe_error" not in probe and bool((probe.get("setup") or {"ok": True}).get("ok"))


def _ssh(probes: Mapping[str, Mapping[str, Any]], head: str) -> Mapping[str, Mapping[str, Any]]:
    return (probes.get(head) or {}).get("ssh") or {}


def changed(probes: Mapping[str, Mapping[str, Any]], head: str, baseline: Mapping[str, str] | None) -> list[str]:
    """The nodes whose fingerprint differs from the baseline (or is missing): the head, when it
    checked banners, and the targets whose banner it checked."""
    banner = [t for t, r in _ssh(probes, head).items() if r.get("check") == "banner" and _usable(probes.get(t))]
    if not banner:
        return []
    kept = baseline or {}
    return sorted(n for n in {head, *banner} if not (probes.get(n) or {}).get("ssh_fingerprint")
                  or (probes.get(n) or {}).get("ssh_fingerprint") != kept.get(n))


def finding(probes: Mapping[str, Mapping[str, Any]], head: str, baseline: Mapping[str, str] | None) -> tuple[bool, str, str]:
    """The ssh check of the head once every check it made passed: ok, or unverified when a
    banner stood in for a login and a node changed since the login was proved."""
    results = _ssh(probes, head)
    banner = sorted(t for t, r in results.items() if r.get("check") == "banner")
    logins = sorted(t for t in results if t not in banner)
    moved = changed(probes, head, baseline)
    if moved:
        return (False, f"{head} -> {','.join(banner)}: sshd answers, but no login was verified since "
                       f"{','.join(moved)} changed (the user, its ssh keys or config, sshd or a reboot)",
                "run 'distrun check --ssh-logins' (it logs in from every node), then train again")
    parts = [f"reaches {','.join(logins)}"] if logins else []
    if banner:
        parts.append(f"sshd answers on {','.join(banner)} (login verified earlier, nothing changed since)")
    return True, "; ".join(parts), ""


def summary(probes: Mapping[str, Mapping[str, Any]], *, head: str, baseline: Mapping[str, str] | None,
            every: bool = False) -> dict[str, Any]:
    """What the runner needs of a preflight (published as FACT): how ssh was checked ('login',
    'banner' or 'none'), whether every check passed, the fingerprints of the nodes checked, and the
    nodes a banner check left unverified. The head's checks; with ``every`` (the full set, where
    every node checks every other), every node's, and ``mesh`` says so."""
    sources = sorted(n for n, p in probes.items() if _ssh(probes, n)) if every else [head]
    results = [r for s in sources for r in _ssh(probes, s).values()]
    nodes = {*sources, *(t for s in sources for t in _ssh(probes, s))}
    how = "none" if not results else "banner" if any(r.get("check") == "banner" for r in results) else "login"
    fingerprints = {n: str(probes[n]["ssh_fingerprint"]) for n in sorted(nodes)
                    if _usable(probes.get(n)) and probes[n].get("ssh_fingerprint")}
    passed = bool(results) and all(r.get("ok") for r in results)
    if every:  # a mesh is proved only with every node's probe through and its fingerprint known
        passed = passed and all(_usable(p) for p in probes.values()) and set(fingerprints) == nodes
    out = {"head": head, "checked": how, "passed": passed, "fingerprints": fingerprints,
           "unverified": sorted({n for s in sources for n in changed(probes, s, baseline)})}
    if every:
        out["mesh"] = True
    return out


def unverified(mesh: Mapping[str, Any] | None) -> bool:
    """Whether a preflight's ssh check failed only for want of a login: run it again with logins."""
    return bool(isinstance(mesh, Mapping) and mesh.get("unverified"))


def _file(inventory: Path) -> Path:
    cache = paths.fact_cache_dir(inventory)
    return cache.with_name(cache.name + ".ssh-mesh.json")


def _read(inventory: Path) -> dict[str, Any]:
    try:
        data = json.loads(_file(inventory).read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and isinstance(data.get("head"), str) and isinstance(data.get("nodes"), dict)
    return data if ok else {}


def baseline(inventory: Path, head: str) -> dict[str, str]:
    """Node -> fingerprint a login from ``head`` was proved with; empty for another head (its
    logins were never tried) or when nothing was kept."""
    return _head_nodes(_read(inventory), head)


def _head_nodes(kept: Mapping[str, Any], head: str) -> dict[str, str]:
    """What ``baseline`` gives, from the file's contents as read."""
    if kept.get("head") != head:
        return {}
    return {str(n): str(fp) for n, fp in kept["nodes"].items()}


def mesh_baseline(inventory: Path) -> dict[str, str]:
    """Node -> fingerprint of the nodes among which every login was last proved ('distrun
    check'); empty when none was kept."""
    mesh = _read(inventory).get("mesh")
    return {str(n): str(fp) for n, fp in mesh.items()} if isinstance(mesh, dict) else {}


def remember(inventory: Path, mesh: Mapping[str, Any] | None) -> None:
    """Keep what a preflight's logins proved. Logins that all passed add the head's and the
    targets' fingerprints (to the kept ones while the head is unchanged), and a full set's
    logins replace the kept mesh; a failed login forgets everything, so the next run or check
    logs in again. Banner checks prove nothing new."""
    if not isinstance(mesh, Mapping) or mesh.get("checked") != "login":
        return
    head, found = str(mesh.get("head", "")), dict(mesh.get("fingerprints") or {})
    if not mesh.get("passed"):
        with contextlib.suppress(OSError):
            _file(inventory).unlink(missing_ok=True)
        return
    if head not in found:
        return
    kept = _read(inventory)
    proved = {str(n): str(fp) for n, fp in found.items()}
    nodes = _head_nodes(kept, head)
    if nodes.get(head) != found[head]:
        nodes = {}  # the other nodes were proved from a head that has changed since
    nodes.update(proved)
    data: dict[str, Any] = {"head": head, "nodes": nodes}
    if mesh.get("mesh"):
        data["mesh"] = proved
    elif isinstance(kept.get("mesh"), dict):
        data["mesh"] = kept["mesh"]  # a changed node's fingerprint still sends the next check to logins
    _write(_file(inventory), data)


def _write(path: Path, data: dict[str, Any]) -> None:
    """Replace the file whole (a reader never sees half of it), private to the user."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # not kept: the next run logs in again
