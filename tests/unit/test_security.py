"""What a job or a user cannot make distrun do: run ids that are paths, markup in text from
nodes, secrets in readable places, stop reporting success it did not have, collect reading
outside the run dir."""

from __future__ import annotations

import getpass
import io
import json
import os
import shlex
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from distrun.cli import main as cli
from distrun.errors import PlanError, UserError
from distrun.inventory.cluster import cluster_from_json
from distrun.launchers import mpirun_argv, sbatch_script, torchrun_argv
from distrun.planning import bundle, run_files
from distrun.planning.envnames import OPEN_MPI_PARAMS, check_env_key
from distrun.planning.jobplan import to_json
from distrun.planning.run_files import render_env_file, render_rank_wrapper
from distrun.run import collect, collect_rules, stop, train
from distrun.store import runs
from distrun.transport import ansible_bridge, nodeprog
from distrun.transport.playbook_events import HostProgress, PlaybookEvent, PlaybookResult
from distrun.ui import console as ui
from tests.harness.modules import load_file

from .conftest import REPO, distrun_bin
from .plans import plan_for

HOSTS = {"n1": {"ansible_host": "10.0.0.1", "slots": 1}, "n2": {"ansible_host": "10.0.0.2", "slots": 1}}
SECRET = "s3cr3t-'$(touch /tmp/pwned)'-value"


def cluster(**gv):
    data = {
        "_meta": {"hostvars": {h: {**gv, **hv} for h, hv in HOSTS.items()}},
        "all": {"children": ["head", "workers"]},
        "head": {"hosts": ["n1"]},
        "workers": {"hosts": list(HOSTS)},
    }
    return cluster_from_json(Path("/inv/hosts.yml"), data, None)


def make_run(verb: str, started: float, status: str = "succeeded", suffix: str = "0a0a") -> runs.Run:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    run_id = f"{stamp}-{verb}-{suffix}"
    d = runs.paths.runs_dir() / run_id
    d.mkdir(mode=0o700)
    r = runs.Run(d, runs.RunMeta(run_id=run_id, verb=verb, inventory="/inv", started=started, status=status))
    r.save()
    return r


# --- run ids --------------------------------------------------------------------------------

@pytest.mark.parametrize(("ref", "ok"), [
    ("20261123-001018-train-4630", True),
    ("20261123-0010", True),
    ("4630", True),
    ("last", True),
    ("../../tmp/x", False),
    ("/etc", False),
    ("a/b", False),
    ("..", False),
    ("[/x]", False),
    ("x;rm -rf ~", False),
    ("", False),
    ("a" * 65, False),
])
def test_only_run_ids_prefixes_and_last_name_a_run(ref, ok):
    if ok:
        assert runs.check_run_ref(ref) == ref
    else:
        with pytest.raises(UserError, match="is not a run id"):
            runs.check_run_ref(ref)


def test_a_planted_record_outside_the_runs_folder_is_never_loaded(tmp_path):
    planted = tmp_path / "x"
    planted.mkdir()
    (planted / "meta.json").write_text(json.dumps({"run_id": "x", "verb": "train", "inventory": "/evil", "started": 1}))
    runs.paths.runs_dir()
    with pytest.raises(UserError, match="not a run id"):
        runs.load_run(os.path.relpath(planted, runs.paths.runs_dir()))
    # A link or a record whose id is not its folder's name is not a run either.
    (runs.paths.runs_dir() / "20260101-000000-train-ffff").symlink_to(planted)
    assert runs.list_runs() == []


def test_a_prefix_matching_several_runs_is_ambiguous_and_lists_them():
    t = time.time() - 100
    a = make_run("train", t, suffix="aaaa")
    b = make_run("train", t, suffix="bbbb")
    with pytest.raises(UserError, match="ambiguous") as exc:
        runs.load_run(a.id[:15])
    assert a.id in str(exc.value) and b.id in str(exc.value)
    assert runs.load_run("bbbb").id == b.id
    with pytest.raises(UserError, match="not found"):
        runs.load_run("cccc")


def test_last_means_the_last_train_run_for_stop_and_logs():
    t = time.time() - 100
    train = make_run("train", t, suffix="aaaa")
    make_run("setup", t + 10, suffix="bbbb")
    assert runs.load_run("last", verb="train").id == train.id
    assert runs.load_run("last").meta.verb == "setup"


def test_prune_removes_old_finished_records_keeps_running_and_recent():
    now = time.time()
    old = make_run("train", now - 40 * 86400, suffix="aaaa")
    running = make_run("train", now - 40 * 86400, status="running", suffix="bbbb")
    recent = make_run("setup", now - 3600, suffix="cccc")
    removed = runs.prune_runs(runs.parse_duration("30d"), now=now)
    assert [r.id for r in removed] == [old.id]
    assert not old.dir.exists() and running.dir.exists() and recent.dir.exists()
    with pytest.raises(UserError, match="--older-than '30 days'"):
        runs.parse_duration("30 days")
    assert runs.parse_duration("12h") == 12 * 3600


def test_prune_on_the_command_line_says_what_it_removed(cli_env):
    old = make_run("train", time.time() - 3 * 86400, suffix="aaaa")
    res = subprocess.run([distrun_bin(), "runs", "--prune", "--older-than", "2d"], capture_output=True, text=True,
                         env=cli_env)
    assert res.returncode == 0, res.stderr
    assert f"removed {old.id} (train, succeeded)" in res.stdout
    assert "pruned 1 run record(s)" in res.stdout


# --- markup -------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["logs", "[/x]"], ["stop", "../../tmp/x"], ["logs", "[head]"]])
def test_hostile_run_names_end_in_one_line_not_a_traceback(cli_env, args):
    res = subprocess.run([distrun_bin(), *args], capture_output=True, text=True, env=cli_env)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distrun: error: ")
    assert "Traceback" not in res.stderr and "MarkupError" not in res.stderr
    assert repr(args[1]) in lines[0]


def test_brackets_survive_in_errors_and_node_output(monkeypatch):
    buffer = io.StringIO()
    out = Console(file=buffer, width=200, highlight=False)
    monkeypatch.setattr(ui, "err_console", out)
    monkeypatch.setattr(ui, "console", out)
    ui.fatal("host [head] said [/x] and [bold]no[/bold]")
    ui.warn("logs not collected from: [w1] ([/red])")
    result = PlaybookResult("playbooks/stop.yml", 2, "failed",
                            {"[n1]": HostProgress("[n1]", failed=1, last_error="task: [/oops] [red]x")}, Path("."))
    ui.print_summary(result, 1.0)
    text = buffer.getvalue()
    assert "host [head] said [/x] and [bold]no[/bold]" in text
    assert "logs not collected from: [w1] ([/red])" in text
    assert "[n1]: task: [/oops] [red]x" in text


# --- secrets and reserved keys ------------------------------------------------------------

@pytest.mark.parametrize("key", ["DISTRUN_RUN_ID", "DISTRUN_RUN_DIR", "distrun_run_id", "DISTRUN_X"])
def test_reserved_env_keys_are_refused(key):
    with pytest.raises(PlanError, match="DISTRUN_\\* variables are set by distrun"):
        check_env_key(key)
    with pytest.raises(PlanError, match="DISTRUN_"):
        plan_for(cluster(), run_id="r1", extra_env={key: "other-run"})


@pytest.mark.parametrize("key", ["OMPI_MCA_orte_launch_agent", "OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_rsh_agent",
                                 "OMPI_MCA_mca_base_param_files", "OMPI_MCA_mca_param_files",
                                 "OMPI_MCA_mca_base_component_path", "OMPI_MCA_mca_component_path"])
def test_the_launchers_own_mca_variables_are_refused_in_every_env_form(key, cli_env):
    """--env, the inventory's distrun_env or a project's file: mpirun's daemons would start another
    way than through the relay (the command line's --mca wins, so the value would be ignored), or
    Open MPI would read the files of the training user's home."""
    with pytest.raises(PlanError, match="leave it unset"):
        plan_for(cluster(), run_id="r1", extra_env={key: "/bin/sh -c"})
    res = subprocess.run([distrun_bin(), "train", "-i", "tests/golden/inventories/two-nodes", "--env", f"{key}=sh"],
                         capture_output=True, text=True, env=cli_env, cwd=REPO)
    assert res.returncode == 2
    assert res.stderr.strip().startswith(f"distrun: error: train: --env: {key}: ") and res.stderr.strip().endswith(
        "; leave it unset")


@pytest.mark.parametrize("param", ["orte_launch_agent", "plm_rsh_agent", "orte_rsh_agent", "mca_base_param_files",
                                   "mca_param_files", "mca_base_component_path", "mca_component_path"])
def test_the_launchers_own_mca_parameters_are_refused_in_launcher_args(param, cli_env):
    """The same parameters as --mca on mpirun's command line: one line naming the parameter."""
    res = subprocess.run([distrun_bin(), "train", "-i", "tests/golden/inventories/two-nodes", "--launcher", "mpirun",
                          "--launcher-args", f"--mca {param} x"], capture_output=True, text=True, env=cli_env, cwd=REPO)
    assert res.returncode == 2
    assert res.stderr.strip() == (f"distrun: error: --launcher-args '--mca {param}': distrun sets mpirun's {param} "
                                  f"itself ({OPEN_MPI_PARAMS[param]}); drop it")


def test_reserved_env_key_is_refused_at_parse_time(cli_env):
    res = subprocess.run([distrun_bin(), "train", "-i", "tests/golden/inventories/two-nodes", "--env",
                          "DISTRUN_RUN_ID=20260101-000000-train-ffff"], capture_output=True, text=True, env=cli_env, cwd=REPO)
    assert res.returncode == 2
    assert res.stderr.strip() == ("distrun: error: train: --env: DISTRUN_RUN_ID: DISTRUN_* variables are set by distrun "
                                  "itself; choose another name")


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "slurm"])
def test_env_values_stay_out_of_the_plan_argv_scripts_and_wrapper(launcher):
    plan = plan_for(cluster(), run_id="r1", launcher=launcher, workload="ddp", extra_env={"TOKEN": SECRET},
                      slurm={"partition": "p", "time": "10", "mode": "single"} if launcher == "slurm" else None)
    assert plan.program.user_env_keys == ("TOKEN",)
    assert SECRET not in json.dumps(to_json(plan))
    texts = [*run_files.launch_scripts(plan).values(), *run_files.plan_files(plan).values(), render_rank_wrapper(plan)]
    texts += [" ".join(mpirun_argv(plan))] if launcher == "mpirun" else []
    texts += [" ".join(torchrun_argv(plan, h)) for h in plan.placement.hosts] if launcher == "torchrun" else []
    texts += [sbatch_script(plan)] if launcher == "slurm" else []
    assert not [t for t in texts if SECRET in t]
    assert ". ./env.sh" in render_rank_wrapper(plan)


def test_env_file_is_0600_and_sources_to_the_exact_values(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    run = runs.new_run("train", tmp_path / "hosts.yml")
    plan = plan_for(cluster(), run_id=run.id, extra_env={"TOKEN": SECRET, "EMPTY": ""})
    vars_ = bundle.stage_vars(plan, run, run_files.plan_files(plan), run_files.launch_scripts(plan), None, False,
                            {"TOKEN": SECRET, "EMPTY": ""})
    env_file = Path(vars_["distrun_env_file"])
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert SECRET not in json.dumps({k: v for k, v in vars_.items() if k != "distrun_env_file"})
    assert SECRET not in Path(vars_["distrun_run_bundle"]).read_text()
    out = subprocess.run(["bash", "-c", f'. {env_file} && printf %s "$TOKEN|$EMPTY"'], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.stdout == f"{SECRET}|"
    assert not (tmp_path / "pwned").exists() and not Path("/tmp/pwned").exists()
    assert render_env_file({}).count("export") == 0
    # No --env: no file, and the wrapper sources nothing.
    assert bundle.stage_vars(plan, run, {}, {}, None, False, {})["distrun_env_file"] == ""


def test_run_record_keeps_only_the_ansible_environment(tmp_path):
    command = tmp_path / "command"
    command.write_text(json.dumps({"command": ["ansible-playbook"], "cwd": "/",
                                   "env": {"AWS_SECRET_ACCESS_KEY": "k", "GITHUB_TOKEN": "t", "HOME": "/root",
                                           "ANSIBLE_CONFIG": "/a.cfg", "PATH": "/bin"}}))
    ansible_bridge._scrub_command(command)
    data = json.loads(command.read_text())
    assert data["env"] == {"ANSIBLE_CONFIG": "/a.cfg", "PATH": "/bin"}
    assert data["command"] == ["ansible-playbook"]
    assert stat.S_IMODE(command.stat().st_mode) == 0o600


# --- stop ---------------------------------------------------------------------------------

# The node program's stop answer, as its one line on a node's stdout.
STOP_ANSWER = '{"verb": "stop", "run": "r", "stopped": %d, "killed": 0, "survived": []}'


def _stop_result(**hosts: HostProgress) -> PlaybookResult:
    return PlaybookResult("playbooks/stop.yml", 0, "successful", dict(hosts), Path("."))


def test_stop_counts_per_node_and_succeeds_only_when_every_node_answered():
    healthy = stop.stop_report(_stop_result(n1=HostProgress("n1", ok=2), n2=HostProgress("n2", ok=2)),
                              {"n1": STOP_ANSWER % 4, "n2": STOP_ANSWER % 0})
    assert healthy.stopped == {"n1": 4, "n2": 0} and healthy.missed == {} and healthy.rc == 0

    down = stop.stop_report(
        _stop_result(n1=HostProgress("n1", ok=2), n2=HostProgress("n2", unreachable=True, last_error="Gathering: timed out")),
        {"n1": STOP_ANSWER % 3})
    assert down.stopped == {"n1": 3}
    assert down.missed == {"n2": "unreachable: Gathering: timed out"} and down.rc == 1

    silent = stop.stop_report(_stop_result(n1=HostProgress("n1", ok=1)), {})
    assert silent.missed == {"n1": "no report from the stop step"} and silent.rc == 1

    # A process KILL could not end (in the kernel's uninterruptible sleep, say) is said, not counted as stopped.
    stuck = json.dumps({"verb": "stop", "run": "r", "stopped": 2, "killed": 1,
                        "survived": [{"pid": 77, "comm": "tr\x1b[2Japped", "why": "tag"}]})
    kept = stop.stop_report(_stop_result(n1=HostProgress("n1", ok=1)), {"n1": stuck})
    assert kept.stopped == {} and kept.rc == 1
    assert kept.missed["n1"].startswith("1 process(es) of the run outlived SIGKILL: 77 (tr") and "\x1b" not in kept.missed["n1"]
    forged = json.dumps({"verb": "stop", "stopped": 1, "survived": [{"pid": "1; rm", "comm": 5}]})
    assert stop.stop_report(_stop_result(n1=HostProgress("n1", ok=1)), {"n1": forged}).missed == {
        "n1": "1 process(es) of the run outlived SIGKILL: ? (5)"}


def test_stop_run_exits_non_zero_naming_the_node_it_could_not_reach(monkeypatch, capsys):
    r = make_run("train", time.time() - 10, status="running", suffix="aaaa")

    def fake_playbook(playbook, inventory, run_dir, *, extravars, on_event):
        assert extravars == {"distrun_run_id": r.id}
        on_event(PlaybookEvent("changed", "n1", "stop", data={"stdout": STOP_ANSWER % 5}))
        return _stop_result(n1=HostProgress("n1", ok=1, changed=1),
                            n2=HostProgress("n2", unreachable=True, last_error="ssh: connect timed out"))

    monkeypatch.setattr(stop, "run_playbook", fake_playbook)
    report = stop.stop_run("last")
    with pytest.raises(UserError, match="could not stop it on n2") as exc:
        raise report.refusal()
    assert exc.value.exit_code == 1
    result = CliRunner().invoke(cli.main, ["stop", "last"])
    assert result.exit_code == 1
    assert "n1: stopped 5 process(es)" in result.stdout
    assert runs.load_run(r.id).meta.status == "stopped"


def test_stop_refuses_a_run_that_is_not_a_train_run():
    r = make_run("setup", time.time() - 10, suffix="aaaa")
    with pytest.raises(UserError, match="only train runs"):
        stop.stop_run(r.id)


STOP_TASK = Path(__file__).resolve().parents[2] / "roles/job/tasks/stop.yml"


def test_stop_step_is_one_call_of_the_node_program_as_root_naming_the_training_user():
    import yaml

    task = yaml.safe_load(STOP_TASK.read_text())[1]
    # root: the only one that stops a unit (where the cluster has people, through sudo's one rule)
    assert task["become"] == "{{ not job_people }}" and "become_user" not in task
    raw = task["ansible.builtin.raw"]
    assert "-I -c" in raw and "'node' | distrun_node_source" in raw and " stop" in raw  # the one recipe's node.py
    assert "sudo -n {{ 'entry' | distrun_node_program | quote }} node stop" in raw
    assert "'user': job_user" in raw  # whose processes it may signal
    assert "kill" not in STOP_TASK.read_text() and "/proc" not in STOP_TASK.read_text()


@pytest.mark.usefixtures("alone_with_run_tags")
def test_stop_step_stops_only_its_run(tmp_path):
    """The stop step's command, rendered as the role renders it and run here as this user: the
    run's tagged process and its tagless child stop; another run's process survives, although
    the run's launcher file names its group."""
    import yaml
    from jinja2 import Environment

    task = yaml.safe_load(STOP_TASK.read_text())[1]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTRUN_")}
    run_id = f"unit-{os.getpid()}-stop"
    jinja = Environment()
    jinja.filters.update(quote=shlex.quote, to_json=json.dumps, distrun_node_source=nodeprog.text)
    command = jinja.from_string(task["ansible.builtin.raw"]).render(
        ansible_facts={"python": {"executable": sys.executable}}, job_run_id=run_id, job_run_dir=str(run_dir),
        job_stop_grace=3, job_user=getpass.getuser(), job_people=False)
    mine = subprocess.Popen(["bash", "-c", "env -u DISTRUN_RUN_ID sleep 300 & wait"], env={**env, "DISTRUN_RUN_ID": run_id})
    other = subprocess.Popen(["sleep", "300"], env={**env, "DISTRUN_RUN_ID": run_id + "-other"}, start_new_session=True)
    (run_dir / "attempts" / "0").mkdir(parents=True)
    (run_dir / "attempts" / "0" / "launcher-n1.pgid").write_text(f"{other.pid}\n")
    try:
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"verb": "stop", "run": run_id, "units": 0, "stopped": 2, "killed": 0, "survived": []}
        assert mine.wait(timeout=10) == -15
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


# --- collect ------------------------------------------------------------------------------

def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type = kind
    t.size = size
    return t


@pytest.mark.parametrize(("name", "kind", "ok"), [
    ("./ranks/1/rank.0/stdout", tarfile.REGTYPE, True),
    ("ranks", tarfile.DIRTYPE, True),
    ("/etc/passwd", tarfile.REGTYPE, False),
    ("../../.ssh/authorized_keys", tarfile.REGTYPE, False),
    ("ranks/../../x", tarfile.REGTYPE, False),
    ("root", tarfile.SYMTYPE, False),
    ("hard", tarfile.LNKTYPE, False),
    ("dev", tarfile.CHRTYPE, False),
    ("fifo", tarfile.FIFOTYPE, False),
])
def test_collect_member_filter(name, kind, ok):
    assert collect._safe(_info(name, kind)) is ok


def _local_cluster(user: str):
    data = {"_meta": {"hostvars": {"n1": {"ansible_connection": "local", "ansible_host": "127.0.0.1",
                                          "distrun_user": user}}},
            "all": {"children": ["head", "workers"]}, "head": {"hosts": ["n1"]}, "workers": {"hosts": ["n1"]}}
    return cluster_from_json(Path("/inv/hosts.yml"), data, None)


def test_collect_refuses_a_run_dir_replaced_by_a_link(tmp_path):
    import getpass

    runs_dir = tmp_path / "shared" / "runs"
    runs_dir.mkdir(parents=True)
    (runs_dir / "r1").symlink_to("/")
    dest = tmp_path / "dest"
    failed = collect.pull_run(_local_cluster(getpass.getuser()), str(runs_dir / "r1"), ["n1"], dest,
                              collect_rules.run_end_selection()).errors
    assert failed["n1"].kind == collect.Failure.REFUSED and "is a link" in failed["n1"].why
    assert not list(dest.rglob("*")) or all(p.is_dir() for p in dest.rglob("*"))
    # The runs folder replaced by a link moves every run dir elsewhere: refused too.
    real = tmp_path / "elsewhere" / "r2"
    real.mkdir(parents=True)
    (real / "f").write_text("x")
    (tmp_path / "shared2").mkdir()
    (tmp_path / "shared2" / "runs").symlink_to(tmp_path / "elsewhere")
    failed = collect.pull_run(_local_cluster(getpass.getuser()), str(tmp_path / "shared2" / "runs" / "r2"), ["n1"], dest,
                              collect_rules.run_end_selection()).errors
    assert failed["n1"].kind == collect.Failure.REFUSED
    assert not (dest / "n1" / "f").exists()


def test_collect_stops_at_the_byte_cap_with_a_clear_line(tmp_path):
    import getpass

    run_dir = tmp_path / "shared" / "runs" / "r1"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "a.log").write_bytes(b"a" * 1000)
    (run_dir / "ranks" / "big").write_bytes(os.urandom(300_000))
    dest = tmp_path / "dest"
    failed = collect.pull_run(_local_cluster(getpass.getuser()), str(run_dir), ["n1"], dest, collect_rules.run_end_selection(),
                              max_bytes=200_000).errors
    assert failed["n1"].kind == collect.Failure.CAPPED
    assert "stopped at the cap of 0.2 MiB" in failed["n1"].why and str(run_dir) in failed["n1"].why
    assert not (dest / "n1" / "ranks" / "big").exists()
    # Under the cap: everything arrives.
    assert collect.pull_run(_local_cluster(getpass.getuser()), str(run_dir), ["n1"], tmp_path / "d2",
                            collect_rules.run_end_selection()).errors == {}
    assert (tmp_path / "d2" / "n1" / "ranks" / "big").stat().st_size == 300_000


def test_collect_packs_as_root_with_the_training_users_rights():
    """Where the connection is root, the packer is root's (no process of the user's to trace) and
    takes the user's filesystem identity itself; only a login as that user runs it as that user."""
    command = collect.pack_command("/srv/d/runs/r1", "trainer", collect_rules.run_end_selection())
    assert command.startswith("c=") and 'if [ "$(id -u)" = 0 ]; then exec bash -c "$c"; ' in command
    assert '"user": "trainer"' in command and "pack.py" in command


def test_collect_limits_from_the_environment_are_checked(monkeypatch):
    monkeypatch.setenv("DISTRUN_COLLECT_MAX_MB", "5")
    assert train.collect_limits() == {"max_bytes": 5 << 20}
    monkeypatch.setenv("DISTRUN_COLLECT_MAX_MB", "lots")
    with pytest.raises(UserError, match="DISTRUN_COLLECT_MAX_MB='lots'"):
        train.collect_limits()


def test_fallback_collect_playbook_rejects_links_and_paths_outside_the_run_dir():
    import yaml

    tasks = yaml.safe_load((STOP_TASK.parent / "collect.yml").read_text())
    fetch = next(t for t in tasks if "ansible.builtin.fetch" in t)
    assert "'..' not in (item.path | relpath(job_run_dir)).split('/')" in fetch["when"]
    assert any("not _job_run_dir_stat.stat.islnk" in t.get("ansible.builtin.assert", {}).get("that", []) for t in tasks)
    assert all(t.get("become_user") == "{{ job_user }}" for t in tasks if "ansible.builtin.assert" not in t)


def test_in_sync_mode_each_node_is_told_to_pull_only_its_own_ranks_parts(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    run = runs.new_run("train", tmp_path / "hosts.yml")
    uneven = cluster_from_json(Path("/inv/hosts.yml"), {
        "_meta": {"hostvars": {"n1": {"ansible_host": "10.0.0.9", "slots": 2}, "n2": {"ansible_host": "10.0.0.10", "slots": 3}}},
        "all": {"children": ["head", "workers"]}, "head": {"hosts": ["n1"]}, "workers": {"hosts": ["n1", "n2"]}}, None)

    def parts(**kw):
        plan = plan_for(uneven, run_id=run.id, **kw)
        assert plan.program.partition_dir
        return bundle.stage_vars(plan, run, {}, {}, None, False, {})["distrun_partition_parts"]

    # mpirun: the hostfile's order, each host its slots.
    assert parts(workload="gcn") == {"n1": [0, 1], "n2": [2, 3, 4]}
    # torchrun's rendezvous numbers its agents by their --local-addr strings: "10.0.0.10" < "10.0.0.9".
    assert parts(workload="gcn-torch", launcher="torchrun") == {"n2": [0, 1, 2], "n1": [3, 4]}
    # Slurm orders the nodes of its allocation itself: every node pulls every part.
    assert parts(workload="gcn-torch", launcher="slurm", slurm={"mode": "single", "mpi": "pmix"}) == {}
    # A script needs no partition: no parts to pull.
    script = plan_for(uneven, run_id=run.id, workload=None, script="/tmp/x.py")
    assert bundle.stage_vars(script, run, {}, {}, None, False, {})["distrun_partition_parts"] == {}


# --- staging on a node (role job's files/stage.py, run as the training user) ------------------

def _role_module(role: str, name: str):
    """A role's Ansible module (roles/<role>/library/<name>.py), imported for its functions."""
    return load_file(REPO / "roles" / role / "library" / f"{name}.py")


def _stage_script():
    """Role job's stage script (roles/job/files/stage.py), imported for its functions."""
    return load_file(REPO / "roles" / "job" / "files" / "stage.py", "distrun_stage_script")


def _bundle(files: dict[str, str]) -> str:
    import base64
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def test_staging_writes_the_env_file_0600_in_a_private_run_dir_and_never_follows_a_link(tmp_path):
    stage = _stage_script().stage
    shared = tmp_path / "shared"
    run_dir = shared / "runs" / "r1"
    run_dir.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (run_dir / "env.sh").symlink_to(victim)  # planted by a job that could write the run dir
    params = {"bundle": _bundle({"run/hostfile": "n1 slots=1\n", "workloads/gcn.py": "print(1)\n"}),
              "env": f"export TOKEN='{SECRET}'", "run_dir": str(run_dir), "checkpoint_dir": str(shared / "ckpt" / "r1"),
              "shared_dir": str(shared), "workloads_digest": "abc"}
    assert stage(params) is True  # new workloads: the node changed
    env = run_dir / "env.sh"
    assert not env.is_symlink() and stat.S_IMODE(env.stat().st_mode) == 0o600
    assert env.read_text() == f"export TOKEN='{SECRET}'\n"
    assert victim.read_text() == "untouched\n"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o750
    assert stat.S_IMODE((shared / "ckpt" / "r1").stat().st_mode) == 0o750
    assert (run_dir / "hostfile").read_text() == "n1 slots=1\n"
    assert (shared / "workloads" / ".digest-abc").exists() and (shared / "workloads" / "gcn.py").exists()
    # The same workloads again: nothing copied, no change reported; no env: no env.sh written.
    assert stage({**params, "env": "", "run_dir": str(shared / "runs" / "r2")}) is False
    assert not (shared / "runs" / "r2" / "env.sh").exists()


@pytest.mark.parametrize("member", ["link", "dotdot", "absolute", "fifo"])
def test_staging_writes_nothing_a_bundle_holds_outside_its_own_folders(tmp_path, member):
    """The bundle is distrun's own, and still: a link, a device or fifo, or a name that leaves the
    run refuses the whole stage in one line, before anything is written."""
    import base64
    mod = _stage_script()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ok = tarfile.TarInfo("run/hostfile")
        ok.size = 3
        tar.addfile(ok, io.BytesIO(b"n1\n"))
        bad = tarfile.TarInfo({"link": "run/env.sh", "dotdot": "run/../../victim", "absolute": "/tmp/victim",
                               "fifo": "run/pipe"}[member])
        if member == "link":
            bad.type, bad.linkname = tarfile.SYMTYPE, str(tmp_path / "victim")
        elif member == "fifo":
            bad.type = tarfile.FIFOTYPE
        else:
            bad.size = 1
        tar.addfile(bad, io.BytesIO(b"x") if bad.isfile() else None)
    shared = tmp_path / "shared"
    params = {"bundle": base64.b64encode(buf.getvalue()).decode(), "env": "", "run_dir": str(shared / "runs" / "r1"),
              "checkpoint_dir": "", "shared_dir": str(shared), "workloads_digest": "abc"}
    with pytest.raises(mod.StageError, match="the run's bundle holds"):
        mod.stage(params)
    assert not shared.exists() and not (tmp_path / "victim").exists()


@pytest.mark.parametrize(("run_id", "safe"), [
    ("20261125-101010-train-ab12", True), ("r1", True), ("", False), ("..", False), (".", False),
    ("a/../../etc", False), ("x y", False), ("$(id)", False),
])
def test_staging_refuses_a_run_id_that_is_not_one_plain_folder_name(run_id, safe):
    """The run's folder is runs/<run id> under the shared folder: an id with a slash, or dots
    alone, would put the run's files (and its env file) anywhere."""
    assert _stage_script().safe_run_id(run_id) is safe


def test_a_run_reads_the_facts_setup_cached_without_gathering_them(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    from distrun import paths
    inventory = tmp_path / "hosts.yml"
    cache = paths.fact_cache_dir(inventory)
    (cache / "s1_n1").write_text('{"__payload__": "{}"}')
    (cache / ".s1_n1.tmp").write_text("half written")
    old = time.time() - 3 * 86400  # older than Ansible's fact cache timeout (a day)
    os.utime(cache / "s1_n1", (old, old))
    run_cache = tmp_path / "run" / "ansible" / "artifacts" / "x" / "fact_cache"
    ansible_bridge.seed_facts(run_cache, inventory)
    assert sorted(p.name for p in run_cache.iterdir()) == ["s1_n1"]
    seeded = run_cache / "s1_n1"
    assert seeded.read_text() == '{"__payload__": "{}"}'
    assert time.time() - seeded.stat().st_mtime < 60  # fresh: Ansible does not expire it
    assert stat.S_IMODE(seeded.stat().st_mode) == 0o600 and stat.S_IMODE(run_cache.stat().st_mode) == 0o700


# --- links a job planted where setup writes (role distrun's module distrun_no_links) ---------

def test_every_planted_link_is_named_with_its_target_and_the_fix_in_one_line(tmp_path):
    m = _role_module("distrun", "distrun_no_links")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "authorized_keys").symlink_to("/etc/distrun-victim-keys")
    (home / ".bashrc").write_text("# a file, not a link\n")
    paths = [str(home / ".ssh"), str(home / ".ssh" / "authorized_keys"), str(home / ".bashrc"), str(home / "missing")]
    found = m.links(paths)
    assert found == [(str(home / ".ssh" / "authorized_keys"), "/etc/distrun-victim-keys")]
    assert m.message(found, "node3") == (f"remove the link {home}/.ssh/authorized_keys on node3 "
                                         "(it points to /etc/distrun-victim-keys) and run distrun setup again")
    # A link to a folder is refused itself; paths below it are the kernel's business, as for root.
    (home / ".ssh2").symlink_to(home / ".ssh")
    assert [p for p, _ in m.links([str(home / ".ssh2"), str(home / ".ssh2" / "authorized_keys")])] == \
        [str(home / ".ssh2"), str(home / ".ssh2" / "authorized_keys")]


def test_known_hosts_gets_every_key_in_one_call_keeps_the_users_lines_and_replaces_a_rebuilt_nodes_key(tmp_path):
    m = _role_module("ssh_mesh", "distrun_known_hosts")
    mine = ["# the user's own", "github.com ssh-ed25519 AAAAgithub", "|1|hashed= ssh-ed25519 AAAAhashed"]
    old = ["node1,10.0.0.11 ssh-ed25519 AAAAold1", "node1 ecdsa-sha2-nistp256 AAAAecdsa1"]
    entries = ["node1,node1,10.0.0.11 ssh-ed25519 AAAAnew1", "node2,10.0.0.12 ssh-ed25519 AAAA2"]
    lines = m.merged(mine + old, entries)
    # The rebuilt node's old key of a managed type is gone; a key type distrun does not manage stays.
    assert lines == mine + ["node1 ecdsa-sha2-nistp256 AAAAecdsa1"] + entries
    assert m.merged(lines, entries) == lines  # converged: nothing to change
    path = tmp_path / "known_hosts"
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    path.symlink_to(victim)  # planted: replaced by a file, never written through
    m.write(str(path), lines)
    assert not path.is_symlink() and path.read_text().splitlines() == lines
    assert victim.read_text() == "root's\n"


def local_upload(tmp_path: Path, tag: str) -> dict:
    """A run's files uploaded for this machine's user, as 'distrun train' sends them ahead: the
    one-node cluster, its host and the run id, the bundle and env files, the gate and where the
    upload waits."""
    import pwd

    from distrun.inventory.cluster import cluster_from_json
    from distrun.run import staging

    me = pwd.getpwuid(os.getuid()).pw_name
    host = f"unit-{os.getpid()}-{tag}"
    inv = {"_meta": {"hostvars": {host: {"ansible_connection": "local", "ansible_host": "10.0.0.1", "slots": 1,
                                         "distrun_user": me}}},
           "all": {"children": ["head", "workers"]}, "head": {"hosts": [host]}, "workers": {"hosts": [host]}}
    cluster = cluster_from_json(Path("/inv/hosts.yml"), inv, None)
    run_id = f"20261125-000000-train-{os.getpid() % 10000:04d}"
    bundle_file = tmp_path / "bundle.b64"
    bundle_file.write_text(_bundle({"run/hostfile": "n1 slots=1\n", "workloads/gcn.py": "print(1)\n"}))
    env_file = tmp_path / "env.sh"
    env_file.write_text(f"export TOKEN='{SECRET}'\n")
    gate = tmp_path / "upload"
    assert SECRET not in staging.upload_command(me, run_id)
    staging.Upload(cluster, [host], run_id, bundle_file, str(env_file), gate).join()
    incoming = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "distrun" / "incoming" / f"{run_id}.json"
    return {"cluster": cluster, "host": host, "run_id": run_id, "bundle": bundle_file, "env": env_file, "gate": gate,
            "incoming": incoming}


def test_the_run_files_go_ahead_of_the_play_on_stdin_and_the_raw_stage_step_unpacks_them(tmp_path, monkeypatch):
    """distrun.run.staging and role job's files/stage.py together, on this machine as the training
    user: the upload keeps the run's variables (a secret) in a 0600 file of the user's own home,
    never on a command line; the stage step unpacks it, writes env.sh 0600 and removes the
    upload; a failed upload stages nothing and says which host and why; a refused run's upload
    is removed."""
    import subprocess
    import sys

    from distrun.run import staging

    up = local_upload(tmp_path, "s")
    cluster, host, run_id, gate, incoming = up["cluster"], up["host"], up["run_id"], up["gate"], up["incoming"]
    bundle_file, env_file = up["bundle"], up["env"]
    assert gate.read_text() == "ok\n"
    try:
        assert stat.S_IMODE(incoming.stat().st_mode) == 0o600 and stat.S_IMODE(incoming.parent.stat().st_mode) == 0o700
        shared = tmp_path / "shared"
        config = {"run_id": run_id, "run_dir": str(shared / "runs" / run_id), "checkpoint_dir": "", "shared_dir": str(shared),
                  "workloads_digest": "d1", "upload": gate.read_text().strip()}
        assert SECRET not in json.dumps(config)
        from distrun.transport import nodeprog
        script = nodeprog.text("stage")  # behind the node programs' shared head, as the stage step sends it
        done = subprocess.run([sys.executable, "-c", script, json.dumps(config)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"changed": True, "staged": run_id, "created": [config["run_dir"]]}
        # What the runner launches on: this node's answer that it unpacked this run.
        from distrun.run.starter import PlaybookEvent, staged_run
        assert staged_run(PlaybookEvent("changed", host, "stage", data={"stdout": done.stdout})) == run_id
        env = shared / "runs" / run_id / "env.sh"
        assert env.read_text() == f"export TOKEN='{SECRET}'\n" and stat.S_IMODE(env.stat().st_mode) == 0o600
        assert (shared / "runs" / run_id / "hostfile").read_text() == "n1 slots=1\n"
        assert not incoming.exists(), "the upload (with the secret) was left behind"
        # An upload that did not arrive: nothing is staged, and the line names the host and why.
        failed = subprocess.run([sys.executable, "-c", script, json.dumps({**config, "upload": f"{host}: no answer in 120 s",
                                                                         "run_dir": str(shared / "runs" / "other")})],
                                capture_output=True, text=True, timeout=60)
        assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1] == \
            f"the run's files did not reach the nodes: {host}: no answer in 120 s"
        assert not (shared / "runs" / "other").exists()
        # A run refused before its stage step: its upload is removed.
        staging.Upload(cluster, [host], run_id, bundle_file, str(env_file), gate).join()
        assert incoming.exists()
        staging.discard(cluster, [host], run_id)
        assert not incoming.exists()
    finally:
        incoming.unlink(missing_ok=True)
