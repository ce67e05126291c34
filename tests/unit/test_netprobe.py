"""The preflight's network probe, run for real on loopback addresses: three "nodes" (127.0.0.11-13)
listen and call each other as the role ships it (netprobe.py in front of probe.py), and the
judge names a pair that cannot connect with the likely cause, in the words check and train print."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from distrun.preflight.netjudge import cause
from distrun.preflight.netjudge import verdict as net_verdict

from .probe_text import probe_text
from .test_preflight_needs import failed, judge, probe

FILES = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files"
SHIPPED = probe_text()
NODES = ["node1", "node2", "node3"]
ADDRESS = {"node1": "127.0.0.11", "node2": "127.0.0.12", "node3": "127.0.0.13"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(peers: dict[str, str], *, rendezvous: int, mpi_range: str = "", timeout: float = 3,
              nodes=NODES, late: dict[str, float] | None = None) -> dict[str, dict]:
    """Every node's probe at once, each listening on its own loopback address. The nonce is this
    call's own, so another test process probing beside it (the suite runs two Pythons at once)
    listens on other ports and never answers these nodes."""
    nonce = f"unit-{os.getpid()}-{time.time_ns()}"

    def one(host):
        time.sleep((late or {}).get(host, 0))
        cfg = {"host": host, "user": "no-such-user-distrun", "env_prefix": "/nonexistent", "mpi_prefix": "/usr",
               "shared_dir": "/tmp",
               "net": {"nonce": nonce, "timeout": timeout, "head": "node1", "peers": peers, "rendezvous": rendezvous,
                       "mpi_range": mpi_range, "listen_address": ADDRESS[host]}}
        out = subprocess.run([sys.executable, "-c", SHIPPED, json.dumps(cfg)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(len(nodes)) as pool:
        return dict(zip(nodes, pool.map(one, nodes), strict=True))


def test_every_node_reaches_the_heads_rendezvous_port_and_every_other_in_the_mpi_range():
    port = free_port()
    found = run_nodes(ADDRESS, rendezvous=port, mpi_range="20000-60000")
    assert found["node1"]["net"]["listen"]["rendezvous"] == {"ok": True, "port": port, "seen": ["node2", "node3"]}
    for h in NODES:
        calls = found[h]["net"]["calls"]
        expected = {f"mpi {p}" for p in NODES if p != h} | ({"rendezvous node1"} if h != "node1" else set())
        assert set(calls) == expected and all(c["ok"] for c in calls.values()), calls
        assert sorted(found[h]["net"]["listen"]["mpi"]["seen"]) == [p for p in NODES if p != h]
    # The probe runs apart from the node's other checks: this "node" was never set up.
    assert found["node2"]["setup"]["ok"] is False
    assert all(item[0] for item in net_verdict(found, head="node1").values())


def test_a_node_whose_probe_starts_late_is_waited_for_not_blamed():
    # On a dozen nodes the play starts the probes over seconds: node3 listens 3.5 s after the
    # others' 3 s deadline. Nothing is wrong, and nothing is reported. (The grace is as long
    # again as the deadline: a second of margin on each side, for a loaded machine.)
    port = free_port()
    found = run_nodes(ADDRESS, rendezvous=port, mpi_range="20000-60000", timeout=3, late={"node3": 3.5})
    judged = net_verdict(found, head="node1")
    assert all(item[0] for item in judged.values()), judged


def test_a_node_nobody_can_reach_is_named_as_the_pair_with_the_cause():
    port = free_port()
    # node3's listener is where the others do not look: every call to it is refused.
    peers = {**ADDRESS, "node3": "127.0.0.99"}
    found = run_nodes(peers, rendezvous=port, mpi_range="20000-60000", timeout=2)
    judged = net_verdict(found, head="node1")
    ok, detail, fix = judged["node2"]
    assert not ok
    assert detail.startswith("node2 cannot open a TCP connection to node3 in Open MPI's TCP port range (127.0.0.99:")
    assert detail.endswith("refused: a firewall rejects it, or nothing could listen there")
    assert "TCP ports 20000-60000" in fix and fix.endswith("then 'distrun check'")
    assert judged["node3"][0]  # node3 itself reached node1 and node2


def test_the_judge_names_each_cause_of_a_failed_connection():
    assert cause("timeout", 8) == ("no answer within 8s: a firewall drops it, or that address is not on the "
                                   "nodes' network")
    assert cause("unreachable: No route to host", 8) == ("No route to host: no route between them (a wrong "
                                                          "interface or address)")
    assert cause("foreign", 8) == "another program answers on that port"
    assert cause("silent", 8) == ("it accepts the connection but sends no greeting within 8s: another program, or "
                                  "the node is overloaded")
    assert cause("no address", 8) == "it has no address on the ranks' network (distrun_network)"


def test_a_peer_without_an_address_on_the_ranks_network_is_named_not_called():
    port = free_port()
    # node3 has no address on distrun_network: an empty address must not reach this node itself.
    found = run_nodes({**ADDRESS, "node3": ""}, rendezvous=port, mpi_range="20000-60000", timeout=2)
    ok, detail, _ = net_verdict(found, head="node1")["node2"]
    assert not ok
    assert detail == ("node2 cannot open a TCP connection to node3 in Open MPI's TCP port range (no address): "
                      "it has no address on the ranks' network (distrun_network)")


def net(calls=None, listen=None, mpi_range=""):
    return {"timeout": 8, "mpi_range": mpi_range, "listen": listen or {"mpi": {"ok": True, "port": 1}},
            "calls": calls or {}}


def test_a_dropped_connection_refuses_the_run_in_one_line_naming_the_pair():
    drop = {"ok": False, "address": "10.0.0.3", "port": 40000, "error": "timeout", "foreign": False}
    probes = {h: probe(h) for h in NODES}
    probes["node1"]["net"] = net({"mpi node2": {"ok": True}, "mpi node3": {"ok": True}})
    probes["node2"]["net"] = net({"mpi node1": {"ok": True}, "mpi node3": drop}, mpi_range="1024-65535")
    probes["node3"]["net"] = net({"mpi node1": {"ok": True}, "mpi node2": {"ok": True}})
    line = judge(probes, failed("node2"))
    assert line == ("network: node2 cannot open a TCP connection to node3 in Open MPI's TCP port range "
                    "(10.0.0.3:40000): no answer within 8s: a firewall drops it, or that address is not on the "
                    "nodes' network on node2: let TCP connections between the nodes through the firewall (TCP ports "
                    "1024-65535; e.g. allow the cluster's subnet), and check that every node has an address on the "
                    "ranks' network (ansible_host, or distrun_network where the nodes have several); then "
                    "'distrun check'")


@pytest.mark.parametrize("why", ["the head's port is taken", "the peer's probe did not run"])
def test_calls_that_say_nothing_about_the_network_are_left_to_the_check_that_explains_them(why):
    refused = {"ok": False, "address": "10.0.0.1", "port": 29500, "error": "refused", "foreign": False}
    probes = {
        "node1": {"net": net(listen={"rendezvous": {"ok": True, "port": 29500}}),
                  "ports": {"29500": {"ok": why != "the head's port is taken", "detail": "in use"}}},
        "node2": {"net": net({"rendezvous node1": refused}, listen={})},
    }
    if why == "the peer's probe did not run":
        del probes["node1"]["net"]
    assert net_verdict(probes, head="node1")["node2"][0]


def test_a_node_whose_first_port_is_taken_listens_on_the_next_and_every_caller_finds_it():
    # A port of the range can be in use on a node (one of its own outgoing connections took it as
    # its local port): the node listens on the next port of its list, and the others must call there.
    nonce = f"unit-{os.getpid()}-{time.time_ns()}"
    ns: dict = {}
    exec(compile((FILES / "netprobe.py").read_text(), "netprobe.py", "exec"), ns)  # noqa: S102 - the shipped code
    ports = ns["range_ports"](nonce, "node1", 20000, 60000)
    with socket.socket() as taken:
        taken.bind((ADDRESS["node1"], ports[0]))  # bound, not listening: a caller is refused there
        deadline = time.monotonic() + 3
        listener = ns["Listener"](nonce, "node1", ports, ["node2"], deadline, ADDRESS["node1"])
        assert listener.port == ports[1], listener.error
        reached = ns["call"]("node2", nonce, "node1", ADDRESS["node1"], ports, deadline)
        assert reached == {"ok": True, "address": ADDRESS["node1"], "port": ports[1]}
        assert listener.result()["seen"] == ["node2"]


def _shipped() -> dict:
    ns: dict = {}
    exec(compile((FILES / "netprobe.py").read_text(), "netprobe.py", "exec"), ns)  # noqa: S102 - the shipped code
    return ns


def test_a_caller_that_keeps_the_listener_waiting_delays_no_other_caller():
    # Every node calls the head's rendezvous port at once; a caller slow to say its name (a loaded
    # node) must not keep the next one from its greeting, which it waits for only so long.
    ns, nonce, port = _shipped(), f"unit-{os.getpid()}-{time.time_ns()}", free_port()
    deadline = time.monotonic() + 4
    listener = ns["Listener"](nonce, "node1", [port], ["node2", "node3"], deadline, ADDRESS["node1"])
    with socket.create_connection((ADDRESS["node1"], port)) as slow:
        slow.recv(256)  # greeted; says nothing back
        t0 = time.monotonic()
        reached = ns["call"]("node2", nonce, "node1", ADDRESS["node1"], [port], deadline)
        assert reached == {"ok": True, "address": ADDRESS["node1"], "port": port}
        assert time.monotonic() - t0 < 0.5
    assert "node2" in listener.result()["seen"]


def test_a_port_that_accepts_and_never_greets_is_silent_not_refused():
    ns, port = _shipped(), free_port()
    with socket.socket() as mute:
        mute.bind((ADDRESS["node1"], port))
        mute.listen(8)  # the kernel accepts; nothing ever writes
        got = ns["call"]("node2", "n", "node1", ADDRESS["node1"], [port], time.monotonic() + 1.5)
    assert got["ok"] is False and got["error"] == "silent" and got["foreign"] is False


def test_while_its_probe_is_busy_a_node_listens_and_calls_past_the_deadlines():
    # On loaded nodes the probes start further apart than twice the timeout: a node still at its
    # other checks keeps its listener open, and keeps calling a node that does not listen yet.
    ns, nonce = _shipped(), f"unit-{os.getpid()}-{time.time_ns()}"
    busy = threading.Event()
    busy.set()
    early_port, late_port = free_port(), free_port()
    t0 = time.monotonic()
    listener = ns["Listener"](nonce, "node1", [early_port], ["node2"], t0 + 0.3, ADDRESS["node1"], busy)
    box: dict = {}
    caller = threading.Thread(target=lambda: box.update(ns["call"](
        "node1", nonce, "node2", ADDRESS["node2"], [late_port], t0 + 0.3, t0 + 0.6, busy)))
    caller.start()
    time.sleep(1.0)  # node2's probe starts now, past node1's deadlines
    late = ns["Listener"](nonce, "node2", [late_port], ["node1"], time.monotonic() + 2, ADDRESS["node2"])
    assert ns["call"]("node2", nonce, "node1", ADDRESS["node1"], [early_port], time.monotonic() + 2)["ok"]
    caller.join(5)
    busy.clear()
    assert box == {"ok": True, "address": ADDRESS["node2"], "port": late_port}
    assert listener.result()["seen"] == ["node2"] and late.result()["seen"] == ["node1"]


def test_a_refused_call_ends_at_its_deadline_once_the_probe_is_done():
    ns, port = _shipped(), free_port()
    t0 = time.monotonic()
    got = ns["call"]("node1", "n", "node2", ADDRESS["node2"], [port], t0 + 0.3, t0 + 0.6, threading.Event())
    assert got["error"] == "refused" and time.monotonic() - t0 < 1.5


def test_another_runs_probe_on_the_port_is_waited_for_not_taken_for_another_program():
    """Two runs started together: the other run's probe listens on the head's rendezvous port for a
    moment. A caller waits for its own run's listener instead of dropping the port as foreign."""
    ns, nonce, port = _shipped(), f"unit-{os.getpid()}-{time.time_ns()}", free_port()
    other = ns["Listener"]("another-run", "node1", [port], ["node2"], time.monotonic() + 0.8, ADDRESS["node1"])
    ours: dict = {}

    def ours_after_theirs() -> None:
        other.result()  # the other run's turn ends
        ours["listener"] = ns["Listener"](nonce, "node1", [port], ["node2"], time.monotonic() + 4, ADDRESS["node1"])

    turn = threading.Thread(target=ours_after_theirs)
    turn.start()
    got = ns["call"]("node2", nonce, "node1", ADDRESS["node1"], [port], time.monotonic() + 4)
    turn.join()
    assert got == {"ok": True, "address": ADDRESS["node1"], "port": port}, got
    assert "node2" in ours["listener"].result()["seen"]


def test_two_probes_on_one_node_take_turns(tmp_path):
    """A probe holds its node's turn until it ends; another run's probe there waits for it (as root,
    which the probe runs as, in a root-owned folder)."""
    script = (FILES / "netprobe.py").read_text()
    holder = (f"{script}\nimport sys, time\ntake_turn({str(tmp_path)!r})\nprint('held', flush=True)\n"
              "time.sleep(float(sys.argv[1]))\n")
    first = subprocess.Popen([sys.executable, "-c", holder, "1.5"], stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    second = subprocess.run([sys.executable, "-c", holder, "0"], capture_output=True, text=True, timeout=30)
    waited = time.monotonic() - t0
    first.wait(timeout=30)
    assert second.stdout.strip() == "held" and waited >= 1.0, (waited, second.stderr)
    assert oct((tmp_path / "probe.lock").stat().st_mode & 0o777) == "0o600"
