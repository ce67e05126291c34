"""Command builders are pure functions of the plan: tested without any host."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from distrun.errors import PlanError
from distrun.inventory.cluster import cluster_from_json
from distrun.launchers import mpirun_argv, sbatch_script, torchrun_argv
from distrun.planning.jobplan import from_json, to_json
from distrun.planning.network import Iface, NetworkChoice
from distrun.planning.placement import allocate
from distrun.planning.plan import render_hostfile
from distrun.planning.run_files import launch_scripts, render_rank_wrapper

from .plans import plan_for


def inv(hosts: dict[str, dict], head: str, **group_vars) -> dict:
    return {
        "_meta": {"hostvars": {h: {**group_vars, **hv} for h, hv in hosts.items()}},
        "all": {"children": ["head", "workers"]},
        "head": {"hosts": [head]},
        "workers": {"hosts": list(hosts)},
    }


def cluster(hosts, head="n1", fact_cache=None, **gv):
    return cluster_from_json(Path("/inv/hosts.yml"), inv(hosts, head, **gv), fact_cache)


def net(**per_host):
    return NetworkChoice("10.0.0.0/24", {h: Iface(i, f"10.0.0.{k + 1}", "10.0.0.0/24") for k, (h, i) in enumerate(per_host.items())})


MIXED = {"n1": {"ansible_host": "10.0.0.1", "slots": 2}, "n2": {"ansible_host": "10.0.0.2", "slots": 1}, "n3": {"ansible_host": "10.0.0.3", "slots": 3}}


def test_mpirun_non_root_cpu_mixed_slots_with_interfaces():
    plan = plan_for(cluster(MIXED), run_id="r1", network=net(n1="eth0", n2="ens5", n3="eth0"))
    argv = mpirun_argv(plan)
    assert argv[:3] == ["/usr/bin/mpirun", "-np", "6"]
    assert argv[argv.index("--prefix") + 1] == "/usr"
    assert "--allow-run-as-root" not in argv
    assert "opal_cuda_support" not in argv
    # The subnet, not names: names differ between nodes.
    i = argv.index("btl_tcp_if_include")
    assert argv[i + 1] == "10.0.0.0/24"
    assert argv[argv.index("oob_tcp_if_include") + 1] == "10.0.0.0/24"
    assert "DISTRUN_RUN_ID=r1" in argv
    assert argv[argv.index("--output-filename") + 1] == "/srv/distrun/runs/r1/attempts/0/ranks"
    assert argv[argv.index("--hostfile") + 1] == "/srv/distrun/runs/r1/hostfile"
    assert render_hostfile(plan).splitlines()[1:] == ["n1 slots=2", "n2 slots=1", "n3 slots=3"]
    wrapper = render_rank_wrapper(plan)
    assert "n2) IFACE=ens5 ;;" in wrapper and "n1) IFACE=eth0 ;;" in wrapper
    assert 'export RANK="${RANK:-${OMPI_COMM_WORLD_RANK:-' in wrapper


def test_mpirun_root_gpu_conda():
    hosts = {"g1": {"ansible_host": "10.0.0.1"}, "g2": {"ansible_host": "10.0.0.2"}}
    facts = {"g1": 4, "g2": 4}
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for h, n in facts.items():
            _facts(Path(d), h, ansible_local={"distrun": {"gpus": n}})
        c = cluster(hosts, head="g1", fact_cache=Path(d), distrun_user="root", distrun_mpi_provider="conda")
    plan = plan_for(c, run_id="r2", workload="ddp")
    argv = mpirun_argv(plan)
    assert argv[0] == "/opt/miniforge3/envs/jittor/bin/mpirun"
    assert argv[:3][1:] == ["-np", "8"]
    assert argv[argv.index("--prefix") + 1] == "/opt/miniforge3/envs/jittor"
    assert "--allow-run-as-root" in argv
    assert argv[argv.index("opal_cuda_support") + 1] == "1"
    # No facts about interfaces were given: no include list is invented.
    assert "btl_tcp_if_include" not in argv
    # Python ranks run under mpi4py's runner so a failing rank aborts the whole job at once.
    assert plan.program.argv[:3] == ("/opt/miniforge3/envs/jittor/bin/python", "-m", "mpi4py")
    assert plan.program.argv[3].endswith("/workloads/gcn_ddp.py")


def test_np_fills_hosts_in_order_and_refuses_more_than_slots():
    c = cluster(MIXED)
    assert allocate(c, 4) == [("n1", 2), ("n2", 1), ("n3", 1)]
    assert allocate(c, None) == [("n1", 2), ("n2", 1), ("n3", 3)]
    with pytest.raises(PlanError, match=r"--np 7 is more than the 6 slots in /inv/hosts.yml \(n1=2, n2=1, n3=3\)"):
        allocate(c, 7)
    with pytest.raises(PlanError, match="--np 0"):
        allocate(c, 0)


def test_partition_parts_always_equal_the_world_size():
    plan = plan_for(cluster(MIXED), run_id="r3", np=4, workload="gcn", dataset="cora", data_dir="/data/cora")
    assert plan.program.partition is not None
    p = list(plan.program.partition)
    assert p[p.index("--num-parts") + 1] == "4"
    prog = list(plan.program.argv)
    assert prog[prog.index("--num-parts") + 1] == "4"
    assert prog[prog.index("--part-dir") + 1] == p[p.index("--out") + 1] == plan.program.partition_dir
    assert prog[prog.index("--data-dir") + 1] == "/data/cora"
    # A workload without a partition step gets none.
    assert plan_for(cluster(MIXED), run_id="r4", workload="gcn-tp").program.partition is None


def test_torchrun_one_agent_per_node_with_its_own_slot_count():
    plan = plan_for(cluster(MIXED), run_id="r5", launcher="torchrun", workload="ddp", network=net(n1="eth0", n2="ens5", n3="eth1"))
    cmds = {h.name: torchrun_argv(plan, h) for h in plan.placement.hosts}
    assert cmds["n2"][1:3] == ["--nnodes=3", "--nproc-per-node=1"]
    assert cmds["n3"][2] == "--nproc-per-node=3"
    for argv in cmds.values():
        assert "--rdzv-backend=c10d" in argv
        assert "--rdzv-endpoint=10.0.0.1:29500" in argv
        assert "--rdzv-id=r5" in argv
        assert "--max-restarts=0" in argv
    # The agent on the endpoint's host starts the store, every other agent joins it: torch is
    # not left to match the endpoint against the hostname (127.0.1.1 on installed machines).
    assert [h.net_address for h in plan.placement.hosts if "--rdzv-conf=is_host=1" in cmds[h.name]] == ["10.0.0.1"]
    assert sum("--rdzv-conf=is_host=0" in argv for argv in cmds.values()) == 2
    from distrun.launchers.torchrun import torchrun_env
    assert torchrun_env(plan, plan.placement.hosts[1])["GLOO_SOCKET_IFNAME"] == "ens5"
    assert torchrun_env(plan, plan.placement.hosts[1])["NCCL_SOCKET_IFNAME"] == "ens5"


def test_user_script_runs_from_the_run_dir_with_its_arguments():
    plan = plan_for(cluster(MIXED), run_id="r6", script="/home/me/train.py", script_args=["--lr", "0.1"])
    assert plan.program.argv == ("/opt/distrun/venv/bin/python", "-m", "mpi4py", "/srv/distrun/runs/r6/train.py", "--lr", "0.1")
    assert plan.program.partition is None
    # torchrun starts plain Python: there is no MPI job to abort.
    plan = plan_for(cluster(MIXED), run_id="r6", launcher="torchrun", script="/home/me/train.py")
    assert plan.program.argv == ("/opt/distrun/venv/bin/python", "/srv/distrun/runs/r6/train.py")


def test_bad_env_names_and_launchers_are_refused():
    with pytest.raises(PlanError, match="--env 1BAD=...: not a valid"):
        plan_for(cluster(MIXED), run_id="x", extra_env={"1BAD": "v"})
    with pytest.raises(PlanError, match="--launcher 'pdsh'"):
        plan_for(cluster(MIXED), run_id="x", launcher="pdsh")
    with pytest.raises(PlanError, match="--workload 'bert'"):
        plan_for(cluster(MIXED), run_id="x", workload="bert")


def test_sbatch_script_uniform_and_uneven_slots():
    even = {h: {**v, "slots": 2} for h, v in MIXED.items()}
    script = sbatch_script(plan_for(cluster(even), run_id="r7", launcher="slurm", slurm={"partition": "gpu1", "time": "01:00:00"}))
    assert "#SBATCH --nodes=3" in script
    assert "#SBATCH --ntasks-per-node=2" in script
    assert "#SBATCH --partition=gpu1" in script
    assert "#SBATCH --time=01:00:00" in script
    assert "--gres" not in script
    assert "srun --mpi=pmix --kill-on-bad-exit=1" in script
    uneven = sbatch_script(plan_for(cluster(MIXED), run_id="r8", launcher="slurm"))
    assert "#SBATCH --ntasks=6" in uneven


def test_failure_messages_name_the_cause_not_ansibles_summary():
    from distrun.transport.playbook_events import _message

    assert _message({"msg": "non-zero return code", "stderr": "Traceback...\nModuleNotFoundError: No module named 'mpi4py'"}) \
        == "ModuleNotFoundError: No module named 'mpi4py'"
    loop = {"msg": "One or more items failed", "results": [
        {"item": "node2", "failed": False, "stderr": ""},
        {"item": "node3", "failed": True, "msg": "non-zero return code",
         "stderr": "ssh: connect to host node3 port 22: Connection timed out"}]}
    assert _message(loop) == "node3: ssh: connect to host node3 port 22: Connection timed out"
    assert _message({"msg": "All assertions passed"}) == "All assertions passed"


def _facts(tmp_path: Path, host: str, **facts) -> None:
    (tmp_path / f"s1_{host}").write_text(json.dumps({"__payload__": json.dumps(facts)}))


def test_a_rhel_node_fact_gives_mpirun_its_open_mpi_prefix(tmp_path):
    """The prefix comes from the node's distrun fact, which role mpi_env writes from its
    vars/RedHat.yml: Open MPI is not under /usr there."""
    hosts = {"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "10.0.0.2"}}
    for h in hosts:
        _facts(tmp_path, h, ansible_os_family="RedHat", ansible_local={"distrun": {
            "provider": "venv", "env_prefix": "/opt/distrun/venv", "mpi_prefix": "/usr/lib64/openmpi", "gpus": 0}})
    plan = plan_for(cluster(hosts, fact_cache=tmp_path), run_id="r1")
    argv = mpirun_argv(plan)
    assert argv[0] == "/usr/lib64/openmpi/bin/mpirun"
    assert argv[argv.index("--prefix") + 1] == "/usr/lib64/openmpi"


def test_a_rhel_node_not_set_up_yet_takes_the_prefix_of_role_mpi_env(tmp_path):
    _facts(tmp_path, "n1", ansible_os_family="RedHat")
    plan = plan_for(cluster({"n1": {"ansible_host": "10.0.0.1"}}, fact_cache=tmp_path), run_id="r1")
    assert mpirun_argv(plan)[mpirun_argv(plan).index("--prefix") + 1] == "/usr/lib64/openmpi"


def test_a_fact_about_another_env_is_not_used_for_the_prefix(tmp_path):
    # The inventory moved to conda after setup: the fact still names the venv's Open MPI.
    _facts(tmp_path, "n1", ansible_local={"distrun": {"provider": "venv", "env_prefix": "/opt/distrun/venv",
                                                      "mpi_prefix": "/usr"}})
    c = cluster({"n1": {"ansible_host": "10.0.0.1"}}, fact_cache=tmp_path, distrun_mpi_provider="conda")
    assert plan_for(c, run_id="r1").launch.mpi_prefix == "/opt/miniforge3/envs/jittor"


DEBIAN_OMPI = {"provider": "venv", "env_prefix": "/opt/distrun/venv", "mpi_prefix": "/usr",
               "openmpi_sysconfdir": "/etc/openmpi", "openmpi_pkglibdir": "/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"}


def test_every_open_mpi_process_of_a_run_reads_the_installations_files_never_the_users_home(tmp_path):
    """~/.openmpi/mca-params.conf and ~/.openmpi/components are the training user's, which a job
    writes: mpirun (its environment: it reads its files before its command line), its daemons (the
    command line, which mpirun passes on to them) and every rank (OMPI_MCA_ variables) are pointed
    at the folders role mpi_env recorded from ompi_info."""
    hosts = {"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "10.0.0.2"}}
    for h in hosts:
        _facts(tmp_path, h, ansible_local={"distrun": DEBIAN_OMPI})
    plan = plan_for(cluster(hosts, fact_cache=tmp_path), run_id="r1")
    own = {"mca_base_param_files": "/etc/openmpi/openmpi-mca-params.conf",
           "mca_base_component_path": "/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"}
    argv = mpirun_argv(plan)
    given = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert {k: given[k] for k in own} == own
    scripts = launch_scripts(plan)
    for name, value in own.items():
        assert f"export OMPI_MCA_{name}={value}\n" in scripts["n1"]
        assert dict(plan.program.env)[f"OMPI_MCA_{name}"] == value
    assert dict(plan.program.env)["PYTHONNOUSERSITE"] == "1"  # nor a module from ~/.local
    assert from_json(to_json(plan)) == plan  # plan.json keeps them for the run's restarts
    torch = plan_for(cluster(hosts, fact_cache=tmp_path), run_id="r2", launcher="torchrun")
    assert dict(torch.program.env)["OMPI_MCA_mca_base_param_files"] == own["mca_base_param_files"]


def test_without_ompi_infos_folders_no_parameter_is_guessed(tmp_path):
    """A fact from before role mpi_env recorded the folders, or one where ompi_info said nothing:
    no parameter (a wrong folder would leave Open MPI without its components)."""
    _facts(tmp_path, "n1", ansible_local={"distrun": {**DEBIAN_OMPI, "openmpi_pkglibdir": ""}})
    plan = plan_for(cluster({"n1": {"ansible_host": "10.0.0.1"}}, fact_cache=tmp_path), run_id="r1")
    assert plan.launch.openmpi_params == (("mca_base_param_files", "/etc/openmpi/openmpi-mca-params.conf"),)
    _facts(tmp_path, "n1", ansible_local={"distrun": {"provider": "venv", "env_prefix": "/opt/distrun/venv"}})
    plan = plan_for(cluster({"n1": {"ansible_host": "10.0.0.1"}}, fact_cache=tmp_path), run_id="r1")
    assert plan.launch.openmpi_params == () and "mca_base_param_files" not in mpirun_argv(plan)


def _rank_in_wrapper(plan, env: dict[str, str]) -> dict[str, str]:
    """The torch-style variables the rendered rank wrapper exports, run by bash with ``env``."""
    lines = [ln for ln in render_rank_wrapper(plan).splitlines()
             if ln.startswith(("export RANK=", "export WORLD_SIZE=", "export LOCAL_RANK="))]
    script = "\n".join(lines) + '\necho "$RANK $WORLD_SIZE $LOCAL_RANK"\n'
    out = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                         text=True, check=True).stdout.split()
    return dict(zip(("RANK", "WORLD_SIZE", "LOCAL_RANK"), out, strict=True))


@pytest.mark.parametrize("launcher, env, expected", [
    ("mpirun", {"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, ("4", "6", "1")),
    # Another launcher's variables never place a rank: a Slurm step's leftovers under mpirun.
    ("mpirun", {"SLURM_PROCID": "3", "SLURM_NTASKS": "9", "PMI_RANK": "3"}, ("0", "1", "0")),
    ("slurm", {"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2"}, ("5", "6", "2")),
    ("slurm", {"PMI_RANK": "2", "PMI_SIZE": "3"}, ("2", "3", "0")),
    ("slurm", {"OMPI_COMM_WORLD_RANK": "4"}, ("0", "1", "0")),
    # torchrun sets torch's names itself: they are kept, nothing else is read.
    ("torchrun", {"RANK": "7", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "OMPI_COMM_WORLD_RANK": "1"}, ("7", "8", "3")),
])
def test_the_rank_wrapper_places_a_rank_by_its_own_launchers_variables_only(launcher, env, expected):
    c = cluster(MIXED, slurm_enabled=True) if launcher == "slurm" else cluster(MIXED)
    plan = plan_for(c, run_id="r1", launcher=launcher)
    got = _rank_in_wrapper(plan, env)
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"]) == expected
