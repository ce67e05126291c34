# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The facts 'distrun check' keeps for later plans, read by the probe in its own round trip instead
of a play's fact gathering (Ansible's setup module: a second round trip, a module's upload and
start, and its whole answer parsed on the controller, per node): each interface's IPv4 addresses,
the default route's, the node's local fact distrun.fact (role mpi_env's) and this Python, which
the runner turns into the names Ansible's setup module gives them in the controller's fact cache
(distrun.preflight.nodefacts)."""

import ipaddress
import json
import subprocess
import sys

LOCAL_FACT = "/etc/ansible/facts.d/distrun.fact"


def _ip_json(*args: str) -> list:
    try:
        proc = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=20, check=False)
        found = json.loads(proc.stdout) if proc.returncode == 0 else []
    except (FileNotFoundError, subprocess.TimeoutExpired, ValueError):
        return []
    return [x for x in found if isinstance(x, dict)] if isinstance(found, list) else []


def _ipv4(addr: dict) -> dict:
    net = ipaddress.IPv4Network(f"{addr['local']}/{int(addr.get('prefixlen', 32))}", strict=False)
    return {"address": str(addr["local"]), "netmask": str(net.netmask), "network": str(net.network_address),
            "prefix": str(net.prefixlen)}


def local_fact() -> dict:
    """distrun.fact as the node has it now ({} where role mpi_env never wrote it or it is no JSON object)."""
    try:
        with open(LOCAL_FACT, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def probe_facts() -> dict:
    """This node's facts: each interface with its IPv4 addresses (the first its primary), the
    default route's interface and gateway, distrun.fact and this Python. The runner turns them
    into the cache's names (distrun.preflight.nodefacts)."""
    interfaces = []
    for link in _ip_json("-4", "addr", "show"):
        name = str(link.get("ifname") or "")
        if name:
            interfaces.append({"name": name, "active": "UP" in (link.get("flags") or []),
                               "ipv4": [_ipv4(a) for a in link.get("addr_info") or [] if isinstance(a, dict) and a.get("local")]})
    route: dict = next(iter(_ip_json("-4", "route", "show", "default")), {})
    return {"interfaces": interfaces,
            "default_route": {"interface": str(route.get("dev") or ""), "gateway": str(route.get("gateway") or "")},
            "local": local_fact(),
            "python": {"executable": sys.executable, "version": {"major": sys.version_info[0], "minor": sys.version_info[1]}}}
