"""The facts 'distrun check' keeps for later plans, from its own probes rather than a play's fact
gathering: each node's probe (role preflight's probe_facts.py) reports its interfaces' IPv4
addresses, its default route's, its local fact distrun.fact and its Python, under the names
Ansible's setup module gives them; this module takes them from the probes' answers and merges
them into the inventory's fact cache (the one plans, dry runs and a run's play read), keeping
whatever else setup cached there. Only the names below are written: a probe's answer never adds
any other fact to the cache."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distrun.transport.playbook_events import PlaybookEvent

# The facts a probe may set, and the prefix of one per interface (named in ansible_interfaces).
KEPT = ("ansible_interfaces", "ansible_default_ipv4", "ansible_all_ipv4_addresses", "ansible_local", "ansible_python")
IFACE_KEYS = ("device", "active", "ipv4", "ipv4_secondaries")


def from_answer(event: PlaybookEvent) -> dict[str, Any] | None:
    """The facts a node's probe reported (its stdout's last line, a JSON object with ``facts``), or None."""
    out = event.data.get("stdout") if event.kind in ("ok", "changed", "failed") else None
    if not isinstance(out, str) or '"facts"' not in out:
        return None
    try:
        said = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    facts = said.get("facts") if isinstance(said, dict) else None
    return allowed(facts) if isinstance(facts, Mapping) else None


def allowed(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of KEPT, and one entry per interface ansible_interfaces names (its keys of IFACE_KEYS)."""
    kept = {k: facts[k] for k in KEPT if k in facts}
    names = kept.get("ansible_interfaces")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        kept.pop("ansible_interfaces", None)
        return kept
    for name in names:
        entry = facts.get("ansible_" + name.replace("-", "_"))
        if isinstance(entry, Mapping):
            kept["ansible_" + name.replace("-", "_")] = {k: entry[k] for k in IFACE_KEYS if k in entry}
    return kept


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
