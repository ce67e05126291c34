"""Choose, per node, the network interface on the subnet all nodes share.

Containers, VPNs and docker bridges give nodes several interfaces, and their names may differ
from node to node (eth0 here, ens5 there). The working network is the one holding each node's
inventory address; we pick the interface carrying it on every node and hand MPI the subnet
(``btl_tcp_if_include`` accepts CIDRs, so differing names don't matter) and NCCL/Gloo the
per-node name. ``network(cluster)`` makes that choice from the facts Ansible cached, which run.yml
checks still hold before it stages; ``facts_unusable`` says when there are none to plan from.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from distrun import paths
from distrun.errors import PlanError
from distrun.inventory import rules
from distrun.inventory.cluster import Cluster, load_facts

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


def _shown(ifaces: list[Iface]) -> str:
    return ", ".join(f"{i.name} {i.address}" for i in ifaces) or "none with IPv4"


def choose_interfaces(
    addresses: Mapping[str, str],
    ifaces: Mapping[str, list[Iface]],
    overrides: Mapping[str, str] | None = None,
    default_ipv4: Mapping[str, str] | None = None,
    network: str = "",
) -> NetworkChoice:
    """Pick one interface per host on the subnet that every host shares.

    ``addresses`` are the inventory addresses (ansible_host); when one is a name rather than an
    IP, the host's default IPv4 address stands in. ``overrides`` (hostvar distrun_iface) win.
    ``network`` (the inventory's distrun_network, a CIDR) names the network the ranks talk over
    when it is not the one of the inventory addresses (a fast network beside the management one):
    every host then uses its interface inside it.
    """
    overrides = overrides or {}
    default_ipv4 = default_ipv4 or {}
    hosts = list(addresses)
    if not hosts:
        raise PlanError("no hosts to choose network interfaces for")
    try:
        cidr = rules.cluster_network(network)
    except ValueError as exc:
        raise PlanError(f"{exc} (group_vars)") from None

    def candidates(host: str) -> list[Iface]:
        return [i for i in ifaces.get(host, []) if not i.name.startswith(VIRTUAL_PREFIXES)]

    def inside(i: Iface) -> bool:
        return ipaddress.ip_address(i.address) in ipaddress.ip_network(cidr)

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
            if cidr and not inside(match[0]):
                raise PlanError(f"host {host}: distrun_iface={overrides[host]!r} ({match[0].address}) is not on "
                                f"distrun_network {cidr}; point distrun_iface at its interface on that network "
                                f"(interfaces: {_shown(ifaces.get(host, []))}) or remove it")
            chosen[host] = match[0]
            continue
        if cidr:
            match = [i for i in candidates(host) if inside(i)]
            if not match:
                raise PlanError(f"host {host}: no network interface on distrun_network {cidr} (interfaces: "
                                f"{_shown(ifaces.get(host, []))}); give it an address there, or correct distrun_network")
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


def network(cluster: Cluster) -> NetworkChoice | None:
    """The interface per node from cached facts, or None when no facts were gathered yet."""
    cache = paths.fact_cache_dir(cluster.source)
    facts = {n.name: load_facts(cache, n.name) for n in cluster.workers}
    if any(f is None for f in facts.values()):
        return None
    addresses = {n.name: n.address for n in cluster.workers}
    ifaces = {h: ifaces_from_facts(f or {}) for h, f in facts.items()}
    default_ipv4 = {h: rules.default_ipv4(f) for h, f in facts.items()}
    overrides = {n.name: n.iface for n in cluster.workers if n.iface}
    if all(n.connection == "local" for n in cluster.workers):
        return None  # one machine: loopback is the network, nothing to choose
    return choose_interfaces(addresses, ifaces, overrides, default_ipv4, str(cluster.group_vars.get("distrun_network") or ""))


def facts_unusable(cluster: Cluster) -> str | None:
    """Why the cached facts cannot be planned from (missing, or about another machine), or None."""
    cache = paths.fact_cache_dir(cluster.source)
    for n in cluster.nodes:
        facts = load_facts(cache, n.name)
        if facts is None:
            return f"no facts cached for {n.name}"
        if not rules.is_ip(n.address):
            continue  # a name: the preflight play checks what it resolves to
        if n.connection == "local" or n.iface:
            continue
        ip = ipaddress.ip_address(n.address)
        if not any(ip in ipaddress.ip_network(i.network) for i in ifaces_from_facts(facts)):
            return f"the facts cached for {n.name} hold no interface on the subnet of its address {n.address}"
    return None
