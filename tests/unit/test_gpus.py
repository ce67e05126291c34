"""GPUs per rank: the inventory's `gpus`, `train --gpus N` and `--hosts node1:0,1`, what the dry run
shows, what each launcher's ranks get in CUDA_VISIBLE_DEVICES and LOCAL_RANK (the rank wrapper run
for real, with the launcher's own variables), the container's devices and Slurm's flag, and every
bad selection refused in one line. No GPU is touched: the mapping is the plan's."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.errors import PlanError
from distrun.launchers import sbatch_script
from distrun.launchers.slurm import multi_job_script
from distrun.planning import containers
from distrun.planning.containers import Container
from distrun.planning.jobplan import from_json, to_json
from distrun.planning.run_files import plan_files, render_env_file, render_rank_wrapper
from distrun.run.attempt_shell import launch_command

from .conftest import REPO
from .plans import plan_for as planned
from .test_launchers import cluster, net

INVENTORY = """\
all:
  vars: {{slurm_enabled: true}}
  children:
    head:
      hosts:
        node1: {{ansible_host: 10.0.0.1}}
    workers:
      hosts:
        node1: {{ansible_host: 10.0.0.1, gpus: 4, slots: {slots}}}
        node2: {{ansible_host: 10.0.0.2, gpus: 4, slots: {slots}}}
        cpu1: {{ansible_host: 10.0.0.3, slots: 1}}
"""


def dry_run(tmp_path: Path, *args: str, slots: int = 4) -> tuple[int, str, str]:
    inventory = tmp_path / "inv" / "hosts.yml"
    inventory.parent.mkdir(exist_ok=True)
    inventory.write_text(INVENTORY.format(slots=slots))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = CliRunner().invoke(main, ["train", "-i", str(inventory), "--dry-run", "--script", str(script), *args],
                                prog_name="distrun", env={"DISTRUN_INVENTORY": None})
    return result.exit_code, result.stdout, result.stderr


def mapping(out: str) -> list[str]:
    """The dry run's GPU table: one line per rank, its words."""
    lines = out.split("gpus (nvidia-smi's indices, CUDA_DEVICE_ORDER=PCI_BUS_ID):\n", 1)[1].splitlines()
    assert lines[0].split() == ["host", "rank", "local", "rank", "gpus", "CUDA_VISIBLE_DEVICES"]
    rows = []
    for line in lines[1:]:
        if not line.startswith("  ") or line.startswith("  #"):
            break
        rows.append(" ".join(line.split()))
    return rows


# --- what the dry run shows ----------------------------------------------------------------------

def test_four_gpus_and_four_slots_one_gpu_per_rank_every_rank_indexing_its_nodes_list(private_state, tmp_path):
    code, out, err = dry_run(tmp_path, "--exclude", "cpu1", slots=4)
    assert code == 0, err
    assert mapping(out) == [f"node1 {i} {i} {i} 0,1,2,3" for i in range(4)] + \
                           [f"node2 {4 + i} {i} {i} 0,1,2,3" for i in range(4)]


def test_four_gpus_and_two_slots_two_gpus_per_rank_each_seeing_its_own(private_state, tmp_path):
    code, out, err = dry_run(tmp_path, "--exclude", "cpu1", slots=2)
    assert code == 0, err
    assert mapping(out) == ["node1 0 0 0,1 0,1", "node1 1 1 2,3 2,3", "node2 2 0 0,1 0,1", "node2 3 1 2,3 2,3"]


def test_hosts_with_gpu_indices_choose_the_hosts_and_their_gpus(private_state, tmp_path):
    code, out, err = dry_run(tmp_path, "--hosts", "node1:0,1", slots=2)
    assert code == 0, err
    assert "world size:  2 rank(s) on 1 host(s)" in out
    assert mapping(out) == ["node1 0 0 0 0,1", "node1 1 1 1 0,1"]
    code, out, err = dry_run(tmp_path, "--hosts", "node2:3,2,node1:0,1,cpu1", slots=2)
    assert code == 0, err
    # In the inventory's rank order, node2's GPUs in the order given: its rank 0 on GPU 3.
    assert mapping(out) == ["node1 0 0 0 0,1", "node1 1 1 1 0,1", "cpu1 2 0 - - (no GPU)", "node2 3 0 3 3,2",
                            "node2 4 1 2 3,2"]


def test_plain_host_names_and_gpus_per_node(private_state, tmp_path):
    code, out, err = dry_run(tmp_path, "--hosts", "node2", "--gpus", "2", slots=2)
    assert code == 0, err
    assert mapping(out) == ["node2 0 0 0 0,1", "node2 1 1 1 0,1"]
    code, out, err = dry_run(tmp_path, "--hosts", "node1,node2", "--gpus", "0", slots=2)
    assert code == 0, err
    assert mapping(out) == ['node1 0 0 - "" (none)', 'node1 1 1 - "" (none)', 'node2 2 0 - "" (none)',
                            'node2 3 1 - "" (none)']


def test_a_run_without_gpus_shows_no_mapping(private_state, tmp_path):
    code, out, err = dry_run(tmp_path, "--hosts", "cpu1")
    assert code == 0, err
    assert "CUDA_VISIBLE_DEVICES" not in out


def test_the_dry_runs_json_carries_the_mapping(private_state, tmp_path):
    code, out, err = dry_run(tmp_path, "--hosts", "node1:2,3", "--json", slots=2)
    assert code == 0, err
    shown = json.loads(out)
    schema = json.loads((REPO / "docs" / "guide" / "distrun-json.schema.json").read_text())
    jsonschema.validate(shown, {**schema, "$ref": "#/$defs/dry_run"})
    assert shown["gpus"] == [{"host": "node1", "rank": 0, "local_rank": 0, "gpus": [2], "visible": "2,3"},
                             {"host": "node1", "rank": 1, "local_rank": 1, "gpus": [3], "visible": "2,3"}]
    host = shown["plan"]["hosts"][0]
    assert (host["gpu_ids"], host["rank_gpus"], host["visible"]) == ([2, 3], [[2], [3]], ["2,3", "2,3"])


def test_gpus_n_is_labelled_as_the_first_n_train_takes_the_first_n_free_at_launch(private_state, tmp_path):
    """The dry run asks no node which GPUs are free: where --gpus N leaves the choice to the launch
    it says so beside the mapping, and only there."""
    code, out, err = dry_run(tmp_path, "--hosts", "node1,node2:2,3", "--gpus", "2", slots=2)
    assert code == 0, err
    assert mapping(out)[:2] == ["node1 0 0 0 0,1", "node1 1 1 1 0,1"]
    assert "gpus at launch: node1: the first 2 shown; train takes the first 2 free there at launch (no other " \
           "run's; the dry run asks no node)" in out.splitlines()
    code, out, err = dry_run(tmp_path, "--hosts", "node1,node2", "--gpus", "2", "--json", slots=2)
    assert code == 0, err
    assert json.loads(out)["gpus_first_free"] == ["node1", "node2"]
    for exact in (["--hosts", "node1:0,1"], ["--exclude", "cpu1"], ["--gpus", "2", "--allow-concurrent",
                                                                    "--exclude", "cpu1"]):
        code, out, err = dry_run(tmp_path, *exact, slots=2 if exact[0] != "--exclude" else 4)
        assert code == 0, err
        assert "free there at launch" not in out, exact


# --- bad selections: one line naming the flag or host and the fix ----------------------------------

BAD = [
    (["--hosts", "node1:4"], 2, "--hosts node1:4: node1 has 4 GPU(s) in inventory", "name GPUs 0 to 3"),
    (["--hosts", "node1:0,0"], 2, "--hosts node1:0,0: GPU 0 of node1 is named twice", "name each GPU once"),
    (["--hosts", "node1:x"], 2, "--hosts node1:x: 'x' is not a GPU index", "(--hosts node1:0,1)"),
    (["--hosts", "node1:"], 2, "--hosts node1:: no GPU index after 'node1:'", "or the host alone"),
    (["--hosts", "node1:0,node1:1"], 2, "--hosts node1:1: node1's GPUs are named twice", "(--hosts node1:0,1)"),
    (["--hosts", ":0"], 2, "--hosts :0: no host before ':'", "(--hosts node1:0,1)"),
    (["--hosts", "cpu1:0"], 2, "--hosts cpu1:0: cpu1 declares no GPU in inventory", "set gpus: N for cpu1"),
    (["--hosts", "node1:0,1,2"], 2, "node1: 3 GPU(s) selected (0,1,2) for 2 rank(s) (slots=2)",
     "(--gpus 2, or --hosts node1:0,1)"),
    (["--hosts", "node1:0"], 2, "node1: 1 GPU(s) selected (0) for 2 rank(s) (slots=2)", "set slots=1 for node1"),
    (["--gpus", "8", "--exclude", "cpu1"], 4, "--gpus 8: node1 has 4 GPU(s) in inventory", "give --gpus 4 or less"),
    (["--gpus", "3", "--exclude", "cpu1"], 2, "node1: 3 GPU(s) selected (0,1,2) for 2 rank(s)", "--gpus 2"),
    (["--gpus", "2"], 2, "--gpus 2: cpu1 declares no GPU in inventory", "(--exclude cpu1)"),
    (["--exclude", "node1:0"], 2, "--exclude node1:0: --exclude takes host names only", "--hosts node1:0,1"),
    (["--hosts", "node1:0,1", "--launcher", "slurm"], 2, "--hosts node1:0,1: the scheduler chooses", "(--gpus 2)"),
    (["--gpus", "4", "--hosts", "node1", "--launcher", "slurm"], 2, "the scheduler gives every rank of a node all its "
     "GPUs", "give --gpus 2 (one per rank), or set slots=1 for node1"),
    (["--gpus", "-1"], 2, "--gpus", "give a whole number of at least 0"),
]


@pytest.mark.parametrize(("args", "slots", "said", "fix"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_a_bad_selection_is_one_line_with_the_fix(private_state, tmp_path, args, slots, said, fix):
    code, out, err = dry_run(tmp_path, *args, slots=slots)
    assert code == 2 and out == ""
    line, = err.splitlines()
    assert line.startswith("distrun: error: ") and said in line and fix in line, line


# --- what each launcher's ranks get ----------------------------------------------------------------

GPU_HOSTS = {"g1": {"ansible_host": "10.0.0.1", "slots": 2, "gpus": 4}, "g2": {"ansible_host": "10.0.0.2", "slots": 2, "gpus": 4}}


def plan_for(launcher="mpirun", **kw):
    return planned(cluster(GPU_HOSTS, head="g1", slurm_enabled=True), run_id="r1", launcher=launcher,
                   network=net(g1="eth0", g2="eth0"), **kw)


def fake_hostname(tmp_path: Path, short: str, address: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "hostname"
    fake.write_text(f'#!/bin/sh\ncase "$1" in -I) echo "{address} ";; *) echo {short};; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return f"{bin_dir}:{os.environ['PATH']}"


def rank_sees(plan, tmp_path: Path, env: dict[str, str], *, header: bool = True) -> dict[str, str]:
    """Run the plan's rank wrapper on g2 as the launcher starts a rank there: what the program gets."""
    wrapper = render_rank_wrapper(plan).replace(f"cd {plan.run_dir}", f"cd {tmp_path}")
    names = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LOCAL_RANK", "RANK")
    show = "; ".join(f'echo "{n}=${{{n}-unset}}"' for n in names)
    base = {"PATH": fake_hostname(tmp_path, "g2", "10.0.0.2"), "HOME": str(tmp_path)}
    out = subprocess.run(["bash", "-c", wrapper, "bash", "bash", "-c", show], env={**base, **env}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    first, *lines = out.stdout.splitlines()
    seen = dict(line.split("=", 1) for line in lines)
    # Each rank's log starts with what it was given, where the plan gives any.
    mapped = any(h.visible for h in plan.placement.hosts)
    assert not header or first.endswith(f" cuda_visible_devices={seen['CUDA_VISIBLE_DEVICES']}") == mapped, first
    return seen


def started(launcher: str, rank: int, local_rank: int, size: int) -> dict[str, str]:
    """The variables a launcher starts a rank with (the wrapper maps them to torch's)."""
    if launcher == "mpirun":
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
                "OMPI_COMM_WORLD_SIZE": str(size)}
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(size)}  # torchrun, ssh-ranks.sh


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "ssh"])
def test_every_launchers_rank_gets_its_gpus_and_a_local_rank_that_indexes_them(tmp_path, launcher):
    one_each = rank_sees(plan_for(launcher, gpu_ids={"g2": (3, 1)}, hosts=("g2",)), tmp_path, started(launcher, 1, 1, 2))
    # cuda:LOCAL_RANK is the rank's own GPU: the second of the node's list, nvidia-smi's GPU 1.
    assert one_each == {"CUDA_VISIBLE_DEVICES": "3,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "LOCAL_RANK": "1", "RANK": "1"}
    # Rank 3, the second of g2's, with 2 GPUs per rank: its own two, cuda:0 and cuda:1.
    two_each = rank_sees(plan_for(launcher), tmp_path, started(launcher, 3, 1, 4))
    assert two_each == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "LOCAL_RANK": "1", "RANK": "3"}


def test_under_slurm_the_ranks_keep_the_gpus_slurm_gave_them(tmp_path):
    plan = plan_for("slurm", gpus=2)
    seen = rank_sees(plan, tmp_path, {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
                                      "CUDA_VISIBLE_DEVICES": "0,1"})
    assert seen == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "unset", "LOCAL_RANK": "1", "RANK": "3"}


def fenced(plan, host: str) -> object:
    """The GPUs the node program is told to leave open in host's unit (absent: none hidden)."""
    said = re.findall(r'"gpu_ids": (\[[0-9, ]*\])', launch_command(plan, host))
    assert len(said) <= 1
    return json.loads(said[0]) if said else "absent"


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "ssh"])
def test_each_hosts_unit_keeps_only_the_gpus_the_run_placed_there(launcher):
    assert fenced(plan_for(launcher, gpu_ids={"g2": (3, 1)}, hosts=("g2",)), "g2") == [3, 1]
    assert fenced(plan_for(launcher), "g2") == [0, 1, 2, 3]
    assert fenced(plan_for(launcher, gpus=0), "g2") == []  # --gpus 0: the node's GPUs all hidden
    cpu = planned(cluster({"c1": {"ansible_host": "10.0.0.1"}, "c2": {"ansible_host": "10.0.0.2"}}, head="c1"),
                  run_id="r1", launcher=launcher, network=net(c1="eth0", c2="eth0"))
    assert fenced(cpu, "c2") == "absent"  # a node that declares no GPU: nothing hidden


def test_under_slurm_the_unit_hides_no_gpu_slurm_picks_them():
    assert fenced(plan_for("slurm", gpus=2), "g1") == "absent"


def test_a_rank_of_a_node_given_no_gpu_sees_none(tmp_path):
    seen = rank_sees(plan_for("torchrun", gpus=0), tmp_path, started("torchrun", 3, 1, 4))
    assert seen["CUDA_VISIBLE_DEVICES"] == ""


def test_a_cuda_visible_devices_of_the_users_own_wins_on_every_rank(tmp_path):
    plan = plan_for("torchrun", extra_env={"CUDA_VISIBLE_DEVICES": "7"})
    (tmp_path / "env.sh").write_text(render_env_file({"CUDA_VISIBLE_DEVICES": "7"}))
    # (The log's first line says what distrun gave the rank, before the user's variables.)
    assert rank_sees(plan, tmp_path, started("torchrun", 3, 1, 4), header=False)["CUDA_VISIBLE_DEVICES"] == "7"


def test_the_plan_records_the_mapping_and_reads_it_back():
    plan = plan_for("ssh", gpu_ids={"g1": (2, 3)}, hosts=("g1",))
    recorded = json.loads(json.dumps(to_json(plan)))
    assert recorded["hosts"][0]["visible"] == ["2,3", "2,3"]
    assert from_json(recorded) == plan
    cpu = planned(cluster({"c1": {"ansible_host": "10.0.0.9", "slots": 1}}, head="c1"), run_id="r1")
    assert "visible" not in to_json(cpu)["hosts"][0]  # a run without GPUs: the same plan.json as before


# --- containers and Slurm: rendered ---------------------------------------------------------------

def container_start(plan, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run the plan's container-run.sh with a stand-in runtime recording its argv and the
    CUDA_VISIBLE_DEVICES it passes in."""
    script = tmp_path / "container-run.sh"
    script.write_text(plan_files(plan)[containers.SCRIPT])
    bin_dir = tmp_path / "rt"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / plan.launch.container.runtime
    fake.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" "CVD=${{CUDA_VISIBLE_DEVICES-unset}}" > {shlex.quote(str(tmp_path / "argv"))}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    subprocess.run(["bash", str(script), "python3", "t.py"], env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env},
                   check=True, timeout=30)
    return (tmp_path / "argv").read_text().split("\0")[:-1]


def devices(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a in ("--device", "--gpus")]


@pytest.mark.parametrize("launcher", ["mpirun", "ssh"])
def test_one_container_per_rank_gets_the_cdi_device_of_each_gpu_it_sees_renumbered_inside(tmp_path, launcher):
    plan = plan_for(launcher, gpu_ids={"g2": (3, 1)}, hosts=("g2",), container=Container("localhost/t:1"))
    argv = container_start(plan, tmp_path, {"DISTRUN_HOST": "g2", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "3,1"})
    assert devices(argv) == ["nvidia.com/gpu=3", "nvidia.com/gpu=1"]
    # Inside, the container numbers its two GPUs 0 (GPU 1) and 1 (GPU 3): cuda:LOCAL_RANK is still GPU 1.
    assert argv[-1] == "CVD=1,0" and "CUDA_VISIBLE_DEVICES" in argv
    two_each = plan_for(launcher, container=Container("localhost/t:1", "docker"))
    argv = container_start(two_each, tmp_path, {"DISTRUN_HOST": "g1", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert devices(argv) == ['"device=2,3"'] and argv[-1] == "CVD=0,1"


def test_one_container_per_node_gets_the_nodes_gpus_and_the_wrapper_inside_numbers_them_its_way(tmp_path):
    plan = plan_for("torchrun", gpu_ids={"g2": (3, 1)}, hosts=("g2",), container=Container("localhost/t:1"))
    argv = container_start(plan, tmp_path, {"DISTRUN_HOST": "g2"})
    assert devices(argv) == ["nvidia.com/gpu=3", "nvidia.com/gpu=1"] and argv[-1] == "CVD=unset"
    seen = rank_sees(plan, tmp_path, {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert seen["CUDA_VISIBLE_DEVICES"] == "1,0"


def test_slurm_asks_for_the_selected_gpus_per_node_on_the_sbatch_and_srun_lines():
    script = sbatch_script(plan_for("slurm", gpus=2))
    assert "#SBATCH --gpus-per-node=2\n" in script
    assert " --gpus-per-node=2 " in script.splitlines()[-1]  # the ranks' step
    assert "--gpus-per-node" not in sbatch_script(plan_for("slurm", gpus=0))
    multi = plan_for("slurm", gpus=2, slurm={"mode": "multi-job"})
    assert "#SBATCH --gpus-per-node=2\n" in multi_job_script(multi, 1, multi.placement.hosts[1])


def test_slurm_refuses_nodes_with_different_gpu_counts_in_one_job():
    uneven = dict(GPU_HOSTS, g2={**GPU_HOSTS["g2"], "gpus": 2})
    plan = planned(cluster(uneven, head="g1", slurm_enabled=True), run_id="r1", launcher="slurm",
                   network=net(g1="eth0", g2="eth0"), allow_gpu_mismatch=True)
    with pytest.raises(PlanError, match=r"one GPU count \(--gpus-per-node\), but g1 has 4, g2 has 2; give --gpus 2"):
        sbatch_script(plan)


def test_the_inventorys_gpus_must_be_a_count(write_inventory):
    from distrun.errors import InventoryError
    from distrun.inventory.cluster import load_cluster

    inv = write_inventory("[head]\nh\n[workers]\nh gpus=four\n", name="bad.ini")
    with pytest.raises(InventoryError, match=r"host h has gpus='four'; set gpus to the node's GPU count"):
        load_cluster(inv, None)
