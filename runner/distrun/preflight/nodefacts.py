"""The facts 'distrun check' keeps for later plans, from its own probes rather than a play's fact
gathering: each node's probe (role preflight's probe_facts.py) reports its interfaces' IPv4
addresses, its default route's, its local fact distrun.fact and its Python, under the names
Ansible's setup module gives them; this module takes them from the probes' answers and merges
them into the inventory's fact cache (the one plans, dry runs and a run's play read), keeping
whatever else setup cached there. Only the names cache_facts builds are written: a probe's answer
never adds any other fact to the cache."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distrun.inventory import rules
from distrun.inventory.cluster import Cluster, load_facts
from distrun.transport.playbook_events import PlaybookEvent


def from_answer(event: PlaybookEvent) -> dict[str, Any] | None:
    """The cache's facts from what a node's probe reported (its stdout's last line, a JSON object
    with ``facts``), or None."""
    out = event.data.get("stdout") if event.kind in ("ok", "changed", "failed") else None
    if not isinstance(out, str) or '"facts"' not in out:
        return None
    try:
        said = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    facts = said.get("facts") if isinstance(said, dict) else None
    return cache_facts(facts) if isinstance(facts, Mapping) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def cache_facts(said: Mapping[str, Any]) -> dict[str, Any]:
    """The probe's facts under the setup module's names, and only those: ansible_interfaces, one
    ansible_<iface> each (ipv4 the first address, ipv4_secondaries the others), the default
    route's (rules.DEFAULT_IPV4: its interface's first address, the interface, the gateway),
    ansible_all_ipv4_addresses (loopback left out), ansible_local's distrun and ansible_python."""
    facts: dict[str, Any] = {}
    names: list[str] = []
    every: list[str] = []
    for iface in said.get("interfaces") or []:
        name = _text(iface.get("name")) if isinstance(iface, Mapping) else ""
        if not name:
            continue
        addrs = [{k: _text(a.get(k)) for k in ("address", "netmask", "network", "prefix")}
                 for a in iface.get("ipv4") or [] if isinstance(a, Mapping) and _text(a.get("address"))]
        entry: dict[str, Any] = {"device": name, "active": bool(iface.get("active"))}
        if addrs:
            entry["ipv4"], entry["ipv4_secondaries"] = addrs[0], addrs[1:]
        names.append(name)
        facts["ansible_" + name.replace("-", "_")] = entry
        every += [a["address"] for a in addrs if not a["address"].startswith("127.")]
    facts["ansible_interfaces"] = names
    facts["ansible_all_ipv4_addresses"] = every
    found = said.get("default_route")
    route: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    dev = _text(route.get("interface"))
    primary = (facts.get("ansible_" + dev.replace("-", "_")) or {}).get("ipv4") if dev else None
    facts[f"ansible_{rules.DEFAULT_IPV4}"] = {**primary, "interface": dev, "gateway": _text(route.get("gateway"))} \
        if primary else {}
    if isinstance(said.get("local"), Mapping):
        facts["ansible_local"] = {"distrun": dict(said["local"])}
    python = said.get("python")
    if isinstance(python, Mapping) and _text(python.get("executable")):
        facts["ansible_python"] = {"executable": python["executable"], "version": python.get("version") or {}}
    return facts


class Collector:
    """An event handler that keeps each node's probe facts and hands every event on."""

    def __init__(self, then: Callable[[PlaybookEvent], None] | None = None) -> None:
        self.then = then
        self.facts: dict[str, dict[str, Any]] = {}

    def __call__(self, event: PlaybookEvent) -> None:
        if event.host and (facts := from_answer(event)) is not None:
            self.facts[event.host] = facts
        if self.then is not None:
            self.then(event)


def merge(cache: Path, facts: Mapping[str, Mapping[str, Any]]) -> None:
    """Each host's probe facts into its file of the jsonfile cache (``s1_<host>``, the facts as
    JSON text under ``__payload__``, as ansible-core 2.19 writes it): its interfaces replace the
    cached ones, the other facts setup cached stay."""
    for host, new in facts.items():
        path = cache / f"s1_{host}"
        old: dict[str, Any] = {}
        try:
            data = json.loads(path.read_text())
            payload = json.loads(data["__payload__"]) if isinstance(data, dict) and "__payload__" in data else data
            old = payload if isinstance(payload, dict) else {}
        except (OSError, ValueError, TypeError):
            old = {}
        if "ansible_interfaces" in new:
            for name in old.get("ansible_interfaces") or []:
                old.pop("ansible_" + str(name).replace("-", "_"), None)
        old.update(new)
        tmp = cache / f".s1_{host}.tmp"
        tmp.write_text(json.dumps({"__payload__": json.dumps(old, sort_keys=True)}))
        tmp.chmod(0o600)
        os.replace(tmp, path)


def probe_addresses(cluster: Cluster, cache: Path) -> dict[str, str]:
    """Each node's address the network probe calls it at, from the cached facts (role preflight's
    distrun_network_address, the node's name when it has none): on distrun_network its address
    there ('' where its facts hold none), else its inventory address or its default route's."""
    try:
        network = rules.cluster_network(cluster.group_vars.get("distrun_network"))
    except ValueError:
        network = ""
    return {n.name: rules.network_address(n.hostvars.get("ansible_host"), load_facts(cache, n.name), network, n.name)
            for n in cluster.nodes}
