"""The network probe's verdict: which pair of nodes cannot open the TCP connections ranks open.

Each node's probe (roles/preflight/files/netprobe.py) reports its listeners and its calls: to the
head's rendezvous port (torchrun's, and MASTER_PORT of every torch program) and, in the full set,
to every other node on a port of Open MPI's TCP range. A failed call is blamed on the calling
node, naming the pair, the port and the likely cause. Pure and standard library only (the
preflight judge calls it, in the role and in the runner).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Finding = tuple[bool, str, str]  # ok, detail, fix


def cause(error: str, timeout: object) -> str:
    """What a failed call's error most likely means."""
    if error == "timeout":
        return f"no answer within {timeout}s: a firewall drops it, or that address is not on the nodes' network"
    if error == "refused":
        return "refused: a firewall rejects it, or nothing could listen there"
    if error == "no address":
        return "it has no address on the ranks' network (distrun_network)"
    if error == "foreign":
        return "another program answers on that port"
    if error == "silent":
        return f"it accepts the connection but sends no greeting within {timeout}s: another program, or the node is overloaded"
    if error.startswith("unreachable"):
        return f"{error.split(': ', 1)[-1]}: no route between them (a wrong interface or address)"
    return error or "failed"


def _what(key: str) -> str:
    kind, _, peer = key.partition(" ")
    if kind == "rendezvous":
        return f"the head {peer}'s rendezvous port"
    return f"{peer} in Open MPI's TCP port range"


def verdict(probes: Mapping[str, Mapping[str, Any]], *, head: str) -> dict[str, Finding]:
    """Per node that ran the network probe: ok, or every connection it could not open (the
    probe's report carries its timeout and the MPI range it tried, for the words).

    A call to a node whose own probe did not run (it failed before, or is not in ``probes``) or
    whose listener could not open says nothing about the network and is left out; so is a call
    to the rendezvous port when the head's port check found it taken (that check says by whom).
    """
    ran = {h: p["net"] for h, p in probes.items() if isinstance(p.get("net"), Mapping)}
    head_ports = (probes.get(head) or {}).get("ports") or {}
    rendezvous_taken = any(not v.get("ok") for v in head_ports.values())
    out: dict[str, Finding] = {}
    for h, net in sorted(ran.items()):
        timeout, mpi_range = net.get("timeout", "?"), net.get("mpi_range", "")
        problems = []
        for name, listener in sorted((net.get("listen") or {}).items()):
            if not listener.get("ok"):
                problems.append(f"{h} could not listen for the {name} probe ({listener.get('detail', '')})")
        for key, result in sorted((net.get("calls") or {}).items()):
            if result.get("ok"):
                continue
            kind, _, peer = key.partition(" ")
            listening = (ran.get(peer) or {}).get("listen") or {}
            if peer not in ran or not (listening.get("rendezvous" if kind == "rendezvous" else "mpi") or {}).get("ok"):
                continue
            if kind == "rendezvous" and rendezvous_taken:
                continue
            where = f"{result.get('address')}:{result.get('port')}" if result.get("address") else "no address"
            problems.append(f"{h} cannot open a TCP connection to {_what(key)} ({where}): "
                            f"{cause(str(result.get('error', '')), timeout)}")
        if problems:
            ports = f"TCP ports {mpi_range}" if mpi_range else "the rendezvous port ('distrun train --port')"
            fix = (f"let TCP connections between the nodes through the firewall ({ports}; e.g. allow the cluster's "
                   "subnet), and check that every node has an address on the ranks' network (ansible_host, or "
                   "distrun_network where the nodes have several); "
                   "then 'distrun check'")
            out[h] = (False, "; ".join(problems), fix)
        else:
            calls = net.get("calls") or {}
            out[h] = (True, f"{len(calls)} connection(s) opened" if calls else "listened; nothing to call", "")
    return out
