"""Interface choice: the subnet all nodes share, whatever each node calls its interface."""

from __future__ import annotations

import pytest

from distrun.errors import PlanError
from distrun.planning.network import Iface, choose_interfaces, ifaces_from_facts


def facts(**ifaces):
    out: dict[str, object] = {"ansible_interfaces": list(ifaces)}
    for name, (addr, mask) in ifaces.items():
        out[f"ansible_{name}"] = {"ipv4": {"address": addr, "netmask": mask}}
    return out


def test_names_differ_per_node_but_the_subnet_is_shared():
    f1 = facts(lo=("127.0.0.1", "255.0.0.0"), docker0=("172.17.0.1", "255.255.0.0"), eth0=("10.0.0.11", "255.255.255.0"))
    f2 = facts(lo=("127.0.0.1", "255.0.0.0"), ens5=("10.0.0.12", "255.255.255.0"), tailscale0=("100.64.0.2", "255.192.0.0"))
    choice = choose_interfaces(
        {"w1": "10.0.0.11", "w2": "10.0.0.12"},
        {"w1": ifaces_from_facts(f1), "w2": ifaces_from_facts(f2)},
    )
    assert choice.cidr == "10.0.0.0/24"
    assert {h: i.name for h, i in choice.per_host.items()} == {"w1": "eth0", "w2": "ens5"}


def test_hostname_addresses_fall_back_to_the_default_ipv4():
    f = {"a": [Iface("eth0", "10.1.0.5", "10.1.0.0/16")], "b": [Iface("eth1", "10.1.2.9", "10.1.0.0/16")]}
    choice = choose_interfaces({"a": "a.example", "b": "b.example"}, f, default_ipv4={"a": "10.1.0.5", "b": "10.1.2.9"})
    assert choice.cidr == "10.1.0.0/16"


def test_docker_bridge_is_never_chosen_even_when_it_holds_the_address():
    f = {"a": [Iface("docker0", "172.17.0.2", "172.17.0.0/16")]}
    with pytest.raises(PlanError, match="host a: no network interface carries its address"):
        choose_interfaces({"a": "172.17.0.2"}, f)


def test_nodes_on_different_subnets_are_refused_with_the_details():
    f = {"a": [Iface("eth0", "10.0.0.1", "10.0.0.0/24")], "b": [Iface("eth0", "10.9.0.1", "10.9.0.0/24")]}
    with pytest.raises(PlanError, match=r"share no subnet \(a=eth0\(10.0.0.0/24\), b=eth0\(10.9.0.0/24\)\)"):
        choose_interfaces({"a": "10.0.0.1", "b": "10.9.0.1"}, f)


def test_override_must_exist_on_the_node():
    f = {"a": [Iface("eth0", "10.0.0.1", "10.0.0.0/24")]}
    assert choose_interfaces({"a": "10.0.0.1"}, f, overrides={"a": "eth0"}).per_host["a"].name == "eth0"
    with pytest.raises(PlanError, match="distrun_iface='ib0' has no IPv4 address there"):
        choose_interfaces({"a": "10.0.0.1"}, f, overrides={"a": "ib0"})


# Two networks per node, as real clusters have them: management (the inventory's addresses) and fast.
TWO_NETS = {"w1": [Iface("eth0", "10.0.0.11", "10.0.0.0/24"), Iface("ib0", "10.9.0.11", "10.9.0.0/24")],
            "w2": [Iface("ens5", "10.0.0.12", "10.0.0.0/24"), Iface("ens6", "10.9.0.12", "10.9.0.0/24")]}
MGMT = {"w1": "10.0.0.11", "w2": "10.0.0.12"}


def test_the_ranks_network_is_the_inventory_addresses_one_unless_distrun_network_names_another():
    assert choose_interfaces(MGMT, TWO_NETS).cidr == "10.0.0.0/24"
    choice = choose_interfaces(MGMT, TWO_NETS, network="10.9.0.0/24")
    assert choice.cidr == "10.9.0.0/24"
    assert {h: (i.name, i.address) for h, i in choice.per_host.items()} == {"w1": ("ib0", "10.9.0.11"),
                                                                          "w2": ("ens6", "10.9.0.12")}
    # A host address inside the network is normalised ("10.9.0.7/24" is the network 10.9.0.0/24).
    assert choose_interfaces(MGMT, TWO_NETS, network="10.9.0.7/24").cidr == "10.9.0.0/24"


def test_a_host_without_an_address_on_distrun_network_or_an_override_off_it_is_refused_naming_both():
    ifaces = {**TWO_NETS, "w2": TWO_NETS["w2"][:1]}
    with pytest.raises(PlanError, match=r"^host w2: no network interface on distrun_network 10\.9\.0\.0/24 "
                                        r"\(interfaces: ens5 10\.0\.0\.12\); give it an address there"):
        choose_interfaces(MGMT, ifaces, network="10.9.0.0/24")
    with pytest.raises(PlanError, match=r"^host w1: distrun_iface='eth0' \(10\.0\.0\.11\) is not on distrun_network "
                                        r"10\.9\.0\.0/24; point distrun_iface at its interface on that network"):
        choose_interfaces(MGMT, TWO_NETS, overrides={"w1": "eth0"}, network="10.9.0.0/24")
    with pytest.raises(PlanError, match=r"^distrun_network='fast' is not an IPv4 network; write it as a CIDR"):
        choose_interfaces(MGMT, TWO_NETS, network="fast")


def test_the_preflight_calls_each_node_at_its_address_on_the_ranks_network():
    from distrun.inventory import rules

    facts = {"ansible_all_ipv4_addresses": ["10.0.0.12", "10.9.0.12"]}
    assert rules.network_address("10.0.0.12", facts, "10.9.0.0/24") == "10.9.0.12"
    assert rules.network_address("10.0.0.12", facts, "") == "10.0.0.12"
    assert rules.network_address("10.0.0.12", facts, "10.7.0.0/24") == ""  # none there: the call says so
