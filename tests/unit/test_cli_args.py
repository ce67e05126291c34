"""Bad invocations of every verb, as a user or a script would type them: each is refused before
anything runs, with exit 2 (or the verb's own code), one line on stderr that names the option,
file, run or variable and says the fix, and no traceback. Run in-process (click's CliRunner),
plus a few through the real `distrun` executable to prove the wiring.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from distrun import paths
from distrun.cli.main import main
from distrun.launchers import LAUNCHERS, launcher_named
from distrun.planning import run_files
from distrun.store.runs import new_run

from .cli_cases import CASES
from .cli_cases_world import REFUSED
from .conftest import REPO, distrun_bin

TWO = str(REPO / "tests" / "golden" / "inventories" / "two-nodes")


@dataclass
class Bad:
    label: str
    argv: Callable[[Path], list[str]]
    expect: tuple[str, ...]  # every fragment must be in the one error line: the thing, the fix
    env: dict[str, str | None] = field(default_factory=dict)
    reads_inventory: bool = False  # runs ansible-inventory (about a second); the rest never leave Python
    code: int = 2


def inv(tmp: Path, text: str, name: str = "hosts.ini") -> str:
    p = tmp / name
    p.write_text(text)
    return str(p)


def gpu_inventory(tmp: Path) -> str:
    """g2 has 4 GPUs in this inventory's fact cache but slots=3."""
    path = inv(tmp, "[head]\ng1\n[workers]\ng1\ng2 slots=3\n", "gpus.ini")
    (paths.fact_cache_dir(Path(path)) / "s1_g2").write_text(json.dumps({"__payload__": '{"ansible_local": {"distrun": {"gpus": 4}}}'}))
    return path


def script(tmp: Path, name: str) -> str:
    p = tmp / name
    p.write_text("print('hello')\n")
    return str(p)


def a_file(tmp: Path) -> str:
    p = tmp / "not-a-folder"
    p.write_text("")
    return str(p)


T = ["train", "-i", TWO]
D = [*T, "--dry-run"]
NO_SLURM = "[head]\na\n[workers]\na\n"

BAD: list[Bad] = [
    # --- the top level -----------------------------------------------------------------------
    Bad("misspelt verb", lambda t: ["trian"], ("no such command 'trian'", "did you mean train")),
    Bad("unknown global option", lambda t: ["--verbose", "runs"], ("no such option --verbose", "--help")),
    Bad("verb spelt like an option", lambda t: ["runs", "--jsn"], ("no such option --jsn", "did you mean --json")),
    # --- inventories ---------------------------------------------------------------------------
    Bad("unknown inventory name", lambda t: ["train", "-i", "nosuch", "--dry-run"],
        ("--inventory 'nosuch': no such inventory (known: ", "pass a name under inventory/")),
    Bad("empty --inventory", lambda t: ["train", "-i", "", "--dry-run"], ("--inventory is empty", "give a name")),
    Bad("blank --inventory", lambda t: ["hostfile", "-i", "  "], ("--inventory is empty", "give a name")),
    Bad("no inventory at all", lambda t: ["train", "--dry-run"], ("no inventory given", "DISTRUN_INVENTORY")),
    Bad("empty DISTRUN_INVENTORY", lambda t: ["train", "--dry-run"], ("DISTRUN_INVENTORY is empty", "give a name"),
        env={"DISTRUN_INVENTORY": ""}),
    Bad("unknown DISTRUN_INVENTORY", lambda t: ["hostfile"], ("DISTRUN_INVENTORY='nosuch'", "no such inventory"),
        env={"DISTRUN_INVENTORY": "nosuch"}),
    Bad("inventory path that does not exist", lambda t: ["hostfile", "-i", str(t / "gone" / "hosts.ini")],
        ("no such inventory", "a path to an inventory file")),
    Bad("malformed INI section", lambda t: ["train", "-i", inv(t, "[head\nx\n"), "--dry-run"],
        ("Ansible cannot parse it", "close each header, e.g. [head]", "hosts.ini (ini plugin)"), reads_inventory=True),
    Bad("INI host variable without a value", lambda t: ["hostfile", "-i", inv(t, "[head]\na\n[workers]\na slots\n")],
        ("Expected key=value host variable assignment, got: slots", "hosts.ini"), reads_inventory=True),
    Bad("YAML syntax error keeps line and column", lambda t: ["hostfile", "-i", inv(t, "all:\n  children:\n    head: [\n", "h.yml")],
        ("Ansible cannot parse it", "h.yml:4:1"), reads_inventory=True),
    Bad("no workers group: brackets survive", lambda t: ["train", "-i", inv(t, "[head]\na\n[gpus]\na\n"), "--dry-run"],
        ("no host in group 'workers'", "under [workers]"), reads_inventory=True),
    Bad("no head group: brackets survive", lambda t: ["hostfile", "-i", inv(t, "[heads]\na\n[workers]\na\n")],
        ("no host in group 'head'", "add a [head] group"), reads_inventory=True),
    Bad("two heads", lambda t: ["hostfile", "-i", inv(t, "[head]\na\nb\n[workers]\na\n")],
        ("group 'head' has 2 hosts", "keep exactly one head node"), reads_inventory=True),
    Bad("zero slots", lambda t: ["train", "-i", inv(t, "[head]\na\n[workers]\na slots=0\n"), "--dry-run"],
        ("host a has slots=0", "slots >= 1"), reads_inventory=True),
    Bad("slots not a number", lambda t: ["hostfile", "-i", inv(t, "[head]\na\n[workers]\na slots=many\n")],
        ("host a has slots='many'", "a whole number of ranks"), reads_inventory=True),
    Bad("address that is an ssh option", lambda t: ["hostfile", "-i", inv(t, "[head]\na ansible_host=-oProxyCommand=x\n[workers]\na\n")],
        ("host a has ansible_host='-oProxyCommand=x'", "an IP address or a DNS name"), reads_inventory=True),
    Bad("relative shared folder", lambda t: ["hostfile", "-i", inv(t, "[head]\na distrun_shared_dir=srv\n[workers]\na\n")],
        ("distrun_shared_dir='srv'", "absolute path"), reads_inventory=True),
    Bad("unknown MPI provider", lambda t: ["hostfile", "-i", inv(t, "[head]\na distrun_mpi_provider=spack\n[workers]\na\n")],
        ("distrun_mpi_provider='spack'", "choose one of"), reads_inventory=True),
    Bad("GPU count against slots", lambda t: ["train", "-i", gpu_inventory(t), "--dry-run"],
        ("g2 has slots=3 but 4 GPU(s), which 3 rank(s) cannot share evenly", "set slots=4 for g2", "--allow-gpu-mismatch"),
        reads_inventory=True),
    Bad("setup: unknown inventory", lambda t: ["setup", "-i", "nosuch"], ("--inventory 'nosuch'", "pass a name")),
    Bad("setup: malformed inventory", lambda t: ["setup", "-i", inv(t, "[head\nx\n")], ("Ansible cannot parse it", "hosts.ini"),
        reads_inventory=True),
    Bad("check: empty inventory", lambda t: ["check", "-i", ""], ("--inventory is empty", "give a name")),
    Bad("partition: unknown inventory", lambda t: ["partition", "-i", "nosuch"], ("--inventory 'nosuch'", "pass a name")),
    # --- train's options -----------------------------------------------------------------------
    Bad("misspelt option cannot cancel --dry-run", lambda t: [*T, "--ephocs", "3", "--dry-run"],
        ("no such option --ephocs", "did you mean --epochs", "after '--'")),
    Bad("program as a positional argument", lambda t: [*T, "train.py"], ("unexpected argument 'train.py'", "--script train.py", "after '--'")),
    Bad("program argument before --", lambda t: [*D, "lr=0.1"], ("unexpected argument 'lr=0.1'", "after '--'")),
    Bad("port 0", lambda t: [*D, "--port", "0"], ("--port: 0 is out of range", "from 1 to 65535")),
    Bad("port 70000", lambda t: [*D, "--port", "70000"], ("--port: 70000 is out of range", "from 1 to 65535")),
    Bad("port not a number", lambda t: [*D, "--port", "http"], ("--port: 'http' is not a whole number", "from 1 to 65535")),
    Bad("zero epochs", lambda t: [*D, "--epochs", "0"], ("--epochs: 0 is out of range", "at least 1")),
    Bad("negative epochs", lambda t: [*D, "--epochs", "-3"], ("--epochs: -3 is out of range", "at least 1")),
    Bad("zero ranks", lambda t: [*D, "--np", "0"], ("--np: 0 is out of range", "at least 1")),
    Bad("ranks not a number", lambda t: [*D, "--np", "all"], ("--np: 'all' is not a whole number", "at least 1")),
    Bad("more ranks than slots", lambda t: [*D, "--np", "9"], ("--np 9 is more than the 3 slots", "lower --np or raise 'slots'"),
        reads_inventory=True),
    Bad("--env without =", lambda t: [*D, "--env", "NOEQUALS"], ("--env: 'NOEQUALS'", "write it as KEY=VALUE")),
    Bad("--env with an empty name", lambda t: [*D, "--env", "=1"], ("--env: '=1'", "write it as KEY=VALUE")),
    Bad("--env name not ASCII", lambda t: [*D, "--env", "é=1"], ("--env: 'é' is not a variable name", "letters, digits and _")),
    Bad("--env name starting with a digit", lambda t: [*D, "--env", "1A=1"], ("--env: '1A' is not a variable name", "not starting with a digit")),
    Bad("--env reserved name", lambda t: [*D, "--env", "DISTRUN_RUN_ID=x"], ("--env: DISTRUN_RUN_ID", "choose another name")),
    Bad("--env reserved name in lower case", lambda t: [*D, "--env", "distrun_x=1"], ("--env: distrun_x", "choose another name")),
    Bad("--env value not UTF-8", lambda t: [*D, "--env", "TOKEN=\udcff\udcfe"], ("--env: TOKEN: the value is not valid UTF-8", "pass text")),
    Bad("--env name given twice", lambda t: [*D, "--env", "A=1", "--env", "A=2"], ("--env: A is given twice", "keep one")),
    Bad("--env without its value", lambda t: [*D, "--env"], ("--env needs a value", "--help")),
    Bad("--launcher misspelt", lambda t: [*D, "--launcher", "mpi"], ("--launcher: 'mpi' is not one of mpirun, torchrun, slurm", "did you mean mpirun")),
    Bad("--workload misspelt", lambda t: [*D, "--workload", "gnc"], ("--workload: 'gnc' is not one of", "did you mean gcn")),
    Bad("--dataset unknown", lambda t: [*D, "--dataset", "cor"], ("--dataset: 'cor' is not one of", "did you mean cora")),
    Bad("--slurm-mode without slurm", lambda t: [*D, "--slurm-mode", "single"], ("--slurm-mode goes with --launcher slurm", "add --launcher slurm")),
    Bad("--slurm-mode unknown", lambda t: [*D, "--launcher", "slurm", "--slurm-mode", "multi"], ("--slurm-mode: 'multi' is not one of", "multi-job")),
    Bad("slurm launcher on an inventory without Slurm", lambda t: ["train", "-i", inv(t, NO_SLURM), "--launcher", "slurm"],
        ("--launcher slurm needs Slurm on the nodes", "set slurm_enabled: true"), reads_inventory=True),
    Bad("--dry-run given a value", lambda t: [*T, "--dry-run=yes"], ("--dry-run is a flag and takes no value", "write --dry-run alone")),
    Bad("--script that does not exist", lambda t: [*D, "--script", str(t / "nope.py")], ("--script: ", "nope.py: no such file", "pass the path")),
    Bad("--script that is a folder", lambda t: [*D, "--script", str(t)], ("--script: ", "not a file", "pass the path")),
    Bad("--script named like the rank wrapper", lambda t: [*D, "--script", script(t, "rank-env.sh")],
        ("distrun writes its own 'rank-env.sh'", "rename your script")),
    Bad("--script named hostfile", lambda t: [*D, "--script", script(t, "hostfile")], ("its own 'hostfile'", "rename your script")),
    Bad("--script named like a launch script", lambda t: [*D, "--script", script(t, "launch-w1.sh")], ("its own 'launch-w1.sh'", "rename")),
    Bad("--script named env.sh", lambda t: [*D, "--script", script(t, "env.sh")], ("its own 'env.sh'", "rename your script")),
    Bad("--script named like the Slurm driver", lambda t: [*D, "--script", script(t, "slurm-driver.sh")], ("its own 'slurm-driver.sh'", "rename")),
    Bad("--epochs with --script", lambda t: [*D, "--script", script(t, "train.py"), "--epochs", "3"],
        ("--epochs is an option of the reference workloads", "after '--'")),
    Bad("--dataset with --script", lambda t: [*D, "--script", script(t, "train.py"), "--dataset", "cora"],
        ("--dataset is an option of the reference workloads", "after '--'")),
    Bad("--workload with --script", lambda t: [*D, "--script", script(t, "train.py"), "--workload", "ddp"],
        ("--workload is an option of the reference workloads", "after '--'")),
    Bad("--data-dir relative", lambda t: [*D, "--data-dir", "data/cora"], ("--data-dir: 'data/cora'", "absolute path on the head node")),
    Bad("program argument not UTF-8", lambda t: [*D, "--", "--name", "\udcff"], ("program argument 2 after '--' is not valid UTF-8", "pass text")),
    Bad("collect limit not a number", lambda t: ["train", "-i", inv(t, NO_SLURM)], ("DISTRUN_COLLECT_MAX_MB='lots'", "positive whole number"),
        env={"DISTRUN_COLLECT_MAX_MB": "lots"}, reads_inventory=True),
    # --- state: DISTRUN_HOME ---------------------------------------------------------------------
    Bad("DISTRUN_HOME is a file (runs)", lambda t: ["runs"], ("DISTRUN_HOME", "is a file, not a folder", "point DISTRUN_HOME at a folder"),
        env={"DISTRUN_HOME": "FILE"}),
    Bad("DISTRUN_HOME under a file (show)", lambda t: ["show"], ("a part of that path is a file", "point DISTRUN_HOME at a folder"),
        env={"DISTRUN_HOME": "FILE/state"}),
    Bad("DISTRUN_HOME is a file (dry run)", lambda t: D, ("is a file, not a folder", "point DISTRUN_HOME"), env={"DISTRUN_HOME": "FILE"},
        reads_inventory=True),
    # --- runs ----------------------------------------------------------------------------------
    Bad("runs: --older-than without --prune", lambda t: ["runs", "--older-than", "30d"], ("--older-than only goes with --prune", "--prune --older-than 30d")),
    Bad("runs: duration without unit", lambda t: ["runs", "--prune", "--older-than", "30"], ("--older-than: ", "like 30d, 12h")),
    Bad("runs: unknown unit", lambda t: ["runs", "--prune", "--older-than", "3y"], ("--older-than: ", "like 30d, 12h")),
    Bad("runs: --json with --prune", lambda t: ["runs", "--prune", "--json"], ("--json lists runs", "not go with --prune")),
    Bad("runs: stray argument", lambda t: ["runs", "all"], ("unexpected argument 'all'", "--help")),
    # --- show, logs, stop: run ids -----------------------------------------------------------------
    Bad("show: unknown run", lambda t: ["show", "20990101-000000-train-ffff"], ("run '20990101-000000-train-ffff' not found", "'distrun runs' lists them")),
    Bad("show: a path for a run", lambda t: ["show", "../../etc"], ("RUN_ID: '../../etc' is not a run id", "'distrun runs'")),
    Bad("show: ambiguous prefix", lambda t: ["show", "2"], ("is ambiguous", "give more of the id")),
    Bad("show: misspelt --json", lambda t: ["show", "--jsno"], ("no such option --jsno", "did you mean --json")),
    Bad("logs: unknown run", lambda t: ["logs", "20990101-000000-train-ffff"], ("not found", "'distrun runs' lists them")),
    Bad("logs: negative rank", lambda t: ["logs", "--rank", "-1"], ("--rank: -1 is out of range", "ranks count from 0")),
    Bad("logs: rank not a number", lambda t: ["logs", "--rank", "one"], ("--rank: 'one' is not a whole number", "at least 0")),
    Bad("logs: a path for a run", lambda t: ["logs", "/etc/passwd"], ("'/etc/passwd' is not a run id", "'distrun runs'")),
    Bad("logs: rank with no log", lambda t: ["logs", "last", "--rank", "5"], ("no log for rank 5", "ranks with logs: none")),
    Bad("logs: misspelt --follow", lambda t: ["logs", "--folow"], ("no such option --folow", "did you mean --follow")),
    Bad("stop: a path for a run", lambda t: ["stop", "..;rm"], ("'..;rm' is not a run id", "'distrun runs'")),
    Bad("stop: unknown run", lambda t: ["stop", "ffff0"], ("run 'ffff0' not found", "'distrun runs' lists them")),
    Bad("stop: two run ids", lambda t: ["stop", "last", "last"], ("unexpected argument 'last'", "--help")),
    Bad("fetch: no path", lambda t: ["fetch", "last"], ("missing argument 'PATH...'", "--help")),
    Bad("fetch: a path outside the run dir", lambda t: ["fetch", "last", "../../etc/shadow"],
        ("'../../etc/shadow': give a path inside the run directory", "without '..'")),
    Bad("fetch: an absolute path", lambda t: ["fetch", "last", "/etc/shadow"], ("'/etc/shadow': give a path inside the run directory", "relative to it")),
    Bad("fetch: a path for a run", lambda t: ["fetch", "../x", "out"], ("'../x' is not a run id", "'distrun runs'")),
    Bad("fetch: misspelt --host", lambda t: ["fetch", "last", "out", "--hots", "n1"], ("no such option --hots", "did you mean --host")),
    # --- setup, check, partition, hostfile -------------------------------------------------------
    Bad("setup: misspelt --tags", lambda t: ["setup", "-i", TWO, "--tgas", "base"], ("no such option --tgas", "did you mean --tags")),
    Bad("check: misspelt --json", lambda t: ["check", "-i", TWO, "--jsn"], ("no such option --jsn", "did you mean --json")),
    Bad("partition: zero parts", lambda t: ["partition", "-i", TWO, "--np", "0"], ("--np: 0 is out of range", "at least 1")),
    Bad("partition: unknown dataset", lambda t: ["partition", "-i", TWO, "--dataset", "redit"], ("--dataset: 'redit'", "did you mean reddit")),
    Bad("partition: relative data dir", lambda t: ["partition", "-i", TWO, "--data-dir", "x"], ("--data-dir: 'x'", "absolute path")),
    Bad("hostfile: stray argument", lambda t: ["hostfile", "-i", TWO, "extra"], ("unexpected argument 'extra'", "--help")),
]

BAD += [Bad(label, argv, expect, env, reads, code) for label, argv, expect, env, reads, code in CASES + REFUSED]


@pytest.fixture
def records(private_state):
    """Two train records with no logs (for 'ambiguous' and 'no log for rank')."""
    first = new_run("train", Path(TWO))
    first.finish(0, "ok")
    time.sleep(1.01)  # ids carry the second they started in
    second = new_run("train", Path(TWO))
    second.finish(1, "failed rc=1")
    return [first, second]


def _invoke(case: Bad, tmp: Path) -> tuple[int, str, str, BaseException | None, float]:
    env: dict[str, str | None] = {"DISTRUN_INVENTORY": None, "COLUMNS": "80"}
    for k, v in case.env.items():
        env[k] = None if v is None else v.replace("FILE", a_file(tmp))
    argv = case.argv(tmp)
    started = time.monotonic()
    result = CliRunner().invoke(main, argv, env=env, prog_name="distrun")
    elapsed = time.monotonic() - started
    exc = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.stdout, result.stderr, exc, elapsed


def test_every_bad_invocation_is_one_line_with_the_fix(tmp_path, records, private_state, capsys):
    assert len(BAD) >= 250
    verbs = set()
    for i, b in enumerate(BAD):
        (tmp_path / "verbs" / str(i)).mkdir(parents=True)
        verbs.add(next((w for w in b.argv(tmp_path / "verbs" / str(i)) if not w.startswith("-")), ""))
    assert {"setup", "check", "hostfile", "train", "partition", "runs", "show", "logs", "stop", "fetch", "status",
            "attach", "init", "push-image"} <= verbs
    before = sorted(p.name for p in (private_state / "runs").iterdir())
    problems: list[str] = []
    slow: list[str] = []
    times: list[float] = []
    for i, case in enumerate(BAD):
        work = tmp_path / f"case{i}"
        work.mkdir()
        code, out, err, exc, elapsed = _invoke(case, work)
        times.append(elapsed)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        line = lines[0] if lines else ""
        why = []
        if exc is not None:
            why.append(f"raised {type(exc).__name__}: {exc}")
        if code == 0 or code != case.code:
            why.append(f"exit {code}, wanted {case.code}")
        if "Traceback" in out + err:
            why.append("a traceback")
        if len(lines) != 1 or not line.startswith("distrun: error: "):
            why.append(f"{len(lines)} stderr line(s), not one 'distrun: error:' line")
        missing = [f for f in case.expect if f not in line]
        if missing:
            why.append(f"missing {missing}")
        if elapsed >= (60 if case.reads_inventory else 3):
            why.append(f"took {elapsed:.1f}s")
        if elapsed >= 3:
            slow.append(f"{case.label} ({elapsed:.1f}s)")
        if why:
            problems.append(f"{case.label}: {'; '.join(why)}\n    stderr: {err.strip()!r}")
    after = sorted(p.name for p in (private_state / "runs").iterdir())
    with capsys.disabled():
        print(f"\n{len(BAD)} bad invocations tried, {len(BAD) - len(problems)} refused cleanly (the right exit code, "
              f"one stderr line naming the problem and the fix, no traceback), {len(problems)} not; slowest {max(times):.2f}s, "
              f"{sum(1 for b in BAD if not b.reads_inventory)} without reading an inventory "
              f"(slowest {max(t for t, b in zip(times, BAD, strict=True) if not b.reads_inventory):.3f}s); "
              f"3 s or more: {', '.join(slow) or 'none'}")
    assert not problems, "\n".join(problems)
    assert after == before, "a refused invocation left a run record"


# Through the real executable: argv bytes that are not UTF-8, a real pipe, a real exit status.
SUBPROCESS = [
    ([*D[:3], "--ephocs", "3", "--dry-run"], {}, "no such option --ephocs; did you mean --epochs"),
    ([*T, "train.py"], {}, "--script train.py"),
    ([*D, "--env", b"TOKEN=\xff"], {}, "--env: TOKEN: the value is not valid UTF-8"),
    (["runs"], {"DISTRUN_HOME": "FILE"}, "is a file, not a folder"),
]


@pytest.mark.parametrize("argv,env,expected", SUBPROCESS, ids=["misspelt option", "positional program", "non-UTF-8 env", "home is a file"])
def test_refusals_through_the_real_executable(cli_env, tmp_path, argv, env, expected):
    full = dict(cli_env)
    full.pop("DISTRUN_INVENTORY", None)
    full.update({k: v.replace("FILE", a_file(tmp_path)) for k, v in env.items()})
    started = time.monotonic()
    proc = subprocess.run([distrun_bin(), *argv], capture_output=True, env=full, cwd=REPO, timeout=60)
    elapsed = time.monotonic() - started
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("distrun: error: ") and expected in err, err
    assert "Traceback" not in err and proc.stdout == b""
    assert elapsed < 60


def test_run_dir_names_cover_every_file_a_launcher_renders():
    """--script is refused under any name a launcher, the rank wrapper or a launch script uses."""
    from .plans import plan_for
    from .test_launchers import MIXED, cluster

    for name in LAUNCHERS:
        modes = ("single", "multi-job") if name == "slurm" else ("",)
        for mode in modes:
            plan = plan_for(cluster(MIXED), run_id="r1", launcher=name, slurm={"mode": mode} if mode else None)
            names = set(run_files.plan_files(plan)) | {f"launch-{h}.sh" for h in run_files.launch_scripts(plan)}
            names |= {f"launcher-{h}.{x}" for h in run_files.launch_scripts(plan) for x in ("pid", "log", "pgid")}
            names |= {f"exitcode-{h}" for h in run_files.launch_scripts(plan)} | {"env.sh", "result.json"}
            names |= {launcher_named(name).rank_log(0, "h", 0).split("/")[0]}
            assert all(run_files.clashes_with_run_dir(n) for n in names), sorted(n for n in names if not run_files.clashes_with_run_dir(n))
    assert not run_files.clashes_with_run_dir("train.py") and not run_files.clashes_with_run_dir("launch.py")


def test_no_verb_reads_the_environment_behind_the_users_back(monkeypatch):
    """DISTRUN_INVENTORY is the only default an option takes from the environment."""
    for command in main.commands.values():
        for param in command.params:
            if getattr(param, "envvar", None):
                assert param.name == "inventory" and param.envvar == "DISTRUN_INVENTORY"
    assert os.environ.get("DISTRUN_INVENTORY") is None
