"""Ranks in a container image: the choice of image and runtime, and what each launcher renders.

The container start script is run here for real with a stand-in runtime on PATH that records
its argv: the flags a node's podman or docker would get, the variables passed by name only."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from distrun.errors import PlanError
from distrun.launchers import launcher_named, mpirun_argv, sbatch_script
from distrun.launchers.slurm import multi_job_script
from distrun.planning import containers
from distrun.planning.containers import Container
from distrun.planning.jobplan import to_json
from distrun.planning.run_files import launch_scripts, plan_files
from distrun.run.liveness import recorded_plan
from distrun.ui import data as records

from .plans import plan_for as planned
from .test_launchers import DEBIAN_OMPI, MIXED, _facts, cluster, net

IMAGE = "registry.example:5000/lab/train:2.3"
GPU = {"g1": {"ansible_host": "10.0.0.1", "slots": 2}, "g2": {"ansible_host": "10.0.0.2", "slots": 2}}


def plan_for(launcher="mpirun", runtime="podman", hosts=MIXED, gpus=None, **kw):
    c = cluster(hosts, head=next(iter(hosts)))
    if gpus:
        c = replace(c, workers=tuple(replace(n, gpus=gpus.get(n.name, 0)) for n in c.workers))
    return planned(c, run_id="r1", launcher=launcher, network=net(**{h: "eth0" for h in hosts}),
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
    (tmp_path / "plan.json").write_text(json.dumps(to_json(plan)))

    class Rec:
        id = "r1"
        dir = tmp_path
    assert recorded_plan(Rec()).launch.container == Container(IMAGE, "podman")  # type: ignore[arg-type]
    shown = records._plan(json.loads((tmp_path / "plan.json").read_text()))
    assert shown["container"] == {"image": IMAGE, "runtime": "podman"}


def test_a_plan_without_an_image_runs_as_before():
    plan = planned(cluster(MIXED), run_id="r1", network=net(n1="eth0", n2="eth0", n3="eth0"))
    assert plan.launch.container is None
    assert "container-run.sh" not in " ".join(mpirun_argv(plan)) and "container-run.sh" not in plan_files(plan)
    assert plan.program.argv[0] == "/opt/distrun/venv/bin/python"
    assert containers.stop_argv(plan) == []


# --- the container's start, run with a stand-in runtime ------------------------------------------------

def run_start(plan, tmp_path: Path, env: dict[str, str], args=("python3", "train.py")) -> list[str]:
    """Run the plan's container-run.sh with a fake runtime that records its argv (NUL-separated)."""
    text = plan_files(plan)[containers.SCRIPT]
    script = tmp_path / "container-run.sh"
    script.write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / plan.launch.container.runtime
    fake.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {shlex.quote(str(tmp_path / "argv"))}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    base = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script), *args], env={**base, **env}, check=True, timeout=30)
    return (tmp_path / "argv").read_text().split("\0")[:-1]


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_mpirun_starts_each_rank_in_a_podman_container_as_the_user_with_variables_by_name(tmp_path):
    plan = plan_for()
    plan = replace(plan, program=replace(plan.program, user_env_keys=("HF_TOKEN",), workdir="/srv/distrun/projects/p"))
    argv = mpirun_argv(plan)
    # The host's mpirun starts the rank wrapper, which hands the program to the container start.
    w = argv.index(plan.wrapper)
    assert argv[w + 1] == "/srv/distrun/runs/r1/container-run.sh" and argv[w + 2] == "python3"
    env = {"OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3", "HF_TOKEN": "hunter2-secret", "RANK": "3",
           "UNRELATED": "x", "DISTRUN_HOST": "n2", "SLURM_JOB_ID": "17"}
    got = run_start(plan, tmp_path, env)
    assert got[:3] == ["--cgroup-manager=cgroupfs", "run", "--rm"]  # the container stays in the run's unit
    for flag in ["--network=host", "--ipc=host", "--pid=host", "--userns=keep-id"]:
        assert flag in got
    assert pairs(got, "--label") == ["distrun.run=r1"]
    assert pairs(got, "--volume") == ["/tmp:/tmp", "/srv/distrun:/srv/distrun", "/srv/distrun/runs/r1:/srv/distrun/runs/r1",
                                      "/srv/distrun/projects/p:/srv/distrun/projects/p"]
    assert pairs(got, "--workdir") == ["/srv/distrun/projects/p"]
    names = pairs(got, "--env")
    assert {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "HF_TOKEN", "RANK", "MASTER_ADDR", "DISTRUN_RUN_ID"} <= set(names)
    assert "UNRELATED" not in names and all("=" not in n for n in names)
    assert "SLURM_JOB_ID" not in names  # only the launcher's own prefixes (mpirun: Open MPI's, PMIx's)
    assert "hunter2-secret" not in "\0".join(got)
    assert got[-3:] == [IMAGE, "python3", "train.py"]
    assert "--device" not in got and "--user" not in got  # no GPU here; podman keeps the user itself


def test_the_nodes_open_mpi_folders_stay_out_of_the_image(tmp_path):
    """mpirun gives its ranks the node's Open MPI folders (where the node keeps its parameter file
    and components, so a rank never reads the training user's ~/.openmpi); the image's Open MPI
    has folders of its own, and the container sees no home to protect."""
    facts = tmp_path / "facts"
    facts.mkdir()
    for h in MIXED:
        _facts(facts, h, ansible_local={"distrun": DEBIAN_OMPI})
    plan = planned(cluster(MIXED, head=next(iter(MIXED)), fact_cache=facts), run_id="r1", launcher="mpirun",
                      network=net(**{h: "eth0" for h in MIXED}), container=Container(IMAGE, "podman"))
    own = (("mca_base_param_files", "/etc/openmpi/openmpi-mca-params.conf"),
           ("mca_base_component_path", "/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"))
    assert plan.launch.openmpi_params == own
    assert "mca_base_component_path" in mpirun_argv(plan)  # the node's daemons
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_MCA_mca_base_param_files": own[0][1],
           "OMPI_MCA_mca_base_component_path": own[1][1], "OMPI_MCA_btl_tcp_if_include": "10.0.0.0/24"}
    names = pairs(run_start(plan, tmp_path, env), "--env")
    assert {"OMPI_COMM_WORLD_RANK", "OMPI_MCA_btl_tcp_if_include"} <= set(names)
    assert not {"OMPI_MCA_mca_base_param_files", "OMPI_MCA_mca_base_component_path"} & set(names), names
    assert not [k for k, _ in plan.program.env if k.startswith("OMPI_MCA_")]


def test_docker_runs_as_the_callers_uid_and_gets_gpus_only_on_gpu_nodes(tmp_path):
    plan = plan_for("torchrun", runtime="docker", hosts=GPU, gpus={"g1": 2})
    on_gpu = run_start(plan, tmp_path, {"DISTRUN_HOST": "g1"})
    assert pairs(on_gpu, "--user") == [f"{os.getuid()}:{os.getgid()}"]
    # One container per node: the node's selected GPUs (all it has, by default), by index.
    assert pairs(on_gpu, "--gpus") == ['"device=0,1"'] and "--userns=keep-id" not in on_gpu
    assert on_gpu[0] == "run"  # docker's containers are its daemon's children: removed by label on stop
    assert "--pid=host" not in on_gpu  # one container per node: its ranks share its namespace
    assert "--gpus" not in run_start(plan, tmp_path, {"DISTRUN_HOST": "g2"})
    podman = plan_for("torchrun", hosts=GPU, gpus={"g1": 2, "g2": 2})
    assert pairs(run_start(podman, tmp_path, {"DISTRUN_HOST": "g2"}), "--device") == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    # A node whose GPUs its ranks cannot share, launched anyway: every GPU, as the node has them.
    odd = plan_for("torchrun", hosts=GPU, gpus={"g1": 2, "g2": 3}, allow_gpu_mismatch=True)
    assert pairs(run_start(odd, tmp_path, {"DISTRUN_HOST": "g2"}), "--device") == ["nvidia.com/gpu=all"]


def test_torchrun_runs_one_agent_container_per_node_with_the_images_torchrun():
    plan = plan_for("torchrun")
    launcher = launcher_named("torchrun")
    for host in plan.placement.hosts:
        argv = launcher.command(plan, host)
        assert argv[0] == "/srv/distrun/runs/r1/container-run.sh" and argv[1] == "torchrun"
        assert argv[argv.index("--no-python") + 1:][:2] == [plan.wrapper, "python3"]
        assert ("DISTRUN_HOST", host.name) in launcher.environment(plan, host)
    scripts = launch_scripts(plan)
    assert all("container-run.sh torchrun" in text for text in scripts.values())
    assert launcher.needs(plan) == ({"podman": ["podman"]}, {})


def test_slurm_single_renders_pyxis_and_multi_job_one_container_per_job():
    single = plan_for("slurm", slurm={"mode": "single", "mpi": "pmix"})
    srun = next(line for line in sbatch_script(single).splitlines() if line.startswith("srun --mpi"))
    words = shlex.split(srun)
    assert f"--container-image={IMAGE}" in words
    assert "--container-mounts=/srv/distrun:/srv/distrun,/srv/distrun/runs/r1:/srv/distrun/runs/r1" in words
    assert "--container-workdir=/srv/distrun/runs/r1" in words
    assert words.index(single.wrapper) > words.index(f"--container-image={IMAGE}")
    multi = plan_for("slurm", slurm={"mode": "multi-job", "mpi": "pmix"})
    job = multi_job_script(multi, 1, multi.placement.hosts[1])
    assert f"export DISTRUN_HOST={multi.placement.hosts[1].name}" in job
    assert "--ntasks=1 --kill-on-bad-exit=1 /srv/distrun/runs/r1/container-run.sh torchrun " in job
    assert containers.SCRIPT in plan_files(multi) and containers.SCRIPT not in plan_files(single)


def test_mpirun_needs_the_runtime_on_every_node():
    nodes, head = launcher_named("mpirun").needs(plan_for(runtime="docker"))
    assert nodes["docker"] == ["docker"] and "orted" in nodes and "mpirun" in head


PODMAN_RM = ["podman", "rm", "-f", "--filter", "label=distrun.run=r1"]


def test_stop_removes_the_runs_containers_by_label_in_a_unit_of_the_users_own():
    argv = containers.stop_argv(plan_for())
    assert argv == containers.in_user_unit("distrun", PODMAN_RM, containers.STOP_MAX_S)
    assert argv[:2] == ["sh", "-c"] and argv[3:6] == ["sh", "distrun", "60"] and argv[6:] == PODMAN_RM
    docker = containers.stop_argv(plan_for(runtime="docker"))
    assert docker[:2] == ["sh", "-c"] and "docker ps -aq --filter label=distrun.run=r1" in docker[2]


def test_the_dry_run_shows_the_image_and_the_container_start(private_state):
    from click.testing import CliRunner

    from distrun.cli.main import main

    from .cli_cases import TWO

    base = ["train", "-i", TWO, "--dry-run", "--launcher", "torchrun", "--image", IMAGE, "--env", "TOKEN=s3cret-value"]
    text = CliRunner().invoke(main, base, prog_name="distrun", env={"DISTRUN_INVENTORY": None})
    assert text.exit_code == 0, text.output
    assert f"container:   podman image {IMAGE}" in text.stdout
    assert "--userns=keep-id" in text.stdout and "--env TOKEN" in text.stdout and "s3cret-value" not in text.stdout
    got = CliRunner().invoke(main, [*base, "--json", "--container-runtime", "docker"], prog_name="distrun",
                             env={"DISTRUN_INVENTORY": None})
    dry = json.loads(got.stdout)
    assert dry["plan"]["container"] == {"image": IMAGE, "runtime": "docker"}
    assert all(s.count("container-run.sh torchrun") == 1 for s in dry["launch_scripts"].values())


def test_distrun_stop_hands_the_containers_removal_of_a_recorded_run_to_the_stop_play(tmp_path):
    from distrun.run import stop

    class Rec:
        id = "r1"
        dir = tmp_path
    assert stop.stop_vars("r1", stop.recorded(Rec())) == {"distrun_run_id": "r1"}  # type: ignore[arg-type]  # no plan.json
    (tmp_path / "plan.json").write_text(json.dumps(to_json(plan_for(runtime="podman"))))
    assert stop.stop_vars("r1", stop.recorded(Rec()))["distrun_container_stop_argv"] == containers.in_user_unit(  # type: ignore[arg-type]
        "distrun", PODMAN_RM, containers.STOP_MAX_S)
    assert containers.stop_shell(plan_for()) == shlex.join(containers.stop_argv(plan_for())) + " >/dev/null"


def _fake_bin(tmp_path: Path, names: dict[str, str]) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in names.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    return bindir


def test_a_users_unit_has_its_own_runtime_folder_and_the_probe_asks_for_the_same(tmp_path):
    """The runner's unit for the user's runtime (containers.USER_UNIT) and the preflight probe's
    (role preflight's userprobe.py) are one set of properties: their own /tmp, /dev/shm, IPC and
    runtime folder /run/user/<uid>, so podman's pause process starts in them and ends with them."""
    import ast

    from distrun import paths
    tree = ast.parse((paths.project_dir() / "roles" / "preflight" / "files" / "userprobe.py").read_text())
    probe = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "USER_UNIT_PROPERTIES")
    assert probe == containers.USER_UNIT_PROPERTIES
    assert "TemporaryFileSystem=/run/user/{uid}:mode=0700,uid={uid},gid={gid}" in probe


def test_a_users_unit_is_started_by_systemd_as_that_user_with_its_streams_and_status(tmp_path):
    """USER_UNIT's shell, as root with systemd, hands the command to systemd-run (here a stand-in
    that prints its argv) with the user's ids, the unit's properties and its time limit."""
    bindir = _fake_bin(tmp_path, {"systemd-run": 'printf "%s\\n" "$@"; exit 3', "id": 'case "$1" in -u) [ -n "$2" ] && echo 1000 || echo 0 ;; -g) echo 1000 ;; esac',
                                  "getent": "echo distrun:x:1000:1000::/home/distrun:/bin/bash"})
    script = containers.USER_UNIT.replace("[ -d /run/systemd/system ]", "true")
    proc = subprocess.run(["sh", "-c", script, "sh", "distrun", "60", "podman", "load", "-q"], capture_output=True,
                          text=True, env={"PATH": f"{bindir}:/usr/bin:/bin"}, check=False)
    assert proc.returncode == 3, proc.stderr
    argv = proc.stdout.splitlines()
    assert argv[-4:] == ["--", "podman", "load", "-q"]
    assert {"--uid=1000", "--gid=1000", "--pipe", "--wait", "RuntimeMaxSec=60", "XDG_RUNTIME_DIR=/run/user/1000",
            "TemporaryFileSystem=/run/user/1000:mode=0700,uid=1000,gid=1000", "PrivateTmp=yes"} <= set(argv), argv


@pytest.mark.parametrize("lines, start", [
    ([], 100000),  # shadow's floor
    (["alice:100000:65536"], 165536),
    (["alice:100000:65536", "bob:300000:1000", "# a comment", "broken line", "carol:1000:10"], 301000),
    (["svc:1000:10"], 100000),  # a range below the floor moves nothing up
])
def test_setup_gives_the_training_user_a_subordinate_range_that_overlaps_no_other(lines, start):
    from distrun.inventory import rules

    assert rules.free_subid(lines, 65536) == start
    taken = [(int(s), int(s) + int(n)) for name, s, n in (ln.split(":") for ln in lines if ln.count(":") == 2
                                                          and not ln.startswith("#"))]
    assert all(start >= end or start + 65536 <= s for s, end in taken)


def test_a_subordinate_range_needs_ids():
    from distrun.inventory import rules

    with pytest.raises(ValueError, match="at least 1 id"):
        rules.free_subid([], 0)
