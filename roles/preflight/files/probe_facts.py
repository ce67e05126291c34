# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The facts 'distrun check' keeps for later plans, read by the probe in its own round trip instead
of a play's fact gathering (Ansible's setup module: a second round trip, a module's upload and
start, and its whole answer parsed on the controller, per node): each interface's IPv4 addresses,
the default route's, the node's local fact distrun.fact (role mpi_env's) and this Python, under
the names Ansible's setup module gives them in the controller's fact cache (``ansible_*``), which
the runner merges into that cache (distrun.preflight.nodefacts)."""

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
    """This node's facts under the setup module's names: ansible_interfaces, ansible_<iface>
    (ipv4, ipv4_secondaries), ansible_default_ipv4, ansible_all_ipv4_addresses, ansible_local
    (distrun), ansible_python (executable)."""
    facts: dict = {"ansible_local": {"distrun": local_fact()},
                   "ansible_python": {"executable": sys.executable, "version": {"major": sys.version_info[0],
                                                                                "minor": sys.version_info[1]}}}
    names, every = [], []
    for link in _ip_json("-4", "addr", "show"):
        name = str(link.get("ifname") or "")
        if not name:
            continue
        names.append(name)
        addrs = [_ipv4(a) for a in link.get("addr_info") or [] if isinstance(a, dict) and a.get("local")]
        entry: dict = {"device": name, "active": "UP" in (link.get("flags") or [])}
        if addrs:
            entry["ipv4"] = addrs[0]
            entry["ipv4_secondaries"] = addrs[1:]
        facts["ansible_" + name.replace("-", "_")] = entry
        every += [a["address"] for a in addrs if not a["address"].startswith("127.")]
    facts["ansible_interfaces"] = names
    facts["ansible_all_ipv4_addresses"] = every
    default: dict = {}
    for route in _ip_json("-4", "route", "show", "default"):
        dev = str(route.get("dev") or "")
        entry = facts.get("ansible_" + dev.replace("-", "_")) or {}
        if entry.get("ipv4"):
            default = {**entry["ipv4"], "interface": dev, "gateway": str(route.get("gateway") or "")}
            break
    facts["ansible_default_ipv4"] = default
    return facts
