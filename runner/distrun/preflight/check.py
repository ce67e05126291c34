"""'distrun check': the full preflight on the real nodes, as one report per check and node.

The role ``preflight`` (``preflight_full: true``) probes every node in one command per host,
judges the probes (``distrun.preflight.judge``, through a filter plugin), fails the nodes it blames and
publishes its verdict as the fact ``preflight_verdict``. This module runs that playbook and
adds what only the controller knows: which nodes answered, and GPUs against slots.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from distrun import paths
from distrun.errors import ExitCode
from distrun.inventory import identity, rules
from distrun.inventory import read as inventory_read
from distrun.inventory.cluster import Cluster, Node, cluster_from_json
from distrun.planning import containers
from distrun.planning.placement import gpu_slot_mismatches
from distrun.preflight import gpuhealth, nodefacts, sshmesh
from distrun.preflight.report import Item, Report, blamed, build_report, from_dicts, refusal, report_json
from distrun.store import drained
from distrun.store.runs import new_run
from distrun.transport.ansible_bridge import run_playbook
from distrun.transport.handshake import PREFLIGHT_FACT
from distrun.transport.playbook_events import PlaybookResult


def gpu_items(nodes: Sequence[Node], inventory: str) -> dict[str, Item]:
    bad = {m.host: m for m in gpu_slot_mismatches(nodes)}
    out: dict[str, Item] = {}
    for n in nodes:
        if not n.is_worker:
            continue
        if n.name in bad:
            out[n.name] = Item(False, bad[n.name].message(),
                               f"set slots={n.gpus} for {n.name} in {inventory} (or remove 'slots' to use the GPU "
                               "count), or a number of slots that divides it (several GPUs per rank); "
                               "'distrun train --allow-gpu-mismatch' runs anyway")
        else:
            why = f"{n.gpus} GPU(s)" if n.gpus else "no GPU detected"
            out[n.name] = Item(True, f"slots={n.slots}, {why}")
    return out


HEALTH_FACT = "preflight_gpu_health"  # role preflight's tasks/gpu_health.yml


def gpu_health(result: PlaybookResult, nodes: Sequence[Node]) -> dict[str, gpuhealth.Health]:
    """Each reached node's GPU health from its reading (the fact preflight_gpu_health), the GPUs
    setup counted there and those its inventory declares (gpus: N), compared with nvidia-smi's."""
    readings = {n.name: result.hosts[n.name].facts.get(HEALTH_FACT) for n in nodes if n.name in result.hosts}
    usable = {n: r for n, r in readings.items() if isinstance(r, dict) and "error" not in r}
    declared = {n.name: n.gpus for n in nodes if rules.declares_gpus(n.hostvars)}
    return gpuhealth.judge_all(usable, {n.name: n.gpus for n in nodes}, declared)


def health_items(health: Mapping[str, gpuhealth.Health]) -> dict[str, Item]:
    """The report's 'gpu health' row: every node's, where any node has GPUs; else no row."""
    if not any(h.has_gpus for h in health.values()):
        return {}
    return {n: h.item() if h.has_gpus else Item(True, "no GPU") for n, h in health.items()}


def settle_drains(inventory: Path, health: Mapping[str, gpuhealth.Health], report: Report,
                  reached: Sequence[str]) -> dict[str, drained.Drain]:
    """Drain the nodes whose GPUs are faulty; bring back the reached nodes every check passed on
    (whatever drained them: a GPU, or a run that lost them). The marks after this check."""
    for node, h in sorted(health.items()):
        if h.drain_reason():
            drained.drain(inventory, node, h.drain_reason(), drained.SOURCE_GPU_HEALTH)
    failing = set(blamed(report))
    drained.undrain_passed(inventory, [n for n in reached if n not in failing])
    return drained.drained(inventory)


def host_states(result: PlaybookResult, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """Ansible's state and last error per host; 'not reached' for one the play never saw."""
    states = {h.name: ({"state": "hung", "error": f"hung: its probe did not end within {h.hung_s} s"} if h.hung_s
                       else {"state": h.state, "error": h.last_error}) for h in result.hosts.values()}
    judged = blamed(from_dicts(result.fact(PREFLIGHT_FACT)))
    for h in result.hosts.values():
        # The judge's own task failed the play on this node (run.yml's one-task judge): the
        # verdict names the nodes to blame, not the node the task ran on.
        if h.state == "failed" and PREFLIGHT_FACT in h.facts and h.failed == 1 and judged and h.name not in judged:
            states[h.name] = {"state": "ok", "error": ""}
    for name in names:
        states.setdefault(name, {"state": "not reached", "error": ""})
    return states


def report_of(result: PlaybookResult, names: Sequence[str], gpus: Mapping[str, Item] | None = None,
              health: Mapping[str, Item] | None = None) -> Report:
    """The report of a preflight run: the role's verdict (the fact preflight_verdict), which of
    ``names`` answered, ``gpus`` (GPUs against slots) and ``health`` (GPU health), node -> Item
    each. 'distrun check' shows it whole; 'distrun train' refuses with its failures."""
    return build_report(nodes=names, hosts=host_states(result, names), judged=from_dicts(result.fact(PREFLIGHT_FACT)),
                        gpus=gpus, more={"gpu health": health or {}})


def preflight_vars(label: str, run_dir: Path) -> dict[str, Any]:
    """What the preflight role is told so its messages name the inventory and the run's log."""
    return {"preflight_inventory": label, "preflight_log_dir": str(run_dir / "ansible")}


def image_vars(cluster: Cluster) -> dict[str, Any]:
    """The inventory's container image (distrun_image), checked on every node like a run's."""
    container = containers.pinned(containers.choose(cluster.source, cluster.group_vars, None, None), cluster.source)
    if container is None:
        return {}
    # An empty module list still looks inside: python3's and torch's versions, the shared folder.
    return {"preflight_image": {**containers.image_asked(container), "modules": []}}


def run_check(inventory: Path, label: str,
              progress: Callable[[list[str]], Any] | None = None,
              ssh_logins: bool = False) -> tuple[dict[str, Any], Cluster]:
    """Run the full preflight; the report as 'distrun check --json' prints it, and the cluster.

    ``progress(host_names)`` gives a context manager that is also the event handler (the live
    table of the human output); without it nothing is printed. Every node logs in to every other
    unless the last logins proved that mesh and nothing a login depends on changed on any node
    since (sshmesh): then each checks the others' sshd banners, and a changed node sends the
    check back to logins from every node. ``ssh_logins``: log in whatever was proved.
    """
    started = time.monotonic()
    # Read the inventory once (ansible-inventory takes a second or more): a stopped node must
    # be reported fast, and the second Cluster below only re-reads the fact cache.
    data = inventory_read.read_inventory_json(inventory)
    # With people: as the person this process acts as, refused before any connection if unlisted.
    cluster = identity.as_person(cluster_from_json(inventory, data, paths.fact_cache_dir(inventory)))
    run = new_run("check", inventory)
    names = [n.name for n in cluster.nodes]
    extravars = {"preflight_full": True, **preflight_vars(label, run.dir), **image_vars(cluster)}
    proved = {} if ssh_logins else sshmesh.mesh_baseline(inventory)
    cache = paths.fact_cache_dir(inventory)
    with (progress(names) if progress else contextlib.nullcontext()) as on_event:
        again = getattr(on_event, "again", None)

        def full(baseline: dict[str, str], net: bool = True) -> PlaybookResult:
            # One fork per node: the full network probe's listeners wait for calls from every
            # other node, so every node's probe must run at once (with fewer forks, the nodes
            # past the first forks start when the first have given up on them). The plays see
            # the cached facts (no setup module): each probe reports the node's facts anew, and
            # they are merged into the cache once it answered.
            probed = nodefacts.Collector(on_event)
            more = {"preflight_ssh_baseline": baseline, **({} if net else {"preflight_net_probe": False})}
            result = run_playbook("playbooks/preflight.yml", inventory, run.dir, on_event=probed, cached_facts=True,
                                  extravars={**extravars, **more}, forks=len(names))
            nodefacts.merge(cache, probed.facts)
            return result

        calls = nodefacts.probe_addresses(cluster, cache)  # where the network probe calls each node
        # A node with no address known on distrun_network (no facts cached yet: a first check of
        # this inventory) cannot be called: the first pass only collects the facts for the second.
        known = all(calls.values())
        baseline = proved
        result: PlaybookResult = full(baseline, net=known)
        mesh = result.fact(sshmesh.FACT)
        if proved and sshmesh.unverified(mesh):
            # A node changed what a login depends on: every node logs in again. The live table
            # (when there is one) starts again too, and says why.
            if callable(again):
                again(f"ssh: {', '.join(mesh['unverified'])} changed since the logins between the nodes were "
                      "proved: every node logs in to every other again")
            baseline = {}
            result = full(baseline, net=known)
        moved = sorted(h for h, a in nodefacts.probe_addresses(cluster, cache).items() if a != calls[h])
        if moved or not known:
            # The network probe called a node at an address its cached facts gave, and its probe
            # reported another (or it could not call it: no facts cached): once more, at the new one.
            if callable(again) and moved:
                again(f"network: {', '.join(moved)} had other addresses than the facts cached for them: "
                      "every node is probed again at the addresses they reported")
            result = full(baseline)
    sshmesh.remember(inventory, result.fact(sshmesh.FACT))  # the logins' proof, when there were logins
    hosts = host_states(result, names)
    cluster = identity.as_person(cluster_from_json(inventory, data, cache))  # the facts the probes just reported: gpus
    reached = [n for n in cluster.nodes if hosts[n.name]["state"] != "unreachable"]
    health = gpu_health(result, reached)
    report = report_of(result, names, gpu_items(reached, label), health_items(health))
    out = report_json(report, hosts, time.monotonic() - started)
    if not result.ok:
        out["ok"] = False
    marks = settle_drains(inventory, health, report, [n.name for n in reached])
    out["drained"] = {n: {k: v for k, v in d.as_dict().items() if k != "node"} for n, d in sorted(marks.items())}
    run.write("check.json", json.dumps(out, indent=2) + "\n")
    run.finish(ExitCode.OK if out["ok"] else ExitCode.FAILED, "ok" if out["ok"] else "failed: " + ", ".join(
        c for c, items in out["checks"].items() if any(not v["ok"] for v in items.values())))
    return out, cluster


def preflight_refusal(result: PlaybookResult, inventory: str) -> str:
    """The one line that refuses a run: what 'distrun check' says about the same fault (the role's
    verdict, and the nodes that did not answer), every failing node named."""
    report = report_of(result, list(result.hosts))
    line = refusal(report)
    bad = blamed(report)
    if not line:
        bad = [h.name for h in result.failures()]
        line = "; ".join(f"{h.name}: {h.last_error}" for h in result.failures()) or "a node failed the preflight"
    return (f"preflight failed on {', '.join(bad) or 'the cluster'}: {line}; nothing was started "
            f"(see 'distrun check --inventory {inventory}')")
