"""The preflight's report as data: check -> node -> ``Item`` (ok, detail, fix), in report order.

What the judge's verdict and 'distrun check' and 'distrun train' share: the whole report built
from the verdict and what only the controller knows (which nodes answered, GPUs against slots),
the report as plain data (the fact the role publishes, what --json prints) and back, the nodes
it blames, one host's problems, and the one line that refuses a run. Standard library only:
Ansible imports it through role distrun's filter plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Report order; also the rows of the human table.
CHECKS = ("reach", "setup", "env", "mpi4py", "needs", "image", "slurm", "versions", "ports", "addresses", "network", "ssh", "names",
          "shared folder",
          "gpus vs slots", "gpu health", "preflight")
LOG_DIR = "the run record's ansible/ folder"


@dataclass(frozen=True)
class Item:
    ok: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Item:
        return cls(bool(data.get("ok")), str(data.get("detail", "")), str(data.get("fix", "")))


Report = dict[str, dict[str, Item]]  # check -> node -> item


def build_report(
    *,
    nodes: Sequence[str],
    hosts: Mapping[str, Mapping[str, str]],
    judged: Report,
    gpus: Mapping[str, Item] | None = None,
    more: Mapping[str, Mapping[str, Item]] | None = None,
) -> Report:
    """The whole report: which nodes answered (``hosts``: Ansible's state and last error per
    host), the role's verdict, GPUs against slots, the controller's own checks (``more``: check
    -> node -> Item, e.g. GPU health), and a failure nothing above explains."""
    report: Report = {c: {} for c in CHECKS}
    for h in nodes:
        st = hosts.get(h, {"state": "not reached", "error": ""})
        reached = any(h in items for items in judged.values())
        if st["state"] == "hung":
            report["reach"][h] = Item(False, st.get("error") or "hung",
                                      f"look at what hangs on {h} (a shared folder that stopped answering: 'findmnt "
                                      f"-o TARGET,FSTYPE', the mount's unit; a process stuck in state D), then 'distrun check' again")
        elif st["state"] == "unreachable" or (st["state"] == "not reached" and not reached):
            report["reach"][h] = Item(False, st.get("error") or "not reached",
                                      f"start {h}, check its ansible_host and that sshd runs; then 'distrun check' again")
        elif st["state"] != "failed" or reached:  # failed before any probe answered: reached or not, nobody knows
            report["reach"][h] = Item(True, "reached over ssh")
    for check, items in judged.items():
        report[check].update(items)
    report["gpus vs slots"].update(gpus or {})
    for check, extra in (more or {}).items():
        report[check].update(extra)
    explained = {h for c, items in report.items() for h, it in items.items() if not it.ok}
    for h, st in hosts.items():
        if st["state"] == "failed" and h not in explained:
            report["preflight"][h] = Item(False, st.get("error", ""), f"see {LOG_DIR}")
    return {c: dict(sorted(items.items())) for c, items in report.items() if items}


def as_dicts(report: Report) -> dict[str, dict[str, dict[str, Any]]]:
    """The report as plain data (what the role publishes, what --json prints)."""
    return {c: {h: it.as_dict() for h, it in items.items()} for c, items in report.items()}


def from_dicts(data: Mapping[str, Mapping[str, Mapping[str, Any]]] | None) -> Report:
    return {str(c): {str(h): Item.from_dict(it) for h, it in items.items()} for c, items in (data or {}).items()}


def blamed(report: Report) -> list[str]:
    """The nodes the report finds anything wrong on, sorted."""
    return sorted({h for items in report.values() for h, it in items.items() if not it.ok})


def problems(report: Report, host: str) -> list[str]:
    """What is wrong on one host, one line per check: ``check: detail; fix: fix``."""
    return [f"{c}: {it.detail}" + (f"; fix: {it.fix}" if it.fix else "")
            for c, items in report.items() if (it := items.get(host)) is not None and not it.ok]


def refusal(report: Report) -> str:
    """Every problem of a report on one line, hosts with the same problem named together.

    ``needs: torchrun is not in /opt/env/bin on node1, node2: add torch to ...``
    """
    groups: dict[tuple[str, str, str], list[str]] = {}
    for check in CHECKS:
        for h, it in (report.get(check) or {}).items():
            if not it.ok:
                groups.setdefault((check, it.detail, it.fix), []).append(h)
    parts = [f"{check}: {detail} on {', '.join(hosts)}" + (f": {fix}" if fix else "")
             for (check, detail, fix), hosts in groups.items()]
    return " | ".join(parts)


def network_changed(report: Report) -> bool:
    """Whether the verdict blames a node's network for having changed since the plan."""
    return any(not item.ok for item in report.get("addresses", {}).values())


def report_json(report: Report, hosts: Mapping[str, Mapping[str, str]], elapsed: float) -> dict[str, Any]:
    ok = all(it.ok for items in report.values() for it in items.values())
    return {
        "schema": 1,  # distrun check --json's, docs/guide/distrun-json.schema.json
        "ok": ok,
        "checks": as_dicts(report),
        "hosts": {h: dict(v) for h, v in hosts.items()},
        "elapsed_s": round(elapsed, 2),
    }
