"""plan.json, the record of what a run executes: runs recorded by earlier versions of distrun (the
flat files under data/plans, written before the plan had parts) are read back as the same plan,
and a plan is written as exactly those files again (their "slurm" key and a plan without
"attempt_dirs" are read until store/retiring.py's READ_UNTIL)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from distrun.inventory.cluster import load_cluster
from distrun.planning.containers import Container
from distrun.planning.jobplan import KEYS, OPTIONAL, JobPlan, from_json, to_json
from distrun.run import liveness
from distrun.store.runs import RecordError, Run, RunMeta
from distrun.transport import rundir

from .plans import plan_for
from .test_launchers import MIXED, cluster, net
from .test_slurm_site import LOGIN_ONLY

DATA = Path(__file__).parent / "data" / "plans"
# Variables every rank gets that distrun added after these files were recorded (a recorded run
# keeps the env it was planned with).
NEWER_ENV = ("PYTHONNOUSERSITE",)


def _as_recorded(plan: JobPlan) -> JobPlan:
    return replace(plan, program=replace(plan.program, env=tuple(kv for kv in plan.program.env if kv[0] not in NEWER_ENV)))


def _torchrun_workdir_container() -> JobPlan:
    return plan_for(cluster(MIXED), run_id="20261127-101500-ab12", launcher="torchrun", workload="ddp",
                      network=net(n1="eth0", n2="ens5", n3="eth0"), extra_env={"TOKEN": "never-recorded"}, restart=1,
                      max_restarts=2, command=("python", "train.py", "--np", "{np}"), workdir="/srv/distrun/workdirs/proj-1",
                      prepare=("python", "prep.py"), launcher_args=("--log-dir", "/tmp/x"),
                      container=Container("localhost/train:1", "podman"))


def _slurm_gcn_partition() -> JobPlan:
    plan = plan_for(cluster(MIXED), run_id="20261127-101600-cd34", launcher="slurm", workload="gcn", dataset="cora",
                    epochs=5, gdc=(0.1, 64), master_port=29511)
    # Recorded with the options as that distrun kept them (a mode name of its own, no defaults).
    return replace(plan, launch=replace(plan.launch, options={"mode": "multi", "partition": "gpu"}))


def _slurm_site_login(write_inventory) -> JobPlan:
    c = load_cluster(write_inventory(LOGIN_ONLY.format(extra="slurm_nodes: 2")))
    return plan_for(c, run_id="20261127-101700-ef56", launcher="slurm", workload="ddp",
                      script="/home/alice/train.py", script_args=("--lr", "0.1"))


@pytest.fixture(params=["torchrun-workdir-container", "slurm-gcn-partition", "slurm-site-login"])
def recorded(request, write_inventory) -> tuple[str, JobPlan]:
    """A plan.json an earlier distrun wrote, and the plan the same request gives today."""
    made = {"torchrun-workdir-container": _torchrun_workdir_container, "slurm-gcn-partition": _slurm_gcn_partition,
            "slurm-site-login": lambda: _slurm_site_login(write_inventory)}[request.param]()
    assert dict(made.program.env)["PYTHONNOUSERSITE"] == "1"
    return (DATA / f"{request.param}.json").read_text(), _as_recorded(made)


def test_a_plan_json_written_before_the_plan_had_parts_reads_as_todays_plan(recorded):
    text, plan = recorded
    assert from_json(json.loads(text)) == plan


def test_a_plan_is_written_as_the_same_flat_file_with_its_keys_in_the_same_order(recorded):
    text, plan = recorded
    # Today's name for the launcher's options, where those files say "slurm".
    assert json.dumps(to_json(plan), indent=2) + "\n" == text.replace('"slurm": {', '"launcher_options": {')
    assert [{"slurm": "launcher_options"}.get(k, k) for k in json.loads(text)] == [k for k in KEYS if k not in OPTIONAL]


def test_the_parts_hold_what_the_flat_keys_said(recorded):
    text, plan = recorded
    flat = json.loads(text)
    assert list(plan.program.argv) == flat["program"] and dict(plan.launch.options) == flat["slurm"]
    assert to_json(plan)["launcher_options"] == flat["slurm"] and "slurm" not in to_json(plan)
    assert plan.placement.master_port == flat["master_port"] and plan.attempt.restart == flat["restart"]
    assert [h.name for h in plan.placement.hosts] == [h["name"] for h in flat["hosts"]]
    assert plan.run_dir == f"{flat['shared_dir']}/runs/{flat['run_id']}"


def _record(tmp_path: Path, data: dict) -> Run:
    (tmp_path / "plan.json").write_text(json.dumps(data))
    return Run(tmp_path, RunMeta("R1", "train", "inv", 0.0))


def test_a_run_recorded_before_attempt_folders_keeps_its_files_at_the_top_of_its_run_dir(tmp_path):
    data = json.loads((DATA / "torchrun-workdir-container.json").read_text())
    del data["attempt_dirs"]
    old = liveness.recorded_plan(_record(tmp_path, data))
    assert not old.attempt.attempt_dirs and rundir.attempt_path(old) == old.run_dir
    assert old.launch.container == Container("localhost/train:1", "podman")


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d.update(hosts_v2=[]), "ValueError"),  # a key this distrun does not know
    (lambda d: d.pop("world_size"), "TypeError"),  # a key without a default, missing
    (lambda d: d.update(launcher="pdsh"), "launcher 'pdsh' is unknown"),
], ids=["unknown-key", "missing-key", "unknown-launcher"])
def test_a_plan_json_this_distrun_cannot_read_is_one_line_naming_the_run(tmp_path, change, said):
    data = json.loads((DATA / "slurm-gcn-partition.json").read_text())
    change(data)
    with pytest.raises(RecordError) as err:
        liveness.recorded_plan(_record(tmp_path, data))
    assert "run R1" in str(err.value) and said in str(err.value) and "\n" not in str(err.value)
