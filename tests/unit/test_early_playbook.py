"""run.yml's ansible-playbook is started before the run is planned (early_playbook.EarlyPlaybook):
given its arguments, it runs exactly what the usual start runs; without them, it runs nothing."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from distrun.errors import UserError
from distrun.planning.request import JobRequest, ProgramRequest
from distrun.run import train
from distrun.transport import ansible_bridge
from distrun.transport.ansible_bridge import run_playbook
from distrun.transport.ansible_start import ARGS_FROM, NO_ARGUMENTS, unix_address
from distrun.transport.early_playbook import EarlyPlaybook
from distrun.transport.playbook_events import PlaybookResult

PROGRAM = Path(sys.executable).parent / "distrun-ansible-playbook"
pytestmark = pytest.mark.skipif(not os.access(PROGRAM, os.X_OK), reason=f"{PROGRAM} is not installed (pip install -e .)")

PLAY = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: Publish what the run said
      ansible.builtin.set_fact:
        said: "{{ word | default('nothing') }}"
        in_play: "{{ ansible_play_hosts | join(',') }}"
    - name: Leave a mark
      ansible.builtin.copy:
        content: "{{ word | default('nothing') }}"
        dest: "{{ marks }}/{{ inventory_hostname }}"
    - name: A step the run skips by its tag
      ansible.builtin.fail:
        msg: not skipped
      tags: [skipped_in_runs]
"""


@pytest.fixture
def play(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(PROGRAM.parent) + os.pathsep + os.environ["PATH"])
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "marks").mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "marks": str(tmp_path / "marks")}
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"a": local, "b": local}}}))
    return tmp_path


def _run_args(where: Path) -> dict:
    return {"extravars": {"word": "hello"}, "limit": "a", "skip_tags": "skipped_in_runs"}


def test_given_its_arguments_it_runs_what_the_usual_start_runs(play):
    usual = run_playbook(str(play / "play.yml"), play / "hosts.yml", play / "usual", **_run_args(play))
    (play / "marks" / "a").unlink()
    early = EarlyPlaybook.start(str(play / "play.yml"), play / "hosts.yml", play / "early")
    assert early is not None
    seen: list[str] = []
    result = early.run(**_run_args(play), on_event=lambda e: seen.append(e.kind))
    assert result is not None
    assert result.ok and usual.ok, [h.last_error for h in result.failures()]
    # The same play: only the limited host, the extra vars, the tagged step skipped.
    assert set(result.hosts) == set(usual.hosts) == {"a"}
    assert result.fact("said") == usual.fact("said") == "hello" and result.fact("in_play") == "a"
    assert (play / "marks" / "a").read_text() == "hello" and not (play / "marks" / "b").exists()
    assert "ok" in seen and "stats" in seen  # its events reached the caller
    # The record says the command it ran, not the socket it waited on; no socket is left.
    command = json.loads((result.artifact_dir / "command").read_text())["command"]
    assert ARGS_FROM not in command and command[command.index("--limit") + 1] == "a"
    assert command[command.index("-e") + 1] == json.dumps({"word": "hello"})
    assert not list((play / "early" / "ansible").glob("*.sock"))


@pytest.mark.parametrize("when", ["at once", "while it waits"])
def test_cancelled_it_runs_nothing_and_leaves_no_record(play, when):
    early = EarlyPlaybook.start(str(play / "play.yml"), play / "hosts.yml", play / "early")
    assert early is not None
    if when == "while it waits":  # Ansible imported, the program asked for its arguments
        assert select.select([early.sock], [], [], 60)[0], "the program never asked for its arguments"
    early.cancel()
    assert not early.thread.is_alive()
    assert not list((play / "marks").iterdir())  # not a task ran
    assert not (play / "early" / "ansible" / "artifacts" / str(early.runner.config.ident)).exists()
    assert not list((play / "early" / "ansible").glob("*.sock"))
    early.cancel()  # twice: nothing more


def test_a_program_that_ends_before_asking_leaves_the_playbook_to_the_usual_start(play, monkeypatch, tmp_path):
    broken = tmp_path / "ends-at-once"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(ansible_bridge, "playbook_program", lambda: str(broken))
    early = EarlyPlaybook.start(str(play / "play.yml"), play / "hosts.yml", play / "early")
    assert early is not None
    assert early.run(**_run_args(play)) is None
    assert not (play / "early" / "ansible" / "artifacts" / str(early.runner.config.ident)).exists()


@pytest.mark.parametrize("start", ["usual", "early"])
def test_a_sigterm_as_the_playbook_ends_is_not_lost(play, start):
    """SIGTERM (distrun stop asking a run's controller to stop) that arrives as the last task of
    run.yml ends: the result says 'canceled', so the run takes the Ctrl-C way instead of following
    ranks nobody will stop."""
    import signal

    from distrun import terminating

    def on_event(event) -> None:
        if event.kind == "stats":  # the playbook's end: every task has run
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    result: PlaybookResult | None
    try:
        if start == "usual":
            result = run_playbook(str(play / "play.yml"), play / "hosts.yml", play / "usual", on_event=on_event,
                                  **_run_args(play))
        else:
            early = EarlyPlaybook.start(str(play / "play.yml"), play / "hosts.yml", play / "early")
            assert early is not None
            result = early.run(**_run_args(play), on_event=on_event)
        assert result is not None
        assert (play / "marks" / "a").read_text() == "hello"  # it ran to its end
        assert result.status == "canceled" and not result.ok
        assert terminating.exit_code() == 143
        assert signal.getsignal(signal.SIGTERM) is before  # the handler before is back
    finally:
        signal.signal(signal.SIGTERM, before)
        terminating.received = None


@pytest.mark.parametrize("answer", [b"", b"{}", b'{"args": "--limit a"}', b'{"args": [1]}', b"not json"])
def test_without_a_well_formed_answer_the_program_runs_nothing(play, answer):
    where = play / "args.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, fd = unix_address(str(where))
    server.bind(address)
    os.close(fd)
    server.listen(1)

    def answer_once() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(answer)

    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    proc = subprocess.run([str(PROGRAM), ARGS_FROM, str(where), str(play / "play.yml"), "-i", str(play / "hosts.yml")],
                          capture_output=True, text=True, timeout=120)
    server.close()
    assert proc.returncode == NO_ARGUMENTS, proc.stdout + proc.stderr
    assert "gave this playbook no arguments; nothing was run" in proc.stderr
    assert not list((play / "marks").iterdir())


@pytest.fixture
def started(monkeypatch) -> list[EarlyPlaybook | None]:
    """Every early playbook started, in order (None: not started)."""
    seen: list[EarlyPlaybook | None] = []
    real = EarlyPlaybook.start

    def start(*args, **kwargs):
        early = real(*args, **kwargs)
        seen.append(early)
        return early

    monkeypatch.setattr(EarlyPlaybook, "start", start)
    return seen


def test_a_refused_run_stops_it_and_leaves_no_record(play, started):
    (play / "bad.yml").write_text(json.dumps({"all": {"children": {"head": {"hosts": {"a": {}}}}}}))
    with pytest.raises(UserError, match="workers"):
        train.run_job(JobRequest(inventory=play / "bad.yml", program=ProgramRequest(script=play / "job.py")))
    assert started and started[0] is not None and not started[0].thread.is_alive()
    assert not list((play / "home" / "runs").iterdir())  # a bad inventory leaves no record


def test_the_command_line_starts_it_first_and_a_bad_flag_stops_it(play, started, capsys):
    """'distrun train' starts run.yml's program before it imports the rest of the runner; a flag
    it refuses after that (--prepare without --workdir) stops the program and leaves no record.
    --dry-run never starts one."""
    from distrun.cli.main import main

    (play / "job.py").write_text("print('hi')\n")
    base = ["train", "--inventory", str(play / "hosts.yml"), "--script", str(play / "job.py")]
    with pytest.raises(SystemExit) as stop:
        main([*base, "--prepare", "make"], standalone_mode=False)
    assert stop.value.code == 2 and "--prepare runs in your project folder" in capsys.readouterr().err
    assert len(started) == 1 and started[0] is not None and not started[0].thread.is_alive()
    assert not list((play / "home" / "runs").iterdir())
    with pytest.raises(SystemExit):
        main([*base, "--dry-run", "--np", "0"], standalone_mode=False)
    assert len(started) == 1
