"""What a run needs on its nodes before anything is staged, as the preflight role's variables:
the env's modules, the programs each launcher runs (on every node, on the head), and with --image
the image and what its python3 must import. Pure functions of the plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distrun.launchers import launcher_named
from distrun.planning import containers
from distrun.planning.jobplan import JobPlan

# Python modules a reference workload imports beyond the env's base (the partitioner uses Metis).
WORKLOAD_MODULES: Mapping[str, tuple[str, ...]] = {
    "gcn": ("jittor", "pymetis"), "gcn-tp": ("jittor",), "ddp": ("torch",), "gcn-torch": ("torch", "pymetis"),
}


def preflight_needs(plan: JobPlan) -> dict[str, Any]:
    """What this run needs on its nodes, as the preflight role's variables: checked before staging."""
    programs, head_programs = launcher_named(plan.launch.launcher).needs(plan)
    # With an image the workload's modules are the image's, not the node env's.
    modules = [] if plan.launch.container else list(WORKLOAD_MODULES.get(plan.program.workload or "", ()))
    image: dict[str, Any] = {}
    if plan.launch.container:
        launcher = launcher_named(plan.launch.launcher)
        # The partitioner runs on the head in the node's env (pymetis there), the ranks in the image.
        inside = {*WORKLOAD_MODULES.get(plan.program.workload or "", ()), *launcher.image_modules(plan)} - {"pymetis"}
        image = {**containers.image_asked(plan.launch.container), "modules": sorted(inside),
                 "mpi": launcher.image_uses_node_mpi, "torchrun": "torch" in launcher.image_modules(plan)}
    return {"preflight_modules": modules, "preflight_programs": programs, "preflight_head_programs": head_programs,
            "preflight_image": image}
