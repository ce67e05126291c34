"""'distrun check' without nodes: fake probes in, the report and its messages out."""

from __future__ import annotations

import copy
import json

import pytest

from distrun.errors import PlanError
from distrun.inventory.cluster import Node, load_cluster
from distrun.planning.placement import check_gpu_slots, gpu_slot_mismatches
from distrun.preflight.judge import compare_names, compare_versions, verdict
from distrun.preflight.report import Item, build_report, network_changed, report_json

from .plans import plan_for

SETUP = "distrun setup --inventory test"
NODES = ["node1", "node2", "node3"]
VERSIONS = {"python": "3.11.2", "openmpi": "4.1.4", "mpi4py": "4.1.2", "torch": "2.13.0",
            "jittor": "absent", "env lock": "sha256:aaaa"}


def probe(host: str, **over) -> dict:
    p = {
        "host": host,
        "env": {"ok": True, "detail": "/opt/distrun/venv/bin/python"},
        "mpi4py": {"ok": True, "detail": "Open MPI v4.1.4"},
        "versions": dict(VERSIONS),
        "shared_writable": {"ok": True, "detail": "/srv/distrun is writable by distrun"},
        "ssh": {o: {"ok": True, "detail": "ok"} for o in NODES if o != host},
        "names": {n: f"10.0.0.{i + 1}" for i, n in enumerate(NODES)},
    }
    if host == "node1":
        p["ports"] = {"29500": {"ok": True, "detail": "free"}}
        p["shared_probe"] = {"ok": True, "detail": "wrote /srv/distrun/.distrun-preflight-1"}
        p["synced"] = {o: {"ok": True, "detail": "synced"} for o in NODES if o != host}
    p.update(over)
    return p


def healthy() -> dict:
    return {h: probe(h) for h in NODES}


def report(probes: dict, *, seen: dict | None = None, hosts: dict | None = None, mode: str = "sync", gpus=None):
    judged = verdict(probes, head="node1", shared_mode=mode, shared_dir="/srv/distrun", setup=SETUP,
                     seen=seen if seen is not None else {"node2": "/srv/distrun/.p", "node3": "/srv/distrun/.p"})
    return build_report(nodes=NODES, hosts=hosts or {h: {"state": "ok", "error": ""} for h in NODES},
                        judged=judged, gpus=gpus)


def failures(rep) -> dict[tuple[str, str], Item]:
    return {(c, h): it for c, items in rep.items() for h, it in items.items() if not it.ok}


def test_a_healthy_cluster_passes_every_check_and_says_each_sync_copy_is_writable():
    rep = report(healthy())
    assert failures(rep) == {}
    assert set(rep) >= {"reach", "env", "mpi4py", "versions", "ports", "ssh", "names", "shared folder"}
    assert rep["shared folder"]["node2"].detail == "/srv/distrun writable (sync: this node's own copy)"
    assert list(rep["ports"]) == ["node1"]  # ports are the head's alone


def test_version_mismatch_names_the_nodes_and_both_versions():
    versions = {h: dict(VERSIONS) for h in NODES}
    versions["node3"]["torch"] = "2.12.0"
    out = compare_versions(versions, "node1", SETUP)
    assert out["node1"].ok and out["node2"].ok
    assert not out["node3"].ok
    assert out["node3"].detail == "versions differ: torch 2.13.0 on node1,node2 but 2.12.0 on node3"
    assert out["node3"].fix == f"run '{SETUP}' (mpi_env) so every node has the same env"


def test_absent_is_a_version_and_every_differing_key_is_listed():
    versions = {h: dict(VERSIONS) for h in NODES}
    versions["node2"].update({"jittor": "1.3.11", "env lock": "sha256:bbbb"})
    out = compare_versions(versions, "node1", SETUP)
    assert out["node2"].detail == ("versions differ: jittor absent on node1,node3 but 1.3.11 on node2; "
                                   "env lock sha256:aaaa on node1,node3 but sha256:bbbb on node2")


def test_on_a_tie_the_head_is_the_reference():
    versions = {"node1": dict(VERSIONS), "node2": {**VERSIONS, "mpi4py": "4.0.3"}}
    out = compare_versions(versions, "node1", SETUP)
    assert out["node1"].ok
    assert out["node2"].detail == "versions differ: mpi4py 4.1.2 on node1 but 4.0.3 on node2"


def test_a_wrong_or_missing_name_is_reported_on_the_node_that_has_it():
    names = {h: {n: f"10.0.0.{i + 1}" for i, n in enumerate(NODES)} for h in NODES}
    names["node2"]["node3"] = "127.0.0.2"
    names["node3"]["node1"] = ""
    out = compare_names(names, "node1", SETUP)
    assert out["node1"].ok
    assert out["node2"].detail == "node2 resolves node3 to 127.0.0.2 but node1,node3 to 10.0.0.3"
    assert out["node3"].detail == "node1 does not resolve on node3 (10.0.0.1 on node1,node2)"
    assert "/etc/hosts" in out["node2"].fix and "--tags base" in out["node2"].fix


def test_a_node_whose_own_name_is_on_127_0_1_1_as_debian_installs_it_is_not_blamed():
    names = {h: {n: f"10.0.0.{i + 1}" for i, n in enumerate(NODES)} for h in NODES}
    names["node1"]["node1"] = "127.0.1.1,10.0.0.1"  # the installer's line, then role base's
    names["node2"]["node2"] = "127.0.1.1"  # the installer's line alone
    out = compare_names(names, "node1", SETUP)
    assert all(item.ok for item in out.values()), {h: i.detail for h, i in out.items()}
    # Loopback for another node's name is still wrong.
    names["node3"]["node1"] = "127.0.1.1"
    assert compare_names(names, "node1", SETUP)["node3"].detail == "node3 resolves node1 to 127.0.1.1 but node1,node2 to 10.0.0.1"


def test_busy_port_names_the_process_and_the_fix():
    probes = healthy()
    probes["node1"]["ports"] = {"29500": {"ok": False, "detail": "in use by python3 (pid 42)"}}
    bad = failures(report(probes))
    assert list(bad) == [("ports", "node1")]
    assert bad[("ports", "node1")].detail == "port 29500 in use by python3 (pid 42)"
    assert "--port" in bad[("ports", "node1")].fix


def test_pairwise_ssh_failure_is_reported_on_the_source_node():
    probes = healthy()
    probes["node3"]["ssh"]["node2"] = {"ok": False, "detail": "Permission denied (publickey)."}
    bad = failures(report(probes))
    assert bad[("ssh", "node3")].detail == "node3 -> node2: Permission denied (publickey)."
    assert "--tags ssh_mesh" in bad[("ssh", "node3")].fix


def test_shared_folder_not_writable_gets_a_fix_not_a_return_code():
    probes = healthy()
    probes["node2"]["shared_writable"] = {"ok": False,
                                          "detail": "/srv/distrun is not writable by distrun (owner root, mode 0755)"}
    bad = failures(report(probes))
    item = bad[("shared folder", "node2")]
    assert "owner root, mode 0755" in item.detail
    assert item.fix == f"run '{SETUP} --tags shared_fs'"


def test_shared_folder_probe_file_missing_in_nfs_mode_and_a_sync_copy_that_is_not_writable():
    probes = healthy()
    nfs = failures(report(probes, seen={"node2": "/srv/distrun/.p", "node3": ""}, mode="nfs"))
    assert list(nfs) == [("shared folder", "node3")]
    assert "not visible on node3" in nfs[("shared folder", "node3")].detail
    assert report(probes, mode="nfs")["shared folder"]["node2"].detail.startswith("seen")

    # sync: each node's own copy; no check copies a file between nodes (that would run a process
    # of the training user's on each of them, which a job could trace): a copy must be writable.
    probes["node3"]["shared_writable"] = {"ok": False, "detail": "/srv/distrun is not writable by distrun"}
    sync = failures(report(probes, seen={}))
    assert list(sync) == [("shared folder", "node3")] and "not writable" in sync[("shared folder", "node3")].detail


def test_an_unreachable_node_fails_reach_only_and_the_rest_is_checked():
    probes = healthy()
    del probes["node2"]
    for p in probes.values():
        p["ssh"].pop("node2", None)
        p["names"]  # names still resolve
    probes["node1"]["synced"].pop("node2")
    hosts = {"node1": {"state": "ok", "error": ""}, "node2": {"state": "unreachable", "error": "No route to host"},
             "node3": {"state": "ok", "error": ""}}
    rep = report(probes, hosts=hosts, seen={"node3": "/srv/distrun/.p"})
    assert list(failures(rep)) == [("reach", "node2")]
    assert "start node2" in rep["reach"]["node2"].fix
    assert "node2" not in rep["versions"]


def test_a_node_out_of_play_fails_reach_only_though_the_others_probes_tried_to_log_in_to_it():
    # No fact gathering drops it before the probes start: the others' probes try it and time out.
    probes = healthy()
    del probes["node2"]
    for h, p in probes.items():
        p["ssh"]["node2"] = {"ok": False, "detail": f"distrun@node2: ssh: connect to host node2 port 22: timed out ({h})"}
    hosts = {"node1": {"state": "ok", "error": ""}, "node2": {"state": "unreachable", "error": "No route to host"},
             "node3": {"state": "ok", "error": ""}}
    rep = report(probes, hosts=hosts, seen={"node3": "/srv/distrun/.p"})
    assert list(failures(rep)) == [("reach", "node2")]
    assert rep["ssh"]["node1"].detail == "reaches node3"


def test_a_host_ansible_failed_without_a_known_cause_is_still_reported():
    hosts = {h: {"state": "ok", "error": ""} for h in NODES}
    hosts["node3"] = {"state": "failed", "error": "Probe ...: Traceback"}
    rep = report(healthy(), hosts=hosts)
    assert list(failures(rep)) == [("preflight", "node3")]


def test_json_report_keeps_the_hosts_shape_and_adds_checks():
    hosts = {h: {"state": "ok", "error": ""} for h in NODES}
    probes = healthy()
    probes["node3"] = probe("node3", mpi4py={"ok": False, "detail": "ImportError: libmpi.so.40"})
    out = report_json(report(probes), hosts, 4.2)
    assert out["ok"] is False
    assert out["hosts"]["node1"] == {"state": "ok", "error": ""}
    assert out["checks"]["mpi4py"]["node3"] == {"ok": False, "detail": "ImportError: libmpi.so.40",
                                                "fix": f"run '{SETUP} --tags mpi_env'"}
    json.dumps(out)  # serialisable as printed by --json


# --- GPUs vs slots ---------------------------------------------------------------------------

def node(name: str, slots: int, gpus: int, worker: bool = True) -> Node:
    return Node(name, name, slots, "inventory", gpus, name == "g1", worker)


def test_gpu_slot_mismatch_only_where_slots_cannot_share_the_gpus():
    nodes = [node("g1", 4, 4), node("g2", 3, 4), node("g3", 2, 4), node("g4", 8, 4), node("c1", 2, 0),
             node("login", 1, 2, worker=False)]
    # g3: two GPUs per rank; g4: two ranks on each GPU.
    assert [(m.host, m.slots, m.gpus) for m in gpu_slot_mismatches(nodes)] == [("g2", 3, 4), ("g4", 8, 4)]


@pytest.fixture
def gpu_cluster(write_inventory, tmp_path):
    cache = tmp_path / "facts"
    cache.mkdir()
    for host, gpus in (("g1", 4), ("g2", 4)):
        (cache / f"s1_{host}").write_text(json.dumps({"__payload__": json.dumps({"ansible_local": {"distrun": {"gpus": gpus}}})}))
    inv = write_inventory("[head]\ng1\n[workers]\ng1\ng2 slots=3\n", name="gpu.ini")
    return load_cluster(inv, cache)


def test_train_refuses_a_gpu_slot_mismatch_with_host_slots_gpus_and_fix(gpu_cluster):
    with pytest.raises(PlanError) as exc:
        plan_for(gpu_cluster, run_id="T")
    msg = str(exc.value)
    assert "g2 has slots=3 but 4 GPU(s), which 3 rank(s) cannot share evenly" in msg
    assert "set slots=4 for g2" in msg and "--allow-gpu-mismatch" in msg
    assert "\n" not in msg


def test_allow_gpu_mismatch_launches_anyway(gpu_cluster):
    plan = plan_for(gpu_cluster, run_id="T", allow_gpu_mismatch=True)
    assert plan.placement.world_size == 7
    # The node's GPUs are left as they are where its ranks cannot share them.
    assert [h.visible for h in plan.placement.hosts] == [("0,1,2,3",) * 4, ()]
    check_gpu_slots(gpu_cluster, allow=True)


def test_check_reports_the_gpu_mismatch_per_node(gpu_cluster):
    from distrun.preflight.check import gpu_items

    items = gpu_items(gpu_cluster.workers, "prod")
    assert items["g1"].ok and items["g1"].detail == "slots=4, 4 GPU(s)"
    assert not items["g2"].ok
    assert "set slots=4 for g2 in prod" in items["g2"].fix
    rep = report(healthy(), gpus=copy.deepcopy(items))
    assert ("gpus vs slots", "g2") in failures(rep)


def test_human_report_shows_marks_and_fix_lines(capsys):
    from distrun.ui.check import print_check_report

    probes = healthy()
    probes["node1"]["ports"] = {"29500": {"ok": False, "detail": "in use by python3 (pid 42)"}}
    hosts = {h: {"state": "ok", "error": ""} for h in NODES}
    print_check_report(report_json(report(probes), hosts, 3.0))
    out = capsys.readouterr().out
    assert "✓" in out and "✗" in out
    assert "✗ ports on node1: port 29500 in use by python3 (pid 42)" in out
    assert "fix: stop that process" in out
    assert "1 check(s) failed" in out


def test_a_node_whose_planned_address_moved_is_blamed_and_the_runner_plans_again():
    planned = {h: {"iface": "eth0", "address": f"10.0.0.{i + 1}"} for i, h in enumerate(NODES)}
    probes = {h: probe(h, addresses={"lo": ["127.0.0.1"], "eth0": [planned[h]["address"]]}) for h in NODES}
    probes["node3"]["addresses"] = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.99"]}
    probes["node2"].pop("addresses")  # the probe could not tell: not judged on it
    judged = verdict(probes, head="node1", shared_mode="sync", shared_dir="/srv/distrun", setup=SETUP, planned=planned)
    assert {h: it.ok for h, it in judged["addresses"].items()} == {"node1": True, "node3": False}
    assert judged["addresses"]["node3"].detail == (
        "the plan expected 10.0.0.3 on eth0; the node's network changed since its facts were cached")
    assert network_changed(judged) and not network_changed(verdict(
        {h: probe(h) for h in NODES}, head="node1", shared_mode="sync", shared_dir="/srv/distrun", setup=SETUP,
        planned=planned))
    # 'distrun check' plans nothing: no such check.
    assert "addresses" not in verdict(probes, head="node1", shared_mode="sync", shared_dir="/srv/distrun", setup=SETUP)
