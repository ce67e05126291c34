"""The drained nodes' store: marks per inventory with reason, source and time; cleared one at a
time or by a passing check; a damaged file said in one line; and check's part of it (a faulty GPU
drains, a passing node comes back) and 'distrun check --clear NODE'; a node a run lost, as 'runs'
and 'show' say it and the next run leaves it out (test_run_attempts.py: when a run drains one)."""

from __future__ import annotations

import json
import subprocess
import threading
from types import SimpleNamespace

import pytest

from distrun import paths
from distrun.errors import UserError
from distrun.preflight import check as pc
from distrun.preflight import gpuhealth
from distrun.preflight.report import Item
from distrun.store import drained as dr

from .conftest import distrun_bin

T0 = 1_762_000_000.0


def test_a_mark_keeps_reason_source_and_first_time(tmp_path):
    inv = tmp_path / "prod.yml"
    assert dr.drained(inv) == {}
    first = dr.drain(inv, "node3", "Xid 79 on GPU 0000:3a:00\n(GPU has fallen off the bus)", dr.SOURCE_GPU_HEALTH, now=T0)
    assert first == dr.Drain("node3", "Xid 79 on GPU 0000:3a:00 (GPU has fallen off the bus)", "check: gpu health", T0, T0)
    again = dr.drain(inv, "node3", "Xid 48 on GPU 0000:2a:00", "run 20251103-train-ab12", now=T0 + 60)
    assert (again.since, again.updated, again.source, again.reason) == (T0, T0 + 60, "run 20251103-train-ab12",
                                                                        "Xid 48 on GPU 0000:2a:00")
    assert dr.drained(inv) == {"node3": again}
    assert dr.drained(tmp_path / "other.yml") == {}  # per inventory
    assert paths.drained_file(inv).parent.stat().st_mode & 0o777 == 0o700  # the controller's private state


def test_the_line_says_since_when_why_and_how_it_comes_back(tmp_path):
    mark = dr.drain(tmp_path / "inv", "node3", "Xid 79", dr.SOURCE_GPU_HEALTH, now=T0)
    assert mark.line() == (f"node3 is drained since {mark.when()} (check: gpu health: Xid 79); a 'distrun check' that "
                           "passes on it, or 'distrun check --clear node3', brings it back")


def test_clear_one_and_clear_the_passed_ones(tmp_path):
    inv = tmp_path / "inv"
    for node in ("node1", "node2", "node3"):
        dr.drain(inv, node, f"why {node}", "run r1", now=T0)
    gone = dr.undrain(inv, "node2")
    assert gone is not None and gone.reason == "why node2"
    assert dr.undrain(inv, "node2") is None
    assert [d.node for d in dr.undrain_passed(inv, ["node3", "node4"])] == ["node3"]
    assert list(dr.drained(inv)) == ["node1"]
    kept, out = dr.left_out(inv, ["node3", "node1", "node2"])
    assert kept == ["node3", "node2"] and [d.node for d in out] == ["node1"]


def test_marks_made_at_once_are_all_kept(tmp_path):
    inv = tmp_path / "inv"
    threads = [threading.Thread(target=dr.drain, args=(inv, f"n{i}", "r", "s")) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(dr.drained(inv)) == sorted(f"n{i}" for i in range(12))


def test_a_damaged_file_is_one_line_naming_it_and_the_fix(tmp_path):
    inv = tmp_path / "inv"
    paths.drained_file(inv).write_text("{not json")
    with pytest.raises(UserError, match=r"the drained nodes' file .*\.json is damaged .*; remove it \(every node then "
                                        r"counts as not drained\) and run 'distrun check' again"):
        dr.drained(inv)


# -- check's part


def health(node_reading: dict, gpus: int) -> gpuhealth.Health:
    return gpuhealth.judge(node_reading, gpus)


LOST = {"devices": 2, "smi": "/usr/bin/nvidia-smi", "now": T0, "boot": T0 - 100,
        "query": {"rc": 0, "out": "index, pci.bus_id, name, driver_version, persistence_mode, ecc.mode.current, "
                  "ecc.errors.uncorrected.volatile.total, ecc.errors.uncorrected.aggregate.total\n"
                  "0, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 550.90.07, Enabled, Enabled, 0, 0\n", "err": ""}}


def test_check_drains_a_faulty_gpu_node_and_brings_back_a_passing_one(tmp_path):
    inv = tmp_path / "inv"
    dr.drain(inv, "node1", "lost by run r7", "run r7", now=T0)  # issue 60's mark: cleared by a passing check
    hs = {"node1": health({"devices": 0, "smi": ""}, 0), "node2": health(LOST, 2)}
    items = pc.health_items(hs)
    assert items["node1"] == Item(True, "no GPU")
    assert not items["node2"].ok and items["node2"].detail == "DRAINED: 1 of 2 GPU(s) answer nvidia-smi"
    report = {"gpu health": {"node2": items["node2"]}, "reach": {"node1": Item(True, "ok"), "node2": Item(True, "ok")}}
    marks = pc.settle_drains(inv, hs, report, ["node1", "node2"])
    assert list(marks) == ["node2"] and marks["node2"].source == "check: gpu health"
    assert marks["node2"].reason == "1 of 2 GPU(s) answer nvidia-smi"


def test_no_gpu_anywhere_gives_no_row_and_no_mark(tmp_path):
    hs = {n: health({"devices": 0, "smi": ""}, 0) for n in ("node1", "node2")}
    assert pc.health_items(hs) == {}
    assert pc.settle_drains(tmp_path / "inv", hs, {}, ["node1", "node2"]) == {}


def test_a_node_a_check_did_not_reach_stays_drained(tmp_path):
    inv = tmp_path / "inv"
    dr.drain(inv, "node2", "lost", "run r1", now=T0)
    assert list(pc.settle_drains(inv, {}, {}, ["node1"])) == ["node2"]


def test_the_readings_come_from_each_hosts_published_fact():
    hosts = {"node1": SimpleNamespace(facts={pc.HEALTH_FACT: {"devices": 0, "smi": ""}}),
             "node2": SimpleNamespace(facts={pc.HEALTH_FACT: LOST}),
             "node3": SimpleNamespace(facts={pc.HEALTH_FACT: {"error": "python3: not found"}})}
    nodes = [SimpleNamespace(name=n, gpus=g, hostvars={}) for n, g in (("node1", 0), ("node2", 2), ("node3", 0))]
    got = pc.gpu_health(SimpleNamespace(hosts=hosts), nodes)  # type: ignore[arg-type]
    assert sorted(got) == ["node1", "node2"] and got["node2"].drain_reason()
    # node1 declares 4 GPUs (gpus: 4) and has neither nvidia-smi nor a device: said, not drained.
    nodes[0] = SimpleNamespace(name="node1", gpus=4, hostvars={"gpus": 4})
    got = pc.gpu_health(SimpleNamespace(hosts=hosts), nodes)  # type: ignore[arg-type]
    assert [p.what for p in got["node1"].problems] == [
        "gpus: 4 declared in the inventory, none detected (no nvidia-smi, no /dev/nvidia*)"]
    assert got["node1"].drain_reason() == "" and "set gpus: 0 for node1 in the inventory" in got["node1"].item().fix


# -- the command line


def test_check_clear_node_brings_it_back_in_one_line(cli_env, write_inventory, private_state):
    inv = write_inventory("all:\n  children:\n    head: {hosts: {node1: {ansible_host: 10.0.0.1}}}\n"
                          "    workers: {hosts: {node1: {}, node2: {ansible_host: 10.0.0.2}}}\n")
    dr.drain(inv, "node2", "Xid 79 on GPU 0000:3a:00", dr.SOURCE_GPU_HEALTH, now=T0)
    run = lambda *a: subprocess.run([distrun_bin(), "check", "-i", str(inv), *a], capture_output=True,  # noqa: E731
                                    text=True, env=cli_env, timeout=120)
    res = run("--clear", "node2")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("node2 is back: cleared its drain from ") and "(check: gpu health: Xid 79 on GPU" in res.stdout
    assert dr.drained(inv) == {}
    res = run("--clear", "node2", "--json")
    assert res.returncode == 0 and json.loads(res.stdout) == {"schema": 1, "node": "node2", "cleared": None}
    res = run("--clear", "node9")
    assert res.returncode == 2 and res.stderr.strip().endswith(f"--clear node9: no such node in {inv} (its nodes: node1, node2)")
    res = run("--clear", "node2", "--ssh-logins")
    assert res.returncode == 2 and "--clear NODE only brings a drained node back: drop the other options" in res.stderr


@pytest.mark.parametrize("args,said", [
    (["--max-bytes", "4M"], "--max-bytes only goes with --bandwidth"),
    (["--launcher", "torchrun"], "--launcher only goes with --bandwidth"),
    (["--bandwidth", "--ssh-logins"], "--ssh-logins belongs to the full check, not to --bandwidth"),
    (["--bandwidth", "--max-bytes", "4X"], "'4X' is not a size: give bytes or a whole number with K, M or G"),
    (["--bandwidth", "--max-bytes", "32G"], "32G: at most 16G per message"),
])
def test_checks_options_that_do_not_go_together_are_refused_in_one_line(cli_env, write_inventory, args, said):
    inv = write_inventory("all:\n  children:\n    head: {hosts: {node1: {ansible_host: 10.0.0.1}}}\n"
                          "    workers: {hosts: {node1: {}}}\n")
    res = subprocess.run([distrun_bin(), "check", "-i", str(inv), *args], capture_output=True, text=True, env=cli_env,
                         timeout=120)
    assert res.returncode == 2 and said in res.stderr, res.stderr


def test_check_says_each_node_still_drained_after_its_table(capsys):
    from distrun.cli.check import say_drained

    say_drained({"drained": {"node3": {"reason": "Xid 79 on GPU 0000:3a:00", "source": "check: gpu health",
                                       "since": T0, "updated": T0}}})
    out = capsys.readouterr().out
    assert out.splitlines() == [f"drained: {dr.Drain('node3', 'Xid 79 on GPU 0000:3a:00', 'check: gpu health', T0, T0).line()}"]
    say_drained({"drained": {}})
    assert capsys.readouterr().out == ""


THREE = ("all:\n  children:\n    head: {hosts: {node1: {ansible_host: 10.0.0.1}}}\n"
         "    workers: {hosts: {node1: {}, node2: {ansible_host: 10.0.0.2}, node3: {ansible_host: 10.0.0.3}}}\n")


def test_a_run_leaves_a_drained_node_out_and_says_why_and_how_it_comes_back(cli_env, write_inventory, private_state):
    inv = write_inventory(THREE)
    train = lambda *a: subprocess.run([distrun_bin(), "train", "-i", str(inv), "--dry-run", *a],  # noqa: E731
                                      capture_output=True, text=True, env=cli_env, timeout=120)
    before = json.loads(train("--json").stdout)
    assert [h["name"] for h in before["plan"]["hosts"]] == ["node1", "node2", "node3"]
    assert before["left_out"] == []
    dr.drain(inv, "node2", "Xid 79 on GPU 0000:3a:00", dr.SOURCE_GPU_HEALTH, now=T0)
    res = train("--json")
    assert res.returncode == 0, res.stderr
    after = json.loads(res.stdout)
    assert [h["name"] for h in after["plan"]["hosts"]] == ["node1", "node3"]
    assert after["plan"]["world_size"] == 2
    assert after["left_out"] == [f"left out: {dr.drained(inv)['node2'].line()}"]
    assert "node2" not in after["files"]["hostfile"]
    text = train().stdout
    assert "  left out: node2 is drained since " in text and "'distrun check --clear node2', brings it back" in text
    # Named in --hosts, it is refused rather than dropped, in one line with the way back.
    res = train("--hosts", "node1,node2")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--hosts node2: node2 is drained since " in res.stderr and "or leave it out of --hosts" in res.stderr
    # Cleared, it is back in every run.
    dr.undrain(inv, "node2")
    assert [h["name"] for h in json.loads(train("--json").stdout)["plan"]["hosts"]] == ["node1", "node2", "node3"]


def test_a_run_whose_every_worker_is_drained_is_refused_naming_them(cli_env, write_inventory, private_state):
    inv = write_inventory(THREE)
    for node in ("node1", "node2", "node3"):
        dr.drain(inv, node, f"{node} stopped answering", "run 20251103-train-ab12", now=T0)
    res = subprocess.run([distrun_bin(), "train", "-i", str(inv), "--dry-run"], capture_output=True, text=True,
                         env=cli_env, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "every worker of inventory" in res.stderr and "node1 is drained since" in res.stderr
    assert "(and node2, node3)" in res.stderr and "'distrun check --clear node1'" in res.stderr


def test_runs_and_show_say_which_node_a_run_drained_and_the_next_run_leaves_it_out(cli_env, write_inventory,
                                                                                 private_state):
    from distrun.run.ending import LOST_MID_RUN, RunEnd
    from distrun.run.listener import Listener
    from distrun.store.runs import new_run

    inv = write_inventory(THREE)
    lost = new_run("train", inv)
    RunEnd(lost, inv, Listener()).drain_lost({"node3"}, {"node1", "node2"}, LOST_MID_RUN)
    lost.finish(1, "failed rc=255; lost contact with node3 (ssh failed)")
    other = new_run("train", inv)
    other.finish(0, "ok test_acc=0.8")
    cli = lambda *a: subprocess.run([distrun_bin(), *a], capture_output=True, text=True, env=cli_env,  # noqa: E731
                                    timeout=120)
    mark = dr.drained(inv)["node3"]
    assert (mark.source, mark.reason) == (f"run {lost.id}", "lost mid-run: ssh to it failed")
    listed = {r["run_id"]: r["drained"] for r in json.loads(cli("runs", "--json").stdout)["runs"]}
    assert listed == {lost.id: {"node3": "lost mid-run: ssh to it failed"}, other.id: {}}
    table = cli("runs").stdout
    assert "failed rc=255; lost contact with node3 (ssh failed); drained node3: lost mid-run: ssh to it failed" in table
    assert table.count("drained") == 1
    shown = cli("show", lost.id).stdout.splitlines()
    assert ("drained:    node3, by this run: lost mid-run: ssh to it failed (a 'distrun check' that passes on it, "
            "or 'distrun check --clear node3', brings it back)") in shown
    assert not [line for line in cli("show", other.id).stdout.splitlines() if line.startswith("drained")]
    assert json.loads(cli("show", lost.id, "--json").stdout)["drained"] == {"node3": "lost mid-run: ssh to it failed"}
    # The next run leaves it out, saying so; named in --hosts, it is refused in one line with the way back.
    dry = cli("train", "-i", str(inv), "--dry-run", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["left_out"] == [f"left out: {mark.line()}"]
    assert f"(run {lost.id}: lost mid-run: ssh to it failed)" in mark.line()
    named = cli("train", "-i", str(inv), "--dry-run", "--hosts", "node1,node3")
    assert named.returncode == 2 and named.stdout == "", named.stderr
    assert named.stderr == f"distrun: error: --hosts node3: {mark.line()}; or leave it out of --hosts\n"


def test_a_run_that_cannot_write_the_mark_says_so_and_goes_on(tmp_path):
    from distrun.run.ending import LOST_MID_RUN, RunEnd
    from distrun.run.listener import Listener
    from distrun.store.runs import new_run

    class Said(Listener):
        def __init__(self) -> None:
            self.warned: list[str] = []

        def warn(self, message: str) -> None:
            self.warned.append(message)

    inv = tmp_path / "inv"
    paths.drained_file(inv).write_text("{not json")
    run, said = new_run("train", inv), Said()
    RunEnd(run, inv, said).drain_lost({"node3"}, {"node1"}, LOST_MID_RUN)
    assert run.meta.drained == {}
    assert len(said.warned) == 1 and said.warned[0].startswith("node3 was lost but is not drained: the drained nodes' file ")
