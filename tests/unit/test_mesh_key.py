"""The cluster key's forced command (role job's relay.py, verb ``mesh``; role ssh_mesh puts it in
root's keys file): run here as sshd runs it, with SSH_ORIGINAL_COMMAND. What distrun sends over
the key works (the preflight's login check, sftp, rsync's server, an Open MPI daemon's start
through the relay, in the form mpirun writes it); anything else, a shell first, is refused in one
line and starts nothing. The key's use on real nodes: tests/cluster/test_hostile_escapes.py."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from distrun.transport import nodeprog

from .test_relay import RELAY, serving

NS = runpy.run_path(str(RELAY))
CallError = NS["CallError"]
PROGRAMS = nodeprog.PROGRAMS_DIR
INSTALLED = nodeprog.installed("relay")
# What Open MPI 4.1's rsh launcher sent over ssh for a daemon on node2 of the test cluster, with
# --prefix /usr and distrun's launch agent (its plm_base_verbose output; the vpid filled in).
ORTE = (Path(__file__).parent / "data" / "openmpi" / "daemon-over-ssh.txt").read_text().strip()


def plan(command, env=None):
    return NS["mesh_plan"](command, {"PATH": "/usr/bin:/bin", "HOME": "/home/distrun", **(env or {})}, PROGRAMS)


def refused(command) -> str:
    with pytest.raises(CallError) as exc:
        plan(command)
    return str(exc.value)


def test_the_login_check_and_a_daemons_start_are_allowed():
    assert plan("true") == ("exit", 0)
    kind, run, attempt, argv, env = NS["mesh_plan"](ORTE, {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/local/lib"},
                                                    "/usr/local/lib/distrun")
    assert (kind, run, attempt) == ("join", "r1", "0")
    assert argv[:3] == ["/usr/bin/orted", "-mca", "ess"]
    assert "1167785984.0;tcp://10.89.0.11,10.89.1.11:49901" in argv  # a quoted ';' is an argument
    assert argv[-1] == "^s1,s2,cray,isolated"
    assert env["PATH"] == "/usr/bin:/usr/bin:/bin"
    assert env["LD_LIBRARY_PATH"] == "/usr/lib:/usr/local/lib"
    assert env["DYLD_LIBRARY_PATH"] == "/usr/lib:"


@pytest.mark.skipif(not shutil.which("rsync"), reason="rsync is not installed on this machine")
def test_rsyncs_server_runs_from_the_systems_path_and_its_daemon_mode_is_refused():
    kind, argv, env = plan("rsync --server -logDtpre.iLsfxCIvu --omit-dir-times . /srv/distrun/")
    assert kind == "exec" and os.path.basename(argv[0]) == "rsync" and argv[0].startswith("/")
    assert argv[1:] == ["--server", "-logDtpre.iLsfxCIvu", "--omit-dir-times", ".", "/srv/distrun/"]
    assert env["PATH"] == NS["SYSTEM_PATH"]
    for bad in ("rsync --server --daemon .", "rsync --server --config=/home/distrun/x.conf --daemon .",
                "rsync --server -e.LsfxC . /x ; sh -c id", "rsync --server --rsh=sh . /x",
                "rsync --server -s .", "rsync --server -logDtprse.iLsfxCIvu . /x", "rsync --server --protect-args . /x"):
        assert refused(bad).startswith("rsync ")


@pytest.mark.parametrize("command", [
    None, "", "bash", "sh -c id", "setsid sleep 900 &", "true; id", "true && id",
    f"python3 -I {INSTALLED} serve r1 0",  # a relay of its own: a listener outside every unit
    "python3 -I /home/distrun/relay-0123456789ab.py join r1 0 sleep 900",  # a relay file the job wrote
    f"python3 {INSTALLED} join r1 0 sleep 900",  # without -I the job's modules would load
    f"LD_PRELOAD=/home/distrun/x.so ; export LD_PRELOAD ; python3 -I {INSTALLED} join r1 0 orted",
    f"PATH=/x ; id ; python3 -I {INSTALLED} join r1 0 orted",
    f"PATH=$(id) ; export PATH ; python3 -I {INSTALLED} join r1 0 orted",
    f"python3 -I {INSTALLED} join ../x 0 orted",
    f"python3 -I {INSTALLED} join r1 0 orted ; sleep 900",
    "python3 -c 'import os; os.system(\"id\")'",
])
def test_anything_else_is_refused(command):
    assert refused(command)


def run_mesh(command: str | None, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SSH_ORIGINAL_COMMAND"}
    if command is not None:
        env["SSH_ORIGINAL_COMMAND"] = command
    return subprocess.run([sys.executable, "-I", str(RELAY), "mesh"], env=env, capture_output=True, text=True,
                          timeout=60, **kw)


def test_a_refusal_is_one_line_exit_1_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    done = run_mesh(f"touch {marker}")
    assert done.returncode == 1 and not marker.exists()
    assert len(done.stderr.strip().splitlines()) == 1
    assert "refused 'touch " in done.stderr and "through a distrun launcher" in done.stderr
    shell = run_mesh(None)
    assert shell.returncode == 1 and "(a login shell)" in shell.stderr


def test_a_daemons_start_runs_in_the_relay_with_the_paths_mpirun_set(tmp_path):
    """The whole way: sshd's command in Open MPI's form reaches the attempt's relay, which starts
    the daemon as its child with the PATH the assignments made, never as the gate's own child."""
    run_id = f"mesh-{uuid.uuid4().hex[:8]}"
    server = serving(run_id)
    try:
        relay_dir = str(RELAY.parent)
        command = (f"PATH={tmp_path}:$PATH ; export PATH ; python3 -I {relay_dir}/relay-0123456789ab.py join {run_id} 0 "
                   "sh -c 'echo \"ppid=$PPID path=${PATH%%:*}\"; exit 5'")
        ns_plan = NS["mesh_plan"](command, dict(os.environ), relay_dir)
        assert ns_plan[0] == "join"
        done = subprocess.run([sys.executable, "-c", (
            "import runpy, sys; ns = runpy.run_path(sys.argv[1]); "
            "kind, run, attempt, argv, env = ns['mesh_plan'](sys.argv[2], dict(__import__('os').environ), sys.argv[3]); "
            "sys.exit(ns['join'](run, attempt, argv, env=env))"), str(RELAY), command, relay_dir],
            capture_output=True, text=True, timeout=30)
        assert done.returncode == 5, done.stderr
        assert done.stdout.strip() == f"ppid={server.pid} path={tmp_path}"
    finally:
        server.kill()

