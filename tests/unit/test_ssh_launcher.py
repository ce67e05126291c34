"""The ssh launcher's rendered scripts, run for real on this machine: every rank host's launch
script starts its ranks with torch's variables, one log per rank, and ends with the exit code of
the rank that failed first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from distrun.launchers import LAUNCHERS
from distrun.planning import run_files
from distrun.planning.jobplan import JobPlan
from distrun.run.diagnosis import first_failure
from distrun.transport import rundir

from .plans import plan_for
from .test_launchers import MIXED, cluster

# Prints the variables it got as one JSON line, then ends as the rank's RANK says.
PROGRAM = """
import json, os, sys, time
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
keys += ("EVIL",) if "EVIL" in os.environ else ()
print("VARS " + json.dumps({k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}), flush=True)
how = json.loads(os.environ["HOW"]).get(os.environ["RANK"], [0, 0])
time.sleep(how[1])
sys.exit(how[0])
"""


def _plan(tmp_path: Path, program: tuple[str, ...], **kw) -> JobPlan:
    hosts = {name: dict(h) for name, h in MIXED.items()}
    hosts["n1"]["distrun_shared_dir"] = str(tmp_path)
    plan = plan_for(cluster(hosts), run_id="r1", launcher="ssh", np=4, **kw)
    return replace(plan, program=replace(plan.program, argv=program))


def _stage(plan: JobPlan, env: dict[str, str] | None = None) -> dict[str, Path]:
    """Write the run directory as the nodes would have it; host -> its launch script."""
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if env:
        (run_dir / "env.sh").write_text(run_files.render_env_file(env))
    for name, text in run_files.plan_files(plan).items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    (run_dir / "rank-env.sh").chmod(0o755)
    scripts = {}
    for host, text in run_files.launch_scripts(plan).items():
        path = run_dir / rundir.in_attempt(plan, rundir.launch_script(host))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        scripts[host] = path
    return scripts


def _run(plan: JobPlan, how: dict[str, list[float]], user_env: dict[str, str] | None = None) -> dict[str, int]:
    """Start every host's launch script at once, as the nodes would; host -> exit code."""
    env = {**os.environ, "HOW": json.dumps(how)}
    procs = {h: subprocess.Popen(["/bin/bash", str(p)], env=env) for h, p in _stage(plan, user_env).items()}
    return {h: p.wait(timeout=60) for h, p in procs.items()}


def _vars(plan: JobPlan) -> dict[int, dict]:
    out = {}
    attempt = Path(rundir.attempt_path(plan))
    for rank in range(plan.placement.world_size):
        log = attempt / LAUNCHERS["ssh"].rank_log(rank, "", 0)
        line = next(x for x in log.read_text().splitlines() if x.startswith("VARS "))
        out[rank] = json.loads(line[5:])
    return out


def test_each_host_starts_its_slots_with_torchs_variables(tmp_path):
    plan = _plan(tmp_path, (sys.executable, "-c", PROGRAM, "a b"))
    assert [(h.name, h.slots) for h in plan.placement.hosts] == [("n1", 2), ("n2", 1), ("n3", 1)]
    assert _run(plan, {}) == {"n1": 0, "n2": 0, "n3": 0}
    got = _vars(plan)
    want = {0: ("0", "2", "0"), 1: ("1", "2", "0"), 2: ("0", "1", "1"), 3: ("0", "1", "2")}
    for rank, (local, local_size, node) in want.items():
        assert got[rank] == {"RANK": str(rank), "LOCAL_RANK": local, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": local_size,
                             "NODE_RANK": node, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(plan.placement.master_port),
                             "argv": ["a b"]}
    attempt = Path(rundir.attempt_path(plan))
    # The wrapper's header line opens every rank's log (collect and 'distrun logs' match on it),
    # and the launcher's log of each host carries its ranks' output, which the run follows.
    for rank in range(4):
        assert (attempt / f"ranks/{rank}/stdout").read_text().startswith(f"DISTRUN_RANK rank={rank} ")
    assert (attempt / rundir.launcher_log("n1")).read_text().count("VARS ") == 2
    assert (attempt / rundir.exit_code("n3")).read_text().strip() == "0"


def test_hostile_values_stay_values(tmp_path):
    evil = "$(touch pwned)'; touch pwned2 #\n`touch pwned3`"
    plan = _plan(tmp_path, (sys.executable, "-c", PROGRAM, evil), extra_env={"EVIL": evil})
    assert _run(plan, {}, {"EVIL": evil}) == {"n1": 0, "n2": 0, "n3": 0}
    assert _vars(plan)[3]["argv"] == [evil] and _vars(plan)[3]["EVIL"] == evil
    assert not list(tmp_path.rglob("pwned*")) and not list(Path.cwd().glob("pwned*"))


def test_the_host_ends_with_the_first_failing_ranks_code_and_stops_the_others(tmp_path):
    plan = _plan(tmp_path, (sys.executable, "-c", PROGRAM))
    # On n1, rank 1 fails first (7) while rank 0 would fail later (5) and is stopped before.
    started = time.monotonic()
    codes = _run(plan, {"0": [5, 30], "1": [7, 0.3], "3": [9, 0]})
    assert codes == {"n1": 7, "n2": 0, "n3": 9}
    assert time.monotonic() - started < 20
    attempt = Path(rundir.attempt_path(plan))
    assert (attempt / rundir.exit_code("n1")).read_text().strip() == "7"
    said = (attempt / rundir.launcher_log("n1")).read_text()
    assert "rank 1 ended with exit code 7" in said
    # The run's summary names the rank from what the launcher printed and the wrapper's headers.
    assert first_failure(said.splitlines(), LAUNCHERS["ssh"]).startswith("; first failing rank 1 on ")


def test_term_reaches_the_ranks(tmp_path):
    plan = _plan(tmp_path, (sys.executable, "-c", PROGRAM))
    _stage(plan)
    attempt = Path(rundir.attempt_path(plan))
    env = {**os.environ, "HOW": json.dumps({"0": [0, 60], "1": [0, 60]})}
    script = ["/bin/bash", f"{plan.run_dir}/ssh-ranks.sh", "0", "2", plan.wrapper, *plan.program.argv]
    with (attempt / "term.log").open("w") as log:
        proc = subprocess.Popen(script, cwd=attempt, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = attempt / "started"
        for _ in range(100):
            if len(list(started.glob("rank-*"))) == 2:
                break
            time.sleep(0.1)
        pids = [int(f.read_text().split()[1]) for f in started.glob("rank-*")]
        assert len(pids) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert "ended with exit code" not in (attempt / "term.log").read_text()
        for pid in pids:
            for _ in range(50):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.1)
            assert not Path(f"/proc/{pid}").exists(), f"rank process {pid} outlived the TERM"
    finally:
        if proc.poll() is None:  # a script that ignored the TERM: never left behind
            proc.kill()
            proc.wait()


def test_rank_logs_and_names_are_where_collect_and_clashes_look():
    launcher = LAUNCHERS["ssh"]
    assert launcher.rank_log(3, "n2", 0) == "ranks/3/stdout"
    assert run_files.clashes_with_run_dir("ssh-ranks.sh")
    assert launcher.rank_order([{"name": "b"}, {"name": "a"}]) == [{"name": "b"}, {"name": "a"}]


def _cli(args: list[str]) -> tuple[int, str, str]:
    from click.testing import CliRunner

    from distrun.cli.main import main

    result = CliRunner().invoke(main, args, prog_name="distrun", env={"DISTRUN_INVENTORY": None})
    return result.exit_code, result.stdout, result.stderr


def test_the_cli_takes_ssh_from_the_registry_and_a_dry_run_shows_the_layout():
    from .test_cli_args import TWO

    code, out, err = _cli(["train", "-i", TWO, "--launcher", "ssh", "--workload", "ddp", "--dry-run"])
    assert code == 0, err
    assert "launcher:    ssh" in out and "world size:  3 rank(s) on 2 host(s)" in out
    # Both rank hosts launch: w1 ranks 0-1 (node 0), w2 rank 2 (node 1).
    assert "/ssh-ranks.sh 0 2 /shared/runs/DRYRUN/rank-env.sh " in out
    assert "/ssh-ranks.sh 2 1 /shared/runs/DRYRUN/rank-env.sh " in out
    w2 = out[out.index("# launch on w2"):]
    assert "export NODE_RANK=1\n" in w2 and "export WORLD_SIZE=3\n" in w2 and "export MASTER_ADDR=10.0.0.11\n" in w2
    code, out, err = _cli(["train", "--help"])
    said = " ".join(out.split())  # the help is wrapped to the terminal's width
    assert all(name in said for name in LAUNCHERS) and "own rendezvous" in said


def test_the_cli_refuses_a_misspelt_launcher_and_launcher_args_for_ssh():
    from .test_cli_args import TWO

    code, out, err = _cli(["train", "-i", TWO, "--launcher", "shh", "--dry-run"])
    assert code == 2 and "'shh' is not one of mpirun, torchrun, slurm, ssh; did you mean ssh?" in err
    code, out, err = _cli(["train", "-i", TWO, "--launcher", "ssh", "--launcher-args", "--foo", "--dry-run"])
    assert code != 0 and "--launcher ssh has no command line of its own" in err and out == ""


def test_with_an_image_each_rank_starts_in_its_own_container():
    from distrun.planning.containers import Container

    from .test_containers import IMAGE

    plan = plan_for(cluster(MIXED), run_id="r1", launcher="ssh", np=4, container=Container(IMAGE, "podman"))
    launcher = LAUNCHERS["ssh"]
    argv = launcher.command(plan, plan.placement.hosts[1])
    # The rank wrapper runs on the node and hands the program to the container's start.
    assert argv[2:6] == ["2", "1", plan.wrapper, f"{plan.run_dir}/container-run.sh"]
    files = run_files.plan_files(plan)
    assert "ssh-ranks.sh" in files and "--env NODE_RANK" in files["container-run.sh"]
    assert launcher.needs(plan) == ({"podman": ["podman"]}, {})
