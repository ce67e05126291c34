"""GDC flags and the torch partitioned workload in the plan: what the partitioner and the trainer get."""

from __future__ import annotations

import pytest

from distrun.errors import PlanError
from distrun.planning.needs import preflight_needs

from .plans import plan_for
from .test_launchers import MIXED, cluster


def test_gdc_reaches_the_partitioner_and_the_trainer_in_its_own_folder():
    plan = plan_for(cluster(MIXED), run_id="g1", workload="gcn-torch", dataset="cora", gdc=(0.1, 64))
    assert plan.program.partition is not None
    part, prog = list(plan.program.partition), list(plan.program.argv)
    for argv in (part, prog):
        i = argv.index("--use-gdc")
        assert argv[i:i + 5] == ["--use-gdc", "--gdc-alpha", "0.1", "--gdc-topk", "64"]
    assert prog[prog.index("--part-dir") + 1] == plan.program.partition_dir == "/srv/distrun/partitions/cora-6parts-gdc"
    assert prog[prog.index("-m") + 2].endswith("/workloads/gcn_torch.py")
    plain = plan_for(cluster(MIXED), run_id="g2", workload="gcn-torch", dataset="cora")
    assert "--use-gdc" not in plain.program.argv and plain.program.partition_dir == "/srv/distrun/partitions/cora-6parts"
    assert {"torch", "pymetis"} <= set(preflight_needs(plain)["preflight_modules"])


@pytest.mark.parametrize("gdc,needle", [((1.5, 128), "--gdc-alpha 1.5"), ((0.05, 0), "--gdc-topk 0")])
def test_bad_gdc_values_fail_in_the_plan(gdc, needle):
    with pytest.raises(PlanError, match=needle):
        plan_for(cluster(MIXED), run_id="g3", gdc=gdc)


def test_gdc_with_a_script_is_refused():
    with pytest.raises(PlanError, match="--use-gdc applies to the reference workloads"):
        plan_for(cluster(MIXED), run_id="g4", script="/home/me/train.py", gdc=(0.05, 128))


def test_cli_dry_run_shows_the_gdc_partition(cli_env, write_inventory):
    from .test_slurm import _cli

    inv = write_inventory("all:\n  hosts:\n    n1: {ansible_host: 127.0.0.9}\n"
                          "  children:\n    head: {hosts: {n1: }}\n    workers: {hosts: {n1: }}\n")
    r = _cli(["train", "-i", str(inv), "--workload", "gcn-torch", "--use-gdc", "--gdc-topk", "32", "--dry-run"], cli_env)
    assert r.returncode == 0, r.stderr
    assert "--use-gdc --gdc-alpha 0.05 --gdc-topk 32" in r.stdout and "gcn_torch.py" in r.stdout
