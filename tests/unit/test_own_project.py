"""A user's own project run: the command and --prepare with the run's variables, --launcher-args
in every launcher's command, --hosts/--exclude, the rank environment's three sources, the
prepare step run for real on this machine, 'distrun init', and the CLI's one-line refusals."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distrun.errors import InventoryError, PlanError, UserError
from distrun.inventory.cluster import cluster_from_json, load_cluster
from distrun.inventory.scaffold import write_inventory
from distrun.launchers import mpirun_argv, sbatch_script, torchrun_argv
from distrun.launchers.slurm import multi_job_script
from distrun.planning.bundle import record_plan
from distrun.planning.jobenv import env_file_warning, inventory_env, read_env_file, run_env
from distrun.planning.needs import WORKLOAD_MODULES
from distrun.planning.plan import render_hostfile
from distrun.planning.run_files import render_rank_wrapper
from distrun.planning.selection import host_names, select
from distrun.planning.variables import VARIABLES, split_words, substitute, substitute_strict
from distrun.project.prepare import prepare_argv, run_prepare
from distrun.store.runs import new_run

from .conftest import REPO, distrun_bin
from .plans import plan_for

HOSTS = {"n1": {"ansible_host": "10.0.0.1", "slots": 2}, "n2": {"ansible_host": "10.0.0.2"}, "n3": {"ansible_host": "10.0.0.3"}}


def cluster(hosts=None, head="n1", **group_vars):
    hosts = hosts or HOSTS
    data = {"_meta": {"hostvars": {h: {**group_vars, **hv} for h, hv in hosts.items()}},
            "head": {"hosts": [head]}, "workers": {"hosts": list(hosts)}}
    return cluster_from_json(Path("/inv/prod"), data)


def project_plan(c=None, *, launcher="mpirun", command=("python", "-m", "pkg.train", "--parts", "{np}", "--cfg", "{x}"),
                 prepare=("python", "part.py", "--num_parts", "{np}", "--out", "{workdir}/parts"), launcher_args=(), **kw):
    return plan_for(c or cluster(), run_id="r1", launcher=launcher, command=command, workdir="/srv/distrun/workdirs/p-1",
                      prepare=prepare, launcher_args=launcher_args, **kw)


# ------------------------------------------------------------------ command, prepare, variables

def test_the_command_runs_exactly_as_given_with_the_run_variables_filled_in():
    plan = project_plan()
    # Not rewritten (no interpreter path, no mpi4py runner), only {np} filled in; {x} is no variable.
    assert plan.program.argv == ("python", "-m", "pkg.train", "--parts", "4", "--cfg", "{x}")
    assert plan.program.prepare == ("python", "part.py", "--num_parts", "4", "--out", "/srv/distrun/workdirs/p-1/parts")
    assert ("DISTRUN_WORKDIR", "/srv/distrun/workdirs/p-1") in plan.program.env
    wrapper = render_rank_wrapper(plan)
    assert wrapper.endswith('export PATH=/opt/distrun/venv/bin:"$PATH"\ncd /srv/distrun/workdirs/p-1\nexec "$@"\n')
    assert mpirun_argv(plan)[-8:] == [plan.wrapper, *plan.program.argv]


def test_every_variable_has_a_value_and_unknown_ones_are_refused_in_prepare():
    values = {k: f"<{k}>" for k in VARIABLES}
    assert substitute_strict(["{np}{{x}}", "{hosts}"], values, "--prepare") == ("<np>{x}", "<hosts>")
    with pytest.raises(PlanError, match=r"--prepare: unknown variable \{nparts\}; known: \{np\}, \{nodes\}"):
        substitute_strict(["--num_parts", "{nparts}"], values, "--prepare")
    assert substitute(["{nparts}", "{np}", '{"a": 1}'], values) == ("{nparts}", "<np>", '{"a": 1}')
    plan = project_plan(command=("echo", "{np}", "{nodes}", "{hosts}", "{head}", "{run_id}", "{run_dir}", "{workdir}",
                                 "{shared_dir}"))
    assert plan.program.argv[1:] == ("4", "3", "n1,n2,n3", "n1", "r1", "/srv/distrun/runs/r1", "/srv/distrun/workdirs/p-1",
                                "/srv/distrun")


def test_flag_text_is_split_like_a_shell_would_but_never_by_one():
    assert split_words("--mca btl_base_verbose 0 -x 'A=b c'", "--launcher-args") == ("--mca", "btl_base_verbose", "0", "-x", "A=b c")
    assert split_words("echo $(id) ; rm", "--prepare") == ("echo", "$(id)", ";", "rm")
    with pytest.raises(PlanError, match="--launcher-args \"--mca 'x\": No closing quotation"):
        split_words("--mca 'x", "--launcher-args")


# ------------------------------------------------------------------ --launcher-args

def test_launcher_args_follow_distruns_own_options_in_every_launcher():
    extra = ("--mca", "btl_base_verbose", "0")
    plan = project_plan(launcher_args=extra)
    argv = mpirun_argv(plan)
    assert argv[argv.index(plan.wrapper) - 3:argv.index(plan.wrapper)] == list(extra)

    t = project_plan(launcher="torchrun", launcher_args=("--rdzv-conf", "join_timeout=120", "--max-restarts=2"))
    targv = torchrun_argv(t, t.placement.hosts[1])
    assert targv.index("--max-restarts=0") < targv.index("--max-restarts=2") < targv.index("--no-python")
    assert targv[targv.index("--no-python") - 3:targv.index("--no-python")] == ["--rdzv-conf", "join_timeout=120", "--max-restarts=2"]

    s = project_plan(launcher="slurm", launcher_args=("--cpu-bind=cores", "--label"), slurm={"mode": "single"})
    srun = [ln for ln in sbatch_script(s).splitlines() if ln.startswith("srun --mpi")][0]
    words = shlex.split(srun)
    assert words[words.index(s.wrapper) - 2:words.index(s.wrapper) + 2] == ["--cpu-bind=cores", "--label", s.wrapper, "python"]
    m = project_plan(launcher="slurm", launcher_args=("--label",), slurm={"mode": "multi-job"})
    line = [ln for ln in multi_job_script(m, 1, m.placement.hosts[1]).splitlines() if ln.startswith("srun ")][0]
    assert line.startswith("srun --ntasks=1 --kill-on-bad-exit=1 --label ")
    assert line.count("--label") == 1  # srun's, not torchrun's
    assert "python -m pkg.train" in line  # the exact command, even where distrun's own Python loses mpi4py


def test_launcher_args_are_quoted_where_a_shell_reads_them():
    plan = project_plan(launcher_args=("-x", "A=$(touch /tmp/p); b"))
    from distrun.planning.run_files import launch_scripts
    script = launch_scripts(plan)["n1"]
    assert "'A=$(touch /tmp/p); b'" in script


# ------------------------------------------------------------------ --hosts / --exclude

def test_exclude_and_hosts_choose_the_workers_and_everything_follows():
    c = select(cluster(), exclude=["n3"])
    plan = plan_for(c, run_id="r1")
    assert [h.name for h in plan.placement.hosts] == ["n1", "n2"] and plan.placement.world_size == 3
    assert render_hostfile(plan).splitlines()[1:] == ["n1 slots=2", "n2 slots=1"]
    assert [n.name for n in c.nodes] == ["n1", "n2"]  # the preflight's hosts: n3 is not contacted
    only = select(cluster(), hosts=["n2,n3"])
    plan = plan_for(only, run_id="r1", launcher="torchrun")
    assert [h.name for h in plan.placement.hosts] == ["n2", "n3"]
    assert [n.name for n in only.nodes] == ["n1", "n2", "n3"]  # the head still stages and prepares
    # Rank 0 is on n2, so torch's store and torchrun's rendezvous are there.
    assert plan.placement.master_addr == "10.0.0.2"
    assert "--rdzv-endpoint=10.0.0.2:29500" in torchrun_argv(plan, plan.placement.hosts[1])
    assert host_names(["a,b", "b", " c "]) == ("a", "b", "c")


@pytest.mark.parametrize("kw,expected", [
    ({"exclude": ["n9"]}, "--exclude n9: no such host in inventory /inv/prod (its hosts: n1, n2, n3)"),
    ({"hosts": ["n1,n4"]}, "--hosts n4: no such host in inventory /inv/prod"),
    ({"exclude": ["n1,n2,n3"]}, "--exclude n1,n2,n3 leaves no host to run ranks on in inventory /inv/prod"),
])
def test_unknown_hosts_are_refused_naming_the_inventory(kw, expected):
    with pytest.raises(PlanError) as err:
        select(cluster(), **kw)
    assert str(err.value).startswith(expected)


def test_a_head_that_runs_no_ranks_cannot_be_chosen_as_a_worker():
    data = {"_meta": {"hostvars": {"h": {}, "w": {}}}, "head": {"hosts": ["h"]}, "workers": {"hosts": ["w"]}}
    c = cluster_from_json(Path("/inv/x"), data)
    with pytest.raises(PlanError, match="--hosts h: h runs no ranks in inventory /inv/x"):
        select(c, hosts=["h"])


# ------------------------------------------------------------------ the rank environment

def test_rank_variables_come_from_the_inventory_the_env_file_and_env_in_that_order(tmp_path):
    (tmp_path / ".distrun_env").write_text(
        "# the project's\nexport NCCL_DEBUG=WARN\nTOKEN='s3cr3t value'\nEMPTY=\nURL=http://x?a=b\n")
    (tmp_path / ".distrun_env").chmod(0o600)
    c = cluster(distrun_env={"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": 1, "FLAG": True})
    assert inventory_env(c) == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1", "FLAG": "true"}
    env = run_env(c, tmp_path, {"OMP_NUM_THREADS": "4"})
    assert env == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "4", "FLAG": "true", "TOKEN": "s3cr3t value", "EMPTY": "",
                   "URL": "http://x?a=b"}
    assert env_file_warning(tmp_path) is None
    (tmp_path / ".distrun_env").chmod(0o644)
    assert "readable by other users of this machine (mode 0644)" in (env_file_warning(tmp_path) or "")


def test_a_run_says_first_that_its_project_env_file_is_readable_by_others(tmp_path, monkeypatch):
    """docs/guide/your-own-project.md: distrun warns when .distrun_env is readable by other users."""
    from distrun.planning.request import JobRequest, ProgramRequest
    from distrun.run import train

    env = tmp_path / ".distrun_env"
    env.write_text("TOKEN=s3cr3t\n")
    env.chmod(0o644)
    said: list[str] = []

    class Told(train.Listener):
        def warn(self, message: str) -> None:
            said.append(message)

    def planned_no_further(*args, **kwargs):
        raise PlanError("planned no further")

    monkeypatch.setattr(train.EarlyPlaybook, "for_training_run", staticmethod(lambda *a, **k: None))
    monkeypatch.setattr(train, "load_noting", lambda request: (cluster(), []))  # no node drained
    monkeypatch.setattr(train, "plan_attempt", planned_no_further)
    request = JobRequest(inventory=tmp_path / "hosts.yml", program=ProgramRequest(args=("python", "t.py"), workdir=tmp_path))
    with pytest.raises(PlanError):
        train.run_job(request, Told())
    assert said == [f"{env} is readable by other users of this machine (mode 0644); it may hold secrets: chmod 600 {env}"]
    env.chmod(0o600)
    said.clear()
    with pytest.raises(PlanError):
        train.run_job(request, Told())
    assert said == []


def test_values_never_reach_the_plan_the_scripts_or_the_commands(tmp_path, private_state):
    c = cluster()
    plan = plan_for(c, run_id="r1", command=("python", "t.py"), workdir="/w", prepare=("python", "p.py"),
                      extra_env={"TOKEN": "s3cr3t"})
    assert plan.program.user_env_keys == ("TOKEN",)
    run = new_run("train", Path("/inv/prod"))
    from distrun.planning.run_files import launch_scripts, plan_files
    record_plan(run, plan, plan_files(plan), launch_scripts(plan), {"prepare": shlex.join(prepare_argv(c.head, plan))})
    for f in run.dir.iterdir():
        assert "s3cr3t" not in f.read_text(), f
    assert ". ./env.sh" in render_rank_wrapper(plan)


@pytest.mark.parametrize("gv,expected", [
    ({"distrun_env": ["A=1"]}, "distrun_env must be a mapping of NAME: value"),
    ({"distrun_env": {"BAD-NAME": "1"}}, "distrun_env: 'BAD-NAME' is not a valid environment variable name"),
    ({"distrun_env": {"DISTRUN_RUN_ID": "x"}}, "DISTRUN_* variables are set by distrun itself"),
    ({"distrun_env": {"A": {"b": 1}}}, "distrun_env: A needs a plain value"),
])
def test_bad_inventory_variables_are_refused_naming_the_inventory(gv, expected):
    with pytest.raises(InventoryError) as err:
        inventory_env(cluster(**gv))
    assert str(err.value).startswith("inventory /inv/prod: ") and expected in str(err.value)


@pytest.mark.parametrize("text,expected", [
    ("A=1\nno equals here\n", "line 2: write KEY=VALUE"),
    ("1ABC=x\n", "line 1: '1ABC' is not a valid environment variable name"),
    ("DISTRUN_X=1\n", "line 1: 'DISTRUN_X' is refused"),
])
def test_bad_env_file_lines_are_refused_with_their_line(tmp_path, text, expected):
    f = tmp_path / ".distrun_env"
    f.write_text(text)
    with pytest.raises(UserError) as err:
        read_env_file(f)
    assert str(err.value).startswith(f"{f} {expected}")


# ------------------------------------------------------------------ --prepare, run for real

def test_prepare_runs_in_the_workdir_with_the_runs_env_from_stdin_and_its_exit_code(tmp_path):
    """On this machine through the same shell a local head gets: output streamed, rc returned."""
    workdir = tmp_path / "shared" / "workdirs" / "p-1"
    workdir.mkdir(parents=True)
    here = cluster({"n1": {"ansible_connection": "local", "slots": 2}}, distrun_user=getpass.getuser(),
                   distrun_shared_dir=str(tmp_path / "shared"))
    plan = plan_for(here, run_id="r1", command=("python", "t.py"), workdir=str(workdir),
                      prepare=("sh", "-c", 'echo "np=$1 in $(pwd) token=$TOKEN run=$DISTRUN_RUN_ID"; echo {np} > parts.txt', "sh", "{np}"),
                      extra_env={"TOKEN": "s3cr3t"})
    assert not any("s3cr3t" in a for a in prepare_argv(here.head, plan))
    lines: list[str] = []
    rc = run_prepare(here.head, plan, "export TOKEN='s3cr3t'\n", lines.append)
    assert rc == 0, lines
    assert lines == [f"np=2 in {workdir} token=s3cr3t run=r1"]
    assert (workdir / "parts.txt").read_text() == "2\n"
    assert oct((tmp_path / "shared" / "runs" / "r1").stat().st_mode & 0o777) == "0o750"
    failing = plan_for(here, run_id="r2", command=("x",), workdir=str(workdir), prepare=("sh", "-c", "echo no data >&2; exit 3"))
    out: list[str] = []
    assert run_prepare(here.head, failing, "", out.append) == 3 and out == ["no data"]


# ------------------------------------------------------------------ distrun init, sample-prod

def test_init_writes_an_inventory_ansible_reads_and_refuses_to_overwrite(tmp_path):
    written = write_inventory(tmp_path, "prod", "w1=10.0.0.11", "w1, w2=10.0.0.12,on=10.0.0.13", "admin")
    c = load_cluster(tmp_path / "prod")
    assert c.head.name == "w1" and [n.name for n in c.workers] == ["w1", "on", "w2"]
    assert {n.name: n.address for n in c.workers} == {"w1": "10.0.0.11", "w2": "10.0.0.12", "on": "10.0.0.13"}
    assert c.group_vars["ansible_user"] == "admin" and c.user == "distrun"
    assert [f.name for f in written.files] == ["hosts.yml", "all.yml"]
    assert written.next_commands[0].startswith(f"distrun setup --inventory {tmp_path / 'prod'}")
    with pytest.raises(UserError, match="already exists; choose another name or remove it"):
        write_inventory(tmp_path, "prod", "w1", "w1")


@pytest.mark.parametrize("args,expected", [
    (("x y", "w1", "w1"), "name the inventory with letters"),
    (("p", "w 1", "w1"), "--head 'w 1': 'w 1' is not a host name"),
    (("p", "w1=-oProxyCommand=x", "w1"), "is neither an IP address nor a DNS name"),
    (("p", "w1=10.0.0.1", "w1=10.0.0.2"), "w1 was given as 10.0.0.1 already"),
    (("p", "w1", "w2,w2"), "w2 is listed twice"),
    (("p", "w1", " , "), "--workers: name at least one host"),
])
def test_init_refuses_bad_names_in_one_line_and_writes_nothing(tmp_path, args, expected):
    with pytest.raises(UserError, match=expected.replace("(", r"\(")):
        write_inventory(tmp_path, *args)
    assert not (tmp_path / args[0]).exists()


def _packages(path: Path) -> tuple[set[str], set[str]]:
    gv = yaml.safe_load(path.read_text())
    names = {p.split("=")[0].split("<")[0].split(">")[0].strip() for p in gv.get("mpi_env_packages", [])}
    return names, set(gv.get("base_packages_extra", []))


@pytest.mark.parametrize("source", ["sample-prod", "init", "test"])
def test_inventories_we_ship_or_write_have_what_the_default_workload_needs(tmp_path, source):
    """The default workload (gcn) imports jittor and pymetis; Jittor compiles with g++ against
    the Python headers. inventory/test is what the cluster tests run it with."""
    if source == "init":
        write_inventory(tmp_path, "new", "w1", "w1")
        path = tmp_path / "new" / "group_vars" / "all.yml"
    else:
        path = REPO / "inventory" / source / "group_vars" / "all.yml"
    modules, os_packages = _packages(path)
    assert set(WORKLOAD_MODULES["gcn"]) <= modules
    assert {"g++", "python3-dev"} <= os_packages


# ------------------------------------------------------------------ the CLI

def _cli(args: list[str], env: dict, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([distrun_bin(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


TWO = "tests/golden/inventories/two-nodes"


@pytest.mark.parametrize("args,expected", [
    (["--workdir", "{t}/nope", "--", "python", "x.py"], "--workdir {t}/nope: no such folder"),
    (["--workdir", "{t}"], "--workdir {t} needs the command every rank runs, after --"),
    (["--workdir", "{t}", "--script", "{t}/x.py", "--", "python"], "--script and --workdir: give one"),
    (["--prepare", "python p.py"], "--prepare runs in your project folder: pass it with --workdir DIR"),
    (["--launcher-args", "--mca 'x", "--workdir", "{t}", "--", "p"], "--launcher-args \"--mca 'x\": No closing quotation"),
    (["--exclude", "w9", "--workdir", "{t}", "--", "p"], "--exclude w9: no such host in inventory"),
    (["--prepare", "p --n {nparts}", "--workdir", "{t}", "--", "p"], "--prepare: unknown variable {nparts}"),
])
def test_bad_project_flags_give_one_clear_line(cli_env, tmp_path, args, expected):
    (tmp_path / "x.py").write_text("")
    res = _cli(["train", "-i", TWO, "--dry-run", *[a.replace("{t}", str(tmp_path)) for a in args]], cli_env)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("distrun: error: ") and expected.replace("{t}", str(tmp_path)) in lines[0]


def test_dry_run_shows_the_sync_the_prepare_and_the_launcher_args(cli_env, tmp_path):
    project = tmp_path / "project"  # beside the test's distrun home, not around it
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "m.py").write_text("x = 1\n")
    (project / ".gitignore").write_text("data/\n")
    res = _cli(["train", "-i", TWO, "--workdir", str(project), "--exclude", "w2", "--launcher-args",
                "--mca btl_base_verbose 0", "--prepare", "python part.py --num_parts {np}", "--dry-run", "--",
                "python", "-m", "pkg.train", "--num_parts", "{np}"], cli_env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "world size:  2 rank(s) on 1 host(s)" in out  # w1 alone (slots=2)
    assert f"workdir:     {project} -> /shared/workdirs/" in out and "(2 files, " in out
    assert "# workdir sync: " in out and "'--filter=- data/'" in out
    assert "# prepare (on w1 as trainer, in /shared/workdirs/" in out and "python part.py --num_parts 2" in out
    assert "--mca btl_base_verbose 0 /shared/runs/DRYRUN/rank-env.sh python -m pkg.train --num_parts 2" in out


def test_init_prints_the_next_command_and_a_second_init_is_refused(cli_env, tmp_path):
    res = _cli(["init", "lab", "--head", "w1=10.0.0.11", "--workers", "w1,w2=10.0.0.12", "--user", "admin"], cli_env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "wrote inventory/lab/hosts.yml" in res.stdout and "distrun setup --inventory lab" in res.stdout
    again = _cli(["init", "lab", "--head", "w1", "--workers", "w1"], cli_env, cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.strip() == (
        "distrun: error: inventory/lab already exists; choose another name or remove it (distrun init never overwrites)")
    assert json.loads(subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", "inventory/lab",
                                      "--list"], cwd=tmp_path, capture_output=True, text=True, check=True,
                                     env={**os.environ}).stdout)["head"]["hosts"] == ["w1"]
