"""'distrun check --bandwidth' on the 3 nodes: nccl-tests' table over gloo, and a node whose NIC is
throttled named.

The throttle is a token-bucket qdisc (tc ... tbf) on the interface the ranks use on node3, set
from the host in node3's network namespace (the nodes have neither tc nor the capability, as a
job would not) and removed in ``finally``. The rate (100 Mbit/s) is far below what the bridge
between the containers carries (about 1 GB/s of bus bandwidth measured here), so the verdict does
not depend on the machine's load; the unthrottled test asserts only what load cannot change.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from .conftest import distrun

NODES = ["node1", "node2", "node3"]
MAX = "4M"  # the largest message: enough to see the NIC, short under a throttle (a few seconds)


def bandwidth(*extra: str) -> tuple[int, dict, str, float]:
    started = time.monotonic()
    res = distrun("check", "--inventory", "test", "--bandwidth", "--max-bytes", MAX, "--json", *extra, timeout=600)
    took = time.monotonic() - started
    try:
        out = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"check --bandwidth printed no JSON (rc {res.rc}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.rc, out, res.stderr, took


def iface(cluster, k: int) -> str:
    """The interface node k's inventory address is on (the one its ranks use: no distrun_network here)."""
    return cluster.exec(k, f"ip -o -4 addr show to {cluster.ip(k)} | awk '{{print $2}}'").stdout.strip()


def test_bandwidth_prints_nccl_tests_table_for_every_size_over_the_chosen_nic(provisioned):
    res = distrun("check", "--inventory", "test", "--bandwidth", "--max-bytes", MAX, "--launcher", "torchrun",
                  timeout=600)
    lines = res.stdout.splitlines()
    assert res.rc in (0, 1), res.stdout[-3000:] + res.stderr[-3000:]
    head = next(i for i, ln in enumerate(lines) if ln.startswith("#       size"))
    assert lines[head].split() == ["#", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    assert lines[head + 1].split() == ["#", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)"]
    rows = []
    for ln in lines[head + 2:]:
        if ln.startswith("#"):
            break
        rows.append(ln.split())
    # 1K to 4M by a factor of 4: seven sizes, floats summed, no element wrong.
    assert [int(r[0]) for r in rows] == [1024, 4096, 16384, 65536, 262144, 1048576, 4194304], res.stdout
    assert all(r[1] == str(int(r[0]) // 4) and r[2:4] == ["float", "sum"] and r[7] == "0" for r in rows), res.stdout
    assert all(float(r[6]) > 0 for r in rows[-2:]), res.stdout  # big messages move at a measurable rate
    assert lines[0].startswith("# all-reduce (sum, in place): 3 rank(s) on 3 node(s) (node1, node2, node3), gloo on cpu over ")
    pairs = [ln.split() for ln in lines if ln.startswith("  node")]
    assert [p[:3] for p in pairs] == [["node1", "-", "node2"], ["node1", "-", "node3"], ["node2", "-", "node3"]]
    assert res.stdout.rstrip().splitlines()[-1].startswith("run record: ")


def test_bandwidth_json_has_every_size_and_pair_and_each_nodes_interface(provisioned):
    rc, out, err, took = bandwidth()
    print(f"\ncheck --bandwidth (mpirun) took {took:.1f}s; pairs "
          + ", ".join(f"{'-'.join(p['hosts'])} {p['busbw']:.3f} GB/s" for p in out["pairs"]))
    assert rc in (0, 1), err[-3000:]
    assert out["hosts"] == NODES and out["ranks"] == 3 and out["backend"] == "gloo" and out["device"] == "cpu"
    # The interface the rank wrapper chose on each node (GLOO_SOCKET_IFNAME), the one the inventory's address is on.
    ifaces = {n: iface(provisioned, k) for k, n in enumerate(NODES, 1)}
    assert out["nics"] == ifaces, (out["nics"], ifaces)
    assert [s["bytes"] for s in out["sizes"]] == [1024 << (2 * i) for i in range(7)]
    assert all(s["wrong"] == 0 and s["busbw"] >= 0 and s["algbw"] * 4 / 3 == pytest.approx(s["busbw"]) for s in out["sizes"])
    assert [p["hosts"] for p in out["pairs"]] == [["node1", "node2"], ["node1", "node3"], ["node2", "node3"]]
    assert all(p["busbw"] > 0 and p["ranks"] == 2 for p in out["pairs"]) and out["pair_bytes"] == 4 << 20
    assert out["reference_busbw"] == pytest.approx(sorted(max(p["busbw"] for p in out["pairs"] if n in p["hosts"])
                                                          for n in NODES)[1])
    # Each pair's bus bandwidth is its all-reduce's; the record keeps the program's result.
    record = json.loads(open(os.path.join(os.environ["DISTRUN_HOME"], "runs", out["run_id"], "result.json")).read())
    assert record["workload"] == "allreduce_bw" and record["pairs"] == out["pairs"]


def test_a_node_with_a_throttled_nic_is_named(provisioned):
    nic = iface(provisioned, 3)
    shaper = ["tc", "qdisc", "add", "dev", nic, "root", "tbf", "rate", "100mbit", "burst", "64kb", "latency", "100ms"]
    provisioned.netns(3, shaper)
    try:
        rc, out, err, took = bandwidth()
        print(f"\nthrottled node3 ({nic}, 100 Mbit/s): check --bandwidth took {took:.1f}s; pairs "
              + ", ".join(f"{'-'.join(p['hosts'])} {p['busbw']:.3f} GB/s" for p in out["pairs"]))
    finally:
        provisioned.netns(3, ["tc", "qdisc", "del", "dev", nic, "root"])
    assert rc == 1, err[-3000:]
    assert out["ok"] is False and list(out["slow_nodes"]) == ["node3"] and out["slow_pairs"] == []
    # 100 Mbit/s is 0.0125 GB/s: node3's best pair is bound by it, node1 - node2 is not.
    assert out["slow_nodes"]["node3"] < 0.02
    fast = next(p for p in out["pairs"] if p["hosts"] == ["node1", "node2"])
    assert fast["busbw"] > 5 * out["slow_nodes"]["node3"]
    detail = out["problems"][0]["detail"]
    assert detail.startswith(f"node3: bus bandwidth {out['slow_nodes']['node3']:.3f} GB/s over {nic} at best, "
                             "far below the other nodes'"), detail
    assert f"look at node3's NIC over {nic}" in out["problems"][0]["fix"]
    assert "'distrun train --exclude node3'" in out["problems"][0]["fix"]
    # Without the throttle, nothing is named again: the verdict came from the qdisc.
    rc, after, err, _ = bandwidth()
    assert "node3" not in after["slow_nodes"], json.dumps(after["pairs"])
