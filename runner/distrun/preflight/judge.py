"""The preflight's judge: what the nodes' probes mean, per check and node, with the fix.

One evaluator for both ways a preflight runs. Role ``preflight`` calls ``verdict`` through role
distrun's filter plugin (``distrun_preflight_report``) on every node's probe, fails the nodes it
blames and publishes the verdict as the fact ``preflight_verdict``; 'distrun check' and
'distrun train' read that fact and add what only the controller knows (which nodes answered,
GPUs against slots). Comparisons take the value most nodes have as the reference (the head
breaks ties), so a fault is blamed on the same node and told in the same words on either path.
Pure and standard library only: the unit tests feed it fake probes, and Ansible imports it.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from distrun.preflight import imagejudge, judge_site, netjudge, sharedfs, sshmesh
from distrun.preflight.report import CHECKS, LOG_DIR, Item, Report

VERSION_KEYS = ("python", "openmpi", "mpi4py", "torch", "jittor", "env lock")


def _hosts(names: Sequence[str]) -> str:
    return ",".join(names)


def _reference(values: Mapping[str, str], head: str) -> str:
    """The value most nodes have; on a tie the head's (the node that launches)."""
    counts = Counter(values.values())
    best = max(counts.values())
    tied = [v for v, c in counts.items() if c == best]
    if len(tied) > 1 and head in values and values[head] in tied:
        return values[head]
    return tied[0]


def compare_versions(versions: Mapping[str, Mapping[str, str]], head: str, setup: str) -> dict[str, Item]:
    """Per node: ok when every version equals the reference; a difference names both sides.

    ``versions differ: torch 2.13.0 on node1,node2 but 2.12.0 on node3``
    """
    problems: dict[str, list[str]] = {h: [] for h in versions}
    for key in VERSION_KEYS:
        values = {h: str(v.get(key, "missing")) for h, v in versions.items()}
        if len(set(values.values())) <= 1:
            continue
        ref = _reference(values, head)
        agree = sorted(h for h, v in values.items() if v == ref)
        for other in sorted(set(values.values()) - {ref}):
            odd = sorted(h for h, v in values.items() if v == other)
            text = f"{key} {ref} on {_hosts(agree)} but {other} on {_hosts(odd)}"
            for h in odd:
                problems[h].append(text)
    fix = f"run '{setup}' (mpi_env) so every node has the same env"
    out: dict[str, Item] = {}
    for h, v in versions.items():
        if problems[h]:
            out[h] = Item(False, "versions differ: " + "; ".join(problems[h]), fix)
        else:
            out[h] = Item(True, ", ".join(f"{k} {v.get(k, 'missing')}" for k in VERSION_KEYS))
    return out


def _without_own_loopback(host: str, name: str, addresses: str) -> str:
    """What a node's answer for its own name says to the others: Debian's and Ubuntu's installers
    put the machine's hostname on 127.0.1.1, harmless beside the cluster address (nothing else
    reaches a node by its loopback), so a node's loopback answers for itself are left out."""
    if name != host or not addresses:
        return addresses
    kept = []
    for a in addresses.split(","):
        try:
            if ipaddress.ip_address(a).is_loopback:
                continue
        except ValueError:
            pass
        kept.append(a)
    return ",".join(kept)


def compare_names(names: Mapping[str, Mapping[str, str]], head: str, setup: str) -> dict[str, Item]:
    """Every node must resolve every cluster name to the same addresses (and resolve it at all);
    a node that resolves its own name only to loopback addresses agrees with every other."""
    problems: dict[str, list[str]] = {h: [] for h in names}
    all_names = sorted({n for v in names.values() for n in v})
    for name in all_names:
        answers = {h: (v.get(name, ""), _without_own_loopback(h, name, v.get(name, ""))) for h, v in names.items()}
        # Only loopback for itself: no view of its own address to compare.
        values = {h: kept for h, (raw, kept) in answers.items() if kept or not raw}
        resolved = {h: a for h, a in values.items() if a}
        ref = _reference(resolved, head) if resolved else ""
        agree = sorted(h for h, a in values.items() if a == ref)
        for h, a in sorted(values.items()):
            if not a:
                problems[h].append(f"{name} does not resolve on {h}" + (f" ({ref} on {_hosts(agree)})" if ref else ""))
            elif a != ref:
                problems[h].append(f"{h} resolves {name} to {a} but {_hosts(agree)} to {ref}")
    out: dict[str, Item] = {}
    for h in names:
        if problems[h]:
            fix = f"correct /etc/hosts or DNS on {h} (role base manages /etc/hosts: '{setup} --tags base')"
            out[h] = Item(False, "; ".join(problems[h]), fix)
        else:
            out[h] = Item(True, f"{len(names[h])} names resolve as on every other node")
    return out


def verdict(
    probes: Mapping[str, Mapping[str, Any]],
    *,
    head: str,
    shared_mode: str,
    shared_dir: str,
    setup: str,
    seen: Mapping[str, str] | None = None,
    log_dir: str = LOG_DIR,
    site: bool = False,
    env_prefix: str = "",
    planned: Mapping[str, Mapping[str, str]] | None = None,
    ssh_baseline: Mapping[str, str] | None = None,
) -> Report:
    """What the probes (host -> the probe's JSON) say, check -> node -> Item; ``seen`` (host ->
    what the search for the head's probe file printed) only in the full set. ``site``: the head
    is the login node of a Slurm the user does not administer, and the fixes are the user's.
    ``planned``: host -> {iface, address} a run was planned with, checked against the addresses
    each probe found (a node whose probe could not tell is not judged on it). ``ssh_baseline``:
    node -> the ssh fingerprint a login was proved with, which a banner check stands on."""
    seen = seen or {}
    report: Report = {c: {} for c in CHECKS}
    # A probe's ssh to a node out of play (unreachable, its own probe never ran: no fact gathering
    # drops it from the play before the probes start) says nothing about the prober: that node is
    # reported on its own ('reach'), as the network probe's calls to it are left out (netjudge).
    probes = {h: {**p, "ssh": {t: r for t, r in p["ssh"].items() if t in probes}} if isinstance(p.get("ssh"), Mapping)
              else p for h, p in probes.items()}
    never_set_up = set()
    for h, p in list(probes.items()):
        if "probe_error" in p:
            step = (p.get("probe_error") or {}).get("step", "unknown")
            report["preflight"][h] = Item(False, f"the probe failed at step '{step}'", f"its full log is in {log_dir}")
            del probes[h]
        elif not (p.get("setup") or {"ok": True}).get("ok"):
            report["setup"][h] = Item(False, str(p["setup"].get("detail", f"distrun never set up {h}")), f"run '{setup}'")
            never_set_up.add(h)
            del probes[h]
    for h, p in probes.items():
        env = p.get("env") or {}
        missing = sorted((k, v) for k, v in (p.get("needs") or {}).items() if not v.get("ok"))
        if env.get("ok") and missing:
            report["needs"][h] = Item(False, "; ".join(f"{k} is {v.get('detail', 'missing')}" for k, v in missing),
                                      need_fix([k for k, _ in missing], setup))
        elif env.get("ok") and p.get("needs"):
            report["needs"][h] = Item(True, ", ".join(sorted(p["needs"])) + " found")
        report["env"][h] = Item(bool(env.get("ok")), str(env.get("detail", "")),
                                "" if env.get("ok") else f"run '{setup}' (mpi_env)")
        mpi = p.get("mpi4py") or {}
        report["mpi4py"][h] = Item(bool(mpi.get("ok")), str(mpi.get("detail", "")),
                                   "" if mpi.get("ok") else f"run '{setup} --tags mpi_env'")
        if "slurm" in p:
            report["slurm"][h] = Item(bool(p["slurm"].get("ok")), str(p["slurm"].get("detail", "")))
        if "ports" in p:
            busy = {k: v for k, v in p["ports"].items() if not v.get("ok")}
            if busy:
                detail = "; ".join(f"port {k} {v['detail']}" for k, v in busy.items())
                report["ports"][h] = Item(False, detail, "stop that process (a leftover run: 'distrun stop last') "
                                                         "or pass another --port to 'distrun train'")
            else:
                report["ports"][h] = Item(True, "free: " + ", ".join(p["ports"]))
        # ssh as the training user to a node without that user says nothing more than "never set up".
        ssh_fail = {t: r for t, r in (p.get("ssh") or {}).items() if not r.get("ok") and t not in never_set_up}
        if ssh_fail:
            report["ssh"][h] = Item(False, "; ".join(f"{h} -> {t}: {r['detail']}" for t, r in sorted(ssh_fail.items())),
                                    f"run '{setup} --tags ssh_mesh' (add base if names do not resolve)")
        elif p.get("ssh"):
            report["ssh"][h] = Item(*sshmesh.finding(probes, h, ssh_baseline))
    versions = {h: p["versions"] for h, p in probes.items() if (p.get("env") or {}).get("ok") and "versions" in p}
    if versions:
        report["versions"].update(compare_versions(versions, head, setup))
    names = {h: p["names"] for h, p in probes.items() if p.get("names")}
    if names:
        report["names"].update(compare_names(names, head, setup))
    report["shared folder"].update(_shared(probes, seen, head, shared_mode, shared_dir, setup))
    report["addresses"].update(planned_addresses(probes, planned or {}))
    report["network"].update({h: Item(*f) for h, f in netjudge.verdict(probes, head=head).items()})
    report["image"].update({h: Item(*f) for h, f in imagejudge.verdict(probes, head=head, reference=_reference).items()})
    if site:
        report = judge_site.site_fixes(report, probes, env_prefix=env_prefix, shared_dir=shared_dir)
    return {c: dict(sorted(items.items())) for c, items in report.items() if items}


def planned_addresses(probes: Mapping[str, Mapping[str, Any]], planned: Mapping[str, Mapping[str, str]]) -> dict[str, Item]:
    """Whether each planned interface still has the address the plan uses."""
    out: dict[str, Item] = {}
    for h, want in planned.items():
        found = (probes.get(h) or {}).get("addresses")
        if not isinstance(found, Mapping) or not isinstance(want, Mapping):
            continue
        iface, address = str(want.get("iface", "")), str(want.get("address", ""))
        if address in (found.get(iface) or []):
            out[h] = Item(True, f"{address} on {iface}, as planned")
        else:
            out[h] = Item(False, f"the plan expected {address} on {iface}; the node's network changed since its "
                                 "facts were cached", "run 'distrun check' (it gathers the facts again) and train again")
    return out


# What installs each thing a run may need (the labels the runner gives the preflight).
NEED_PACKAGES = {"torchrun": "torch", "module torch": "torch", "module jittor": "jittor", "module pymetis": "pymetis",
                 "module mpi4py": "mpi4py", "module numpy": "numpy"}


def need_fix(labels: Sequence[str], setup: str) -> str:
    """The fix for missing needs: the env's package list for Python things, the roles for the rest."""
    packages = list(dict.fromkeys(NEED_PACKAGES[k] for k in labels if k in NEED_PACKAGES))
    others = [k for k in labels if k not in NEED_PACKAGES]
    fixes = []
    if packages:
        fixes.append(f"add {', '.join(packages)} to the env's packages (mpi_env_packages) and run '{setup}'")
    if any(k in ("mpirun", "orted") for k in others):
        fixes.append(f"run '{setup} --tags mpi_env' (Open MPI)")
    if any(k in ("podman", "docker") for k in others):
        fixes.append("install the container runtime on those nodes (Debian: apt install podman uidmap, with "
                     "subuid/subgid ranges for the training user; or docker.io) or run without --image")
    if any(k in ("srun", "sbatch") for k in others):
        fixes.append(f"enable Slurm for the inventory (slurm_enabled: true) and run '{setup}'")
    return "; ".join(fixes) or f"run '{setup}'"


def _shared(probes: Mapping[str, Mapping[str, Any]], seen: Mapping[str, str], head: str, mode: str,
            shared_dir: str, setup: str) -> dict[str, Item]:
    found = sharedfs.verdict(probes, seen, head=head, mode=mode, shared_dir=shared_dir, setup=setup)
    return {h: Item(*finding) for h, finding in found.items()}
