"""Role job's node program (files/node.py), run for real on this machine against processes these
tests start: what a run's scan finds, what stop ends and what it spares, how a bad call is told."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distrun.transport import nodeprog

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "roles" / "job" / "files" / "node.py"

# Tagged processes of this machine's user: a claim test beside these takes turns with them.
pytestmark = pytest.mark.usefixtures("alone_with_run_tags")


def node(verb: str, config: object) -> subprocess.CompletedProcess[str]:
    """The program as the roles run it: its text behind its shared head on an isolated Python's command line."""
    return subprocess.run([sys.executable, "-I", "-c", nodeprog.text("node"), verb, json.dumps(config)],
                          capture_output=True, text=True, timeout=60)


def answer(verb: str, config: object) -> dict:
    out = node(verb, config)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    return json.loads(lines[0])


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DISTRUN_")}


def start_time(pid: int) -> int | None:
    """pid's start time while it lives (a zombie is dead), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


class Procs:
    """Processes a test started, by name, each with its start time (a pid alone may be reused)."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[int, int]] = {}
        self.popens: list[subprocess.Popen[bytes]] = []

    def add(self, name: str, pid: int, program: str | None = "sleep") -> None:
        """Keep pid under name; with program, once pid runs it: a background job's pid is a fork
        of its shell until it execs, and until then its environment is the shell's (its tag too)."""
        deadline = time.monotonic() + 10
        while program is not None and _comm(pid) != program:
            assert time.monotonic() < deadline, f"{name} ({pid}) never ran {program}"
            time.sleep(0.01)
        start = start_time(pid)
        assert start is not None, f"{name} ({pid}) is not running"
        self.started[name] = (pid, start)

    def from_file(self, path: Path, names: list[str]) -> None:
        deadline = time.monotonic() + 10
        while len(path.read_text().split() if path.exists() else []) < len(names):
            assert time.monotonic() < deadline, f"{path} never listed {names}"
            time.sleep(0.05)
        for name, pid in zip(names, path.read_text().split()[:len(names)], strict=True):
            self.add(name, int(pid))

    def alive(self) -> set[str]:
        return {n for n, (pid, start) in self.started.items() if start_time(pid) == start}

    def end(self) -> None:
        for name in self.alive():
            os.kill(self.started[name][0], 9)
        for p in self.popens:
            p.wait(timeout=10)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.end()


def attempt_dir(run_dir: Path, n: int = 0) -> Path:
    """The run's attempt folder attempts/<n>/ (runner/distrun/transport/rundir.py), made."""
    folder = run_dir / "attempts" / str(n)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def fake_launcher(procs: Procs, run_dir: Path, run_id: str, host: str = "n1") -> None:
    """A run's launch script as the launch command starts it: its own session, no tag of its own
    (env -i), in the attempt's folder ``run_dir``; it tags what it starts, as the launchers do. Started from it:
    a tagged rank, a rank that dropped the tag, a tagless escapee to its own session (setsid)
    and a tagged one; each writes its pid to pids-<host>."""
    script = run_dir / f"launch-{host}.sh"
    script.write_text(
        "cd \"$(dirname \"$0\")\" 2>/dev/null || true\n"
        f"export DISTRUN_RUN_ID={run_id}\n"
        f"sleep 300 & echo $! >> pids-{host}\n"
        f"env -u DISTRUN_RUN_ID sleep 300 & echo $! >> pids-{host}\n"
        f"env -u DISTRUN_RUN_ID setsid sleep 300 & echo $! >> pids-{host}\n"
        f"setsid sleep 300 & echo $! >> pids-{host}\n"
        "wait\n")
    launcher = subprocess.Popen(["bash", script.name], cwd=run_dir, env={"PATH": os.environ["PATH"]},
                                start_new_session=True)
    procs.popens.append(launcher)
    procs.add(f"{run_id} launcher", launcher.pid, program=None)
    procs.from_file(run_dir / f"pids-{host}", [f"{run_id} {n}" for n in ("rank", "untagged rank", "escapee", "tagged escapee")])


def other_run(procs: Procs, run_id: str) -> int:
    """Another run's processes in a group whose leader has ended: a tagged rank and an untagged
    one stay in the group. Its pgid."""
    leader = subprocess.Popen(
        ["bash", "-c", "sleep 300 & echo $!; env -u DISTRUN_RUN_ID sleep 300 & echo $!"],
        env={**clean_env(), "DISTRUN_RUN_ID": run_id}, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leader.stdout is not None
    tagged, untagged = int(leader.stdout.readline()), int(leader.stdout.readline())
    leader.wait(timeout=10)
    procs.add(f"{run_id} rank", tagged)
    procs.add(f"{run_id} untagged rank", untagged)
    return leader.pid


def test_stop_ends_the_run_with_its_escapees_and_spares_a_group_forged_into_its_files(tmp_path, procs):
    mine, other = f"unit-{os.getpid()}-a", f"unit-{os.getpid()}-b"
    run_dir = tmp_path / "runs" / mine
    attempt = attempt_dir(run_dir)
    fake_launcher(procs, attempt, mine)
    other_group = other_run(procs, other)
    # The job writes other groups into its own launcher files: another run's, and the group of
    # the process that runs these tests.
    (attempt / "launcher-n1.pgid").write_text(f"{other_group}\n")
    (attempt / "launcher-n2.pgid").write_text(f"{os.getpgid(0)}\n")
    (attempt / "launcher-n3.pgid").write_text("1\n")
    os.mkfifo(attempt / "launcher-n4.pgid")  # read by nobody: the scan must not wait on it

    found = answer("scan", {"run": mine, "run_dir": str(run_dir)})
    assert set(found["runs"]) == {mine}
    assert {p["pid"] for p in found["runs"][mine]} == {procs.started[n][0] for n in procs.started if n.startswith(mine)}
    assert {p["why"] for p in found["runs"][mine]} == {"launcher", "descendant"}

    stopped = answer("stop", {"run": mine, "run_dir": str(run_dir), "grace_s": 5})
    assert stopped == {"verb": "stop", "run": mine, "units": 0, "stopped": 5, "killed": 0, "survived": []}
    assert procs.alive() == {f"{other} rank", f"{other} untagged rank"}
    # The other run's own stop finds its group although its leader ended: the tagged rank vouches for it.
    (attempt_dir(tmp_path / "runs" / other) / "launcher-n1.pgid").write_text(f"{other_group}\n")
    assert answer("stop", {"run": other, "run_dir": str(tmp_path / "runs" / other), "grace_s": 5})["stopped"] == 2
    assert procs.alive() == set()


def test_a_run_dir_pointed_at_another_runs_folder_stops_nothing_of_that_run(tmp_path, procs):
    """The job owns its run directory's path: replaced by a link to another run's folder, where
    that run's launch script works, its stop must still not take the other run's launcher."""
    mine, other = f"unit-{os.getpid()}-g", f"unit-{os.getpid()}-h"
    other_dir = tmp_path / "runs" / other
    fake_launcher(procs, attempt_dir(other_dir), other)
    (tmp_path / "runs" / mine).symlink_to(other_dir)
    assert answer("scan", {"run": mine, "run_dir": str(tmp_path / "runs" / mine)})["runs"] == {}
    assert answer("stop", {"run": mine, "run_dir": str(tmp_path / "runs" / mine), "grace_s": 1})["stopped"] == 0
    assert procs.alive() == set(procs.started)


def test_an_escapee_whose_parents_ended_is_found_by_its_tag_or_its_recorded_group(tmp_path, procs):
    """Orphans re-parented to init: the tagged one by its tag, the tagless one because it stayed in
    the group the launcher recorded (whose leader ended) beside a process of the run. A tagless
    orphan in a session of its own carries no evidence: only a cgroup would hold it."""
    run = f"unit-{os.getpid()}-c"
    run_dir = tmp_path / run
    run_dir.mkdir()
    script = ("sleep 300 & echo $!; env -u DISTRUN_RUN_ID sleep 300 & echo $!; "
              "env -u DISTRUN_RUN_ID setsid sleep 300 & echo $!; "
              "(env -u DISTRUN_RUN_ID DISTRUN_RUN_ID=someone-else sleep 300 & echo $!)")
    leader = subprocess.Popen(["bash", "-c", script], env={**clean_env(), "DISTRUN_RUN_ID": run},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leader.stdout is not None
    for name in ("tagged", "tagless", "tagless escapee", "forged tag"):
        procs.add(name, int(leader.stdout.readline()))
    leader.wait(timeout=10)
    (attempt_dir(run_dir) / "launcher-n1.pgid").write_text(f"{leader.pid}\n")
    found = answer("scan", {"run": run, "run_dir": str(run_dir)})
    whys = {p["pid"]: p["why"] for p in found["runs"][run]}
    assert whys == {procs.started["tagged"][0]: "tag", procs.started["tagless"][0]: "group",
                    procs.started["forged tag"][0]: "group"}
    assert answer("stop", {"run": run, "run_dir": str(run_dir), "grace_s": 5})["stopped"] == 3
    assert procs.alive() == {"tagless escapee"}


def test_a_process_that_ignores_term_is_killed_after_the_grace_and_counted(tmp_path, procs):
    run = f"unit-{os.getpid()}-d"
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; while :; do sleep 0.1; done"],
                                env={**clean_env(), "DISTRUN_RUN_ID": run})
    procs.popens.append(stubborn)
    procs.add("stubborn", stubborn.pid, program=None)
    began = time.monotonic()
    stopped = answer("stop", {"run": run, "grace_s": 1})
    assert stopped["killed"] >= 1 and stopped["survived"] == [] and procs.alive() == set()
    assert 1 <= time.monotonic() - began < 10


def test_a_scan_of_every_run_names_each_run_once_and_a_forged_tag_stays_with_its_run(tmp_path, procs):
    """The claim's question: which runs have processes here. A process of run A started with the
    tag of run B is still A's while an ancestor of it is A's."""
    a, b = f"unit-{os.getpid()}-e", f"unit-{os.getpid()}-f"
    parent = subprocess.Popen(["bash", "-c", f"DISTRUN_RUN_ID={b} sleep 300 & echo $!; wait"],
                              env={**clean_env(), "DISTRUN_RUN_ID": a}, stdout=subprocess.PIPE, text=True)
    procs.popens.append(parent)
    assert parent.stdout is not None
    procs.add("a", parent.pid, program=None)
    procs.add("forged", int(parent.stdout.readline()))
    found = answer("scan", {})
    assert a in found["runs"] and b not in found["runs"]
    assert {p["pid"]: p["why"] for p in found["runs"][a]} == {parent.pid: "tag", procs.started["forged"][0]: "descendant"}


@pytest.mark.parametrize(("argv", "message"), [
    ([], "usage: node.py {scan,stop,claim}"),
    (["kill", "{}"], "usage: node.py {scan,stop,claim}"),
    (["scan", "{not json"], "the scan config is not JSON"),
    (["scan", "[]"], "the scan config is not a JSON object"),
    (["stop", "{}"], "stop: run None is empty or not a run id"),
    (["stop", '{"run": "../x"}'], "stop: run '../x' is empty or not a run id"),
    (["stop", '{"run": "r", "grace_s": "ten"}'], "stop: grace_s 'ten' is not a number of seconds"),
    (["claim", '{"run": "r", "host": "h", "hold_s": -1}'], "claim: hold_s -1 is not a number of seconds"),
    (["stop", '{"run": "r", "run_dir": "runs/r"}'], "stop: run_dir 'runs/r' is not an absolute path"),
    (["claim", '{"run": "r"}'], "missing 'host'"),
    (["claim", '{"run": "r", "host": "../h"}'], "host '../h' is not a plain name"),
])
def test_a_bad_call_is_one_line_and_exit_2(argv, message):
    out = subprocess.run([sys.executable, "-I", str(NODE), *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def test_the_attempt_folders_are_the_run_directorys_own(tmp_path, procs):
    """Each attempt's launch script works in its folder attempts/<n>/ (runner/distrun/transport/rundir.py):
    the scan finds the run by it; a group recorded in the last attempt's folder counts, one an
    earlier attempt recorded does not (that attempt was stopped before the next began)."""
    sys.path.insert(0, str(REPO / "runner"))
    from distrun.transport import rundir

    head_text = NODE.with_name("nodecommon.py").read_text()  # the node programs' shared head
    assert f'ATTEMPTS = "{rundir.ATTEMPTS}"' in head_text
    run = f"unit-{os.getpid()}-g"
    run_dir = tmp_path / run
    (run_dir / rundir.ATTEMPTS / "9").mkdir(parents=True)
    last = run_dir / rundir.ATTEMPTS / "10"  # 10 after 9: by number, not by name
    last.mkdir()
    fake_launcher(procs, last, run)
    found = answer("scan", {"run": run, "run_dir": str(run_dir)})
    assert {p["pid"] for p in found["runs"][run]} == {procs.started[n][0] for n in procs.started}
    assert "launcher" in {p["why"] for p in found["runs"][run]}

    def orphans(name: str) -> int:
        """A group whose leader ended, holding a tagged process of the run and a tagless one."""
        leader = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; env -u DISTRUN_RUN_ID sleep 300 & echo $!"],
                                  env={**clean_env(), "DISTRUN_RUN_ID": run}, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        assert leader.stdout is not None
        procs.add(f"{name} tagged", int(leader.stdout.readline()))
        procs.add(f"{name} tagless", int(leader.stdout.readline()))
        leader.wait(timeout=10)
        return leader.pid

    (last / "launcher-n2.pgid").write_text(f"{orphans('recorded now')}\n")
    (run_dir / rundir.ATTEMPTS / "9" / "launcher-n2.pgid").write_text(f"{orphans('recorded before')}\n")
    whys = {p["pid"]: p["why"] for p in answer("scan", {"run": run, "run_dir": str(run_dir)})["runs"][run]}
    assert whys[procs.started["recorded now tagless"][0]] == "group"
    assert procs.started["recorded before tagless"][0] not in whys


def _fake(view: Path, pid: int, cgroup: str, tag: str) -> None:
    """A process as /proc would show it: the caller's uid, a session of its own, a tag, a cgroup."""
    folder = view / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} (sleep) S 1 {pid} {pid} " + " ".join(["0"] * 15) + " 12345 0 0\n")
    (folder / "status").write_text(f"Name:\tsleep\nUid:\t{os.getuid()}\t{os.getuid()}\t{os.getuid()}\t{os.getuid()}\n")
    (folder / "environ").write_bytes(f"DISTRUN_RUN_ID={tag}\0".encode())
    (folder / "cgroup").write_text(f"0::{cgroup}\n")


def test_only_a_unit_of_the_system_manager_names_a_run(tmp_path):
    """A cgroup of the training user's own manager (delegated to that user: systemd-run --user
    names it as it likes) is no unit of launch.py's: it says nothing of whose a process is."""
    view = tmp_path / "proc"
    (view / "1").mkdir(parents=True)
    (view / "1" / "cgroup").write_text("0::/init.scope\n")
    mine, victim = f"unit-{os.getpid()}-m", f"unit-{os.getpid()}-v"
    _fake(view, 4000001, f"/system.slice/distrun:{victim}:0:h1.service", mine)
    _fake(view, 4000002, f"/user.slice/user-1000.slice/user@1000.service/app.slice/distrun:{victim}:0:h1.service", mine)
    _fake(view, 4000003, f"/user.slice/user-1000.slice/user@1000.service/system.slice/distrun:{victim}:0:h1.service", mine)
    runs = answer("scan", {"proc": str(view)})["runs"]
    assert {r: [(p["pid"], p["why"]) for p in ps] for r, ps in runs.items()} == {
        victim: [(4000001, "unit")], mine: [(4000002, "tag"), (4000003, "tag")]}


def _fake_proc(view: Path, pid: int, ppid: int, uid: int, cgroup: str, tag: str | None, comm: str = "sleep") -> None:
    """A process as /proc would show it: its parent, uid, name, cgroup and tag (none: untagged)."""
    folder = view / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} " + " ".join(["0"] * 15) + " 12345 0 0\n")
    (folder / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (folder / "environ").write_bytes(f"DISTRUN_RUN_ID={tag}\0".encode() if tag else b"")
    (folder / "cgroup").write_text(f"0::{cgroup}\n")


def test_what_an_ended_slurm_job_left_in_slurmd_s_cgroup_is_no_run_s(tmp_path):
    """Under proctrack/linuxproc a Slurm job's processes live in slurmd's cgroup. A process there
    under a slurmstepd of root's is its running job's; one re-parented away from every slurmstepd
    (rootless podman's pause process after the job ended) keeps its run's tag but is no run's, so
    it holds no host. A slurmstepd of the user's own making proves nothing; outside slurmd's
    cgroup the evidence is as before."""
    import pwd
    view = tmp_path / "proc"
    (view / "1").mkdir(parents=True)
    (view / "1" / "cgroup").write_text("0::/init.scope\n")
    me = pwd.getpwnam("nobody").pw_uid if os.getuid() == 0 else os.getuid()
    slurmd = "/system.slice/slurmd.service"
    live, left, forged, other = (f"slurm-{os.getpid()}-{w}" for w in ("live", "left", "forged", "other"))
    _fake_proc(view, 4100001, 1, 0, slurmd, None, comm="slurmstepd")
    _fake_proc(view, 4100002, 4100001, me, slurmd, live)  # the job's batch script
    _fake_proc(view, 4100003, 4100002, me, slurmd, live)  # its step, a child
    _fake_proc(view, 4100004, 1, me, slurmd, left)  # catatonit of an ended job: init's child now
    _fake_proc(view, 4100005, 1, me, slurmd, forged, comm="slurmstepd")  # the user's own "slurmstepd"
    _fake_proc(view, 4100006, 4100005, me, slurmd, forged)
    _fake_proc(view, 4100007, 1, me, "/user.slice/user-1000.slice/session-3.scope", other)  # a login's
    runs = answer("scan", {"proc": str(view), "user": "nobody"})["runs"]
    assert {r: sorted(p["pid"] for p in ps) for r, ps in runs.items()} == {
        live: [4100002, 4100003], other: [4100007]}
    # The run's own scan leaves it out too; stop still ends it (its evidence is unchanged).
    assert answer("scan", {"proc": str(view), "user": "nobody", "run": left})["runs"] == {}
