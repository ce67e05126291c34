"""'distrun check': the full preflight on the real nodes, as one report per check and node.

The role ``preflight`` (``preflight_full: true``) probes every node in one command per host and
fails hosts with a fix; this module collects the probes from ansible-runner's events and builds
the report: which nodes agree with each other (the most common value wins, the head breaks
ties), what is wrong where, and the fix. Building the report is pure, so it is unit-tested with
fake probes; ``run_check`` is the thin part that talks to the nodes.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import contract, paths
from .ansible_bridge import PlaybookEvent, PlaybookResult, run_playbook
from .inventory import Cluster, Node, cluster_from_json, read_inventory_json
from .plan import gpu_slot_mismatches
from .runs import new_run

# Report order; also the rows of the human table.
CHECKS = ("reach", "setup", "env", "mpi4py", "needs", "versions", "ports", "ssh", "names", "shared folder", "gpus vs slots", "preflight")
VERSION_KEYS = ("python", "openmpi", "mpi4py", "torch", "jittor", "env lock")
PROBE_TASK = "Probe env, versions"
SEEN_TASK = "Look for the head's probe file"


@dataclass(frozen=True)
class Item:
    ok: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "fix": self.fix}


Report = dict[str, dict[str, Item]]  # check -> node -> item


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


def compare_names(names: Mapping[str, Mapping[str, str]], head: str, setup: str) -> dict[str, Item]:
    """Every node must resolve every cluster name to the same address (and resolve it at all)."""
    problems: dict[str, list[str]] = {h: [] for h in names}
    all_names = sorted({n for v in names.values() for n in v})
    for name in all_names:
        values = {h: v.get(name, "") for h, v in names.items()}
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


def gpu_items(nodes: Sequence[Node], inventory: str) -> dict[str, Item]:
    bad = {m.host: m for m in gpu_slot_mismatches(nodes)}
    out: dict[str, Item] = {}
    for n in nodes:
        if not n.is_worker:
            continue
        if n.name in bad:
            out[n.name] = Item(False, bad[n.name].message(),
                               f"set slots={n.gpus} for {n.name} in {inventory} (or remove 'slots' to use the GPU "
                               "count); 'distrun train --allow-gpu-mismatch' runs anyway")
        else:
            why = f"{n.gpus} GPU(s)" if n.gpus else "no GPU detected"
            out[n.name] = Item(True, f"slots={n.slots}, {why}")
    return out


def build_report(
    *,
    nodes: Sequence[str],
    head: str,
    probes: Mapping[str, Mapping[str, Any]],
    seen: Mapping[str, str],
    hosts: Mapping[str, Mapping[str, str]],
    shared_mode: str,
    shared_dir: str,
    setup: str,
    gpus: Mapping[str, Item] | None = None,
    log_dir: str = "the run record's ansible/ folder",
) -> Report:
    """Turn the probes (host -> the role's JSON), the probe-file sightings and the Ansible host
    states into check -> node -> Item. Pure: the unit tests feed it fake probes."""
    report: Report = {c: {} for c in CHECKS}
    for h in nodes:
        st = hosts.get(h, {"state": "not reached", "error": ""})
        if st["state"] == "unreachable" or (st["state"] == "not reached" and h not in probes):
            report["reach"][h] = Item(False, st.get("error") or "not reached",
                                      f"start {h}, check its ansible_host and that sshd runs; then 'distrun check' again")
        else:
            report["reach"][h] = Item(True, "reached over ssh")
    probes = dict(probes)
    for h, p in list(probes.items()):
        if "probe_error" in p:
            step = (p.get("probe_error") or {}).get("step", "unknown")
            report["preflight"][h] = Item(False, f"the probe failed at step '{step}'", f"its full log is in {log_dir}")
            del probes[h]
        elif not (p.get("setup") or {"ok": True}).get("ok"):
            report["setup"][h] = Item(False, str(p["setup"].get("detail", f"distrun never set up {h}")), f"run '{setup}'")
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
        if "ports" in p:
            busy = {k: v for k, v in p["ports"].items() if not v.get("ok")}
            if busy:
                detail = "; ".join(f"port {k} {v['detail']}" for k, v in busy.items())
                report["ports"][h] = Item(False, detail, "stop that process (a leftover run: 'distrun stop last') "
                                                         "or pass another --port to 'distrun train'")
            else:
                report["ports"][h] = Item(True, "free: " + ", ".join(p["ports"]))
        ssh_fail = {t: r for t, r in (p.get("ssh") or {}).items() if not r.get("ok")}
        if ssh_fail:
            report["ssh"][h] = Item(False, "; ".join(f"{h} -> {t}: {r['detail']}" for t, r in sorted(ssh_fail.items())),
                                    f"run '{setup} --tags ssh_mesh' (add base if names do not resolve)")
        elif p.get("ssh"):
            report["ssh"][h] = Item(True, "reaches " + ",".join(sorted(p["ssh"])))
    versions = {h: p["versions"] for h, p in probes.items() if (p.get("env") or {}).get("ok") and "versions" in p}
    if versions:
        report["versions"].update(compare_versions(versions, head, setup))
    names = {h: p["names"] for h, p in probes.items() if p.get("names")}
    if names:
        report["names"].update(compare_names(names, head, setup))
    report["shared folder"].update(_shared(probes, seen, head, shared_mode, shared_dir, setup))
    report["gpus vs slots"].update(gpus or {})
    explained = {h for c, items in report.items() for h, it in items.items() if not it.ok}
    for h, st in hosts.items():
        if st["state"] == "failed" and h not in explained:
            report["preflight"][h] = Item(False, st.get("error", ""), "see the run record's ansible/ folder")
    return {c: dict(sorted(items.items())) for c, items in report.items() if items}


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
    if any(k in ("srun", "sbatch") for k in others):
        fixes.append(f"enable Slurm for the inventory (slurm_enabled: true) and run '{setup}'")
    return "; ".join(fixes) or f"run '{setup}'"


def refusal(report: Report) -> str:
    """Every problem of a report on one line, hosts with the same problem named together.

    ``torchrun is not in /opt/env/bin on node1, node2: add torch to ...``
    """
    groups: dict[tuple[str, str, str], list[str]] = {}
    for check in CHECKS:
        for h, it in (report.get(check) or {}).items():
            if not it.ok:
                groups.setdefault((check, it.detail, it.fix), []).append(h)
    parts = [f"{check}: {detail} on {', '.join(hosts)}" + (f": {fix}" if fix else "")
             for (check, detail, fix), hosts in groups.items()]
    return " | ".join(parts)


def _shared(probes: Mapping[str, Mapping[str, Any]], seen: Mapping[str, str], head: str, mode: str,
            shared_dir: str, setup: str) -> dict[str, Item]:
    fix = f"run '{setup} --tags shared_fs'"
    out: dict[str, Item] = {}
    head_probe = probes.get(head, {})
    for h, p in probes.items():
        w = p.get("shared_writable") or {}
        mount = p.get("shared_mount") or {"ok": True}
        if not mount.get("ok"):
            # Before writability: an empty mount point is writable, and nothing there is shared.
            out[h] = Item(False, str(mount.get("detail")), fix)
            continue
        if not w.get("ok"):
            out[h] = Item(False, str(w.get("detail", f"{shared_dir} not writable")), fix)
            continue
        if h == head:
            sp = head_probe.get("shared_probe")
            if sp is not None and not sp.get("ok"):
                out[h] = Item(False, str(sp.get("detail")), fix)
            else:
                out[h] = Item(True, f"{shared_dir} writable" + (", probe file written" if sp else ""))
            continue
        if "shared_probe" not in head_probe:
            out[h] = Item(True, f"{shared_dir} writable")
            continue
        found = bool(seen.get(h, "").strip())
        if mode == "sync":
            sync = (head_probe.get("synced") or {}).get(h, {"ok": False, "detail": "not attempted"})
            if sync.get("ok") and found:
                out[h] = Item(True, "synced: the head's probe file arrived by rsync")
            else:
                why = sync.get("detail") if not sync.get("ok") else "rsync reported success but the file is not there"
                out[h] = Item(False, f"the head's probe file did not reach {h}: {why}", fix)
        elif found:
            out[h] = Item(True, f"seen: a file written on {head} is visible at once ({mode})")
        else:
            out[h] = Item(False, f"a file written in {shared_dir} on {head} is not visible on {h}: "
                                 f"is the {mode} mount there?", fix)
    return out


def report_json(report: Report, hosts: Mapping[str, Mapping[str, str]], elapsed: float) -> dict[str, Any]:
    ok = all(it.ok for items in report.values() for it in items.values())
    return {
        "ok": ok,
        "checks": {c: {h: it.as_dict() for h, it in items.items()} for c, items in report.items()},
        "hosts": {h: dict(v) for h, v in hosts.items()},
        "elapsed_s": round(elapsed, 2),
    }


class ProbeCollector:
    """Keeps the role's probe results from the event stream, and forwards events to the UI."""

    def __init__(self, forward: Callable[[PlaybookEvent], None] | None) -> None:
        self.forward = forward
        self.probes: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, str] = {}

    def __call__(self, ev: PlaybookEvent) -> None:
        if ev.kind in ("ok", "changed") and ev.host:
            if ev.task.startswith(PROBE_TASK):
                try:
                    found = json.loads(str(ev.data.get("stdout", "")))
                except ValueError:
                    found = None
                if isinstance(found, dict):
                    self.probes[ev.host] = found
            if ev.task.startswith(SEEN_TASK):
                self.seen[ev.host] = str(ev.data.get("stdout", ""))
        if self.forward is not None:
            self.forward(ev)


def run_check(inventory: Path, label: str,
              progress: Callable[[list[str]], Any] | None = None) -> tuple[dict[str, Any], Cluster]:
    """Run the full preflight; the report as 'distrun check --json' prints it, and the cluster.

    ``progress(host_names)`` gives a context manager that is also the event handler (the live
    table of the human output); without it nothing is printed.
    """
    started = time.monotonic()
    # Read the inventory once (ansible-inventory takes a second or more): a stopped node must
    # be reported fast, and the second Cluster below only re-reads the fact cache.
    data = read_inventory_json(inventory)
    cluster = cluster_from_json(inventory, data, paths.fact_cache_dir(inventory))
    run = new_run("check", inventory)
    names = [n.name for n in cluster.nodes]
    with (progress(names) if progress else contextlib.nullcontext()) as on_event:
        collector = ProbeCollector(on_event)
        result: PlaybookResult = run_playbook(
            "playbooks/preflight.yml", inventory, run.dir, on_event=collector,
            extravars={"preflight_full": True, "preflight_inventory": label},
        )
    log_dir = str(run.dir / "ansible")
    hosts = {h.name: {"state": h.state, "error": h.last_error} for h in result.hosts.values()}
    for node in cluster.nodes:
        hosts.setdefault(node.name, {"state": "not reached", "error": ""})
    cluster = cluster_from_json(inventory, data, paths.fact_cache_dir(inventory))  # the facts just gathered: gpus
    reached = [n for n in cluster.workers if hosts[n.name]["state"] != "unreachable"]
    report = build_report(
        nodes=[n.name for n in cluster.nodes], head=cluster.head.name, probes=collector.probes,
        seen=collector.seen, hosts=hosts,
        shared_mode=str(cluster.group_vars.get("distrun_shared_fs_mode") or contract.default("distrun_shared_fs_mode")),
        shared_dir=cluster.shared_dir, setup=f"distrun setup --inventory {label}",
        gpus=gpu_items(reached, label), log_dir=log_dir,
    )
    out = report_json(report, hosts, time.monotonic() - started)
    if not result.ok:
        out["ok"] = False
    run.write("check.json", json.dumps(out, indent=2) + "\n")
    run.finish(0 if out["ok"] else 1, "ok" if out["ok"] else "failed: " + ", ".join(
        c for c, items in out["checks"].items() if any(not v["ok"] for v in items.values())))
    return out, cluster
