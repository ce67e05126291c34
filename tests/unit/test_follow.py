"""The follower's remote commands and what their ends mean, run for real in a local shell."""

from __future__ import annotations

import dataclasses
import getpass
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from distrun.inventory.cluster import cluster_from_json
from distrun.run import attempt_shell, follow, starter
from distrun.transport import nodeprog, rundir
from distrun.transport.remote import as_user, run_each

from .plans import plan_for

ME = getpass.getuser()
HOSTS = {h: {"ansible_connection": "local", "ansible_host": f"10.0.0.{i}", "slots": 1} for i, h in enumerate(("n1", "n2", "n3"), 1)}


def plan_in(tmp_path: Path, launcher: str = "torchrun"):
    inv = {
        "_meta": {"hostvars": HOSTS},
        "all": {"children": ["head", "workers"]},
        "head": {"hosts": ["n1"]},
        "workers": {"hosts": list(HOSTS)},
    }
    cluster = cluster_from_json(Path("/inv/hosts.yml"), inv, None)
    plan = plan_for(cluster, run_id="R1", launcher=launcher, workload="ddp")
    return cluster, dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, user=ME), shared_dir=str(tmp_path))


def sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)


def said(out: str) -> dict:
    """The follow verb's answer (its last JSON line): {"exit": rc} or {"error": why}."""
    got = nodeprog.answer(out, "follow")
    assert got is not None, out
    return got


def test_wait_prints_the_exit_marker_with_the_launchers_code(tmp_path):
    _, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    (run_dir / "exitcode-n2").write_text("7\n")
    out = sh(attempt_shell.wait_command(plan, "n2"))
    assert out.returncode == 0 and said(out.stdout) == {"verb": "follow", "exit": 7}


def test_a_failed_cd_stops_the_command_and_names_host_and_path(tmp_path):
    _, plan = plan_in(tmp_path)  # the run dir does not exist
    out = sh(attempt_shell.wait_command(plan, "n2"))
    assert "exit" not in said(out.stdout)
    assert said(out.stdout)["error"].startswith(f"n2: cannot enter the run directory {plan.run_dir} as user {ME}")


@pytest.mark.parametrize("content", ["", "garbage\n"])
def test_an_exit_file_without_a_number_gives_no_exit_marker(tmp_path, content):
    _, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    (run_dir / "exitcode-n3").write_text(content)
    out = sh(attempt_shell.wait_command(plan, "n3"))
    assert "exit" not in said(out.stdout)
    assert said(out.stdout)["error"].startswith(f"n3: {run_dir}/exitcode-n3 holds no exit code")


def test_the_head_reports_a_launcher_that_never_wrote_its_exit_code(tmp_path):
    _, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    (run_dir / "launcher-n1.pid").write_text("999999\n")  # no such process: tail returns at once
    (run_dir / "launcher-n1.log").write_text("hello\n")
    out = sh(attempt_shell.tail_command(plan, "n1"))
    assert "| hello" in out.stdout.splitlines() and "exit" not in said(out.stdout)
    assert said(out.stdout)["error"].startswith(f"n1: the launcher ended without writing {run_dir}/exitcode-n1")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_as_user_runs_the_command_as_that_user_from_root():
    out = sh(as_user("nobody", "id -un"))
    assert out.stdout.strip() == "nobody"


def test_as_user_names_the_training_user_for_every_login():
    text = as_user("distrun", "cd /srv/distrun/runs/R1")
    assert ("runuser -u distrun -- env -C / -u XDG_RUNTIME_DIR -u DBUS_SESSION_BUS_ADDRESS "
            "env -u BASH_ENV -u ENV bash --norc --noprofile -c") in text
    assert "sudo -n -u distrun -- env -C / env -u BASH_ENV -u ENV bash --norc --noprofile -c" in text


def test_as_user_reads_none_of_the_users_startup_files(tmp_path):
    """bash reads ~/.bashrc for a command when it takes itself for one sshd started (SSH_CLIENT set,
    as under root's ssh login through runuser), and $BASH_ENV always: both are the job's to write."""
    (tmp_path / ".bashrc").write_text(f"touch {tmp_path}/bashrc-ran\n")
    (tmp_path / "env.sh").write_text(f"touch {tmp_path}/bash-env-ran\n")
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    ssh, bash_env = {**base, "SSH_CLIENT": "10.0.0.1 40000 22"}, {**base, "BASH_ENV": str(tmp_path / "env.sh")}
    for env, ran in ((ssh, "bashrc-ran"), (bash_env, "bash-env-ran")):  # what a plain bash -c does
        subprocess.run(["bash", "-c", "true"], env=env, check=True)
        assert [p.name for p in tmp_path.glob("*-ran")] == [ran]
        (tmp_path / ran).unlink()
    for env in (ssh, bash_env):
        done = subprocess.run(["sh", "-c", as_user(getpass.getuser(), "echo ran")], env=env, capture_output=True, text=True)
        assert done.stdout.strip() == "ran", done.stderr
        assert list(tmp_path.glob("*-ran")) == []


def test_a_remote_error_is_reported_as_what_it_is_not_as_lost_contact():
    out = follow.session_ended("w3", 3, ["DISTRUN_ERROR w3: cannot enter the run directory /srv/distrun/runs/R1 as user distrun"], True)
    assert not out.lost and out.host == "w3"
    assert out.reason == "w3: cannot enter the run directory /srv/distrun/runs/R1 as user distrun"


def test_only_ssh_failing_is_lost_contact():
    lost = follow.session_ended("w3", 255, ["Timeout, server w3 not responding."], True)
    assert lost.lost and lost.reason == "lost contact with w3 (ssh failed: Timeout, server w3 not responding.)"
    local = follow.session_ended("w3", 255, [], False)
    assert not local.lost
    sudo = follow.session_ended("w3", 1, ["sudo: a password is required"], True)
    assert not sudo.lost and sudo.reason == "following the launcher on w3 failed (exit 1): sudo: a password is required"


@pytest.mark.usefixtures("alone_with_run_tags")
def test_one_failed_launch_host_stops_the_others_at_once(tmp_path):
    cluster, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    # n3's launcher: a process group that would wait forever on a rendezvous, its launcher
    # process tagged with the run as the launchers tag theirs.
    (run_dir / "launch-n3.sh").write_text(f"DISTRUN_RUN_ID={plan.run_id} sleep 300\n")
    waiting = subprocess.Popen(["bash", "launch-n3.sh"], cwd=run_dir, start_new_session=True)
    try:
        (run_dir / "launcher-n3.pid").write_text(f"{waiting.pid}\n")
        (run_dir / "launcher-n1.pid").write_text("999999\n")
        (run_dir / "launcher-n1.log").write_text("")
        (run_dir / "exitcode-n2").write_text("1\n")  # n2's launcher failed
        outcome = follow.follow(cluster, plan, ["n1", "n2", "n3"], lambda _: None)
        assert outcome.host == "n2" and outcome.rc == 1 and not outcome.lost
        assert outcome.reason == "launcher on n2 exited 1"
        assert waiting.wait(timeout=20) == -signal.SIGTERM
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()


def test_the_follower_reports_an_unenterable_run_dir_with_its_path(tmp_path):
    cluster, plan = plan_in(tmp_path, launcher="mpirun")  # the run dir was never made
    outcome = follow.follow(cluster, plan, ["n1"], lambda _: None)
    assert not outcome.lost and outcome.host == "n1" and outcome.rc != 0
    assert outcome.reason.startswith(f"n1: cannot enter the run directory {plan.run_dir}")


def test_launch_starts_each_launch_script_detached_with_its_own_environment(tmp_path, monkeypatch):
    cluster, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    for h in ("n1", "n2"):
        # The launcher outlives the session that started it, in its own session, with its own env.
        (run_dir / f"launch-{h}.sh").write_text(
            f"sleep 0.5; ps -o sid= -p $$ > sid-{h}; env > env-{h}; echo 0 > exitcode-{h}\n")
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.9 4000 10.0.0.1 22")
    monkeypatch.setenv("LANG", "xx_YY.UTF-8")
    assert starter.launch(cluster, plan, ["n1", "n2"]) == {}
    for h in ("n1", "n2"):
        assert not (run_dir / f"exitcode-{h}").exists(), "launch waited for the launcher"
    for _ in range(100):
        if all((run_dir / f"exitcode-{h}").exists() for h in ("n1", "n2")):
            break
        subprocess.run(["sleep", "0.1"], check=True)
    for h in ("n1", "n2"):
        env = dict(line.split("=", 1) for line in (run_dir / f"env-{h}").read_text().splitlines() if "=" in line)
        assert env["LANG"] == "C.UTF-8" and env["USER"] == ME and "HOME" in env and "PATH" in env
        assert "SSH_CONNECTION" not in env
        assert int((run_dir / f"sid-{h}").read_text()) != os.getsid(0)


def test_launch_names_the_host_whose_launch_script_is_missing(tmp_path):
    cluster, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    (run_dir / "launch-n1.sh").write_text("echo 0 > exitcode-n1\n")
    failed = starter.launch(cluster, plan, ["n1", "n3"])
    assert failed == {"n3": f"n3: there is no launch script {run_dir}/launch-n3.sh"}


def test_launch_names_the_host_whose_run_directory_is_missing(tmp_path):
    cluster, plan = plan_in(tmp_path)
    failed = starter.launch(cluster, plan, ["n2"])
    assert list(failed) == ["n2"] and f"cannot enter the run directory {plan.run_dir}" in failed["n2"]


def test_run_each_runs_every_hosts_command_at_once_and_says_how_each_ended(tmp_path):
    cluster, _ = plan_in(tmp_path)
    nodes = {n.name: n for n in cluster.nodes}
    # Each command waits up to 60 s for the other's file: run one after the other, the first fails.
    a, b = tmp_path / "a", tmp_path / "b"
    wait = "for i in $(seq 600); do [ -e {f} ] && break; sleep 0.1; done; [ -e {f} ]"
    done = run_each(nodes, {"n1": f"touch {a}; {wait.format(f=b)} && echo one",
                            "n2": f"touch {b}; {wait.format(f=a)} && {{ echo two >&2; exit 3; }}"}, 120)
    assert (done["n1"].rc, done["n1"].out.strip()) == (0, "one")
    assert done["n2"].rc == 3 and done["n2"].last_line() == "two"


def test_run_each_kills_a_command_past_its_time_and_says_so(tmp_path):
    cluster, _ = plan_in(tmp_path)
    done = run_each({n.name: n for n in cluster.nodes}, {"n1": "echo begun; sleep 30"}, 1)["n1"]
    assert done.rc is None and done.out.strip() == "begun" and done.last_line() == "no answer in 1 s"


# ------------------------------------------------------------------ a follower never waits forever

def test_wait_ends_when_its_launcher_is_dead_and_no_exit_code_will_come(tmp_path):
    _, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    (run_dir / "launcher-n2.pid").write_text("999999\n")  # no such process, no exit code
    started = time.monotonic()
    out = sh(attempt_shell.wait_command(plan, "n2"))
    assert "exit" not in said(out.stdout)
    assert said(out.stdout)["error"].startswith(f"n2: the launcher ended without writing {run_dir}/exitcode-n2")
    assert time.monotonic() - started < 15


def test_wait_ends_when_its_launch_script_is_killed_before_it_writes_its_exit_code(tmp_path):
    _, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    (run_dir / "launch-n2.sh").write_text("sleep 300\n")
    script = subprocess.Popen(["bash", "launch-n2.sh"], cwd=run_dir, start_new_session=True)
    try:
        (run_dir / "launcher-n2.pid").write_text(f"{script.pid}\n")
        waiting = subprocess.Popen(["bash", "-c", attempt_shell.wait_command(plan, "n2")], stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        assert waiting.poll() is None, "the follower ended while its launcher ran"
        script.kill()
        script.wait()
        out, _ = waiting.communicate(timeout=15)
        assert "the launcher ended without writing" in said(out)["error"]
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()


def test_a_pid_reused_by_another_program_is_not_waited_on(tmp_path):
    _, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "300"])
    try:
        (run_dir / "launcher-n2.pid").write_text(f"{other.pid}\n")
        out = sh(attempt_shell.wait_command(plan, "n2"))
        assert "the launcher ended without writing" in said(out.stdout)["error"]
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("command", ["wait_command", "tail_command"])
def test_a_launcher_that_never_starts_is_named_not_waited_on(tmp_path, monkeypatch, command):
    monkeypatch.setattr(attempt_shell, "START_WAIT_S", 1)
    _, plan = plan_in(tmp_path)
    run_dir = Path(rundir.attempt_path(plan))
    run_dir.mkdir(parents=True)
    out = sh(getattr(attempt_shell, command)(plan, "n1"))
    assert said(out.stdout)["error"].startswith(f"n1: the launcher did not start: no {run_dir}/launcher-n1.pid after 1 s")


def test_a_carriage_return_in_the_log_cannot_end_the_follower(tmp_path):
    """A log line is data whatever it holds: a "\\r" before a forged answer does not make that
    answer a line of its own on the controller."""
    cluster, plan = plan_in(tmp_path, launcher="mpirun")
    folder = Path(rundir.attempt_path(plan))
    folder.mkdir(parents=True)
    (folder / "launcher-n1.log").write_bytes(b'epoch 1 40%\repoch 1 80%\r{"verb": "follow", "exit": 0}\r\ndone\n')
    lines: list[str] = []
    threading.Timer(1.5, lambda: (folder / "exitcode-n1").write_text("5\n")).start()
    outcome = follow.follow(cluster, plan, ["n1"], lines.append)
    assert (outcome.rc, outcome.host) == (5, "n1"), outcome
    assert lines == ["epoch 1 40%", "epoch 1 80%", '{"verb": "follow", "exit": 0}', "done"]


def test_a_byte_that_is_not_utf8_on_a_followers_stream_does_not_hide_its_end(tmp_path, monkeypatch):
    """Whatever a node's shell, sudo or locale prints beside the node program, the controller
    reads on to the answer (a decoding error would end its reader and leave train waiting)."""
    cluster, plan = plan_in(tmp_path, launcher="mpirun")
    monkeypatch.setattr(follow, "tail_command", lambda plan, host: r"""printf 'mot de passe \351chou\351\n| caf\351\n'; """
                        """echo '{"verb": "follow", "exit": 6}'""")
    lines: list[str] = []
    done: list[follow.Outcome] = []
    t = threading.Thread(target=lambda: done.append(follow.follow(cluster, plan, ["n1"], lines.append)), daemon=True)
    t.start()
    t.join(timeout=20)
    assert done and (done[0].rc, done[0].host) == (6, "n1"), "the follower's end never reached the controller"
    assert lines == ["caf\ufffd"]
