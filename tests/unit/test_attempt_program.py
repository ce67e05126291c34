"""Role job's attempt programs (files/attempt.py, files/launch.py), run for real here: how a follower reads an
attempt's end from the record root keeps for its unit, and nothing the job can write.

This machine has no systemd (the unit itself is started on the cluster's nodes:
tests/cluster/test_control_plane.py); the records are made here as systemd's ExecStopPost
makes them, root-owned in /run/distrun."""

from __future__ import annotations

import getpass
import json
import os
import pwd
import re
import resource
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from distrun.transport import nodeprog
from tests.harness.modules import load_file

PROGRAM = Path(__file__).resolve().parents[2] / "roles" / "job" / "files" / "attempt.py"
LAUNCH = PROGRAM.with_name("launch.py")
RECORDS = Path("/run/distrun")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the unit's records are root's: these tests need root")


@pytest.fixture
def attempt(tmp_path):
    """An attempt's folder and the node program's config for host h1 of a fresh run."""
    run = f"unit-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "runs" / run / "attempts" / "0"
    folder.mkdir(parents=True)
    cfg = {"run": run, "run_dir": str(folder.parents[1]), "host": "h1", "attempt": "0", "dir": str(folder),
           "script": "launch-h1.sh", "log": "launcher-h1.log", "exit_file": "exitcode-h1",
           "pid_file": "launcher-h1.pid", "user": "root", "start_wait_s": 2}
    unit = f"distrun:{run}:0:h1.service"
    made: list[Path] = []

    def record(kind: str, text: str, owner: int = 0) -> None:
        RECORDS.mkdir(mode=0o755, exist_ok=True)
        path = RECORDS / f"{unit}.{kind}"
        path.write_text(text)
        os.chown(path, owner, owner)
        made.append(path)

    yield folder, cfg, record
    for path in made:
        path.unlink(missing_ok=True)


def call(verb: str, cfg: dict, timeout: float = 20, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", str(PROGRAM), verb, json.dumps(cfg)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def systemd_says(tmp_path: Path, active: str, journal: str = "") -> dict:
    """An environment whose systemctl shows the unit in state active (LoadState not-found for
    "gone"), and whose journalctl prints journal for it: what a node's systemd would answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    load = "not-found" if active == "gone" else "loaded"
    shown = f"LoadState={load}\\nActiveState={'inactive' if active == 'gone' else active}\\n"
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\n[ \"$1\" = show ] || exit 1\nprintf '{shown}'\n")
    # journalctl -o json: systemd's lines as root's (_UID 0), and a job's forgery as the training user's
    entries = [{"_UID": "0", "MESSAGE": line} for line in journal.splitlines()]
    entries.insert(0, {"_UID": "1000", "MESSAGE": "Failed to forge: a job wrote this"})  # first: it would win
    (bin_dir / "journalctl").write_text("#!/bin/sh\ncat <<'EOF'\n" + "".join(json.dumps(e) + "\n" for e in entries) + "EOF\n")
    for tool in ("systemctl", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(("record", "code", "signal"), [
    ("success exited 0", 0, None), ("exit-code exited 3", 3, None), ("signal killed TERM", 143, "TERM"),
    ("core-dump dumped SEGV", 139, "SEGV"),
])
def test_the_unit_record_is_the_exit_code_whatever_the_job_wrote(attempt, record, code, signal):
    folder, cfg, make = attempt
    # The job's forgeries: an exit code file of success, and markers of success in its log.
    (folder / "exitcode-h1").write_text("0\n")
    (folder / "launcher-h1.log").write_text('DISTRUN_EXIT 0\n{"verb": "follow", "exit": 0}\ntraining done\n')
    make("launched", "x\n")
    make("exit", record + "\n")
    out = call("follow", {**cfg, "log": "launcher-h1.log"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == ["| DISTRUN_EXIT 0", '| {"verb": "follow", "exit": 0}', "| training done"]
    assert nodeprog.answer(out.stdout, "follow") == {"verb": "follow", "exit": code}
    # The signal root's record names (a stop of the unit): the launcher wrote no end of its own.
    assert json.loads(call("state", cfg).stdout) == {"verb": "state", "dir": True, "launcher": "exited", "rc": code,
                                                      "signal": signal, "procs": 0, "started": [], "supervisor": None}


def test_a_record_not_written_by_root_is_not_an_end(attempt, tmp_path):
    folder, cfg, make = attempt
    (folder / "exitcode-h1").write_text("0\n")
    make("launched", "x\n")
    make("exit", "success exited 0\n", owner=65534)  # as if the training user had made it
    env = systemd_says(tmp_path, "active")
    follower = subprocess.Popen([sys.executable, "-I", str(PROGRAM), "follow", json.dumps(cfg)],
                                stdout=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(1.5)
        assert follower.poll() is None, "the follower took a record root did not write, or the job's exit code file"
    finally:
        follower.kill()
        follower.communicate()
    # No root record yet: the unit runs, whatever the job wrote.
    assert json.loads(call("state", cfg, env=env).stdout)["launcher"] == "running"


def test_a_unit_systemd_could_not_start_ends_the_follow_with_the_reason(attempt, tmp_path):
    """A unit that failed before its script ran (its sandbox refused) never writes its record:
    the follower asks systemd, answers the journal's reason instead of waiting forever."""
    _, cfg, make = attempt
    make("launched", "x\n")
    unit = f"distrun:{cfg['run']}:0:h1.service"
    env = systemd_says(tmp_path, "gone", journal=(  # as systemd 252 logs it
        f"{unit}: PrivateIPC=yes is configured, but IPC namespace setup failed, ignoring: Operation not permitted\n"
        f"{unit}: Failed to set up mount namespacing: Operation not supported\n"
        f"{unit}: Failed at step NAMESPACE spawning /bin/bash: Operation not supported\n"))
    out = call("follow", cfg, env=env, timeout=15)
    assert nodeprog.answer(out.stdout, "follow") == {"verb": "follow", "error": (
        f"h1: systemd ended the launcher's unit {unit} without running its script to an end: Failed to set up mount "
        "namespacing: Operation not supported (the unit's private /tmp and /dev/shm need mount namespaces: a "
        "machine's systemd has them, a container needs CAP_SYS_ADMIN)")}
    said = json.loads(call("state", cfg, env=env).stdout)
    assert (said["launcher"], said["rc"]) == ("gone", None)
    # Without a word from its journal, the follower names where to look.
    quiet = systemd_says(tmp_path, "gone")
    told = nodeprog.answer(call("follow", cfg, env=quiet).stdout, "follow")
    assert told is not None and told["error"].endswith(f"see 'journalctl -u {unit}' on h1"), told


def test_a_unit_that_ended_without_a_status_is_named(attempt):
    _, cfg, make = attempt
    make("launched", "x\n")
    make("exit", "resources  \n")
    said = nodeprog.answer(call("follow", cfg).stdout, "follow")
    assert said is not None and said["error"].startswith(f"h1: the launcher's unit distrun:{cfg['run']}:0:h1.service "
                                                         "ended without an exit code")


def test_without_a_unit_the_launch_scripts_own_exit_code_file_is_read(attempt):
    folder, cfg, _ = attempt
    (folder / "exitcode-h1").write_text("4\n")
    assert nodeprog.answer(call("follow", cfg).stdout, "follow") == {"verb": "follow", "exit": 4}


@pytest.mark.parametrize(("cfg", "error"), [
    ({"host": "h1; rm -rf /"}, "follow: host 'h1; rm -rf /' is empty or not a plain name"),
    ({"run": ".."}, "follow: run '..' is empty or not a plain name"),
    ({"attempt": "0/../1"}, "follow: attempt '0/../1' is not a number"),
    ({"attempt": "\u0661"}, "follow: attempt '\u0661' is not a number"),  # a digit to str.isdigit, not to systemd
    ({"attempt": "1234567890"}, "follow: attempt '1234567890' is not a number"),  # node.py's stop would miss its unit
    ({"dir": "relative"}, "follow: dir 'relative' is not an absolute path"),
])
def test_a_bad_config_is_one_line(attempt, cfg, error):
    _, good, _ = attempt
    out = call("follow", {**good, **cfg})
    assert (out.returncode, out.stdout, out.stderr) == (2, "", f"attempt.py: {error}\n")


def test_a_log_that_never_ends_does_not_hide_the_units_end(attempt):
    """A log fed without end (here a FIFO another process writes into forever) is followed in
    bounded helpings: the unit's end is still seen, and the follower answers it."""
    folder, cfg, make = attempt
    os.mkfifo(folder / "launcher-h1.log")
    writer = subprocess.Popen(["bash", "-c", "exec yes training >launcher-h1.log"], cwd=folder)
    try:
        make("launched", "x\n")
        make("exit", "success exited 3\n")
        out = call("follow", {**cfg, "log": "launcher-h1.log"})
        assert out.returncode == 0, out.stderr
        assert nodeprog.answer(out.stdout, "follow") == {"verb": "follow", "exit": 3}
        lines = out.stdout.splitlines()[:-1]
        assert lines and all(ln.startswith("| ") and "training".startswith(ln[2:]) for ln in lines), lines[-3:]
    finally:
        writer.kill()
        writer.wait()


def test_a_line_without_end_reaches_the_controller_in_bounded_pieces(attempt):
    folder, cfg, make = attempt
    (folder / "launcher-h1.log").write_bytes(b"x" * (3 << 20))
    make("launched", "x\n")
    make("exit", "success exited 0\n")
    out = call("follow", {**cfg, "log": "launcher-h1.log"})
    lines = out.stdout.splitlines()
    assert nodeprog.answer(out.stdout, "follow") == {"verb": "follow", "exit": 0}
    assert max(len(ln) for ln in lines) <= 2 + (64 << 10)
    assert sum(len(ln) - 2 for ln in lines[:-1]) == 3 << 20


def _program(monkeypatch, records: Path):
    """launch.py imported here, as if on a node with systemd, its records in records."""
    module = load_file(LAUNCH, "launch_program")
    monkeypatch.setattr(module, "RECORDS", str(records))
    monkeypatch.setattr(module, "_systemd", lambda: True)
    monkeypatch.setattr(module.subprocess, "run", lambda argv, **_: subprocess.CompletedProcess(argv, 0, "", ""))
    return module


@pytest.mark.parametrize("made_before", [False, True])
def test_the_records_are_readable_by_the_followers_whatever_roots_umask(attempt, tmp_path, monkeypatch, made_before):
    """Followers run as the training user: a record they cannot read makes them take the job's
    exit code file instead (a hardened root umask, 027 or 077, must not open that door)."""
    _, cfg, _ = attempt
    records = tmp_path / "records"
    if made_before:
        records.mkdir(mode=0o700)
    program = _program(monkeypatch, records)
    old = os.umask(0o077)
    try:
        said = program.launch(cfg)
    finally:
        os.umask(old)
    assert said == {"verb": "launch", "launched": True, "unit": f"distrun:{cfg['run']}:0:h1.service"}
    assert stat.S_IMODE(records.stat().st_mode) == 0o755
    assert stat.S_IMODE((records / f"{said['unit']}.launched").stat().st_mode) == 0o644


def test_the_units_have_a_runtime_folder_of_their_own(attempt, tmp_path, monkeypatch):
    """Rootless podman keeps its state, its pause process among it, in the user's runtime folder:
    each run's unit gets its own at /run/user/<uid> (a memory folder of the unit's, the user's),
    named by XDG_RUNTIME_DIR, so that pause process starts in the unit and ends with it, and the
    node's own folder (a login's systemd manager and bus) is out of the run's reach."""
    _, cfg, _ = attempt
    program = _program(monkeypatch, tmp_path / "records")
    uid, gid = os.getuid(), os.getgid()
    seen: list[list[str]] = []

    def run(argv, **_):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(program.subprocess, "run", run)
    monkeypatch.setattr(program.pwd, "getpwnam", lambda _: pwd.getpwuid(uid))
    assert program.launch(cfg)["launched"] is True
    props = [seen[0][i + 1] for i, a in enumerate(seen[0]) if a == "-p"]
    assert f"TemporaryFileSystem=/run/user/{uid}:mode=0700,uid={uid},gid={gid}" in props
    assert not [p for p in props if p.startswith("InaccessiblePaths")]
    assert f"--setenv=XDG_RUNTIME_DIR=/run/user/{uid}" in seen[0]


def test_the_units_get_the_inventorys_resource_limits(attempt, tmp_path, monkeypatch):
    _, cfg, _ = attempt
    program = _program(monkeypatch, tmp_path / "records")
    seen: list[list[str]] = []

    def run(argv, **_):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(program.subprocess, "run", run)
    assert program.launch({**cfg, "limits": [["memlock", "infinity"], ["nofile", "4096:8192"]]})["launched"] is True
    assert " ".join(seen[0]).count("-p Limit") == 2
    assert "-p LimitMEMLOCK=infinity -p LimitNOFILE=4096:8192" in " ".join(seen[0])


def test_a_unit_hides_the_nodes_gpus_the_run_was_not_given(attempt, tmp_path, monkeypatch):
    """A rank of a run given GPUs 0,1 of a node cannot open GPU 2 or 3, whatever it sets
    CUDA_VISIBLE_DEVICES to: their device nodes are made inaccessible in the run's unit. The
    control nodes every CUDA program opens stay, and a run that holds the whole node hides nothing."""
    _, cfg, _ = attempt
    program = _program(monkeypatch, tmp_path / "records")
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia10", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"):
        (dev / name).touch()
    assert program.gpu_fence([0, 1], str(dev)) == [
        "-p", f"InaccessiblePaths=-{dev}/nvidia2", "-p", f"InaccessiblePaths=-{dev}/nvidia10"]
    assert program.gpu_fence([2, 10, 0, 1], str(dev)) == []
    assert program.gpu_fence(None, str(dev)) == []
    assert program.gpu_fence([0], str(tmp_path / "no-dev")) == []
    seen: list[list[str]] = []

    def run(argv, **_):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(program.subprocess, "run", run)
    assert program.launch({**cfg, "gpu_ids": [0, 1]})["launched"] is True
    assert [a for a in seen[0] if "/dev/nvidia" in a] == [
        f"InaccessiblePaths=-/dev/{n}" for n in sorted((x for x in os.listdir("/dev") if re.fullmatch(r"nvidia[0-9]+", x)),
                                                       key=lambda x: int(x[6:])) if n not in ("nvidia0", "nvidia1")]


@pytest.mark.parametrize("gpus", ["0,1", [True], [-1], [0.5], [1000]])
def test_a_malformed_gpu_list_is_a_bad_call(attempt, gpus):
    _, cfg, _ = attempt
    out = subprocess.run([sys.executable, "-I", str(LAUNCH), "launch", json.dumps({**cfg, "gpu_ids": gpus})],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("launch.py: launch: gpu_ids "), out.stderr


@pytest.mark.parametrize("limits", [[["nofile", "lots"]], [["nofile"]], [["no file", "1"]], "nofile=1"])
def test_a_malformed_limit_is_a_bad_call(attempt, limits):
    _, cfg, _ = attempt
    out = subprocess.run([sys.executable, "-I", str(LAUNCH), "launch", json.dumps({**cfg, "limits": limits})],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("launch.py: launch: limit" if isinstance(limits, list) else "launch.py: launch: limits is not a list")


def test_without_systemd_the_session_gets_the_limits(attempt):
    """No unit (this machine has no systemd): the launch script's session inherits the limits."""
    folder, cfg, _ = attempt
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(soft, 1000)
    (folder / cfg["script"]).write_text(f"ulimit -Sn > {folder}/seen; ulimit -Hn >> {folder}/seen\n")
    out = subprocess.run([sys.executable, "-I", str(LAUNCH), "launch",
                          json.dumps({**cfg, "limits": [["nofile", f"{want}:{want}"]]})],
                         capture_output=True, text=True, timeout=30)
    assert nodeprog.answer(out.stdout, "launch") == {"verb": "launch", "launched": True, "unit": ""}, out.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len((folder / "seen").read_text().split() if (folder / "seen").exists() else []) < 2:
        time.sleep(0.1)
    assert (folder / "seen").read_text().split() == [str(want), str(want)]


def test_a_limit_the_session_cannot_take_is_named(attempt):
    """Without root, a hard limit above the session's own cannot be had: the launch says which."""
    _, cfg, _ = attempt
    who = "nobody" if os.geteuid() == 0 else getpass.getuser()
    # The node's own Python (stdlib only), which another account can run where this venv's may not be.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = subprocess.run([python, "-I", str(LAUNCH), "launch",
                          json.dumps({**cfg, "user": who, "limits": [["nofile", str(hard + 1)]]})],
                         capture_output=True, text=True, timeout=30, user=who, cwd="/")
    said = nodeprog.answer(out.stdout, "launch")
    assert said is not None and said["error"].startswith(f"h1: cannot set the nofile limit to {hard + 1} "), out


def test_a_units_folder_gone_unreadable_fails_the_attempt_naming_the_cause(attempt):
    """A dropped mount, or the job moving or locking its attempt's folder, ends the follower of a
    unit with that cause (the run fails: a job can make its run fail this way, never succeed)."""
    folder, cfg, make = attempt
    make("launched", "x\n")
    follower = subprocess.Popen([sys.executable, "-I", str(PROGRAM), "follow", json.dumps({**cfg, "log": "launcher-h1.log"})],
                                stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        folder.rename(folder.with_name("moved"))
        out = follower.communicate(timeout=20)[0]
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    said = nodeprog.answer(out, "follow")
    assert said is not None and "exit" not in said, out
    assert said["error"] == (f"h1: the run directory {cfg['run_dir']} is no longer readable as user root "
                             "(is the shared folder still mounted?)")


def test_the_state_of_a_unit_is_its_record_whatever_becomes_of_its_folder(attempt):
    """Reconciling asks state: a job that moves or locks its run directory does not turn its
    unit's end (or its running: the same check, by cgroup) into a launcher that never was."""
    folder, cfg, make = attempt
    make("launched", "x\n")
    make("exit", "exit-code exited 2\n")
    folder.parents[1].rename(folder.parents[1].with_name("moved"))
    said = json.loads(call("state", cfg).stdout)
    assert (said["dir"], said["launcher"], said["rc"]) == (False, "exited", 2)


def test_a_units_processes_are_those_the_kernel_puts_in_its_cgroup_whatever_they_say(tmp_path):
    """state's count of a contained attempt's processes (distrun status, --json's "processes"):
    the processes of the system manager's unit, read from /proc/<pid>/cgroup by root; not a
    tag in an environment (any process of the account can carry it, or drop it), not a unit
    of the same name under the training user's own manager, and whatever the processes' uid."""
    module = load_file(PROGRAM, "attempt_program")
    unit = "distrun:r1:0:h1.service"
    proc = tmp_path / "proc"
    for pid, cgroup, environ in [
        ("1", "0::/init.scope", ""),
        ("10", f"0::/system.slice/{unit}", ""),  # the launcher, its tag dropped (env -i)
        ("11", f"0::/system.slice/{unit}", "DISTRUN_RUN_ID=other"),  # a rank with another run's tag
        ("12", f"0::/system.slice/{unit}", "DISTRUN_RUN_ID=r1"),
        ("20", f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/{unit}", "DISTRUN_RUN_ID=r1"),
        ("21", "0::/system.slice/distrun:r1:1:h1.service", "DISTRUN_RUN_ID=r1"),  # another attempt's unit
        ("22", "0::/user.slice/user-1000.slice/session-3.scope", "DISTRUN_RUN_ID=r1"),
        ("self", f"0::/system.slice/{unit}", ""),
    ]:
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text(cgroup + "\n")
        (proc / pid / "environ").write_text(environ + "\0")
    (proc / "23").mkdir()  # a process that ended while the folder was read
    assert module.unit_processes(unit, str(proc)) == 3
    # On a container node the system manager's units lie under the container's own cgroup.
    (proc / "1" / "cgroup").write_text("0::/machine.slice/libpod-ab12.scope/init.scope\n")
    (proc / "10" / "cgroup").write_text(f"0::/machine.slice/libpod-ab12.scope/system.slice/{unit}\n")
    assert module.unit_processes(unit, str(proc)) == 1


@pytest.mark.parametrize(("cfg", "error"), [
    ({"host": "h1 -p ExecStartPre=/bin/sh"}, "launch: host 'h1 -p ExecStartPre=/bin/sh' is empty or not a plain name"),
    ({"run": "r%n"}, "launch: run 'r%n' is empty or not a plain name"),  # a systemd specifier
    ({"attempt": "1$$"}, "launch: attempt '1$$' is not a number"),
])
def test_a_bad_launch_is_one_line_before_root_does_anything(attempt, cfg, error):
    _, good, _ = attempt
    out = subprocess.run([sys.executable, "-I", str(LAUNCH), "launch", json.dumps({**good, **cfg})], capture_output=True,
                         text=True, timeout=20)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", f"launch.py: {error}\n")


def test_records_of_units_that_ended_long_ago_are_pruned_at_the_next_launch(attempt, tmp_path, monkeypatch):
    """/run/distrun is memory: a unit's records go KEEP_S after its end, at the next launch on the
    node; a unit still running (no .exit record) and one that ended lately keep theirs."""
    _, cfg, _ = attempt
    records = tmp_path / "records"
    records.mkdir()
    program = _program(monkeypatch, records)
    old, recent, running = "distrun:old:0:h1.service", "distrun:recent:0:h1.service", "distrun:long:0:h1.service"
    for unit in (old, recent, running):
        (records / f"{unit}.launched").write_text(unit + "\n")
    for unit in (old, recent):
        (records / f"{unit}.exit").write_text("success 0 0\n")
    long_ago = time.time() - program.KEEP_S - 60
    os.utime(records / f"{old}.exit", (long_ago, long_ago))
    os.utime(records / f"{running}.launched", (long_ago, long_ago))
    said = program.launch(cfg)
    left = sorted(p.name for p in records.iterdir())
    assert said["launched"] is True
    assert left == sorted([f"{recent}.launched", f"{recent}.exit", f"{running}.launched", f"{said['unit']}.launched"])
