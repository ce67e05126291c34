""""The job waits forever": a firewall between two nodes, found before a run starts.

Each test adds one iptables rule in one node's network namespace (from the host, with nsenter),
dropping new TCP connections from one other node, and removes it in ``finally``. 'distrun check'
must name the pair and the cause; 'distrun train' must refuse in its preflight with the same words,
nothing staged. The times are printed with the machine's load; the bound only guards a hang.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import textwrap
import time
from pathlib import Path

import pytest

from tests.harness import matrix

from .conftest import REPO, distrun


def drop_new_tcp(cluster, on: int, source: int, ports: str) -> list[str]:
    """The rule: node ``on`` drops new TCP connections from node ``source`` to ``ports``."""
    return ["INPUT", "-p", "tcp", "--syn", "-s", cluster.ip(source), "--dport", ports, "-j", "DROP"]


def run_dirs(cluster) -> set[str]:
    return set(cluster.exec(1, "ls -1 /srv/distrun/runs 2>/dev/null || true").stdout.split())


def test_check_names_the_pair_a_firewall_separates_in_open_mpis_port_range(provisioned):
    # node3 drops new connections from node2 to every unprivileged port; ssh (22) stays open.
    rule = drop_new_tcp(provisioned, on=3, source=2, ports="1024:65535")
    provisioned.netns(3, ["iptables", "-I", *rule])
    try:
        started = time.monotonic()
        check = distrun("check", "--inventory", "test", "--json", timeout=300)
        took = time.monotonic() - started
        print(f"\ncheck named the blocked pair node2 -> node3 in {took:.1f}s (load average {os.getloadavg()[0]:.1f})")
        assert check.rc != 0, check.stdout[-3000:]
        network = json.loads(check.stdout)["checks"]["network"]
        item = network["node2"]
        assert not item["ok"], network
        assert item["detail"].startswith(f"node2 cannot open a TCP connection to node3 in Open MPI's TCP port range "
                                         f"({provisioned.ip(3)}:"), item
        assert "no answer within 8s: a firewall drops it" in item["detail"], item
        assert "let TCP connections between the nodes through the firewall (TCP ports 1024-65535" in item["fix"], item
        # Only that pair: node3 still reaches node2, node1 reaches both.
        assert network["node1"]["ok"] and network["node3"]["ok"], network
        assert took < 120
    finally:
        provisioned.netns(3, ["iptables", "-D", *rule])


def test_train_refuses_when_a_node_cannot_reach_the_heads_rendezvous_port(provisioned, tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("print('should not run')\n")
    before = run_dirs(provisioned)
    rule = drop_new_tcp(provisioned, on=1, source=3, ports="29500")
    provisioned.netns(1, ["iptables", "-I", *rule])
    try:
        started = time.monotonic()
        train = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(script), timeout=300)
        took = time.monotonic() - started
        print(f"\ntrain refused in {took:.1f}s (load average {os.getloadavg()[0]:.1f})")
        err = " ".join(train.stderr.split())
        assert train.rc == 3, train.stdout[-3000:] + train.stderr
        assert (f"preflight failed on node3: network: node3 cannot open a TCP connection to the head node1's "
                f"rendezvous port ({provisioned.ip(1)}:29500): no answer within 8s: a firewall drops it") in err, err
        assert "nothing was started" in err and train.stderr.strip().count("\n") == 0, train.stderr
        assert run_dirs(provisioned) == before
    finally:
        provisioned.netns(1, ["iptables", "-D", *rule])


# Two networks per node: the inventory's addresses are on the management network, and
# distrun_network names the second one (<cluster>-fast, internal). Each rank lists the TCP
# connections it holds after an allreduce (from /proc: its own sockets only).
TRAFFIC_SCRIPT = textwrap.dedent("""
    import os, socket
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])

    def addr(text):
        ip, port = text.split(":")
        return socket.inet_ntoa(bytes.fromhex(ip)[::-1])

    pairs = set()
    with open("/proc/self/net/tcp") as fh:
        for line in fh.read().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and f[9] in mine:  # ESTABLISHED, this process's
                local, remote = addr(f[1]), addr(f[2])
                if not remote.startswith("127."):
                    pairs.add(f"{local}>{remote}")
    print(f"TRAFFIC rank={dist.get_rank()} sum={int(t.item())} pairs={','.join(sorted(pairs)) or '-'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")
TRAFFIC = re.compile(r"TRAFFIC rank=(\d+) sum=(\d+) pairs=(\S+)")


@pytest.fixture(scope="module")
def fast_inventory(provisioned, tmp_path_factory) -> str:
    assert provisioned.fast_cidr, "the harness gave the nodes no second network"
    dest = tmp_path_factory.mktemp("inventory-fast")
    inventory = str(matrix.mode_inventory(provisioned.inventory, REPO / "inventory" / "test" / "group_vars", dest, None,
                                          distrun_network=provisioned.fast_cidr))
    # Its first check gathers the facts its runs plan from, and finds nothing wrong.
    check = distrun("check", "--inventory", inventory, timeout=300)
    assert check.rc == 0, check.stdout[-3000:] + check.stderr[-2000:]
    return inventory


def _traffic(run: Path) -> dict[int, tuple[int, list[tuple[str, str]]]]:
    found = {}
    for f in (run / "nodes").rglob("*"):
        if f.is_file() and f.name in ("stdout", "stdout.log"):
            for m in TRAFFIC.finditer(f.read_text(errors="replace")):
                pairs = [] if m[3] == "-" else [tuple(p.split(">")) for p in m[3].split(",")]
                found[int(m[1])] = (int(m[2]), pairs)
    return found


@pytest.mark.parametrize("launcher", matrix.LAUNCHERS)
def test_rank_traffic_uses_the_inventorys_network(provisioned, fast_inventory, distrun_home, tmp_path, launcher):
    script = tmp_path / "traffic.py"
    script.write_text(TRAFFIC_SCRIPT)
    res = distrun("train", "--inventory", fast_inventory, "--launcher", launcher, "--script", str(script), timeout=600)
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
    run = matrix.latest_run(distrun_home)
    plan = json.loads((run / "plan.json").read_text())
    fast = ipaddress.ip_network(provisioned.fast_cidr)
    assert {h["name"]: h["net_address"] for h in plan["hosts"]} == {n.name: n.fast_ip for n in provisioned.nodes}
    found = _traffic(run)
    assert sorted(found) == [0, 1, 2], found
    for rank, (total, pairs) in found.items():
        assert total == 3 and pairs, (rank, total, pairs)
        off = [p for p in pairs if not all(ipaddress.ip_address(a) in fast for a in p)]
        assert not off, f"rank {rank} talks over {off}, outside distrun_network {fast} ({launcher})"


def test_the_preflight_probes_the_inventorys_network_and_names_a_pair_it_separates(provisioned, fast_inventory):
    # node3 drops new connections from node2's address on the fast network only.
    rule = ["INPUT", "-p", "tcp", "--syn", "-s", provisioned.node(2).fast_ip, "--dport", "1024:65535", "-j", "DROP"]
    provisioned.netns(3, ["iptables", "-I", *rule])
    try:
        check = distrun("check", "--inventory", fast_inventory, "--json", timeout=300)
        assert check.rc != 0, check.stdout[-3000:]
        network = json.loads(check.stdout)["checks"]["network"]
        assert network["node2"]["detail"].startswith(
            f"node2 cannot open a TCP connection to node3 in Open MPI's TCP port range ({provisioned.node(3).fast_ip}:"), network
        assert network["node1"]["ok"] and network["node3"]["ok"], network
        # The management network is fine: the inventory without distrun_network passes.
        plain = distrun("check", "--inventory", "test", "--json", timeout=300)
        assert json.loads(plain.stdout)["checks"]["network"]["node2"]["ok"], plain.stdout[-3000:]
    finally:
        provisioned.netns(3, ["iptables", "-D", *rule])
