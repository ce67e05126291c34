"""SIGTERM and SIGHUP while a run is followed end it as Ctrl-C does: the 'except KeyboardInterrupt'
path runs (the ranks are stopped, the logs collected), then distrun exits 143 (130 for Ctrl-C).
A SIGHUP ignored at start (nohup) stays ignored. Run as real processes given real signals; the
run itself is a stand-in that follows until interrupted and says what its Ctrl-C path did."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

# The CLI, with train's run_job replaced by a follower that waits for its ranks for ever and,
# when interrupted, does what train's Ctrl-C path does: stop, collect, close the record.
PROGRAM = r"""
import sys, time
import distrun.run.train
from distrun import terminating

def run_job(request, view, early, t0):
    try:
        print("following", flush=True)
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("stopping every rank; collecting logs", flush=True)
        print(f"record: stopped, {terminating.word()}, rc {terminating.exit_code()}", flush=True)
        return terminating.exit_code()

distrun.run.train.run_job = run_job
import distrun.cli.main
sys.argv = ["distrun", "train", "-i", sys.argv[1]]
distrun.cli.main.run()
"""


def _follow(tmp_path, signum: int, preexec=None, then: int | None = None) -> subprocess.CompletedProcess[str]:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[head]\nw1 ansible_host=192.0.2.1\n[workers]\nw1\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DISTRUN_HOME": str(tmp_path / "state")}
    def start() -> None:
        # A shell starts a background command ('cmd &') with SIGINT ignored, and Python then keeps
        # it ignored; a suite run under nohup has SIGHUP ignored: give the program the terminal's
        # defaults, as a command typed at a prompt has (the nohup case sets its own below).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        if preexec is not None:
            preexec()

    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(inv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=start)
    assert proc.stdout is not None
    # wait until it follows, then signal it
    line = ""
    deadline = time.monotonic() + 60
    while "following" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
    assert "following" in line, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signum)
    if then is not None:
        time.sleep(1)
        assert proc.poll() is None, "the first signal ended it"
        proc.send_signal(then)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, -9, out, err)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_sigterm_while_following_takes_the_ctrl_c_path_and_exits_143(tmp_path):
    done = _follow(tmp_path, signal.SIGTERM)
    assert done.returncode == 143, done.stderr
    assert "stopping every rank" in done.stdout and "terminated (SIGTERM), rc 143" in done.stdout
    assert "Traceback" not in done.stderr


def test_ctrl_c_still_exits_130(tmp_path):
    done = _follow(tmp_path, signal.SIGINT)
    assert done.returncode == 130, done.stderr
    assert "stopping every rank" in done.stdout and "interrupted, rc 130" in done.stdout


def test_sighup_ends_the_run_the_same_way_with_its_output_silenced(tmp_path):
    done = _follow(tmp_path, signal.SIGHUP)
    assert done.returncode == 143 and "Traceback" not in done.stderr
    assert "stopping every rank" not in done.stdout  # the terminal is gone: nothing is written to it


def test_a_sighup_ignored_at_start_stays_ignored(tmp_path):
    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    done = _follow(tmp_path, signal.SIGHUP, preexec=nohup, then=signal.SIGTERM)
    assert done.returncode == 143  # still following after the SIGHUP: the SIGTERM ended it
    assert "stopping every rank" in done.stdout and "terminated (SIGTERM)" in done.stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_sigterm_outside_a_run_is_one_line_and_143(tmp_path, signum):
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time, distrun.cli.main, distrun.cli.records as r\n"
                             "r.runs.callback = lambda **k: (print('listing', flush=True), time.sleep(30))\n"
                             "sys.argv = ['distrun', 'runs']\ndistrun.cli.main.run()\n"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "DISTRUN_HOME": str(tmp_path / "s"), "HOME": str(tmp_path)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listing"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 143
    assert err.strip().splitlines() == ["distrun: error: terminated (SIGTERM)"]


def test_a_sighup_while_a_playbook_runs_only_flags_it_as_sigterm_does():
    # The playbook is stopped the way ansible-runner stops it (its cancel flag), then the command
    # ends the Ctrl-C way with 143: a signal raised in the middle of the bridge would leave
    # ansible-playbook running.
    import os

    from distrun import terminating
    from distrun.transport.ansible_bridge import FlagSignals

    before = signal.getsignal(signal.SIGHUP)
    saved = os.dup(1), os.dup(2)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a terminal, even when the suite runs under nohup
        terminating.install()
        with FlagSignals() as flags:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert flags.raised
        assert terminating.exit_code() == 143
        assert signal.getsignal(signal.SIGHUP) is terminating._handler  # restored after the playbook
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        signal.signal(signal.SIGHUP, before)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        terminating.received = None
