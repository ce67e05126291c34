"""Role job's relay (files/relay.py), run for real here: a command handed to it runs as the
relay's child with the caller's descriptors, folder and environment, and the caller exits as
the command did; a relay that is not in the run's unit, or a caller of another account, gets
nothing. This machine has no systemd: the unit itself is on the cluster's nodes
(tests/cluster/test_control_plane.py, mpirun's daemons on the other nodes); root's record
that a unit was started is made here as launch.py makes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from distrun.launchers import launcher_named
from distrun.planning.run_files import launch_scripts, plan_files
from distrun.transport import nodeprog

from .conftest import REPO
from .plans import plan_for
from .test_launchers import MIXED, cluster

RELAY = Path(__file__).resolve().parents[2] / "roles" / "job" / "files" / "relay.py"
RECORDS = Path("/run/distrun")


def relay(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", str(RELAY), *args], **kw)


@pytest.fixture
def make_plan():
    def make(launcher: str, hosts: int):
        return plan_for(cluster(dict(list(MIXED.items())[:hosts])), run_id="r1", launcher=launcher)
    return make


@pytest.fixture
def run_id():
    return f"relay-{uuid.uuid4().hex[:8]}"


def serving(run: str, wait_s: float = 20) -> subprocess.Popen:
    proc = relay("serve", run, "0", str(wait_s), stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    return proc


def test_the_command_runs_as_the_relays_child_with_the_callers_output_folder_and_env(run_id, tmp_path):
    server = serving(run_id)
    try:
        joined = subprocess.run(
            [sys.executable, "-I", str(RELAY), "join", run_id, "0", "sh", "-c",
             'echo "ppid=$PPID foo=$FOO cwd=$(pwd)"; echo to-stderr >&2; exit 7'],
            cwd=tmp_path, env={**os.environ, "FOO": "bar baz"}, capture_output=True, text=True, timeout=30)
        assert joined.returncode == 7, joined.stderr
        assert joined.stdout.strip() == f"ppid={server.pid} foo=bar baz cwd={tmp_path}"
        assert joined.stderr.strip() == "to-stderr"
        assert server.wait(timeout=10) == 0  # served: the relay is done
    finally:
        server.kill()


def test_a_command_killed_by_a_signal_ends_the_caller_as_a_shell_says_it(run_id):
    server = serving(run_id)
    try:
        joined = subprocess.run([sys.executable, "-I", str(RELAY), "join", run_id, "0", "sh", "-c", "kill -9 $$"],
                                capture_output=True, text=True, timeout=30)
        assert joined.returncode == 137, joined.stderr
    finally:
        server.kill()


def test_without_a_relay_the_caller_says_so_and_starts_nothing(run_id, tmp_path):
    marker = tmp_path / "ran"
    code = (f"import runpy, sys; ns = runpy.run_path({str(RELAY)!r}); "
            f"sys.exit(ns['join']({run_id!r}, '0', ['touch', {str(marker)!r}], join_s=0.5))")
    joined = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=30)
    assert joined.returncode == 255
    assert f"no relay of run {run_id} attempt 0" in joined.stderr
    assert not marker.exists()


def test_a_relay_that_waits_for_nobody_ends_on_its_own(run_id):
    server = serving(run_id, wait_s=0.5)
    assert server.wait(timeout=10) == 0
    _, err = server.communicate(timeout=10)
    assert "nobody came" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="root's records of units and another account's process need root")
def test_where_the_attempt_has_a_unit_a_relay_outside_it_gets_nothing(run_id, tmp_path):
    """A process of the same account that listens under the relay's name first (it is not in the
    run's unit) is handed no command: the daemon would run outside the unit."""
    RECORDS.mkdir(mode=0o755, exist_ok=True)
    record = RECORDS / f"distrun:{run_id}:0:h2.service.launched"
    record.write_text(f"distrun:{run_id}:0:h2.service\n")
    server = serving(run_id)
    marker = tmp_path / "ran"
    try:
        joined = subprocess.run([sys.executable, "-I", str(RELAY), "join", run_id, "0", "touch", str(marker)],
                                capture_output=True, text=True, timeout=30)
        assert joined.returncode == 255
        assert "is not in the run's unit: nothing started" in joined.stderr
        assert not marker.exists()
    finally:
        record.unlink()
        server.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="a caller of another account needs root to be made")
def test_a_caller_of_another_account_is_not_served(run_id, tmp_path):
    server = serving(run_id, wait_s=3)
    marker = tmp_path / "ran"
    tmp_path.chmod(0o777)
    # A hand-made request (join itself refuses a relay of another uid): as nobody, with its fds.
    raw = (
        "import json, os, socket, struct\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.connect('\\0distrun-relay:{run_id}:0')\n"
        f"req = json.dumps({{'argv': ['touch', {str(marker)!r}], 'cwd': '/', 'env': {{}}}}).encode()\n"
        "socket.send_fds(s, [struct.pack('!I', len(req))], [0, 1, 2]); s.sendall(req)\n"
        "print(repr(s.recv(4)))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-I", "-c", raw], capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() in ("b''", ""), done.stdout + done.stderr
        assert server.wait(timeout=10) == 0
        assert not marker.exists()
    finally:
        server.kill()


def test_a_malformed_request_is_dropped_and_the_next_caller_is_served(run_id):
    server = serving(run_id)
    raw = (
        "import json, socket, struct\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.connect('\\0distrun-relay:{run_id}:0')\n"
        "req = json.dumps(['not', 'a', 'request']).encode()\n"
        "socket.send_fds(s, [struct.pack('!I', len(req))], [0, 1, 2]); s.sendall(req)\n"
        "print(repr(s.recv(4)))\n"
    )
    try:
        bad = subprocess.run([sys.executable, "-I", "-c", raw], capture_output=True, text=True, timeout=30)
        assert bad.stdout.strip() == "b''", bad.stdout + bad.stderr
        good = subprocess.run([sys.executable, "-I", str(RELAY), "join", run_id, "0", "sh", "-c", "exit 4"],
                              capture_output=True, text=True, timeout=30)
        assert good.returncode == 4, good.stderr
    finally:
        server.kill()


def test_a_bad_call_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-I", str(RELAY), "join", "../x", "0", "true"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip() == "relay: give a run id and an attempt number"


def test_mpiruns_daemons_on_other_nodes_start_through_each_nodes_relay(make_plan):
    """Every host but the head runs the installed relay in its launch script; mpirun names the
    relay as its launch agent, the word orted last (ORTE puts --prefix's orted there); the
    preflight looks for the relay on every node."""
    plan = make_plan(launcher="mpirun", hosts=3)
    mpirun = launcher_named("mpirun")
    installed = nodeprog.installed("relay")
    assert installed.startswith("/usr/local/lib/distrun/relay-") and " " not in installed
    argv = mpirun.command(plan, plan.placement.head)
    agent = argv[argv.index("orte_launch_agent") + 1].split(" ")
    assert agent == ["python3", "-I", installed, "join", plan.run_id, "0", "orted"]
    # The ssh that starts them reads the system's client configuration, never the training
    # user's ~/.ssh/config (a job's ProxyCommand would run in this run), and logs in with the
    # attempt's certificate (the run's hosts, minutes, the relay only).
    assert argv[argv.index("plm_rsh_agent") + 1] == (
        f"ssh -F /etc/ssh/ssh_config -o BatchMode=yes -i {plan.run_dir}/attempts/0/mesh-key")
    scripts = launch_scripts(plan)
    head = plan.placement.head.name
    assert sorted(scripts) == sorted(h.name for h in plan.placement.hosts)
    assert "bin/mpirun" in scripts[head] and " serve " not in scripts[head]
    for host in plan.placement.hosts:
        if host.name != head:
            assert f"python3 -I {installed} serve {plan.run_id} 0 >" in scripts[host.name]
    assert mpirun.needs(plan)[0]["distrun relay"] == [installed]
    assert not any("relay" in name for name in plan_files(plan))


def test_a_restart_joins_its_own_attempts_relay(make_plan):
    plan = make_plan(launcher="mpirun", hosts=2)
    again = replace(plan, attempt=replace(plan.attempt, restart=1))
    argv = launcher_named("mpirun").command(again, again.placement.head)
    assert argv[argv.index("orte_launch_agent") + 1].split(" ")[-3:] == [again.run_id, "1", "orted"]


def test_one_node_needs_no_relay(make_plan):
    plan = make_plan(launcher="mpirun", hosts=1)
    mpirun = launcher_named("mpirun")
    assert "orte_launch_agent" not in mpirun.command(plan, plan.placement.head)
    assert "plm_rsh_agent" not in mpirun.command(plan, plan.placement.head)
    assert "distrun relay" not in mpirun.needs(plan)[0]
    assert list(launch_scripts(plan)) == [plan.placement.head.name]


def test_torchrun_starts_its_own_launcher_on_every_node_and_no_relay(make_plan):
    plan = make_plan(launcher="torchrun", hosts=3)
    assert "relay" not in json.dumps(launch_scripts(plan))


def test_setup_installs_the_relay_the_runner_names(tmp_path):
    """Role job's install step (run by setup) writes the composed relay under the name the
    runner computes from its digest: a node set up by this version has the file runs ask for."""
    if os.geteuid() != 0:
        pytest.skip("the install step makes the files root's: needs root")
    playbook = tmp_path / "install.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: job, tasks_from: install}\n"
        f"      vars: {{job_programs_dir: '{tmp_path}/programs'}}\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_BECOME="false")
    bindir = Path(sys.executable).parent
    done = subprocess.run([str(bindir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-e", "ansible_become=false",
                           str(playbook)], capture_output=True, text=True, env=env, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    names = {Path(nodeprog.installed(p)).name: p for p in nodeprog.INSTALLED}
    assert sorted(p.name for p in (tmp_path / "programs").iterdir()) == sorted(names)
    for name, program in names.items():  # the relay, the root entry point and the programs it runs
        written = tmp_path / "programs" / name
        assert written.read_text() == nodeprog.text(program)
        assert written.stat().st_mode & 0o7777 == 0o755 and written.stat().st_uid == 0


def test_a_supervised_relay_serves_each_try_in_turn_and_ends_on_done(run_id):
    """A detached mpirun run's supervisor starts the daemons again at each try: the relay takes
    up to CALLERS callers, one after another, and the supervisor's --done ends it at once."""
    server = relay("serve", run_id, "0", "20", "3", stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    try:
        for code in (5, 0):
            joined = subprocess.run([sys.executable, "-I", str(RELAY), "join", run_id, "0", "sh", "-c", f"exit {code}"],
                                    capture_output=True, text=True, timeout=30)
            assert joined.returncode == code, joined.stderr
        assert server.poll() is None  # a third try may come
        done = subprocess.run([sys.executable, "-I", str(RELAY), "join", run_id, "0", "--done"], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert server.wait(timeout=10) == 0
    finally:
        server.kill()


def test_a_detached_mpirun_run_with_restarts_runs_the_supervisor_on_the_head(make_plan):
    """The head's launch script runs the supervisor (staged in the attempt's folder with its config:
    mpirun's own command line, the hosts, the policy, the daemons' ssh for its probe); the other
    hosts' relays take one caller per try."""
    plan = make_plan(launcher="mpirun", hosts=3)
    plan = replace(plan, attempt=replace(plan.attempt, max_restarts=2, supervised=True, exclude_failed=True))
    scripts, files = launch_scripts(plan), plan_files(plan)
    head = plan.placement.head.name
    assert "python3 -I supervise.py supervise.json >" in scripts[head] and "bin/mpirun" not in scripts[head]
    installed = nodeprog.installed("relay")
    for host in plan.placement.hosts:
        if host.name != head:
            assert f"python3 -I {installed} serve {plan.run_id} 0 120 3 >" in scripts[host.name]
    config = json.loads(files["attempts/0/supervise.json"])
    assert config["argv"] == launcher_named("mpirun").command(replace(plan, attempt=replace(plan.attempt, supervised=False)),
                                                              plan.placement.head)
    assert (config["head"], config["max_restarts"], config["exclude_failed"], config["np"]) == (head, 2, True, None)
    assert config["probe"][:5] == ["ssh", "-F", "/etc/ssh/ssh_config", "-o", "BatchMode=yes"]
    assert config["release"] == ["python3", "-I", installed, "join", plan.run_id, "0", "--done"]
    program = files["attempts/0/supervise.py"]
    assert program.index("def restart_hosts(") < program.index("class Supervisor")  # the rule, in front
