""""The job waits forever": a firewall between two nodes, found before a run starts.

Each test adds one iptables rule in one node's network namespace (from the host, with nsenter),
dropping new TCP connections from one other node, and removes it in ``finally``. 'distrun check'
must name the pair and the cause; 'distrun train' must refuse in its preflight with the same words,
nothing staged. The times are printed with the machine's load; the bound only guards a hang.
"""

from __future__ import annotations

import json
import os
import time

from .conftest import distrun


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
