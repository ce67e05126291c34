"""Ranks in a container image: the choice of image and runtime, and what each launcher renders.

The container start script is run here for real with a stand-in runtime on PATH that records
its argv: the flags a node's podman or docker would get, the variables passed by name only."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from distrun import containers, records
from distrun.containers import Container
from distrun.errors import PlanError
from distrun.liveness import recorded_plan
from distrun.plan import build_plan

from .test_launchers import MIXED, cluster, net

IMAGE = "registry.example:5000/lab/train:2.3"
GPU = {"g1": {"ansible_host": "10.0.0.1", "slots": 2}, "g2": {"ansible_host": "10.0.0.2", "slots": 2}}


def plan_for(launcher="mpirun", runtime="podman", hosts=MIXED, gpus=None, **kw):
    c = cluster(hosts, head=next(iter(hosts)))
    if gpus:
        c = replace(c, workers=tuple(replace(n, gpus=gpus.get(n.name, 0)) for n in c.workers))
    return build_plan(c, run_id="r1", launcher=launcher, network=net(**{h: "eth0" for h in hosts}),
                      container=Container(IMAGE, runtime), **kw)


# --- which image and runtime ------------------------------------------------------------------------

def test_the_flag_wins_over_the_inventory_and_podman_is_the_default():
    gv = {"distrun_image": "localhost/inv:1", "distrun_container_runtime": "docker"}
    assert containers.choose("/inv", gv, None, None) == Container("localhost/inv:1", "docker")
    assert containers.choose("/inv", gv, IMAGE, "podman") == Container(IMAGE, "podman")
    assert containers.choose("/inv", {}, IMAGE, None) == Container(IMAGE, "podman")
    assert containers.choose("/inv", {}, None, None) is None


@pytest.mark.parametrize("ref", ["python:3.11", "docker.io/library/python", "localhost/t", "nvcr.io/nvidia/pytorch:24.05-py3",
                                 "lab/img@sha256:" + "a" * 64, "host:5000/a/b_c.d-e:v1.0"])
def test_image_references_a_registry_accepts(ref):
    assert containers.check_image(ref, "--image") == ref


def test_a_bad_inventory_value_names_the_variable_and_the_inventory():
    with pytest.raises(PlanError, match=r"inventory /inv: distrun_image 'a b' is not an image reference; write it as"):
        containers.choose("/inv", {"distrun_image": "a b"}, None, None)
    with pytest.raises(PlanError, match=r"inventory /inv: distrun_container_runtime 'lxc': choose one of podman, docker"):
        containers.choose("/inv", {"distrun_container_runtime": "lxc"}, IMAGE, None)


def test_the_plan_records_the_image_and_show_json_and_a_followed_record_read_it(tmp_path):
    plan = plan_for()
    (tmp_path / "plan.json").write_text(json.dumps(asdict(plan), default=str))

    class Rec:
        id = "r1"
        dir = tmp_path
    assert recorded_plan(Rec()).container == Container(IMAGE, "podman")  # type: ignore[arg-type]
    shown = records._plan(json.loads((tmp_path / "plan.json").read_text()))
    assert shown["container"] == {"image": IMAGE, "runtime": "podman"}


def test_a_plan_without_an_image_runs_as_before():
    plan = build_plan(cluster(MIXED), run_id="r1", network=net(n1="eth0", n2="eth0", n3="eth0"))
    assert plan.container is None
    assert plan.program[0] == "/opt/distrun/venv/bin/python"


def test_the_dry_run_shows_the_image_and_the_container_start(private_state):
    from click.testing import CliRunner

    from distrun.cli import main

    from .cli_cases import TWO

    base = ["train", "-i", TWO, "--dry-run", "--launcher", "torchrun", "--image", IMAGE, "--env", "TOKEN=s3cret-value"]
    text = CliRunner().invoke(main, base, prog_name="distrun", env={"DISTRUN_INVENTORY": None})
    assert text.exit_code == 0, text.output
    assert f"container:   podman image {IMAGE}" in text.stdout
    got = CliRunner().invoke(main, [*base, "--json", "--container-runtime", "docker"], prog_name="distrun",
                             env={"DISTRUN_INVENTORY": None})
    dry = json.loads(got.stdout)
    assert dry["plan"]["container"] == {"image": IMAGE, "runtime": "docker"}
