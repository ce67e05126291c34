"""People mode: no run verb of a person sends program text that a node runs as root.

Where the inventory lists people (distrun_users), every command a run verb sends for root's node
programs is ``sudo -n <the installed entry point> PROGRAM VERB CFG``: the one sudo rule names that
file, which takes the caller from sudo and runs setup's installed programs, never text that came
over the connection. The entry point's own refusals are run here for real (as root, the caller
named by SUDO_UID as sudo names it).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from distrun.inventory import identity
from distrun.inventory.people import People, Person
from distrun.run import attempt_shell, busy, certificate, collect, collect_rules, ending, liveness, staging
from distrun.transport import nodeprog, remote
from distrun.transport.remote import Done

from .plans import plan_for
from .test_launchers import MIXED, cluster

ENTRY = nodeprog.installed("entry")
RUNNER = Path(remote.__file__).parents[1]


def _people_cluster():
    """The cluster as alice's verbs reach it (DISTRUN_USER=alice): her login, her runs."""
    c = cluster(dict(list(MIXED.items())[:3]))
    return identity.as_person(dataclasses.replace(c, people=People((Person("alice", 2001, (), False),))),
                              {"DISTRUN_USER": "alice"})


def _people_plan(c):
    return plan_for(c, run_id="r1", launcher="torchrun")


def _sent_as_root(command: str) -> list[str]:
    """What in command is a node program's text or a way to run text as root."""
    found = [w for w in ("-I -c", "NODECOMMON", "bash -c", "sudo -n --") if w in command]
    found += [p for p in nodeprog.SOURCES if nodeprog.text(p)[200:400] in command]
    return found


def test_no_run_verb_of_a_person_sends_program_text_a_node_runs_as_root(monkeypatch, tmp_path):
    c = _people_cluster()
    plan = _people_plan(c)
    assert plan.launch.people and plan.launch.user == "alice" and plan.run_dir.startswith("/srv/distrun/people/alice/")
    host = plan.placement.head.name
    sent: list[tuple[str, str]] = []

    def shell(node, command, **_):
        sent.append((node.name, command))
        return ["true"]

    def each(nodes, commands, *_, **__):
        sent.extend(commands.items())
        return {h: Done(0, json.dumps({"verb": "sign", "key": "", "certificate": ""})) for h in commands}

    for module in (busy, liveness, collect):
        monkeypatch.setattr(module, "shell_argv", shell)
    for module in (staging, ending, certificate):
        monkeypatch.setattr(module, "run_each", each)
    # Every verb's way to a node: train (claim, upload, certificate, launch, follow, state, end),
    # stop, status/show, logs and fetch (pack), and a refused run's discard.
    for h in (host, "n2"):
        sent += [(h, attempt_shell.launch_command(plan, h)), (h, attempt_shell.tail_command(plan, h)),
                 (h, attempt_shell.wait_command(plan, h))]
    sent.append(("*", attempt_shell.stop_command(plan)))
    sent.append(("*", staging.upload_command(c.user, "r1", c.has_people)))
    busy._ask(c, [host, "n2"], "r1", None, {})
    liveness.probe(c, plan)
    collect.pull_run(c, plan.run_dir, [host], tmp_path / "pulled", collect_rules.run_end_selection())
    staging.discard(c, [host, "n2"], "r1")
    ender = ending.RunEnd.__new__(ending.RunEnd)
    ender.listener = type("L", (), {"warn": lambda self, text: None})()
    ender.forget_env(c, dataclasses.replace(plan, program=dataclasses.replace(plan.program, user_env_keys=("K",))), [host])
    try:
        certificate.issue(c, plan)
    except Exception:  # noqa: BLE001 - its answer is a stub here; only what it sent counts
        pass
    programs = {cmd.split(ENTRY, 1)[1].split()[0] for _, cmd in sent if ENTRY in cmd}
    assert programs >= {"node", "launch", "attempt", "sign", "files", "pack"}, programs
    for h, command in sent:
        assert not _sent_as_root(command), f"{h}: {_sent_as_root(command)} in {command[:160]}"
        assert f"sudo -n {ENTRY} " in command, f"{h}: {command[:160]}"


def test_the_same_verbs_send_the_program_where_the_cluster_has_no_people():
    plan = plan_for(cluster(dict(list(MIXED.items())[:3])), run_id="r1", launcher="mpirun")
    assert not plan.launch.people
    command = attempt_shell.launch_command(plan, plan.placement.head.name)
    assert "-I -c" in command and ENTRY not in command


def test_only_the_transport_composes_a_command_for_root_and_every_caller_says_the_mode():
    """A new way to a node for root goes through remote.node_command, which knows people mode:
    no module calls nodeprog.command or as_root_or_user itself, and every node_command call names
    people=."""
    for path in RUNNER.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            where = f"{path.relative_to(RUNNER)}:{call.lineno}"
            if path.name != "remote.py":
                assert name not in ("as_root_or_user", "command") or not _is_nodeprog(call), where
                assert name != "as_root_or_user", where
            if name in ("node_command", "root_or_person") and path.name != "remote.py":
                assert any(k.arg == "people" for k in call.keywords), f"{where}: {name} without people="


def _is_nodeprog(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "nodeprog"


def test_the_entry_point_is_installed_by_its_digest_and_names_the_installed_programs():
    text = nodeprog.text("entry")
    assert text.startswith("#!/usr/bin/python3 -I\n")
    assert ENTRY.startswith(f"{nodeprog.PROGRAMS_DIR}/entry-") and ENTRY.endswith(".py")
    table = next(ln for ln in text.splitlines() if ln.startswith("PROGRAMS: dict = "))
    named = json.loads(table.removeprefix("PROGRAMS: dict = ").split("  #")[0])
    assert named == {p: nodeprog.installed(p) for p in nodeprog.PROGRAMS}
    assert set(nodeprog.INSTALLED) == {"relay", "entry", *nodeprog.PROGRAMS}


def _entry(args: list[str], sudo_uid: int | None, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if sudo_uid is not None:
        env["SUDO_UID"] = str(sudo_uid)
    return subprocess.run([sys.executable, "-I", "-c", nodeprog.text("entry"), *args], input=stdin, env=env,
                          capture_output=True, timeout=60)


@pytest.fixture
def as_root():
    if os.geteuid() != 0:
        raise AssertionError("the entry point's tests run it as root, as sudo does: run them as root")


def test_a_person_asking_as_someone_else_is_refused_in_one_line_naming_what_and_who(as_root):
    nobody = pwd.getpwnam("nobody").pw_uid
    done = _entry(["node", "stop", json.dumps({"run": "r1", "user": "root", "grace_s": 1})], nobody)
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and done.stdout == b"", done
    assert "node stop as 'root' (run r1)" in lines[0] and "nobody called" in lines[0], lines[0]


@pytest.mark.parametrize("args, said", [
    (["node", "exec", "{}"], "is not one of"),
    (["stage", "unpack", "{}"], "is not one of"),
    (["node", "scan", "[1]"], "not a JSON object"),
    (["node", "scan", json.dumps({"user": "nobody", "proc": "/tmp/fake"})], "another /proc is root's"),
    (["node", "scan", json.dumps({"user": "nobody", "run": "../x"})], "not a run id"),
])
def test_the_entry_point_takes_only_its_programs_verbs_and_root_s_names(as_root, args, said):
    done = _entry(args, pwd.getpwnam("nobody").pw_uid)
    assert done.returncode == 2 and said in done.stderr.decode(), done


def _entry_space() -> dict:
    """The entry point's functions, loaded as its composed text (not run: its name is not __main__)."""
    space: dict = {"__name__": "entry"}
    exec(compile(nodeprog.text("entry"), "entry.py", "exec"), space)
    return space


def test_the_owners_of_a_run_are_systemds_answer_for_each_of_its_units(monkeypatch):
    space = _entry_space()
    listed = ("distrun:r1:0:n1.service loaded active running x\ndistrun:r1:0:n2.service loaded active running x\n"
              "distrun:r1:1:n1.service loaded inactive dead x\n")
    shown = ("Id=distrun:r1:0:n1.service\nLoadState=loaded\nUser=2101\n\n"
             "Id=distrun:r1:0:n2.service\nLoadState=loaded\nUser=\n\n"
             "Id=distrun:r1:1:n1.service\nLoadState=not-found\nUser=\n")
    answers = iter([listed, shown])
    monkeypatch.setattr(space["subprocess"], "run", lambda argv, **_: type("R", (), {"stdout": next(answers)})())
    monkeypatch.setattr(space["os"].path, "isdir", lambda path: True)
    monkeypatch.setattr(space["pwd"], "getpwuid", lambda uid: type("P", (), {"pw_name": f"u{uid}"})())
    # A person's unit, a unit of root's (no User=), and one gone since it was listed (nobody's).
    assert space["run_owners"]("r1") == {"u2101", "root"}
    answers = iter([listed, shown.split("\n\n")[0]])
    assert "an account systemd did not name" in space["run_owners"]("r1")


def test_a_caller_acts_only_on_runs_whose_units_are_theirs_and_an_admin_on_everyones(monkeypatch):
    space = _entry_space()
    monkeypatch.setitem(space, "run_owners", lambda run: {"bob"})
    monkeypatch.setitem(space, "admins", lambda: set())
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(space["pwd"], "getpwnam", lambda name: nobody)
    refused = space["Refused"]
    with pytest.raises(refused, match=r"attempt state as 'alice' \(run r1\) refused: alice called; run r1 here is bob's"):
        space["allowed"]("attempt", "state", {"user": "alice", "run": "r1"}, "alice")
    with pytest.raises(refused, match="alice called, who is not an admin"):
        space["allowed"]("node", "stop", {"user": "bob", "run": "r1"}, "alice")
    monkeypatch.setitem(space, "admins", lambda: {"alice"})
    assert space["allowed"]("node", "stop", {"user": "bob", "run": "r1"}, "alice") == "bob"
    # Root itself (no sudo: the single-account mode's connection) acts for the config's user.
    assert space["allowed"]("node", "stop", {"user": "bob", "run": "r1"}, "root") == "bob"
