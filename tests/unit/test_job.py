"""The runner's pure pieces around a run: bundles, which step failed, where a rank's log is."""

from __future__ import annotations

import base64
import io
import json
import re
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from distrun.inventory.cluster import cluster_from_json
from distrun.planning import bundle, run_files
from distrun.planning import network as planning
from distrun.preflight.check import preflight_vars
from distrun.run import collect, logs
from distrun.run import starter as starter_module
from distrun.store.runs import new_run
from distrun.transport import handshake
from distrun.transport.playbook_events import EventReader, HostProgress, PlaybookResult

from .plans import plan_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    return new_run("train", inv)


def _members(bundle: str) -> dict[str, tarfile.TarInfo]:
    raw = base64.b64decode(Path(bundle).read_text())
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_bundle_holds_run_files_scripts_and_workloads_with_their_modes(run, tmp_path):
    script = tmp_path / "train_me.py"
    script.write_text("print('hi')\n")
    path, digest = bundle.run_bundle(run, {"hostfile": "node1 slots=1\n", "launch-node1.sh": "#!/bin/bash\n"}, script)
    members = _members(path)
    assert members["run/hostfile"].mode == 0o644
    assert members["run/launch-node1.sh"].mode == 0o755
    assert "run/train_me.py" in members
    assert "workloads/gcn_jittor.py" in members and "workloads/partition.py" in members
    assert not any("__pycache__" in n for n in members)
    assert len(digest) == 16
    # The record stays private: the bundle holds the user's program.
    assert Path(path).stat().st_mode & 0o077 == 0


def test_bundle_digest_changes_only_with_the_workloads(run):
    _, first = bundle.run_bundle(run, {"hostfile": "a\n"}, None)
    _, second = bundle.run_bundle(run, {"hostfile": "b\n"}, None)
    assert first == second


def _result(*failures: tuple[str, str]) -> PlaybookResult:
    hosts = {name: HostProgress(name, failed=1, failed_step=step, last_error="x") for name, step in failures}
    return PlaybookResult("playbooks/run.yml", 2, "failed", hosts, Path("."))


@pytest.mark.parametrize("step", ["preflight", "stage"])
def test_the_failed_step_is_the_one_the_host_published(step):
    assert handshake.failed_step(_result(("node2", step))) == step


def test_the_earliest_failed_step_wins():
    assert handshake.failed_step(_result(("node1", "stage"), ("node3", "preflight"))) == "preflight"


def test_a_host_that_failed_before_any_step_failed_the_preflight():
    assert handshake.failed_step(_result(("node1", ""))) == "preflight"


def test_run_yml_publishes_each_step_before_the_role_that_does_it():
    plays = yaml.safe_load((Path(__file__).resolve().parents[2] / "playbooks" / "run.yml").read_text())
    seen = []  # in order: ("step", name) and ("role", entry point)
    for play in plays:
        assert not play.get("gather_facts"), "a run reads the cached facts; gathering costs a round trip per node"
        for task in play["tasks"]:
            if "distrun_step" in (task.get("ansible.builtin.set_fact") or {}):
                seen.append(("step", task["ansible.builtin.set_fact"]["distrun_step"]))
            role = task.get("ansible.builtin.import_role") or task.get("ansible.builtin.include_role")
            if role:
                seen.append(("role", role.get("tasks_from", role["name"])))
    # The play starts in the first step (preflight, role preflight); each later step's name is
    # published before its role starts (stage -> job's stage), so a failure in it is blamed on
    # that step, and one before it on the step before. The runner starts the launchers.
    assert tuple(name for kind, name in seen if kind == "step") == handshake.STEPS[1:]
    assert seen == [("role", "preflight"), ("step", "stage"), ("role", "stage")]


def _event(kind: str, host: str, action: str = "ansible.builtin.set_fact", **res) -> dict:
    return {"event": kind, "event_data": {"host": host, "task": "any name", "task_action": action, "res": res}}


def test_the_bridge_keeps_published_facts_and_the_step_a_host_failed_in():
    reader = EventReader()
    for event in (
        _event("runner_on_ok", "n1", "ansible.builtin.setup", ansible_facts={"distrun_step": "gathered, not set"}),
        # A step is published once for the play (run_once): it is every host's step.
        _event("runner_on_ok", "n1", ansible_facts={"distrun_step": "preflight"}),
        _event("runner_on_unreachable", "n2", "ansible.builtin.command", msg="timed out"),
        _event("runner_on_ok", "n1", ansible_facts={"preflight_verdict": {"env": {}}, "_preflight_own": 1}),
        _event("runner_on_ok", "n1", ansible_facts={"distrun_step": "stage"}),
        _event("runner_on_failed", "n3", "ansible.builtin.shell", msg="tar failed"),
    ):
        reader(event)
    result = PlaybookResult("playbooks/run.yml", 2, "failed", reader.hosts, Path("."))
    assert reader.hosts["n3"].failed_step == "stage" and reader.hosts["n2"].failed_step == "preflight"
    assert result.fact("preflight_verdict") == {"env": {}} and result.fact("_preflight_own") is None
    assert handshake.failed_step(result) == "preflight"


PLAN = {
    "run_id": "R1", "shared_dir": "/srv/distrun/", "launcher": "mpirun", "world_size": 5,
    "hosts": [{"name": "node1", "slots": 2}, {"name": "node2", "slots": 1}, {"name": "node3", "slots": 2}],
}


@pytest.mark.parametrize(("rank", "where"), [(0, ("node1", 0)), (1, ("node1", 1)), (2, ("node2", 0)),
                                             (3, ("node3", 0)), (4, ("node3", 1)), (5, None)])
def test_ranks_fill_each_hosts_slots_in_order(rank, where):
    assert logs.rank_host(PLAN, rank) == where


def test_torchrun_ranks_follow_the_agents_addresses_in_string_order():
    hosts = [{"name": "head", "slots": 1, "address": "10.0.0.9", "net_address": ""},
             {"name": "w1", "slots": 2, "address": "10.0.0.10", "net_address": ""},
             {"name": "w2", "slots": 1, "address": "10.0.0.11", "net_address": "192.168.0.1"}]
    plan = {**PLAN, "launcher": "torchrun", "world_size": 4, "hosts": hosts}
    assert [logs.rank_host(plan, r) for r in range(4)] == [("w1", 0), ("w1", 1), ("head", 0), ("w2", 0)]
    # Slurm decides at run time: the plan's order is the best guess for a live log.
    assert logs.rank_host({**plan, "launcher": "slurm"}, 0) == ("head", 0)


def test_remote_log_command_names_the_rank_file_of_each_launcher():
    mpirun = logs.remote_log_command(PLAN, 3)
    assert mpirun is not None and "cd /srv/distrun/runs/R1" in mpirun and "ranks/*/rank.3/stdout" in mpirun
    torch = logs.remote_log_command({**PLAN, "launcher": "torchrun"}, 4)
    assert torch is not None and "torchrun/node3/*/attempt_*/1/stdout.log" in torch
    assert logs.remote_log_command(PLAN, 9) is None
    # A plan with attempt folders: the log of the plan's own attempt, not an earlier one's.
    second = logs.remote_log_command({**PLAN, "attempt_dirs": True, "restart": 1}, 3)
    assert second is not None and " attempts/1/ranks/*/rank.3/stdout " in second


def test_collect_unpacks_only_plain_files_inside_the_destination():
    def info(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
        t = tarfile.TarInfo(name)
        t.type = kind
        return t

    assert collect._safe(info("./ranks/1/rank.0/stdout"))
    assert collect._safe(info("ranks", tarfile.DIRTYPE))
    assert not collect._safe(info("/etc/passwd"))
    assert not collect._safe(info("../../.ssh/authorized_keys"))
    assert not collect._safe(info("link", tarfile.SYMTYPE))
    assert not collect._safe(info("dev", tarfile.CHRTYPE))


def test_each_inventory_has_its_own_fact_cache(tmp_path, monkeypatch):
    """'node1' of a test inventory and 'node1' of production are different machines."""
    from distrun import paths

    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    a, b = tmp_path / "a" / "hosts.yml", tmp_path / "b" / "hosts.yml"
    assert paths.fact_cache_dir(a) != paths.fact_cache_dir(b)
    assert paths.fact_cache_dir(a) == paths.fact_cache_dir(a)
    assert paths.fact_cache_dir(a).stat().st_mode & 0o777 == 0o700


def test_facts_about_another_machine_are_not_planned_from(tmp_path, monkeypatch):
    import json

    from distrun import paths
    from distrun.inventory.cluster import Cluster, Node

    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    inv = tmp_path / "hosts.yml"
    node = Node("node1", "10.0.0.11", 1, "inventory", 0, True, True, {"ansible_host": "10.0.0.11"})
    cluster = Cluster(inv, node, (node,), user="distrun", shared_dir="/srv/distrun", mpi_provider="venv",
                      env_prefix="/opt/distrun/venv", mpi_prefix="/usr")
    assert "no facts cached for node1" in (planning.facts_unusable(cluster) or "")

    def facts(address: str) -> str:
        payload = {"ansible_interfaces": ["eth0", "lo"], "ansible_eth0": {"ipv4": {"address": address, "netmask": "255.255.255.0"}}}
        return json.dumps({"__payload__": json.dumps(payload)})

    (paths.fact_cache_dir(inv) / "s1_node1").write_text(facts("10.9.9.11"))
    assert "no interface on the subnet of its address 10.0.0.11" in (planning.facts_unusable(cluster) or "")
    (paths.fact_cache_dir(inv) / "s1_node1").write_text(facts("10.0.0.11"))
    assert planning.facts_unusable(cluster) is None


def test_a_record_written_with_keys_this_version_lacks_is_still_listed(tmp_path, monkeypatch):
    import json

    from distrun.store import runs

    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    run = new_run("train", tmp_path / "hosts.yml")
    data = json.loads((run.dir / "meta.json").read_text())
    (run.dir / "meta.json").write_text(json.dumps({**data, "extra": {}}))
    assert [r.id for r in runs.list_runs()] == [run.id]


def _starter(monkeypatch, **kw) -> tuple[starter_module.Starter, list[list[str]]]:
    calls: list[list[str]] = []

    def start(cluster, plan, hosts: list[str]) -> dict[str, str]:
        calls.append(hosts)
        return {}

    monkeypatch.setattr(starter_module, "launch", start)
    plan = SimpleNamespace(run_id="R1", launch=SimpleNamespace(launcher="torchrun", container=None), placement=SimpleNamespace(hosts=()),
                           attempt=SimpleNamespace(restart=0))
    monkeypatch.setattr(starter_module, "launcher_named", lambda name: type("L", (), {
        "started_hosts": staticmethod(lambda p: [type("H", (), {"name": n})() for n in ("node1", "node2")])})())
    return starter_module.Starter(None, plan, **kw), calls  # type: ignore[arg-type]


def test_the_launchers_start_on_the_staged_fact_once_and_not_before(monkeypatch):
    """With steps after unpacking, run.yml's last task publishes distrun_staged: the launchers
    start then, while ansible-playbook ends; not on any other fact, nor on a node's unpacking,
    and only once."""
    starter, calls = _starter(monkeypatch, stage_hosts=["node1"], after_steps=True)
    starter.on_event(starter_module.PlaybookEvent("ok", "node1", "t", data={"ansible_facts": {"distrun_step": "stage"}}))
    starter.on_event(starter_module.PlaybookEvent("changed", "node1", "t", data={"stdout": '{"changed": true, "staged": "R1"}'}))
    starter.on_event(starter_module.PlaybookEvent("failed", "node1", "t", data={"ansible_facts": {starter_module.STAGED_FACT: True}}))
    assert not starter.started
    for _ in range(2):
        starter.on_event(starter_module.PlaybookEvent("ok", "node1", "t", data={"ansible_facts": {starter_module.STAGED_FACT: True}}))
    assert starter.started and starter.wait() == {}
    assert calls == [["node1", "node2"]]


def test_the_launchers_start_once_every_node_that_stages_unpacked_this_run(monkeypatch):
    """Without steps after unpacking, the launchers start on the stage script's answers: only
    when each node that stages said it unpacked this run, not on another run's answer, a failed
    node's output or a skipped node."""
    starter, calls = _starter(monkeypatch, stage_hosts=["node1", "node3"], after_steps=False)
    starter.on_event(starter_module.PlaybookEvent("changed", "node1", "t", data={"stdout": '{"changed": true, "staged": "R1"}'}))
    starter.on_event(starter_module.PlaybookEvent("ok", "node3", "t", data={"stdout": '{"changed": false, "staged": "R0"}'}))
    starter.on_event(starter_module.PlaybookEvent("failed", "node3", "t", data={"stdout": '{"changed": false, "staged": "R1"}'}))
    starter.on_event(starter_module.PlaybookEvent("skipped", "node2", "t"))
    starter.on_event(starter_module.PlaybookEvent("ok", "node2", "t", data={"stdout": '{"changed": false, "staged": "R1"}'}))
    starter.on_event(starter_module.PlaybookEvent("ok", "node3", "t", data={"stdout": "not json"}))
    assert not starter.started
    starter.on_event(starter_module.PlaybookEvent("ok", "node3", "t", data={"stdout": 'x\n{"changed": false, "staged": "R1"}\n'}))
    assert starter.started and starter.wait() == {}
    starter.on_event(starter_module.PlaybookEvent("ok", "node1", "t", data={"ansible_facts": {starter_module.STAGED_FACT: True}}))
    assert calls == [["node1", "node2"]]


def test_a_first_attempt_launches_once_the_probes_staged_it_and_the_judge_passed(monkeypatch):
    """Staged in the probes' round trip: the launchers start only when every node that stages
    said it unpacked this run and the judge's verdict arrived with its task's ok, in any order;
    a probe that could not stage names why, and the folders each probe made are kept for a
    refusal to remove."""
    import json

    def probe(host: str, **said) -> starter_module.PlaybookEvent:
        return starter_module.PlaybookEvent("ok", host, "t", data={"stdout": "warning\n" + json.dumps({"host": host, **said})})

    judged = starter_module.PlaybookEvent("ok", "node1", "t", data={"ansible_facts": {"preflight_verdict": {}}})
    for order in ("judge last", "judge first"):
        starter, calls = _starter(monkeypatch, stage_hosts=["node1", "node2"], after_steps=False, judged=True)
        if order == "judge first":
            starter.on_event(judged)
        starter.on_event(probe("node1", staged="R1", stage_created=["/srv/runs/R1"]))
        starter.on_event(starter_module.PlaybookEvent("failed", "node1", "t", data={"ansible_facts": {"preflight_verdict": {}}}))
        starter.on_event(probe("node2", staged="R0"))  # another run's answer
        assert not starter.started
        starter.on_event(probe("node2", staged="R1"))
        assert starter.started == (order == "judge first")
        if order == "judge last":
            starter.on_event(judged)
        assert starter.started and starter.wait() == {} and calls == [["node1", "node2"]]
        assert starter.created == {"node1": ["/srv/runs/R1"]} and starter.unstaged() == {}

    starter, calls = _starter(monkeypatch, stage_hosts=["node1", "node2"], after_steps=False, judged=True)
    starter.on_event(probe("node1", stage_error="not staged: /srv/distrun is not mounted (expected nfs*)"))
    starter.on_event(probe("node2", staged="R1"))
    starter.on_event(judged)
    assert not starter.started
    assert starter.unstaged() == {"node1": "not staged: /srv/distrun is not mounted (expected nfs*)"}
    assert starter.wait() == {} and not starter.started and calls == []


@pytest.mark.parametrize(("preflight", "restart", "mode", "steps", "early"), [
    (True, 0, "sync", False, True),
    (True, 0, "sshfs", False, True),
    (True, 0, "external", False, False),  # judged across the nodes before anything is written to it
    (True, 1, "sync", False, False),  # a restart's run dir holds the earlier attempts
    (True, 0, "nfs", True, False),  # steps must not start where a node did not unpack the run
    (False, 0, "sync", False, False),  # --skip-preflight: no probe to stage with
])
def test_only_a_first_attempt_without_steps_is_staged_by_the_probes(preflight, restart, mode, steps, early):
    assert handshake.stage_early(preflight, restart, mode, steps) is early


def test_a_refusal_removes_only_the_runs_own_folders_whatever_a_node_answered():
    from distrun.run.starter import Starter

    starter = Starter(None, SimpleNamespace(launch=SimpleNamespace(container=None)))  # type: ignore[arg-type]
    starter.created = {"node1": ["/srv/distrun/runs/R1", "/srv/distrun/checkpoints/R1"], "node2": ["/home/distrun", "/"]}
    own = starter.made("/srv/distrun/runs/R1", "/srv/distrun/checkpoints/R1")
    assert own == {"node1": starter.created["node1"], "node2": []}
    assert starter.made("/srv/distrun/runs/R1", "") == {"node1": ["/srv/distrun/runs/R1"], "node2": []}


def test_run_yml_ends_with_the_staged_fact_after_the_stage_steps_and_launches_nothing_itself():
    plays = yaml.safe_load((Path(__file__).resolve().parents[2] / "playbooks" / "run.yml").read_text())
    last = plays[-1]["tasks"][-1]
    assert last["ansible.builtin.set_fact"] == {starter_module.STAGED_FACT: True} and last.get("run_once") is True
    # Skipped with the steps it follows: without them, the stage script's answers start the launch.
    assert last["tags"] == ["job_stage_steps"]
    text = (Path(__file__).resolve().parents[2] / "playbooks" / "run.yml").read_text()
    assert "setsid" not in text and "tasks_from: launch" not in text


def _spec_options(role: str, entry: str) -> dict:
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"][entry]["options"]


def _from_extravars(role: str, options: dict, extravars: dict) -> dict:
    """The role's options as run.yml's extravars set them: directly, or through a default that
    reads a distrun_* variable ('job_run_id: "{{ distrun_run_id | default(...) }}"')."""
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    out = {}
    for name in options:
        m = re.match(r"\{\{\s*\(*\s*(distrun_\w+)", str(defaults.get(name, "")))
        source = name if name in extravars else m.group(1) if m else None
        if source in extravars:
            out[name] = extravars[source]
    return out


@pytest.mark.parametrize("workload,launcher,mode", [("gcn", "mpirun", "sync"), ("ddp", "torchrun", "sync"),
                                                     ("gcn", "torchrun", "sshfs")])
def test_what_the_runner_passes_run_yml_fits_its_roles_argument_specs(run, workload, launcher, mode):
    """run.yml imports its roles without Ansible's per-node argument check (a task per node per
    role on every run): the runner's variables are checked against the same specs here."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    hosts = {h: {"ansible_connection": "local", "ansible_host": f"10.0.0.{i}", "slots": 1}
             for i, h in enumerate(("n1", "n2", "n3"), 1)}
    inv = {"_meta": {"hostvars": hosts}, "all": {"children": ["head", "workers"], "vars": {"distrun_shared_fs_mode": mode}},
           "head": {"hosts": ["n1"]}, "workers": {"hosts": list(hosts)}}
    cluster = cluster_from_json(Path("/inv/hosts.yml"), inv, None)
    plan = plan_for(cluster, run_id=run.id, launcher=launcher, workload=workload, np=3)
    extravars = {**bundle.run_vars(plan, run, run_files.plan_files(plan), run_files.launch_scripts(plan), script=None, env={"K": "v"},
                                   network=None, preflight=True),
                 **preflight_vars("inv", run.dir), "preflight_ports": [29500], "preflight_ssh_baseline": {"n1": "sha256:aa"}}
    extravars["preflight_planned_network"] = extravars["distrun_planned_network"]  # run.yml's own mapping
    checked = set()
    for role, entry in (("job", "stage"), ("preflight", "main")):
        options = _spec_options(role, entry)
        given = _from_extravars(role, options, extravars)
        spec = {k: {kk: vv for kk, vv in v.items() if kk in ("type", "elements", "choices")}
                for k, v in options.items() if k in given}
        result = ArgumentSpecValidator(spec).validate(given)
        assert not result.error_messages, (role, entry, result.error_messages)
        checked |= {f"{role}.{k}" for k in given}
    # The check covers what a run passes: the bundle, the partition, the run dir, the needs.
    for name in ("job.job_run_bundle", "job.job_partition_argv", "job.job_partition_parts", "job.job_run_id",
                 "preflight.preflight_modules", "preflight.preflight_programs", "preflight.preflight_planned_network",
                 "preflight.preflight_ssh_baseline"):
        assert name in checked, name


def _gate_play() -> dict:
    """run.yml's gate task with the play's own variables (which node is missing, the claim)."""
    plays = yaml.safe_load((REPO / "playbooks" / "run.yml").read_text())
    task = next(t for t in plays[0]["tasks"] if (t.get("ansible.builtin.set_fact") or {}).get("distrun_step") == "stage")
    return {"vars": plays[0]["vars"], "tasks": [task]}


@pytest.mark.parametrize(("claim", "missing", "ok"), [
    ("held", False, True),
    ("allowed", False, True),
    ("refused", False, False),
    ("late", False, True),  # the controller answers while the task waits
    (None, True, False),  # a rank host out of play fails the play at once: no wait for the claim
])
def test_run_yml_stages_nothing_before_every_node_is_in_play_and_the_run_holds_them(tmp_path, monkeypatch, claim, missing, ok):
    """run.yml's stage gate for real, on local hosts: what the claim's gate file and the nodes in
    play let through."""
    import json
    import os
    import sys
    import threading

    from distrun.transport import ansible_bridge

    gate = tmp_path / "claim"
    if claim in ("held", "allowed", "refused"):
        gate.write_text(claim + "\n")
    elif claim == "late":
        threading.Timer(0.5, lambda: gate.write_text("held\n")).start()
    ranks = ["node1", "node2"] + (["node3"] if missing else [])  # node3 is in no group of the play
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "distrun_rank_hosts": ranks, "distrun_claim_gate": str(gate)},
                         "children": {"head": {"hosts": {"node1": None}}, "workers": {"hosts": {"node1": None, "node2": None}}}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    play = [{"name": "The gate", "hosts": "head:workers", "gather_facts": False, "roles": [{"role": "distrun"}],
             **_gate_play()}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    result = ansible_bridge.run_playbook(str(tmp_path / "play.yml"), tmp_path / "hosts.yml", tmp_path / "run")
    assert result.ok == ok, [h.last_error for h in result.failures()]
    assert (result.fact("distrun_step") == "stage") == ok
    # No answer ever comes in the missing case: the gate must fail on the missing node, not the wait.
    assert not any("no answer" in h.last_error for h in result.failures()), [h.last_error for h in result.failures()]


@pytest.mark.parametrize(("extravars", "mode", "needed"), [
    ({}, "sync", False),  # a --script run: run.yml skips stage_steps.yml by its tag
    ({"distrun_partition_argv": ["python", "partition.py"], "distrun_partition_dir": "/p"}, "nfs", True),
    ({"distrun_partition_dir": "/p"}, "sync", True),  # parts pulled from the head
    ({"distrun_partition_dir": "/p"}, "nfs", False),  # every node reads the head's folder
    ({"distrun_pull_checkpoints": True, "distrun_checkpoint_dir": "/c"}, "sync", True),  # a restart
    ({"distrun_pull_checkpoints": True, "distrun_checkpoint_dir": "/c"}, "sshfs", False),
    ({"distrun_workdir_pull_argv": ["rsync"]}, "sync", True),
    ({"distrun_jittor_warm": True}, "nfs", True),
])
def test_a_run_skips_the_stage_steps_only_when_no_node_has_one_to_do(extravars, mode, needed):
    assert bundle.needs_stage_steps(extravars, mode) is needed


def test_each_stage_step_applies_only_where_the_runner_says_some_step_is_needed():
    """stage_steps.yml's steps and what makes each apply: every variable a step's condition reads
    is one needs_stage_steps weighs, so skipping the file never skips a step a run needs."""
    steps = yaml.safe_load((REPO / "roles" / "job" / "tasks" / "stage_steps.yml").read_text())
    weighed = {"job_partition_argv", "job_partition_dir", "job_pull_checkpoints", "job_checkpoint_dir",
               "job_workdir_pull_argv", "job_jittor_warm", "job_shared_fs_mode", "_job_is_head",
               "_job_workdir_pull"}  # the last: a step's own result, set by the step before it
    for step in steps:
        when = step.get("when") or []
        text = " ".join(when if isinstance(when, list) else [when])
        names = set(re.findall(r"\b_?job_[a-z_]+", text))
        assert names <= weighed, f"{step['name']}: its condition reads {sorted(names - weighed)}, which needs_stage_steps does not weigh"


@pytest.mark.parametrize("answer,end", [({}, "launched"), ({"node2": "no pid file after 60 s"}, "launch failed")])
def test_the_starter_notes_the_attempts_states_from_the_plays_events(monkeypatch, answer, end):
    """judged on the verdict fact (a failing judge task carries it too), staged when the launchers
    start, launched or launch failed when they answered."""
    from distrun.run.attempt import Attempt, Step

    attempt = Attempt(0)
    starter, _ = _starter(monkeypatch, stage_hosts=["node1"], after_steps=True, attempt=attempt)
    monkeypatch.setattr(starter_module, "launch", lambda cluster, plan, hosts: dict(answer))
    starter.on_event(starter_module.PlaybookEvent("failed", "node3", "judge", data={"ansible_facts": {starter_module.PREFLIGHT_FACT: {}}}))
    assert attempt.reached(Step.JUDGED) and not attempt.reached(Step.STAGED)
    starter.on_event(starter_module.PlaybookEvent("ok", "node1", "t", data={"ansible_facts": {starter_module.STAGED_FACT: True}}))
    starter.wait()
    assert attempt.end is not None and attempt.end.value == end
    assert [s["state"] for s in json.loads(attempt.to_json())["states"]] == ["planned", "judged", "staged", end]
