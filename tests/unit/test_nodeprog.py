"""Role job's node programs as they travel: their shared head (files/nodecommon.py) in front of
each program, one source, and the protocol's names written once for the programs and once for the
runner that reads their answers, held equal here."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distrun.transport import nodeprog, rundir

FILES = Path(__file__).resolve().parents[2] / "roles" / "job" / "files"


def head() -> dict:
    """nodecommon.py's names, as a program sees them."""
    ns: dict = {"__name__": "nodecommon"}
    exec(compile((FILES / "nodecommon.py").read_text(), "nodecommon.py", "exec"), ns)  # noqa: S102 - the shipped code
    return ns


def test_the_runner_reads_the_answers_by_the_names_the_programs_write(capsys):
    ns = head()
    assert (ns["LOG_PREFIX"], ns["LAUNCHER_STATES"], ns["TAG"], ns["ATTEMPTS"], ns["ENV_FILE"]) == \
        (nodeprog.LOG_PREFIX, nodeprog.LAUNCHER_STATES, nodeprog.RUN_TAG, rundir.ATTEMPTS, rundir.ENV_FILE)
    ns["answer"]({"verb": "state", "launcher": ns["LAUNCHER_STATES"][0], "rc": None})
    line = capsys.readouterr().out
    assert line.count("\n") == 1
    said = nodeprog.answer(f"{ns['LOG_PREFIX']}{line}noise\n{line}", "state")
    assert said == {"verb": "state", "launcher": "running", "rc": None}
    # The unit launch.py names is the one node.py reads a run from, and its records are root's folder's.
    unit = ns["unit_name"]({"run": "20260101-000000-train-ab12", "attempt": "3", "host": "n-1.x"})
    match = ns["UNIT"].fullmatch(unit)
    assert match is not None and match.group(1) == "20260101-000000-train-ab12"
    assert ns["record_path"](unit, "exit") == f"/run/distrun/{unit}.exit"


def test_each_name_of_the_head_has_no_second_home_in_a_program():
    """A program that defined a head's name again would silently replace it for itself."""
    shared = {n for n in head() if not n.startswith("__")} - {"annotations", "json", "os", "re", "sys"}
    for program in (p for p in nodeprog.SOURCES if nodeprog.RECIPES[p].head):  # those sent behind the head
        tree = ast.parse(nodeprog.files(program)[-1].read_text())
        defined = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
        defined |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
        assert not defined & shared, f"{program}.py defines {sorted(defined & shared)} again"


@pytest.mark.parametrize("program", nodeprog.SOURCES)
def test_no_two_files_of_a_composed_program_define_one_name(program):
    """The files of one program share one namespace: a name a later part defined again would
    silently replace the earlier one for every part (the probe's dozen parts among them)."""
    homes: dict[str, list[str]] = {}
    for path in nodeprog.files(program):
        for node in ast.parse(path.read_text()).body:
            names = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
            names += [node.name] if isinstance(node, ast.FunctionDef | ast.ClassDef) else []
            for name in names:
                homes.setdefault(name, []).append(path.name)
    assert not {n: h for n, h in homes.items() if len(h) > 1}


@pytest.mark.parametrize("program", nodeprog.SOURCES)
def test_each_composed_program_parses_as_python_3_9(program):
    text = nodeprog.text(program)
    if program == "entry":  # installed, run by sudo's rule: its #! line first
        text = text.removeprefix(nodeprog.ENTRY_SHEBANG)
    assert text.startswith((FILES / "nodecommon.py").read_text()) == nodeprog.RECIPES[program].head
    ast.parse(text, feature_version=(3, 9))  # the oldest Python a node may have


@pytest.mark.parametrize("program", nodeprog.PROGRAMS)
def test_a_bad_call_of_each_composed_program_is_its_usage(program):
    text = nodeprog.text(program)
    out = subprocess.run([sys.executable, "-I", "-c", text], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(f"{program}.py: usage: {program}.py ") and out.stderr.endswith(" (got nothing)\n")


def test_a_bad_call_of_the_composed_probe_is_one_line_and_exit_2():
    """The preflight's probe takes its config as the other programs do: a bad one is its usage."""
    text = nodeprog.text("probe")
    for argv, said in (([], "usage: probe.py '<config JSON>' ['<stage program>'] (got 0 arguments)"),
                       (["[]"], "the probe's config is not a JSON object"),
                       (['{"host": "h1", "env_prefix": "/env", "shared_dir": "/srv"}'], "user None is missing or not a string"),
                       (['{"host": "h1", "user": "u", "env_prefix": "/e", "shared_dir": "/s", "names": "h2"}'],
                        "names 'h2' is not a list of strings")):
        out = subprocess.run([sys.executable, "-I", "-S", "-c", text, *argv], capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout, out.stderr) == (2, "", f"probe.py: {said}\n"), argv


def test_the_composed_programs_answer_a_trivial_verb(tmp_path):
    scan = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("node"), "scan", json.dumps({"run": "none-such"})],
                          capture_output=True, text=True, timeout=60)
    assert scan.returncode == 0, scan.stderr
    assert json.loads(scan.stdout) == {"verb": "scan", "runs": {}}
    cfg = {"run": "none-such", "host": "h1", "attempt": "0", "user": "nobody", "script": "launch-h1.sh",
           "dir": str(tmp_path / "missing"), "exit_file": "exitcode-h1", "pid_file": "launcher-h1.pid"}
    state = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("attempt"), "state", json.dumps(cfg)],
                           capture_output=True, text=True, timeout=60)
    assert state.returncode == 0, state.stderr
    assert nodeprog.answer(state.stdout, "state") == {"verb": "state", "dir": False, "launcher": "none", "rc": None,
                                                      "signal": None, "procs": 0, "started": []}
    bad = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("launch"), "launch", json.dumps({**cfg, "attempt": "x"})],
                         capture_output=True, text=True, timeout=60)
    assert (bad.returncode, bad.stdout, bad.stderr) == (2, "", "launch.py: launch: attempt 'x' is not a number\n")


def test_a_composed_stage_program_refuses_a_run_id_by_the_heads_rule(tmp_path):
    """stage.py's run id is a plain name as every node program's (one rule): exit 1 and the task's line."""
    cfg = {"run_id": "..", "run_dir": str(tmp_path / "r"), "checkpoint_dir": "", "shared_dir": str(tmp_path),
           "workloads_digest": "d1", "upload": "ok"}
    out = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("stage"), json.dumps(cfg)], capture_output=True,
                         text=True, timeout=60)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == "distrun_run_id=.. is empty or unsafe; runs are staged by 'distrun train'\n"
    assert not (tmp_path / "r").exists()


FACTS = {"python": {"executable": "/usr/bin/python3"}}


def _jinja():
    from jinja2 import Environment

    jinja = Environment()
    jinja.filters.update(quote=shlex.quote, to_json=json.dumps, bool=bool)
    return jinja


def _render(task: dict, **values) -> list[str]:
    """A task's raw command rendered as Ansible renders it, role distrun's filters for the node
    programs' source (the one recipe) included, split as the node's shell splits it."""
    from distrun.transport import nodeprog

    jinja = _jinja()
    jinja.filters["distrun_node_source"] = nodeprog.text
    jinja.filters["distrun_node_program"] = nodeprog.installed
    raw = jinja.from_string(task["ansible.builtin.raw"]).render(ansible_facts=FACTS, **values)
    return shlex.split(raw)


def test_every_node_program_is_composed_by_one_recipe_that_the_roles_use():
    """The runner's recipe (nodeprog.RECIPES) is the only one: no role or playbook joins node
    program files itself, and each role task that sends or installs a program asks the recipe."""
    repo = FILES.parents[2]
    yamls = [*repo.glob("roles/*/tasks/*.yml"), *repo.glob("roles/*/vars/*.yml"), *repo.glob("playbooks/*.yml")]
    joined = [str(p.relative_to(repo)) for p in yamls if ".py'" in p.read_text() and "lookup('ansible.builtin.file'" in p.read_text()]
    assert not joined, f"node program files joined outside the recipe: {joined}"
    asked = "".join(p.read_text() for p in yamls)
    for program in ("node", "stage", "fileserver"):
        assert f"'{program}' | distrun_node_source" in asked, program
    # Setup installs every program of nodeprog.INSTALLED, each the recipe's text at the recipe's path.
    install = yaml.safe_load((repo / "roles" / "job" / "tasks" / "install.yml").read_text())[-1]
    assert install["ansible.builtin.copy"]["content"] == "{{ item | distrun_node_source }}"
    assert install["ansible.builtin.copy"]["dest"] == "{{ job_programs_dir }}/{{ item | distrun_node_program | basename }}"
    installed = yaml.safe_load((repo / "roles" / "job" / "vars" / "main.yml").read_text())["_job_installed"]
    assert tuple(installed) == nodeprog.INSTALLED
    for program in ("probe", "gpuhealth"):  # sent on stdin by role distrun's action, which asks the recipe
        assert f"distrun_program:\n    program: {program}\n" in asked, program
    for program in nodeprog.SOURCES:
        assert all(f.is_file() for f in nodeprog.files(program)), program


def test_the_programs_root_runs_with_the_training_users_rights_carry_the_identity_switch():
    """Every program that acts on the training user's files as root composes role distrun's switch
    of a root process's filesystem identity in front of its own code; the probe asks with it first."""
    repo = FILES.parents[2]
    fsuser = repo / "roles" / "distrun" / "module_utils" / "distrun_fsuser.py"
    assert nodeprog.part_path(nodeprog.FSUSER) == fsuser
    for program in ("attempt", "stage", "files", "pack"):
        assert nodeprog.files(program) == [FILES / "nodecommon.py", fsuser, FILES / f"{program}.py"], program
    probe = repo / "roles" / "preflight" / "files"
    parts = [probe / f"{n}.py" for n in nodeprog.PROBE_PARTS]
    assert nodeprog.files("probe") == [FILES / "nodecommon.py", fsuser, *parts, probe / "probe.py"]
    assert {p.name for p in probe.glob("*.py")} - {"gpuhealth.py"} == {p.name for p in [*parts, probe / "probe.py"]}
    assert nodeprog.files("fileserver") == [fsuser, repo / "roles" / "shared_fs" / "files" / "fileserver.py"]
    assert nodeprog.text("probe") == "".join(f.read_text() for f in nodeprog.files("probe"))


def test_the_stage_step_and_the_probes_stage_program_send_the_runners_source():
    """Role job's stage step, and the program run.yml names for the preflight's probe's stage step."""
    stage = yaml.safe_load((FILES.parent / "tasks" / "stage.yml").read_text())[0]
    argv = _render(stage, _job_stage_config={"run_id": "r1"})
    assert argv[:3] == ["/usr/bin/python3", "-I", "-c"] and argv[3] == nodeprog.text("stage")
    repo = FILES.parents[2]
    play = yaml.safe_load((repo / "playbooks" / "run.yml").read_text())
    program = next(t["vars"]["preflight_stage_program"] for p in play for t in p.get("tasks", [])
                   if isinstance(t.get("vars"), dict) and "preflight_stage_program" in t["vars"])
    named = _jinja().from_string(program).render(distrun_stage_early=True)
    probe = yaml.safe_load((repo / "roles" / "preflight" / "tasks" / "probe.yml").read_text())[0]
    args = probe["distrun_program"]
    assert args["program"] == "probe"  # the probe itself, as the recipe composes it
    sent = [_jinja().from_string(a).render(preflight_stage_program=named) for a in args["argv_programs"]]
    assert sent == ["stage"]  # the stage program's text, the probe's second argument


def test_the_stop_task_sends_the_same_source_as_the_runner():
    """Role job's stop step sends the program the runner would: the recipe's text, as one word."""
    task = yaml.safe_load((FILES.parent / "tasks" / "stop.yml").read_text())[1]
    argv = _render(task, job_run_id="r1", job_run_dir="/srv/runs/r1", job_stop_grace=3, job_user="train", job_people=False)
    assert argv[:3] == ["/usr/bin/python3", "-I", "-c"] and argv[4] == "stop"
    assert argv[3] == nodeprog.text("node")
    assert task["become"] == "{{ not job_people }}"


def test_the_stop_task_of_a_cluster_with_people_asks_the_installed_entry_point():
    """Where the inventory has people the stop step sends no program text: sudo's one rule, the
    installed entry point, the runner's config; the task's own become is off."""
    task = yaml.safe_load((FILES.parent / "tasks" / "stop.yml").read_text())[1]
    argv = _render(task, job_run_id="r1", job_run_dir="/srv/runs/r1", job_stop_grace=3, job_user="alice", job_people=True)
    assert argv[:5] == ["sudo", "-n", nodeprog.installed("entry"), "node", "stop"]
    assert json.loads(argv[5]) == {"run": "r1", "run_dir": "/srv/runs/r1", "grace_s": 3, "user": "alice"}
    assert len(argv) == 6


def _large_config(n: int) -> dict:
    """The full set's probe config of an n-node cluster, as probe.yml renders it (long names)."""
    nodes = [f"gpu-node-{i:04d}.cluster.example" for i in range(n)]
    return {"host": nodes[0], "user": "train", "env_prefix": "/opt/distrun/env", "mpi_prefix": "/opt/distrun/env",
            "shared_dir": "/srv/distrun", "ssh_timeout": 10, "user_ssh": ["ssh", "-F", "/etc/ssh/ssh_config"],
            "ssh_mode": "login", "ssh_targets": nodes[1:], "names": nodes, "modules": ["mpi4py", "numpy", "torch"],
            "env_records": False, "programs": {"mpirun": ["/opt/distrun/env/bin/mpirun"], "torchrun": ["/opt/distrun/env/bin/torchrun"]},
            "image": {}, "mount_fstypes": [], "shared_fs_mounts": False, "ports": [29500, "50000-50999"],
            "net": {"nonce": "0" * 40, "timeout": 8, "head": nodes[0], "rendezvous": 29500, "mpi_range": "50000-50999",
                    "peers": {n: f"10.20.{i // 200}.{i % 200 + 1}" for i, n in enumerate(nodes)}, "listen_address": "10.20.0.1"},
            "addresses": True, "facts": True, "slurm": False, "slurm_partition": "", "shared_probe": True,
            "stage": {"run_id": "r" * 40}}


def test_a_1024_node_probe_travels_on_stdin_behind_a_command_line_of_fixed_size():
    """The kernel takes at most 128 KiB in one argument (MAX_ARG_STRLEN), and a raw task's command
    is one argument of the node's shell, quoted once more under become (sudo): the probe's text, a
    run's stage program and a 1,024-node cluster's config are far more. The probe task sends them on
    the connection's stdin (role distrun's action distrun_program, nodeprog's loader): the command
    line stays the loader's few hundred bytes, and the composed probe, run from that stdin, reads
    the whole config (here one it refuses, so that the test runs nothing of a node's)."""
    config = _large_config(1024)
    argv = [json.dumps(config), nodeprog.text("stage")]
    old_way = shlex.join(["/usr/bin/python3", "-I", "-S", "-c", nodeprog.text("probe"), *argv])
    become = "sudo -H -S -n -u root /bin/sh -c " + shlex.quote(f"echo BECOME-SUCCESS-{'x' * 32} ; {old_way}")
    assert len(become.encode()) > 128 * 1024  # what a raw task would need: more than the kernel takes
    command = nodeprog.loader_command(sys.executable)
    become = "sudo -H -S -n -u root /bin/sh -c " + shlex.quote(f"echo BECOME-SUCCESS-{'x' * 32} ; {command}")
    assert len(become.encode()) < 1024, become
    bad = json.dumps({**config, "user": 5})  # every key read, then refused: the probe ran, and stops there
    out = subprocess.run(shlex.split(command), input=nodeprog.stdin_payload("probe", [bad, argv[1]]),
                         capture_output=True, timeout=60, check=False)
    assert (out.returncode, out.stdout, out.stderr) == (2, b"", b"probe.py: user 5 is missing or not a string\n")
    out = subprocess.run(shlex.split(command), input=nodeprog.stdin_payload("probe", []), capture_output=True,
                         timeout=60, check=False)
    assert out.stderr.decode().endswith("(got 0 arguments)\n") and out.returncode == 2


def test_the_probe_task_sends_its_config_and_stage_program_as_arguments_of_the_loader():
    """probe.yml's task: the probe by name (the recipe), its config as its first argument and a
    run's stage program (where one stages in this round trip) as its second, nothing on a command line."""
    task = yaml.safe_load((FILES.parents[1] / "preflight" / "tasks" / "probe.yml").read_text())[0]
    assert set(task) & {"ansible.builtin.raw", "ansible.builtin.command", "ansible.builtin.shell"} == set()
    args = task["distrun_program"]
    jinja = _jinja()
    jinja.filters["to_json"] = json.dumps
    config = _large_config(3)
    rendered = [jinja.from_string(a).render(_preflight_config=config) for a in args["argv"]]
    assert [json.loads(r) for r in rendered] == [config]
    assert jinja.from_string(args["python"]).render(ansible_facts=FACTS) == "/usr/bin/python3"
