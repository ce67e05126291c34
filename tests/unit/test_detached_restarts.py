"""A detached run that restarts by itself (train --detach --max-restarts N): only a launcher that
declares it (Launcher.restarts_itself: torchrun's elastic agents) takes it; torchrun's agents get
the run's budget and, with --exclude-failed, --nnodes 1:<hosts> on the first rank host's
rendezvous; every rank's DISTRUN_RESTART counts the agents' restarts in place, the same on every
node; no distrun process follows such a run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from distrun.errors import PlanError
from distrun.inventory.cluster import cluster_from_json
from distrun.launchers import LAUNCHERS, torchrun_argv
from distrun.planning.jobplan import from_json, to_json
from distrun.planning.run_files import render_rank_wrapper

from .plans import plan_for

NAMES = ("n1", "n2", "n3")


def _cluster(names=NAMES):
    hosts = {h: {"ansible_connection": "local", "ansible_host": f"10.0.0.{i}", "slots": 2} for i, h in enumerate(names, 1)}
    inv = {"_meta": {"hostvars": hosts}, "all": {"children": ["head", "workers"]},
           "head": {"hosts": [names[0]]}, "workers": {"hosts": list(names)}}
    return cluster_from_json(Path("/inv/hosts.yml"), inv, None)


def _argv(**policy):
    plan = plan_for(_cluster(), run_id="R", launcher="torchrun", workload="ddp", **policy)
    return plan, torchrun_argv(plan, plan.placement.hosts[0])


def test_only_torchrun_declares_that_it_restarts_a_detached_run_itself():
    assert [name for name, launcher in LAUNCHERS.items() if launcher.restarts_itself] == ["torchrun"]


def test_a_detached_torchrun_run_without_failed_nodes_keeps_every_node_and_gets_the_budget():
    plan, argv = _argv(detach=True, max_restarts=2, exclude_failed=True)
    assert "--nnodes=1:3" in argv and "--max-restarts=2" in argv
    assert "--rdzv-conf=is_host=1" in argv  # the first rank host's agent holds the rendezvous store
    assert plan.attempt.min_nodes == 1 and to_json(plan)["min_nodes"] == 1
    assert from_json(to_json(plan)) == plan
    _, fixed = _argv(detach=True, max_restarts=2)
    assert "--nnodes=3" in fixed  # without --exclude-failed a lost node is waited for, never left out
    # Followed by distrun, the follower leaves the failed node out (run/restarts.py): torchrun's group stays fixed.
    attached, followed = _argv(max_restarts=2, exclude_failed=True)
    assert "--nnodes=3" in followed and "min_nodes" not in to_json(attached)


def test_a_detached_torchrun_run_of_np_ranks_cannot_leave_a_node_out():
    with pytest.raises(PlanError) as err:
        _argv(np=4, detach=True, max_restarts=1, exclude_failed=True)
    said = str(err.value)
    assert "\n" not in said and "--np 4 with --detach --exclude-failed" in said and "drop --np" in said


def test_a_one_node_run_has_no_node_to_leave_out():
    plan = plan_for(_cluster(("n1",)), run_id="R", launcher="torchrun", workload="ddp", detach=True, max_restarts=1,
                    exclude_failed=True)
    assert "--nnodes=1" in torchrun_argv(plan, plan.placement.hosts[0]) and plan.attempt.min_nodes == 0


def _start(tmp_path, plan, host: str, local_rank: int | str, torch_count: str | None) -> str:
    """One start of the rank wrapper on ``host`` (its own run directory, as in sync mode), as
    torchrun's agent starts a local rank: the DISTRUN_RESTART the job sees."""
    run_dir = tmp_path / host
    run_dir.mkdir(exist_ok=True)
    wrapper = render_rank_wrapper(plan).replace(f"cd {plan.run_dir}", f"cd {run_dir}")
    env = {"PATH": "/usr/bin:/bin", "DISTRUN_RESTART": str(plan.attempt.restart), "LOCAL_RANK": str(local_rank),
           "RANK": str(local_rank)}
    if torch_count is not None:
        env["TORCHELASTIC_RESTART_COUNT"] = torch_count
    out = subprocess.run(["bash", "-c", wrapper, "bash", "printenv", "DISTRUN_RESTART"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()[-1]


def test_every_rank_of_a_group_restarted_in_place_sees_the_same_distrun_restart(tmp_path):
    # Rank 0 on n1 fails: n1's agent restarts its workers (its TORCHELASTIC_RESTART_COUNT: 1); n2's
    # agent restarts its healthy workers for the new rendezvous, which torch does not count (0).
    plan = plan_for(_cluster(), run_id="R", launcher="torchrun", workload="ddp", max_restarts=3)
    assert [_start(tmp_path, plan, h, lr, "0") for h in ("n1", "n2") for lr in (0, 1)] == ["0"] * 4
    assert [_start(tmp_path, plan, "n1", lr, "1") for lr in (0, 1)] == ["1", "1"]
    assert [_start(tmp_path, plan, "n2", lr, "0") for lr in (0, 1)] == ["1", "1"]
    # A second time: n2's workers failed now.
    assert [_start(tmp_path, plan, h, 0, c) for h, c in (("n1", "1"), ("n2", "1"))] == ["2", "2"]


def test_distrun_restart_counts_distruns_restart_and_torchruns_in_place(tmp_path):
    plan = plan_for(_cluster(), run_id="R", launcher="torchrun", workload="ddp", max_restarts=3, restart=1)
    assert [_start(tmp_path, plan, "n1", 0, c) for c in ("0", "1", None)] == ["1", "2", "3"]
    # A local rank that is not a number names no other file, nor runs anything.
    assert _start(tmp_path, plan, "n3", "0/../../x$(touch planted)", None) == "1"
    assert not list(tmp_path.rglob("planted")) and not list(tmp_path.rglob("x"))
    mpirun = plan_for(_cluster(), run_id="R", launcher="mpirun", workload="gcn", max_restarts=3, restart=1)
    assert "starts-" not in render_rank_wrapper(mpirun)
    assert _start(tmp_path, mpirun, "n1", 0, "2") == "1"  # restarted by distrun only


def test_mpirun_declares_that_distruns_supervisor_restarts_its_detached_runs():
    assert [name for name, launcher in LAUNCHERS.items() if launcher.supervised] == ["mpirun"]


@pytest.mark.parametrize(("policy", "said"), [
    ({"detach": True, "max_restarts": 2, "exclude_failed": True}, (True, True, False)),
    ({"detach": True, "max_restarts": 1, "np": 4, "exclude_failed": True}, (True, True, True)),  # --np: its ranks must fit
    ({"detach": True, "max_restarts": 1}, (True, False, False)),
    ({"max_restarts": 1, "exclude_failed": True}, (False, False, False)),  # followed: the controller restarts it
    ({"detach": True}, (False, False, False)),
])
def test_a_detached_mpirun_run_with_restarts_is_planned_for_the_supervisor(policy, said):
    plan = plan_for(_cluster(), run_id="R", launcher="mpirun", workload="ddp", **policy)
    assert (plan.attempt.supervised, plan.attempt.exclude_failed, plan.attempt.np_asked) == said
    assert plan.attempt.min_nodes == 0  # torchrun's --nnodes MIN:MAX only
    again = from_json(to_json(plan))
    assert again.attempt == plan.attempt
    assert ("supervised" in to_json(plan)) == said[0]  # a plan without a supervisor is the same file as before
