"""Choose, per node, the network interface on the subnet all nodes share.

Containers, VPNs and docker bridges give nodes several interfaces, and their names may differ
from node to node (eth0 here, ens5 there). The working network is the one holding each node's
inventory address; we pick the interface carrying it on every node and hand MPI the subnet
(``btl_tcp_if_include`` accepts CIDRs, so differing names don't matter) and NCCL/Gloo the
per-node name.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import rules
from .errors import PlanError

# Interfaces that never carry inter-node traffic: picking one of them is the classic NCCL hang.
VIRTUAL_PREFIXES = ("lo", "docker", "virbr", "veth", "br-", "cni", "flannel", "cali", "podman", "vxlan", "tun", "tap")


@dataclass(frozen=True)
class Iface:
    name: str
    address: str
    network: str  # CIDR, e.g. 10.0.0.0/24


@dataclass(frozen=True)
class NetworkChoice:
    cidr: str
    per_host: Mapping[str, Iface]


def ifaces_from_facts(facts: Mapping[str, Any]) -> list[Iface]:
    found: list[Iface] = []
    for name in facts.get("ansible_interfaces") or []:
        entry = facts.get(f"ansible_{str(name).replace('-', '_')}") or {}
        ipv4 = entry.get("ipv4") or {}
        for item in [ipv4, *(entry.get("ipv4_secondaries") or [])]:
            addr, mask = item.get("address"), item.get("netmask")
            if not addr or not mask:
                continue
            net = ipaddress.IPv4Network(f"{addr}/{mask}", strict=False)
            found.append(Iface(str(name), str(addr), str(net)))
    return found


def choose_interfaces(
    addresses: Mapping[str, str],
    ifaces: Mapping[str, list[Iface]],
    overrides: Mapping[str, str] | None = None,
    default_ipv4: Mapping[str, str] | None = None,
) -> NetworkChoice:
    """Pick one interface per host on the subnet that every host shares.

    ``addresses`` are the inventory addresses (ansible_host); when one is a name rather than an
    IP, the host's default IPv4 address stands in. ``overrides`` (hostvar distrun_iface) win.
    """
    overrides = overrides or {}
    default_ipv4 = default_ipv4 or {}
    hosts = list(addresses)
    if not hosts:
        raise PlanError("no hosts to choose network interfaces for")

    def candidates(host: str) -> list[Iface]:
        return [i for i in ifaces.get(host, []) if not i.name.startswith(VIRTUAL_PREFIXES)]

    def wanted_ip(host: str) -> str | None:
        return rules.address(addresses[host], default_ipv4.get(host, "")) or None

    chosen: dict[str, Iface] = {}
    for host in hosts:
        if host in overrides:
            match = [i for i in ifaces.get(host, []) if i.name == overrides[host]]
            if not match:
                have = ", ".join(sorted({i.name for i in ifaces.get(host, [])})) or "none with IPv4"
                raise PlanError(
                    f"host {host}: distrun_iface={overrides[host]!r} has no IPv4 address there "
                    f"(interfaces: {have}); fix distrun_iface in the inventory"
                )
            chosen[host] = match[0]
            continue
        ip = wanted_ip(host)
        match = [i for i in candidates(host) if ip and i.address == ip]
        if not match and ip:
            # The address may be NATed or a name; fall back to an interface whose subnet holds it.
            match = [i for i in candidates(host) if ipaddress.ip_address(ip) in ipaddress.ip_network(i.network)]
        if not match:
            raise PlanError(
                f"host {host}: no network interface carries its address {addresses[host]}; "
                "set distrun_iface for it in the inventory"
            )
        chosen[host] = match[0]
    networks = {i.network for i in chosen.values()}
    if len(networks) != 1:
        detail = ", ".join(f"{h}={i.name}({i.network})" for h, i in chosen.items())
        raise PlanError(
            f"the nodes share no subnet ({detail}); give every node an address on one network "
            "(ansible_host) or set distrun_iface per host"
        )
    return NetworkChoice(cidr=networks.pop(), per_host=chosen)
