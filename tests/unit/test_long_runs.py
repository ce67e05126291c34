"""Runs that outlive the terminal, run for real in local shells: a run's state read from its
"node" (this machine), records checked against it, the claim on busy hosts, restarts."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import cluster_from_json
from distrun.launchers.mpirun import Mpirun
from distrun.planning.jobplan import to_json
from distrun.planning.run_files import launch_scripts
from distrun.run import busy, liveness, pending, reconcile, restarts
from distrun.run.logs import log_text
from distrun.store import controller, runs
from distrun.transport import rundir

from .conftest import distrun_bin
from .plans import plan_for

# These tests start processes tagged with a run id on this machine, or claim it as a host (a claim
# counts every tagged process of the user there): a test process beside this one (the suite runs
# the unit tests on two Pythons at once) takes turns with them.
pytestmark = pytest.mark.usefixtures("alone_with_run_tags")

ME = getpass.getuser()


def local_cluster(names=("n1",), slots=1):
    hosts = {h: {"ansible_connection": "local", "ansible_host": f"10.0.0.{i}", "slots": slots, "distrun_user": ME}
             for i, h in enumerate(names, 1)}
    inv = {"_meta": {"hostvars": hosts}, "all": {"children": ["head", "workers"]},
           "head": {"hosts": [names[0]]}, "workers": {"hosts": list(names)}}
    return cluster_from_json(Path("/inv/hosts.yml"), inv, None)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def record(run_id: str, verb: str = "train", **meta) -> runs.Run:
    """A record as a distrun process that was killed leaves it: running, its controller gone."""
    run = runs.new_run(verb, Path("/inv/hosts.yml"), run_id)
    run.meta.controller = {**controller.identity(), "pid": dead_pid()}
    for key, value in meta.items():
        setattr(run.meta, key, value)
    run.save()
    return run


class LocalRun:
    """A train run launched on this machine with distrun's own launch script; the launcher's
    command is replaced by a shell line (no mpirun needed)."""

    def __init__(self, tmp_path: Path, monkeypatch, program: str, run_id: str = "20260101-000000-train-aaaa") -> None:
        self.cluster = local_cluster()
        plan = plan_for(self.cluster, run_id=run_id, launcher="mpirun", script="job.py")
        self.plan = dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, user=ME), shared_dir=str(tmp_path / "shared"))
        monkeypatch.setattr(Mpirun, "command", lambda self_, plan_, host: ["bash", "-c", program])
        self.dir = Path(rundir.attempt_path(self.plan))  # the attempt's own folder
        self.dir.mkdir(parents=True)
        for host, text in launch_scripts(self.plan).items():
            (self.dir / f"launch-{host}.sh").write_text(text)
        self.run = record(run_id)
        self.run.write("plan.json", json.dumps(to_json(self.plan)))

    def launch(self) -> None:
        # As the job role starts it: detached, in its own session.
        subprocess.run(["setsid", "-f", "bash", "launch-n1.sh"], cwd=self.dir, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not (self.dir / "launcher-n1.pid").is_file() and time.monotonic() < deadline:
            time.sleep(0.05)

    def state(self) -> liveness.ClusterState:
        return liveness.read(self.cluster, self.plan)

    def cache(self) -> reconcile.ClusterCache:
        cache = reconcile.ClusterCache()
        cache._clusters[self.run.meta.inventory] = self.cluster
        return cache

    def wait_exit(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not (self.dir / "exitcode-n1").exists() and time.monotonic() < deadline:
            time.sleep(0.1)


# ------------------------------------------------------------------ records that never lie

def test_distrun_stop_has_the_runs_own_controller_stop_it_and_says_so(private_state, tmp_path):
    """A run whose distrun process still starts or follows it: 'distrun stop' asks in the record,
    sends that process SIGTERM (only while it is that process) and waits for it; the controller
    then records the run as stopped by 'distrun stop', exit 130."""
    from distrun.run.stop import STOPPED, interruption, stop_controller

    said = tmp_path / "said"
    follower = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(said)!r}, 'w').write('TERM'), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    assert follower.stdout is not None and follower.stdout.readline().strip() == "ready"
    run = runs.new_run("train", Path("/inv/hosts.yml"))
    run.meta.controller = controller.identity(follower.pid)
    run.save()
    assert interruption(run) != (ExitCode.INTERRUPTED, STOPPED)  # nobody asked yet
    assert stop_controller(run) == f"pid {follower.pid} on {controller.identity()['host']}"
    assert follower.wait(timeout=10) == 0 and said.read_text() == "TERM"
    assert run.stop_asked and interruption(run) == (ExitCode.INTERRUPTED, STOPPED)
    # A pid reused by another process is never signalled; an ended run has no controller to stop.
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        run.meta.controller = {**controller.identity(stranger.pid), "start": 1}
        run.save()
        assert stop_controller(run) == "" and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    run.finish(0)
    assert stop_controller(run) == ""


def test_distrun_stop_counts_what_the_controller_stopped_before_its_own_sweep(private_state, monkeypatch):
    """The controller stopped the run's processes (its stop play kept the counts in the record);
    'distrun stop' then finds none left, and says how many the run's stop ended, never '0'."""
    from distrun.run import stop
    from distrun.transport.playbook_events import HostProgress, PlaybookEvent, PlaybookResult

    answer = '{"verb": "stop", "run": "r", "stopped": %d, "killed": 0, "survived": []}'
    counts = iter([{"n1": 4, "n2": 2}, {"n1": 0, "n2": 1}])

    def play(playbook, inventory, run_dir, *, extravars, on_event, **_):
        for host, n in next(counts).items():
            on_event(PlaybookEvent("ok", host, "stop", data={"stdout": answer % n}))
        return PlaybookResult(playbook, 0, "successful", {h: HostProgress(h, ok=1) for h in ("n1", "n2")}, run_dir)

    monkeypatch.setattr(stop, "run_playbook", play)
    run = runs.new_run("train", Path("/inv/hosts.yml"))
    assert stop.stop_play(run, Path("/inv/hosts.yml"), None).stopped == {"n1": 4, "n2": 2}  # the controller's
    run.meta.controller = {**controller.identity(), "pid": dead_pid()}
    run.save()
    monkeypatch.setattr(stop, "stop_controller", lambda r: "pid 1 on here")
    report = stop.stop_run(run.id)
    assert report.stopped == {"n1": 4, "n2": 3} and report.followed_by == "pid 1 on here"


def test_a_record_keeps_its_controller_and_knows_when_it_is_gone(private_state):
    run = runs.new_run("train", Path("/inv/hosts.yml"))
    assert controller.alive(run.meta.controller) is True  # this test process
    run.meta.controller = {**controller.identity(), "pid": dead_pid()}
    assert controller.alive(run.meta.controller) is False
    # A pid that is alive but started at another time is not the controller (pid reuse).
    assert controller.alive({**controller.identity(), "start": 1}) is False
    assert controller.alive({**controller.identity(), "host": "another-machine"}) is None
    run.finish(0)
    assert runs.read_meta(run.dir).controller is None


@pytest.mark.parametrize(("text", "said"), [
    ("{not json", "is unreadable"),
    ('["a list"]', "holds no JSON object"),
    ('{"run_id": "X", "verb": "train", "inventory": "i", "started": "yesterday"}', "started='yesterday' is not what distrun expects"),
    ('{"format": 9, "run_id": "X", "verb": "train", "inventory": "i", "started": {"t": 1}}',
     "written by a newer distrun (record format 9; this one reads 1): upgrade distrun"),
    ('{"verb": "train"}', "lacks run_id, inventory, started"),
])
def test_an_unreadable_record_is_one_error_naming_it_and_the_fix(private_state, text, said):
    run_id = "20260101-000000-train-bad1"
    folder = runs.new_run("train", Path("/inv"), run_id).dir
    (folder / "meta.json").write_text(text.replace('"X"', f'"{run_id}"'))
    with pytest.raises(runs.RecordError) as caught:
        runs.read_meta(folder)
    assert said in str(caught.value) and str(folder) in str(caught.value) and "\n" not in str(caught.value)
    bad: dict[str, runs.RecordError] = {}
    assert runs.list_runs(bad) == [] and list(bad) == [run_id]


def test_every_verb_says_an_unreadable_record_in_one_line(private_state, cli_env):
    run_id = "20260101-000000-train-bad1"
    folder = runs.new_run("train", Path("/inv"), run_id).dir
    (folder / "meta.json").write_text("{not json")
    for args in (["runs"], ["logs", run_id], ["status", run_id], ["attach", "bad1"], ["stop", run_id]):
        out = subprocess.run([distrun_bin(), *args], capture_output=True, text=True, env=cli_env, timeout=60)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "is unreadable" in lines[0] and str(folder) in lines[0], (args, out.stderr)
        assert out.returncode == (0 if args == ["runs"] else 2), (args, out)


def test_a_newer_record_with_unknown_fields_is_read(private_state):
    run = runs.new_run("train", Path("/inv"))
    data = json.loads((run.dir / "meta.json").read_text())
    (run.dir / "meta.json").write_text(json.dumps({**data, "format": 2, "priority": "high", "labels": {"a": 1}}))
    assert runs.read_meta(run.dir).run_id == run.id


def test_records_whose_distrun_process_died_are_shown_lost_and_corrected(private_state, cli_env):
    setup = record("20260101-000000-setup-aaaa", verb="setup")
    unplanned = record("20260101-000001-train-bbbb")
    out = subprocess.run([distrun_bin(), "runs"], capture_output=True, text=True, env=cli_env, timeout=60)
    assert out.returncode == 0, out.stderr
    for run in (setup, unplanned):
        row = next(line for line in out.stdout.splitlines() if run.id in line)
        assert " lost " in row, row
        assert runs.read_meta(run.dir).status == "lost"
    # 'logs last' no longer targets a run that waits forever: it is over.
    logs = subprocess.run([distrun_bin(), "logs", "last", "-f"], capture_output=True, text=True, env=cli_env, timeout=60)
    assert logs.returncode == 2 and "launcher.log does not exist" in logs.stderr


def test_partition_with_a_bad_np_leaves_no_running_record(private_state, cli_env):
    out = subprocess.run([distrun_bin(), "partition", "-i", "tests/golden/inventories/two-nodes", "--np", "99"],
                         capture_output=True, text=True, env=cli_env, timeout=120, cwd=Path(__file__).parents[2])
    assert out.returncode == 2 and "--np 99 is more than the 3 slots" in out.stderr
    assert all(r.meta.status != "running" for r in runs.list_runs())


# ------------------------------------------------------------------ a run's live state

def test_the_nodes_say_running_then_the_real_exit_code_and_the_record_is_corrected(tmp_path, monkeypatch):
    # The job runs until the test releases it (at most a minute), however slow this machine is.
    release = tmp_path / "release"
    local = LocalRun(tmp_path, monkeypatch, "mkdir -p started && : > started/rank-0; echo hello; "
                     f"for _ in $(seq 1200); do [ -e {release} ] && break; sleep 0.05; done; exit 3")
    local.launch()
    state = local.state()
    assert state.state == "running", state
    assert state.hosts["n1"].launcher == "running" and state.hosts["n1"].procs >= 1
    assert state.started == (0,)
    shown = reconcile.view(local.run, local.cache())
    assert shown.state == "running" and "no distrun process follows it" in shown.detail
    assert runs.read_meta(local.run.dir).status == "running"

    release.touch()
    local.wait_exit()
    state = local.state()
    assert (state.state, state.rc) == ("failed", 3)
    shown = reconcile.view(local.run, local.cache())
    meta = runs.read_meta(local.run.dir)
    # The record now says how it ended: distrun's exit code, the launcher's in the summary;
    # its logs are still on the node until 'distrun attach' brings them.
    assert (shown.state, meta.status, meta.rc, meta.collected) == ("failed", "failed", 1, False)
    assert "failed rc=3" in meta.summary and "distrun attach" in shown.detail


def test_a_launcher_that_vanished_without_an_exit_code_is_lost(tmp_path, monkeypatch):
    local = LocalRun(tmp_path, monkeypatch, "true")
    (local.dir / "launcher-n1.pid").write_text(f"{dead_pid()}\n")
    state = local.state()
    assert state.state == "lost" and "ended without writing its exit code" in state.reason
    assert reconcile.view(local.run, local.cache()).state == "lost"
    assert runs.read_meta(local.run.dir).status == "lost"


def test_a_host_that_does_not_answer_is_unreachable_and_the_record_is_kept(tmp_path, monkeypatch):
    local = LocalRun(tmp_path, monkeypatch, "true")
    monkeypatch.setattr(liveness, "_probe_one", lambda node, plan, t: liveness.HostState(node.name, reached=False,
                                                                                       error="ssh: connect timed out"))
    shown = reconcile.view(local.run, local.cache())
    assert shown.state == "unreachable" and "cannot reach n1 (ssh: connect timed out)" in shown.detail
    assert runs.read_meta(local.run.dir).status == "running"


def state_answer(words: str, procs: int, started: list[int]) -> str:
    """The node program's state answer for words like "launcher=exited rc=1" (rc as given: a
    word that is no number stays a string, as a hostile node could send it)."""
    said = dict(w.split("=", 1) for w in words.split())
    rc = said.get("rc")
    value = int(rc) if rc is not None and rc.lstrip("-").isdigit() else rc
    return json.dumps({"verb": "state", "dir": True, "launcher": said["launcher"], "rc": value,
                       "procs": procs, "started": started}) + "\n"


@pytest.mark.parametrize(("launcher", "answers", "state", "rc"), [
    ("mpirun", {"n1": "launcher=running", "n2": "launcher=none"}, "running", None),
    ("mpirun", {"n1": "launcher=exited rc=0", "n2": "launcher=none"}, "succeeded", 0),
    ("mpirun", {"n1": "launcher=exited rc=137", "n2": None}, "failed", 137),
    ("mpirun", {"n1": None, "n2": "launcher=none"}, "unreachable", None),
    ("torchrun", {"n1": "launcher=running", "n2": None}, "running", None),
    ("torchrun", {"n1": "launcher=exited rc=0", "n2": "launcher=exited rc=1"}, "failed", 1),
    ("torchrun", {"n1": "launcher=exited rc=0", "n2": "launcher=gone"}, "lost", None),
    ("torchrun", {"n1": "launcher=exited rc=0", "n2": "launcher=exited rc=junk"}, "lost", None),
])
def test_the_launchers_decide_the_runs_state(launcher, answers, state, rc):
    cluster = local_cluster(("n1", "n2"))
    plan = plan_for(cluster, run_id="R", launcher=launcher, workload="ddp")
    hosts = {h: liveness.parse_probe(h, "noise\n" + state_answer(a, procs=2, started=[0]) if a else "ssh: timeout")
             for h, a in answers.items()}
    judged = liveness.judge(plan, hosts)
    assert (judged.state, judged.rc) == (state, rc), judged


@pytest.mark.parametrize(("launcher", "answers", "lost", "out"), [
    # torchrun: every rank host launches. n3 lost, its peers' launchers ended: the run can be
    # stopped, collected and restarted on n1 and n2, not given up as out of reach.
    ("torchrun", {"n1": "launcher=exited rc=1", "n2": "launcher=exited rc=1", "n3": None}, {"n3"}, None),
    ("torchrun", {"n1": "launcher=running", "n2": "launcher=running", "n3": None}, {"n3"}, None),
    # Nothing but the lost node answers any more: this machine's network, or the nodes, are gone.
    ("torchrun", {"n1": None, "n2": None, "n3": None}, {"n3"}, "cannot reach n1 (ssh: timeout); cannot reach n2"),
    # mpirun launches from the head only: a lost worker leaves the head to ask, a lost head does not.
    ("mpirun", {"n1": "launcher=exited rc=1", "n2": "launcher=none", "n3": None}, {"n3"}, None),
    ("mpirun", {"n1": None, "n2": "launcher=none", "n3": "launcher=none"}, {"n1"}, "every launch host of the run was lost (n1)"),
])
def test_a_lost_node_leaves_the_run_in_reach_while_another_launch_host_answers(launcher, answers, lost, out):
    cluster = local_cluster(("n1", "n2", "n3"))
    plan = plan_for(cluster, run_id="R", launcher=launcher, workload="ddp")
    hosts = {h: liveness.parse_probe(h, state_answer(a, procs=0, started=[]) if a else "ssh: timeout")
             for h, a in answers.items()}
    said = liveness.out_of_contact(plan, hosts, lost)
    if out is None:
        assert said is None
    else:
        assert said is not None and said.startswith(out), said


# ------------------------------------------------------------------ logs -f ends with the run

def test_logs_follow_of_a_run_nothing_follows_reads_the_head_and_ends_with_the_run(tmp_path, monkeypatch):
    local = LocalRun(tmp_path, monkeypatch, "for i in 1 2 3; do echo line $i; sleep 0.5; done")
    monkeypatch.setattr("distrun.run.logs._cluster", lambda run: local.cluster)
    local.launch()
    started = time.monotonic()
    text = "".join(log_text(local.run.id, None, follow=True))
    assert "line 1\nline 2\nline 3\n" in text
    assert (local.dir / "exitcode-n1").exists(), "logs -f returned before the launcher ended"
    assert time.monotonic() - started < 60


def test_logs_follow_of_a_lost_run_ends_at_once_with_one_line(tmp_path, monkeypatch):
    local = LocalRun(tmp_path, monkeypatch, "true")
    monkeypatch.setattr("distrun.run.logs._cluster", lambda run: local.cluster)
    (local.dir / "launcher-n1.pid").write_text(f"{dead_pid()}\n")
    with pytest.raises(UserError, match="is lost: the launcher on n1 ended without writing its exit code"):
        "".join(log_text(local.run.id, None, follow=True))


# ------------------------------------------------------------------ one run at a time

@pytest.fixture
def proc_view(tmp_path, monkeypatch):
    """What the claim sees of this machine's processes: only those a test links in (real
    /proc entries), not the runs other tests on this machine start meanwhile as the same user."""
    view = tmp_path / "proc"
    view.mkdir()
    monkeypatch.setattr(busy, "PROC", str(view))
    return view


def show(view: Path, pid: int) -> None:
    (view / str(pid)).symlink_to(f"/proc/{pid}")


def test_a_claimed_host_is_refused_to_a_second_run_and_freed_when_the_first_lets_go(proc_view):
    host = f"unit-{os.getpid()}"
    cluster = local_cluster((host,))
    first, second = "20260101-000000-train-aaa1", "20260101-000000-train-bbb2"
    held = busy.claim(cluster, [host], first)
    try:
        with pytest.raises(UserError, match=f"{host} is busy with run {first} \\(starting there now\\).*--allow-concurrent"):
            busy.claim(cluster, [host], second)
    finally:
        held.release()
    busy.claim(cluster, [host], second).release()
    # A run's processes keep its hosts busy after its controller let go (a detached run).
    tagged = subprocess.Popen(["sleep", "30"], env={**os.environ, "DISTRUN_RUN_ID": first})
    show(proc_view, tagged.pid)
    show(proc_view, os.getpid())  # untagged: no run
    try:
        with pytest.raises(UserError, match=f"busy with run {first} \\(running there now\\): .*'distrun stop {first}'"):
            busy.claim(cluster, [host], second)
    finally:
        tagged.send_signal(signal.SIGKILL)
        tagged.wait()
    busy.claim(cluster, [host], second).release()
    home = Path(os.path.expanduser(f"~{ME}")) / ".cache" / "distrun"
    for f in home.glob(f"busy-{host}.*"):
        f.unlink()


def gpu_cluster(host: str):
    """One local host that declares 4 GPUs and 2 slots."""
    inv = {"_meta": {"hostvars": {host: {"ansible_connection": "local", "ansible_host": "10.0.0.1", "slots": 2, "gpus": 4,
                                          "distrun_user": ME}}},
           "all": {"children": ["head", "workers"]}, "head": {"hosts": [host]}, "workers": {"hosts": [host]}}
    return cluster_from_json(Path("/inv/hosts.yml"), inv, None)


def test_runs_on_disjoint_gpus_of_a_host_both_hold_it_and_an_overlap_is_refused_naming_host_gpus_run_and_fix(proc_view):
    host = f"unit-{os.getpid()}-g"
    cluster = gpu_cluster(host)
    first, second, third = "20260101-000000-train-ab01", "20260101-000000-train-ab02", "20260101-000000-train-ab03"
    held = [busy.claim(cluster, [host], first, {host: (0, 1)})]
    try:
        with pytest.raises(UserError) as refused:
            busy.claim(cluster, [host], third, {host: (1, 2)})
        assert str(refused.value) == (
            f"{host}: GPU 1 is held by run {first} (starting there now): choose free ones (--hosts {host}:2,3), wait "
            f"for it to end, or stop it with 'distrun stop {first}' (or pass --allow-concurrent)")
        assert refused.value.exit_code == ExitCode.BUSY
        held.append(busy.claim(cluster, [host], second, {host: (2, 3)}))
        with pytest.raises(UserError, match=rf"^{host}: GPUs 1,2 are held by run {first}, {second} \(starting there "
                                            rf"now\): wait for it to end, or stop it with 'distrun stop {first}'"):
            busy.claim(cluster, [host], third, {host: (1, 2)})
        with pytest.raises(UserError, match=rf"^{host} is busy with run {first}, {second} \(starting there now\)"):
            busy.claim(cluster, [host], third)  # no GPUs: the whole host
    finally:
        for claim in held:
            claim.release()
    busy.claim(cluster, [host], third, {host: (1, 2)}).release()
    home = claims_folder()
    for f in [*home.glob(f"busy-{host}.*"), *home.glob(f"busy-{host}@*")]:
        f.unlink()


def test_a_gpu_refusal_names_the_holders_owner_where_it_is_another_person():
    line = json.dumps({"verb": "claim", "claimed": False, "held": False, "runs": ["20260101-000000-train-b0b1"],
                       "gpu_ids": [2, 3], "free": [0, 1], "owners": {"20260101-000000-train-b0b1": "bob"}})
    error = busy.refusal([busy.parse_answer("node1", line)], {"node1": (2, 3)}, "alice")
    assert str(error) == ("node1: GPUs 2,3 are held by run 20260101-000000-train-b0b1 (of bob) (running there now): "
                          "choose free ones (--hosts node1:0,1), wait for it to end, or stop it with 'distrun stop "
                          "20260101-000000-train-b0b1' (or pass --allow-concurrent)")
    assert "(of bob)" not in str(busy.refusal([busy.parse_answer("node1", line)], {"node1": (2, 3)}, "bob"))


def test_gpus_by_count_are_picked_among_those_no_run_holds_before_the_one_plan(proc_view):
    from distrun.planning.request import JobRequest, PlacementRequest, RunPolicy

    host = f"unit-{os.getpid()}-p"
    cluster = gpu_cluster(host)
    request = JobRequest(inventory=Path("/inv/hosts.yml"), placement=PlacementRequest(gpus=2))
    assert pending.with_free_gpus(request, cluster, "20260101-000000-train-ac00") == request  # all free: its first 2
    held = busy.claim(cluster, [host], "20260101-000000-train-ac01", {host: (0, 1)})
    try:
        picked = pending.with_free_gpus(request, cluster, "20260101-000000-train-ac02")
        assert picked.placement.gpu_ids == ((host, (2, 3)),)
        allowed = dataclasses.replace(request, policy=RunPolicy(allow_concurrent=True))
        assert pending.with_free_gpus(allowed, cluster, "20260101-000000-train-ac02") == allowed
    finally:
        held.release()
    home = claims_folder()
    for f in [*home.glob(f"busy-{host}.*"), *home.glob(f"busy-{host}@*")]:
        f.unlink()


def claims_folder() -> Path:
    """Where the node program keeps a host's claim: root's folder where the claim runs as root (the
    connection is root's, or sudo needs no password), else the training user's."""
    sudo = subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False) if shutil.which("sudo") else None
    if os.geteuid() == 0 or (sudo is not None and sudo.returncode == 0):
        return Path("/run/distrun/claims")
    return Path(os.path.expanduser(f"~{ME}")) / ".cache" / "distrun"


def test_two_runs_claiming_at_once_one_holds_every_host_and_the_other_is_refused_naming_it(proc_view):
    """Both ask at the same moment: they meet on the first host (the head), so one holds all of
    them and the other is refused there, with the winner's name (never a part each, never a name
    left by an earlier holder), and the exit code of busy hosts."""
    hosts = [f"unit-{os.getpid()}-h{k}" for k in (1, 2, 3)]
    cluster = local_cluster(tuple(hosts))
    home = claims_folder()
    home.mkdir(parents=True, exist_ok=True)
    (home / f"busy-{hosts[0]}.run").write_text("20250101-000000-train-dead\n")  # a killed holder's
    runs = ["20260101-000000-train-ccc1", "20260101-000000-train-ccc2"]
    got: dict[str, object] = {}
    gate = threading.Barrier(2)

    def take(run: str) -> None:
        gate.wait()
        try:
            got[run] = busy.claim(cluster, hosts, run)
        except UserError as exc:
            got[run] = exc

    threads = [threading.Thread(target=take, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        held = [r for r in runs if isinstance(got[r], busy.Claim)]
        refused = [r for r in runs if isinstance(got[r], UserError)]
        assert len(held) == 1 and len(refused) == 1, got
        claim = got[held[0]]
        assert isinstance(claim, busy.Claim) and sorted(claim.hosts) == sorted(hosts)
        error = got[refused[0]]
        assert isinstance(error, UserError) and error.exit_code == ExitCode.BUSY
        assert f"{hosts[0]} is busy with run {held[0]} (starting there now)" in str(error), error
        assert (home / f"busy-{hosts[0]}.run").read_text() == f"{held[0]}\n"
        claim.release()
        assert (home / f"busy-{hosts[0]}.run").read_text() == ""  # let go: no name is left behind
    finally:
        for left in got.values():
            if isinstance(left, busy.Claim):
                left.release()
        for h in hosts:
            for f in home.glob(f"busy-{h}.*"):
                f.unlink()


def test_a_refusal_names_the_run_whose_process_forged_another_runs_tag(proc_view):
    """A job of one run starts a process tagged with another, ended run: the refusal names the
    run that started it, not the innocent one."""
    host = f"unit-{os.getpid()}-f"
    cluster = local_cluster((host,))
    forger, innocent = "20260101-000000-train-abc1", "20260101-000000-train-abc2"
    parent = subprocess.Popen(["bash", "-c", f"DISTRUN_RUN_ID={innocent} sleep 30 & echo $!; wait"],
                              env={**os.environ, "DISTRUN_RUN_ID": forger}, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    show(proc_view, parent.pid)
    show(proc_view, child)
    try:
        with pytest.raises(UserError, match=f"busy with run {forger} \\(running there now\\)") as err:
            busy.claim(cluster, [host], "20260101-000000-train-abc3")
        assert innocent not in str(err.value)
    finally:
        os.kill(child, signal.SIGKILL)
        parent.wait()
    for f in (Path(os.path.expanduser(f"~{ME}")) / ".cache" / "distrun").glob(f"busy-{host}.*"):
        f.unlink()


def test_a_claim_ends_with_the_process_that_held_it(proc_view):
    host = f"unit-{os.getpid()}-b"
    cluster = local_cluster((host,))
    code = ("import sys, time; sys.path[:0] = sys.argv[1:]; from distrun.run import busy; from tests.unit.test_long_runs import "
            f"local_cluster; busy.PROC = {str(proc_view)!r}; busy.claim(local_cluster(({host!r},)), [{host!r}], '20260101-000000-train-ccc3'); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parents[2]), str(Path(__file__).parents[2] / "runner")],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match="busy with run 20260101-000000-train-ccc3"):
        busy.claim(cluster, [host], "20260101-000000-train-ddd4")
    holder.send_signal(signal.SIGKILL)  # as a controller killed with SIGKILL
    holder.wait()
    deadline = time.monotonic() + 30
    while True:
        try:
            busy.claim(cluster, [host], "20260101-000000-train-ddd4").release()
            break
        except UserError:
            assert time.monotonic() < deadline, "the claim outlived its controller"
            time.sleep(0.5)
    for f in (Path(os.path.expanduser(f"~{ME}")) / ".cache" / "distrun").glob(f"busy-{host}.*"):
        f.unlink()


def test_a_pending_claim_opens_the_gate_or_refuses_and_says_so_in_the_gate_file(tmp_path, proc_view):
    """The claim a run takes while ansible-playbook starts: its answer reaches run.yml's gate file
    whether the gate is named before or after it is known, and a refusal is raised here too."""
    host = f"unit-{os.getpid()}-p"
    cluster = local_cluster((host,))
    first = pending.Pending(cluster, [host], "20260101-000000-train-eee5")
    first.gate(tmp_path / "first")  # named before the answer is known
    try:
        first.wait()
        assert (tmp_path / "first").read_text() == "held\n"
        second = pending.Pending(cluster, [host], "20260101-000000-train-fff6")
        with pytest.raises(UserError, match=f"{host} is busy with run 20260101-000000-train-eee5"):
            second.wait()
        assert second.refused
        second.gate(tmp_path / "second")  # named after: written at once
        assert (tmp_path / "second").read_text() == "refused\n"
        second.release()
        beside = pending.Pending(cluster, [host], "20260101-000000-train-aab7", allow=True)  # --allow-concurrent
        beside.gate(tmp_path / "beside")
        beside.wait()
        assert (tmp_path / "beside").read_text() == "allowed\n" and not beside.refused
    finally:
        first.release()
    for f in (Path(os.path.expanduser(f"~{ME}")) / ".cache" / "distrun").glob(f"busy-{host}.*"):
        f.unlink()


# ------------------------------------------------------------------ restarts

@pytest.mark.parametrize(("np", "failed", "lost", "exclude_failed", "expect"), [
    (None, "n3", {"n3"}, True, {"exclude": {"n3"}}),
    (None, "n2", set(), True, {"exclude": {"n2"}}),
    (None, "n2", set(), False, {"exclude": set()}),
    (None, "n1", set(), True, {"exclude": set()}),  # the head is never left out
    (None, "n3", {"n3"}, False, {"refused": "n3 cannot be reached; restart with --exclude-failed"}),
    (None, "n1", {"n1"}, True, {"refused": "the head node n1 is lost"}),
    (3, "n3", {"n3"}, True, {"refused": "--np 3 needs 3 slots; without n3 only 2 are left"}),
    (3, "n2", set(), True, {"exclude": set()}),  # does not fit without n2, which still answers: same hosts
])
def test_where_a_restart_runs(np, failed, lost, exclude_failed, expect):
    cluster = local_cluster(("n1", "n2", "n3"))
    plan = plan_for(cluster, run_id="R", np=np, workload="ddp")
    decision = restarts.decide(cluster, plan, np, failed=failed, lost=lost, exclude_failed=exclude_failed)
    if "refused" in expect:
        assert expect["refused"] in decision.refused
    else:
        assert decision.ok and set(decision.exclude) == expect["exclude"]


def test_ranks_see_the_restart_and_its_files_have_their_own_folder(tmp_path):
    cluster = local_cluster()
    plan = plan_for(cluster, run_id="R", workload="ddp", restart=2)
    plan = dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, user=ME), shared_dir=str(tmp_path))
    env = dict(plan.program.env)
    assert env["DISTRUN_RESTART"] == "2" and env["DISTRUN_CHECKPOINT_DIR"].endswith("/checkpoints/R")
    assert rundir.attempt_path(plan) == f"{plan.run_dir}/attempts/2"
    assert f"cd {plan.run_dir}/attempts/2 || exit 3\n" in launch_scripts(plan)["n1"]


def test_torchrun_restarts_its_workers_in_place_up_to_the_runs_budget():
    from distrun.launchers import torchrun_argv

    cluster = local_cluster(("n1", "n2"))
    plan = plan_for(cluster, run_id="R", launcher="torchrun", workload="ddp", max_restarts=2)
    assert "--max-restarts=2" in torchrun_argv(plan, plan.placement.hosts[0])
    assert "--max-restarts=0" in torchrun_argv(plan_for(cluster, run_id="R", launcher="torchrun", workload="ddp"), plan.placement.hosts[0])


@pytest.mark.parametrize(("args", "said"), [
    (["--exclude-failed"], "--exclude-failed only goes with --max-restarts N"),
    (["--launcher", "ssh", "--detach", "--max-restarts", "1"],
     "--launcher ssh restarts a run only while distrun follows it; use --launcher mpirun or --launcher torchrun"),
    (["--max-restarts", "-1"], "-1 is out of range; give a whole number from 0 to 100"),
])
def test_restart_flags_that_do_not_go_together_are_refused(cli_env, args, said):
    out = subprocess.run([distrun_bin(), "train", "-i", "tests/golden/inventories/two-nodes", *args], capture_output=True,
                         text=True, env=cli_env, timeout=60, cwd=Path(__file__).parents[2])
    assert out.returncode == 2 and said in out.stderr, out.stderr
