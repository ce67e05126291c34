"""Several ranks per node, as the users' clusters run them (N nodes x 8 GPUs): cluster A with
slots: 2 on every node and with uneven slots 2/1/1, on every launcher and Slurm's two modes,
each rank checked for the layout it was told; then a smaller --np and an --exclude of a
2-slot node, each checked against the layout its dry run printed.

The slots are inventory values: a run reads them when it plans (its hostfile, -np, torchrun's
--nproc-per-node, srun's layout), so no setup runs between these cells. Slurm knows each node's
CPUs from its facts (2 on this machine), which is why no node here gets more than 2 slots.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import matrix

from .conftest import REPO, distrun
from .test_matrix import HOSTS

SHAPES = {"yaml-slots-2": {"node1": 2, "node2": 2, "node3": 2}, "yaml-slots-2-1-1": {"node1": 2, "node2": 1, "node3": 1}}


@pytest.fixture(scope="module")
def shaped(provisioned, tmp_path_factory) -> dict[str, str]:
    group_vars = REPO / "inventory" / "test" / "group_vars"
    return {kind: str(matrix.slots_inventory(provisioned.inventory, group_vars, tmp_path_factory.mktemp(kind), slots))
            for kind, slots in SHAPES.items()}


@pytest.mark.parametrize("kind", SHAPES)
@pytest.mark.parametrize("launcher", matrix.COLUMNS)
def test_multi_slot_cell(shaped, distrun_home, cell_script, kind, launcher):
    matrix.run_cell(distrun, shaped[kind], launcher, "sync", kind, distrun_home, cell_script, HOSTS, SHAPES[kind])


def _dry_layout(inventory: str, *args: str) -> dict[str, int]:
    """Host -> ranks, as 'train --dry-run --json' plans them."""
    res = distrun("train", "--inventory", inventory, "--dry-run", "--json", *args, timeout=300)
    assert res.rc == 0, res.stdout[-2000:] + res.stderr[-2000:]
    plan = json.loads(res.stdout)
    plan = plan.get("plan", plan)
    return {h["name"]: int(h["slots"]) for h in plan["hosts"]}


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
@pytest.mark.parametrize("args, expected", [
    (("--np", "3"), {"node1": 2, "node2": 1}),
    (("--exclude", "node2"), {"node1": 2, "node3": 2}),
], ids=["np-3", "exclude-2-slot-node"])
def test_a_smaller_np_and_an_excluded_node_run_the_layout_the_dry_run_printed(shaped, distrun_home, cell_script,
                                                                             launcher, args, expected):
    inventory = shaped["yaml-slots-2"]
    layout = _dry_layout(inventory, "--launcher", launcher, "--script", str(cell_script), *args)
    assert layout == expected, layout
    hosts = {name: HOSTS[name] for name in layout}
    res = distrun("train", "--inventory", inventory, "--launcher", launcher, "--script", str(cell_script), *args,
                  timeout=600)
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
    run = matrix.latest_run(distrun_home)
    matrix.assert_layout(run, hosts, layout)
