"""GPUs placed per rank by every launcher that runs on the CPU test nodes, as the dry run shows
them, and two runs sharing a node on disjoint GPUs, with `gpus: 4` declared (an inventory derived
from the test one). No GPU is needed: a rank only sees its CUDA_VISIBLE_DEVICES,
and train's preflight reads no GPU (only 'distrun check' reads nvidia-smi: there a node that
declares GPUs and has no nvidia-smi fails its 'gpu health' row, tests/unit/test_gpuhealth.py).
Each rank of mpirun, torchrun and the ssh launcher says its host, rank, LOCAL_RANK and
CUDA_VISIBLE_DEVICES: the same table as 'train --dry-run --json' (containers and Slurm need a GPU
node's CDI spec and gres: their mapping is tested on the plan, tests/unit/test_gpus.py).
Two detached runs on node1:0,1 and node1:2,3 both run, each rank with its own GPUs and unable to
open the other run's (stand-in device nodes on node1: the run's unit hides the others); a third on
node1:1,2 is refused in one line naming the host, the GPUs and the runs that hold them; both stop.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, distrun, new_train_run, run_processes

BUSY = 8  # errors.ExitCode.BUSY
# Each rank says which GPUs it sees and which of the node's GPU device nodes it can open (into
# the run's checkpoint folder, which the job may write), then sleeps until it is stopped.
SHOW_GPUS = textwrap.dedent("""
    import glob, os, time
    print(f"GPUS local={os.environ.get('LOCAL_RANK')} visible={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    opens = []
    for dev in sorted(glob.glob("/dev/nvidia[0-9]*")):
        try:
            with open(dev) as f:
                opens.append(dev[len("/dev/nvidia"):] + "=" + f.read().strip())
        except OSError as e:
            opens.append(dev[len("/dev/nvidia"):] + "=" + type(e).__name__)
    os.makedirs(os.environ["DISTRUN_CHECKPOINT_DIR"], exist_ok=True)
    path = os.path.join(os.environ["DISTRUN_CHECKPOINT_DIR"], f"opens-{os.environ['LOCAL_RANK']}")
    with open(path + ".tmp", "w") as f:
        f.write(" ".join(opens) + "\\n")
    os.rename(path + ".tmp", path)
    time.sleep(600)
""")
# Stand-ins for node1's four GPU device nodes (the CPU test nodes have none): plain files that
# anyone may read, saying which GPU they are. A run's unit hides those of the GPUs it was not given.
FAKE_GPUS = "for i in 0 1 2 3; do echo gpu$i > /dev/nvidia$i && chmod 0444 /dev/nvidia$i; done"
RUN_ID = re.compile(r"\d{8}-\d{6}-train-[0-9a-f]{4}")
# Each rank says where it runs and what it sees, then ends.
SAY_GPUS = textwrap.dedent("""
    import os, socket
    print(f"PLACED host={socket.gethostname().split('.')[0]} rank={os.environ['RANK']} "
          f"local={os.environ['LOCAL_RANK']} visible={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}", flush=True)
""")
PLACED = re.compile(r"^PLACED host=(\S+) rank=(\d+) local=(\d+) visible=([0-9,]+|unset)$", re.M)


def gpu_inventory(provisioned, where: Path) -> Path:
    """The test inventory with 4 GPUs and 2 slots declared on every node."""
    shutil.copytree(REPO / "inventory" / "test" / "group_vars", where / "group_vars")
    hosts = yaml.safe_load(provisioned.inventory.read_text())
    for node in hosts["all"]["hosts"].values():
        node.update({"gpus": 4, "slots": 2})
    (where / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return where


# On node1: each rank of run $RUN (its python process, tagged), its LOCAL_RANK and CUDA_VISIBLE_DEVICES.
RANK_GPUS = r"""
for d in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < $d/cmdline 2>/dev/null) || continue
  case "${c%% *}" in *python*) ;; *) continue ;; esac
  case "$c" in *show_gpus.py*) ;; *) continue ;; esac
  e=$(tr '\0' '\n' < $d/environ 2>/dev/null) || continue
  printf '%s\n' "$e" | grep -qxF "DISTRUN_RUN_ID=$RUN" || continue
  echo "local=$(printf '%s\n' "$e" | sed -n 's/^LOCAL_RANK=//p') visible=$(printf '%s\n' "$e" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')"
done
"""


def rank_gpus(provisioned, run_id: str, within_s: float = 30) -> list[str]:
    """What each rank of the run on node1 was started with (its environment), once both ranks run."""
    deadline = time.monotonic() + within_s
    while True:
        out = provisioned.exec(1, f"RUN={run_id}; {RANK_GPUS}", check=False).stdout
        lines = sorted(line for line in out.splitlines() if line.startswith("local="))
        if len(lines) >= 2 or time.monotonic() > deadline:
            return lines
        time.sleep(1)


def rank_opens(provisioned, run_id: str, within_s: float = 30) -> list[str]:
    """Which of node1's GPU device nodes each rank of the run could open, once both said."""
    deadline = time.monotonic() + within_s
    while True:
        out = provisioned.exec(1, f"cd /srv/distrun/checkpoints/{run_id} && cat opens-0 opens-1", check=False)
        if out.returncode == 0 or time.monotonic() > deadline:
            return out.stdout.splitlines()
        time.sleep(1)


def placed(text: str) -> set[tuple[str, int, int, str]]:
    return {(m[1], int(m[2]), int(m[3]), m[4]) for m in PLACED.finditer(text)}


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "ssh"])
def test_every_launchers_ranks_see_the_gpus_the_dry_run_shows(provisioned, distrun_home, tmp_path, launcher):
    inv = gpu_inventory(provisioned, tmp_path / "gpus4")
    script = tmp_path / "say_gpus.py"
    script.write_text(SAY_GPUS)
    args = ("--inventory", str(inv), "--launcher", launcher, "--script", str(script))
    dry = distrun("train", *args, "--dry-run", "--json", timeout=300)
    assert dry.rc == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    shown = {(r["host"], r["rank"], r["local_rank"], r["visible"]) for r in json.loads(dry.stdout)["gpus"]}
    # 3 nodes, 2 slots and 4 GPUs each: each rank two GPUs of its own.
    assert len(shown) == 6 and {v for *_, v in shown} == {"0,1", "2,3"}, shown
    before = set((distrun_home / "runs").glob("*-train-*"))
    res = distrun("train", *args, timeout=600)
    run = new_train_run(distrun_home, before)
    assert res.rc == 0 and run is not None, res.stdout[-3000:] + res.stderr[-2000:]
    # What every rank said, in the rank logs the run collected from each node (the terminal's
    # lines of several ranks may interleave).
    said: set[tuple[str, int, int, str]] = set()
    for log in (run / "nodes").rglob("*"):
        if log.is_file() and log.name in ("stdout", "stdout.log"):
            said |= placed(log.read_text(errors="replace"))
    assert said == shown, (sorted(said), sorted(shown))


def test_two_detached_runs_share_node1_on_disjoint_gpus_and_an_overlapping_third_is_refused_naming_them(
        provisioned, distrun_home, tmp_path):
    inv = gpu_inventory(provisioned, tmp_path / "gpus4")
    script = tmp_path / "show_gpus.py"
    script.write_text(SHOW_GPUS)
    started: list[str] = []
    provisioned.exec(1, FAKE_GPUS)
    try:
        for hosts in ("node1:0,1", "node1:2,3"):
            res = distrun("train", "--inventory", str(inv), "--hosts", hosts, "--script", str(script), "--detach",
                          timeout=600)
            assert res.rc == 0, f"--hosts {hosts}:\n" + res.stdout[-3000:] + res.stderr[-2000:]
            started.append(res.stdout.strip().splitlines()[-1])
            assert RUN_ID.fullmatch(started[-1]), res.stdout[-2000:]
        first, second = started
        # Each rank sees its own run's GPUs (one per rank: LOCAL_RANK indexes the node's list).
        assert rank_gpus(provisioned, first) == ["local=0 visible=0,1", "local=1 visible=0,1"]
        assert rank_gpus(provisioned, second) == ["local=0 visible=2,3", "local=1 visible=2,3"]
        # ... and can open only those: the other run's GPUs are fenced off, whatever a rank sets
        # CUDA_VISIBLE_DEVICES to.
        assert rank_opens(provisioned, first) == ["0=gpu0 1=gpu1 2=PermissionError 3=PermissionError"] * 2
        assert rank_opens(provisioned, second) == ["0=PermissionError 1=PermissionError 2=gpu2 3=gpu3"] * 2
        assert run_processes(provisioned, first, (1,)) and run_processes(provisioned, second, (1,))

        records = set((distrun_home / "runs").glob("*-train-*"))
        refused = distrun("train", "--inventory", str(inv), "--hosts", "node1:1,2", "--script", str(script),
                          "--detach", timeout=600)
        said = " ".join(refused.stderr.split())
        assert refused.rc == BUSY, refused.stdout[-2000:] + refused.stderr[-2000:]
        assert (f"node1: GPUs 1,2 are held by run {first}, {second} (running there now): wait for it to end, or "
                f"stop it with 'distrun stop {first}' (or pass --allow-concurrent)") in said, said
        assert set((distrun_home / "runs").glob("*-train-*")) == records  # the refused run left no record
    finally:
        provisioned.exec(1, "rm -f /dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3", check=False)
        for run_id in started:
            stop = distrun("stop", run_id, timeout=300)
            assert stop.rc == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    assert not run_processes(provisioned, started[0], (1,)) and not run_processes(provisioned, started[1], (1,))


def test_a_run_told_to_wait_starts_once_the_detached_run_holding_its_gpus_ends(provisioned, distrun_home, tmp_path):
    """train --wait: node1's GPUs 0,1 held by a detached run that ends after ~10 s; a second run on
    them says once that it waits, naming that run, and then runs to its end."""
    inv = gpu_inventory(provisioned, tmp_path / "gpus4")
    holder, waiter = tmp_path / "hold.py", tmp_path / "say_gpus.py"
    holder.write_text("import time\ntime.sleep(10)\n")
    waiter.write_text(SAY_GPUS)
    first = distrun("train", "--inventory", str(inv), "--hosts", "node1:0,1", "--script", str(holder), "--detach",
                    timeout=600)
    assert first.rc == 0, first.stdout[-3000:] + first.stderr[-2000:]
    first_id = first.stdout.strip().splitlines()[-1]
    assert RUN_ID.fullmatch(first_id), first.stdout[-2000:]
    try:
        started = time.monotonic()
        before = set((distrun_home / "runs").glob("*-train-*"))
        second = distrun("train", "--inventory", str(inv), "--hosts", "node1:0,1", "--script", str(waiter),
                         "--wait", "120", timeout=600)
        said = " ".join((second.stdout + second.stderr).split())
        assert second.rc == 0, second.stdout[-3000:] + second.stderr[-2000:]
        assert said.count("waiting up to") == 1, said[-3000:]
        assert f"waiting up to 120 s for node1's GPUs 0,1 held by run {first_id} (Ctrl-C gives up" in said, said[-3000:]
        run = new_train_run(distrun_home, before)
        assert run is not None
        ranks: set[tuple[str, int, int, str]] = set()
        for log in (run / "nodes").rglob("*"):
            if log.is_file() and log.name in ("stdout", "stdout.log"):
                ranks |= placed(log.read_text(errors="replace"))
        assert ranks == {("node1", 0, 0, "0,1"), ("node1", 1, 1, "0,1")}, second.stdout[-3000:]
        assert time.monotonic() - started < 120
    finally:
        distrun("stop", first_id, timeout=300)
    assert not run_processes(provisioned, first_id, (1,))
