"""A run's attempts through ``run_job``, on three local nodes with run.yml played by the role's
judge on fake probes (test_sshmesh.FakeRole): each attempt is planned once, the claim takes its
hosts from the first attempt's plan, and the record keeps each attempt's states; a node the run (or
'distrun attach') lost is drained, a job that fails drains none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distrun.errors import ExitCode
from distrun.inventory.cluster import cluster_from_json
from distrun.planning import attempt as planning_attempt
from distrun.planning.jobplan import from_json
from distrun.planning.run_files import launch_scripts
from distrun.run import ending, launching, playbooks, starter, train
from distrun.run.ending import RunEnd
from distrun.run.follow import Outcome
from distrun.run.listener import Listener
from distrun.run.liveness import ClusterState, HostState
from distrun.run.stop import StopReport
from distrun.store import drained as dr
from distrun.store.runs import RunStatus, list_runs

from .plans import plan_for, request_for
from .test_check import NODES
from .test_sshmesh import FP, FakeRole

REAL_STOP = RunEnd.stop


@pytest.fixture
def local_run(tmp_path, monkeypatch):
    """run_job's world: the inventory read, no early playbook, run.yml faked, the launchers, the
    attempt's certificate, the follower, stop and collect faked; the plans counted, the claim's hosts noted."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    hosts = {h: {"ansible_connection": "local", "ansible_host": f"10.0.0.{i}", "slots": 1} for i, h in enumerate(NODES, 1)}
    cluster = cluster_from_json(inv, {"_meta": {"hostvars": hosts}, "all": {"children": ["head", "workers"]},
                                      "head": {"hosts": ["node1"]}, "workers": {"hosts": NODES}}, None)
    monkeypatch.setattr(train, "load", lambda request: cluster)
    monkeypatch.setattr(train, "load_noting", lambda request: (cluster, []))  # no node drained
    monkeypatch.setattr(train, "facts_unusable", lambda cluster: None)
    monkeypatch.setattr(train.EarlyPlaybook, "for_training_run", staticmethod(lambda *a, **k: None))
    monkeypatch.setattr(playbooks, "run_playbook", FakeRole(FP))
    monkeypatch.setattr(starter, "launch", lambda cluster, plan, hosts: {})
    monkeypatch.setattr(launching.certificate, "issue", lambda cluster, plan: {})  # no CA here: no head of a cluster
    seen: dict = {"plans": 0, "claimed": []}
    real_build = planning_attempt.build_plan

    def counted(*a, **k):
        seen["plans"] += 1
        return real_build(*a, **k)

    monkeypatch.setattr(planning_attempt, "build_plan", counted)
    real_pending = train.Pending

    def pending(cluster, hosts, run_id, *, allow=False, gpus=None, held=None):
        seen["claimed"].append(list(hosts))
        seen["claimed_gpus"] = gpus
        return real_pending(cluster, hosts, run_id, allow=True)  # the local nodes are not claimed for real

    monkeypatch.setattr(train, "Pending", pending)
    outcomes: list[Outcome] = []
    monkeypatch.setattr(RunEnd, "follow", lambda self, cluster, plan: outcomes.pop(0))
    monkeypatch.setattr(RunEnd, "stop", lambda self, plan, hosts: set())
    monkeypatch.setattr(RunEnd, "collect", lambda self, cluster, plan, hosts, lost: None)
    return inv, seen, outcomes


def _states(record: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((record / "attempts").glob("*/states.json"))]


def test_each_attempt_is_planned_once_and_the_claim_takes_the_first_plans_hosts(local_run):
    inv, seen, outcomes = local_run
    outcomes.append(Outcome(0))
    code = train.run_job(request_for(inv, launcher="torchrun", workload="ddp", np=2))
    assert code == ExitCode.OK
    record = list_runs()[-1]
    assert seen["plans"] == 1 == len(_states(record.dir))
    plan = json.loads((record.dir / "plan.json").read_text())
    assert [h["name"] for h in plan["hosts"]] == ["node1", "node2"] and seen["claimed"] == [["node1", "node2"]]
    assert seen["claimed_gpus"] == {}  # no GPU declared: each host is claimed whole
    assert _states(record.dir)[0]["end"] == "launched"


def test_a_restart_is_one_more_attempt_and_one_more_plan(local_run):
    inv, seen, outcomes = local_run
    outcomes += [Outcome(1, "node2", "launcher on node2 exited 1"), Outcome(0)]
    code = train.run_job(request_for(inv, launcher="torchrun", workload="ddp", np=3, max_restarts=1))
    assert code == ExitCode.OK
    record = list_runs()[-1]
    attempts = _states(record.dir)
    assert seen["plans"] == 2 == len(attempts)
    assert [a["attempt"] for a in attempts] == [0, 1] and all(a["end"] == "launched" for a in attempts)
    assert len(seen["claimed"]) == 1  # the run holds its hosts once, for every attempt
    assert record.meta.restarts == 1 and record.meta.status == "succeeded"


def test_a_detached_torchrun_run_with_restarts_is_let_go_once_started_and_never_followed(local_run, monkeypatch):
    inv, seen, outcomes = local_run  # no outcome: following the run would fail the test
    monkeypatch.setattr(train, "wait_started", lambda cluster, plan, timeout_s: ClusterState(RunStatus.RUNNING))
    code = train.run_job(request_for(inv, launcher="torchrun", workload="ddp", detach=True, max_restarts=1,
                                     exclude_failed=True))
    assert code == ExitCode.OK and seen["plans"] == 1
    record = list_runs()[-1]
    plan = json.loads((record.dir / "plan.json").read_text())
    assert plan["max_restarts"] == 1 and plan["min_nodes"] == 1
    script = launch_scripts(from_json(plan))[plan["hosts"][0]["name"]]
    assert f"--nnodes=1:{len(plan['hosts'])}" in script and "--max-restarts=1" in script
    assert record.meta.status == RunStatus.RUNNING and record.meta.restarts == 0


# -- a lost node is drained; a job that fails is not


class Said(Listener):
    def __init__(self) -> None:
        self.warned: list[str] = []

    def warn(self, message: str) -> None:
        self.warned.append(message)


def _answered(monkeypatch, *hosts: str) -> None:
    """The controller's probe after a loss: only ``hosts`` answer."""
    monkeypatch.setattr(train, "probe", lambda cluster, plan, lost=frozenset(): {
        h: HostState(h, reached=h in hosts, error="" if h in hosts else "ssh: connect timed out") for h in NODES})


LOST3 = Outcome(255, "node3", "lost contact with node3 (ssh failed: Connection reset)", lost=True)


def test_a_run_that_loses_a_node_drains_it_and_says_so(local_run, monkeypatch):
    inv, _, outcomes = local_run
    outcomes.append(LOST3)
    _answered(monkeypatch, "node1", "node2")
    said = Said()
    assert train.run_job(request_for(inv, launcher="torchrun", workload="ddp", np=3), said) != ExitCode.OK
    record = list_runs()[-1]
    mark = dr.drained(inv)["node3"]
    assert (mark.source, mark.reason) == (f"run {record.id}", "lost mid-run: ssh to it failed")
    assert list(dr.drained(inv)) == ["node3"]  # the nodes that answered stay in
    assert record.meta.drained == {"node3": "lost mid-run: ssh to it failed"}
    assert said.warned == [f"drained: {mark.line()}"]


def test_a_job_that_fails_drains_nothing_whatever_it_printed(local_run, monkeypatch):
    inv, _, outcomes = local_run

    def follow(self, cluster, plan):  # the job's own words: a node's account, ssh's words
        self.lines += ["DISTRUN_FAILED_HOST node2 lost contact with node2", "lost contact with node2 (ssh failed)"]
        return Outcome(1, "node2", "launcher on node2 exited 1")

    monkeypatch.setattr(RunEnd, "follow", follow)
    _answered(monkeypatch, "node1", "node3")
    assert train.run_job(request_for(inv, launcher="torchrun", workload="ddp", np=3)) != ExitCode.OK
    assert dr.drained(inv) == {} and list_runs()[-1].meta.drained == {}


def test_a_loss_while_no_other_node_answers_drains_nothing(local_run, monkeypatch):
    inv, _, outcomes = local_run
    outcomes.append(LOST3)
    _answered(monkeypatch)  # this machine's network went away: it cannot tell which node is at fault
    assert train.run_job(request_for(inv, launcher="torchrun", workload="ddp", np=3)) == ExitCode.CONTACT_LOST
    assert dr.drained(inv) == {}


def test_a_node_the_runs_stop_cannot_reach_is_drained(local_run, monkeypatch):
    inv, _, outcomes = local_run
    outcomes.append(Outcome(1, "node2", "launcher on node2 exited 1"))
    monkeypatch.setattr(RunEnd, "stop", REAL_STOP)  # on a stop play that reaches every node but node3
    monkeypatch.setattr(ending, "stop_play", lambda record, inventory, plan, hosts: StopReport(
        unreachable={"node3"} & set(hosts)))
    assert train.run_job(request_for(inv, launcher="torchrun", workload="ddp", np=3)) != ExitCode.OK
    record = list_runs()[-1]
    assert dr.drained(inv)["node3"].source == f"run {record.id}"
    assert record.meta.drained == {"node3": "lost: the run's stop step could not reach it"}


def test_attach_drains_a_node_the_run_lost_while_it_followed(tmp_path, monkeypatch):
    from distrun.run import attach as attaching
    from distrun.run.liveness import ClusterState
    from distrun.store.runs import new_run

    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    hosts = {h: {"ansible_connection": "ssh", "ansible_host": f"10.0.0.{i}", "slots": 1} for i, h in enumerate(NODES, 1)}
    cluster = cluster_from_json(inv, {"_meta": {"hostvars": hosts}, "all": {"children": ["head", "workers"]},
                                      "head": {"hosts": ["node1"]}, "workers": {"hosts": NODES}}, None)
    run = new_run("train", inv)
    run.let_go()  # detached: nothing follows it
    plan = plan_for(cluster, run_id=run.id, launcher="torchrun", workload="ddp", np=3)
    reads = [ClusterState("running"), ClusterState("running", hosts={
        h: HostState(h, reached=h != "node3", error="ssh: connect timed out") for h in NODES})]
    monkeypatch.setattr(attaching, "recorded_plan", lambda r: plan)
    monkeypatch.setattr(attaching, "load_cluster", lambda inventory, facts: cluster)
    monkeypatch.setattr(attaching, "read", lambda cluster, plan, lost=frozenset(): reads.pop(0))
    monkeypatch.setattr(RunEnd, "follow", lambda self, cluster, plan: LOST3)
    monkeypatch.setattr(ending, "stop_play", lambda record, inventory, plan, hosts: StopReport())
    monkeypatch.setattr(RunEnd, "collect", lambda self, cluster, plan, hosts, lost: None)
    assert attaching.attach(run.id) != ExitCode.OK
    assert dr.drained(inv)["node3"].source == f"run {run.id}"
    assert run.reload().meta.drained == {"node3": "lost mid-run: ssh to it failed"}
