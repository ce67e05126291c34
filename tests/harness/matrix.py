"""The launcher x shared folder x inventory matrix: every combination distrun supports, run.

Each cell is one short 3-rank torch job (``CELL_SCRIPT``: an allreduce, a DistributedSampler DDP of
a few epochs with a snapshot in its working directory, and a file written in the run directory and
read back), started with the real CLI, then read back with 'distrun logs'. A cluster runs the
cells of its inventory in every shared folder mode, switching only the shared folder between
modes. A combination that cannot run on this machine is listed with its reason (``NOT_RUNNABLE``).

Every cell writes one row into ``$DISTRUN_TEST_REPORT_DIR/matrix-<pid>.jsonl``; the suite's
closing report prints them as one table (``table``).
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import re
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LAUNCHERS = ("mpirun", "torchrun", "slurm")
# Slurm's multi-job mode (one job and one torchrun agent per node) is a column of its own where a
# row runs it; "slurm" is its single mode (one job, srun's ranks).
COLUMNS = (*LAUNCHERS, "slurm multi-job")
# The table's columns: the ssh launcher is a column of the YAML inventory's rows only, and of
# two of its shared folder modes (the others show "-"): its ranks read the run directory as
# torchrun's do, so two modes prove it and keep the suite short.
# A launcher from outside distrun is a column too, registered by its one line (DISTRUN_LAUNCHERS)
# and found on PYTHONPATH: the test-only podlet (tests/launchers/podlet), in the same two modes.
OUTSIDE = {"podlet": "tests.launchers.podlet:Podlet"}
TABLE_COLUMNS = (*COLUMNS, "ssh", *OUTSIDE)
COLUMN_MODES = {"ssh": ("sync", "sshfs"), **{name: ("sync", "sshfs") for name in OUTSIDE}}
MODES = ("sync", "sshfs", "external", "nfs")
INVENTORIES = {
    "yaml-root": "YAML, names = hostnames, admin root",
    "ini-alias-ops": "INI, names alpha/w2/w3 != hostnames node1..3, admin ops (not root) with become",
    "yaml-slots-2": "the YAML inventory with slots: 2 on every node (6 ranks, 2 per node)",
    "yaml-slots-2-1-1": "the YAML inventory with slots 2/1/1 (4 ranks, uneven)",
    "yaml-image": "the YAML inventory with distrun_image: every rank in a rootless podman container",
}
# The rows an inventory has (its shared folder modes) and the columns it runs; every test node's
# hostname is on 127.0.1.1 in its /etc/hosts, as Debian's installer writes it.
ROWS = {"yaml-root": (MODES, (*LAUNCHERS, "ssh", *OUTSIDE)), "ini-alias-ops": (MODES, LAUNCHERS),
        "yaml-slots-2": (("sync",), COLUMNS), "yaml-slots-2-1-1": (("sync",), COLUMNS),
        # Slurm's own container path is pyxis, which cannot be installed here: its multi-job mode
        # (torchrun in one container per node) is the Slurm cell of this row.
        "yaml-image": (("sync",), ("mpirun", "torchrun", "slurm multi-job"))}
NOT_RUNNABLE = {
    "nfs": "this kernel has no NFS client or server: the nfs mode is converged rendered-only "
           "(exports, fstab; molecule/nfs), never mounted",
}
EPOCHS = 3
# Where the test clusters' nodes all bind one host folder: a site's shared filesystem, for the
# external mode, whose shared folder is a folder in it (as a site gives a project its folder).
SITE_MOUNT = "/mnt/site"
SITE_SHARED_DIR = f"{SITE_MOUNT}/distrun"

CELL_SCRIPT = textwrap.dedent(f"""
    import gc, os, socket
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)

    # The usual shape of a DDP script: a sampler per rank, a resumable snapshot in the working directory.
    torch.manual_seed(0)
    x = torch.randn(96, 4)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if os.path.exists("snapshot.pt"):
        snap = torch.load("snapshot.pt")
        model.module.load_state_dict(snap["model"])
        start = snap["epoch"] + 1
    for epoch in range(start, {EPOCHS}):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()
            opt.step()
        if rank == 0:
            torch.save({{"epoch": epoch, "model": model.module.state_dict()}}, "snapshot.pt")
        print(f"CELL epoch {{epoch + 1}}/{EPOCHS} rank={{rank}} loss={{loss.item():.4f}}", flush=True)

    # What the launcher told this rank, beside what the process group says.
    layout = " ".join(f"{{k}}={{os.environ.get(k, '-')}}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    print(f"CELL layout rank={{rank}} world={{world}} host={{socket.gethostname()}} {{layout}}", flush=True)
    # Where the rank ran: in a container or not, and in which network namespace (the node's own
    # when a container shares the host's network).
    print(f"CELL where rank={{rank}} container={{os.path.exists('/run/.containerenv')}} "
          f"netns={{os.readlink('/proc/self/ns/net')}}", flush=True)

    path = os.path.join(os.getcwd(), f"cell-rank{{rank}}.txt")
    with open(path, "w") as fh:
        fh.write(f"rank {{rank}} of {{world}} on {{socket.gethostname()}} sum {{int(total.item())}}")
    with open(path) as fh:
        back = fh.read()
    print(f"CELL rank={{rank}} world={{world}} host={{socket.gethostname()}} sum={{int(total.item())}} "
          f"cwd={{os.getcwd()}} file={{back!r}}", flush=True)
    # Release DDP's reducer (it holds gloo's pending work) while the interpreter is whole, then
    # the process group: gloo threads torn down at interpreter exit can abort a finished rank
    # ("terminate called without an active exception").
    del model, opt, loader
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
""")

CELL_LINE = re.compile(r"CELL rank=(\d+) world=(\d+) host=(\S+) sum=(\d+) cwd=(\S+) file='([^']*)'")
EPOCH_LINE = re.compile(rf"CELL epoch {EPOCHS}/{EPOCHS} rank=(\d+)")
WHERE_LINE = re.compile(r"CELL where rank=(\d+) container=(True|False) netns=(\S+)")
LAYOUT_LINE = re.compile(r"CELL layout rank=(\d+) world=(\d+) host=(\S+) RANK=(\S+) LOCAL_RANK=(\S+) WORLD_SIZE=(\S+) "
                         r"LOCAL_WORLD_SIZE=(\S+)")


@dataclass
class Cell:
    launcher: str
    mode: str
    inventory: str
    status: str  # "passed", "failed: <why>"
    seconds: float
    run_id: str = ""


MODE_VARS: dict[str, dict[str, str]] = {
    "sync": {"distrun_shared_fs_mode": "sync"},
    "sshfs": {"distrun_shared_fs_mode": "sshfs"},
    "external": {"distrun_shared_fs_mode": "external", "distrun_shared_dir": SITE_SHARED_DIR},
}


def mode_inventory(hosts_file: Path, group_vars: Path, dest: Path, mode: str | None, **more: object) -> Path:
    """A copy of an inventory (its hosts file and group_vars) whose shared folder is in ``mode``
    (None: as it is), with ``more`` group variables."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(hosts_file, dest / hosts_file.name)
    shutil.rmtree(dest / "group_vars", ignore_errors=True)
    shutil.copytree(group_vars, dest / "group_vars")
    import yaml  # the venv has it (Ansible needs it)

    path = dest / "group_vars" / "all.yml"
    values = {**(yaml.safe_load(path.read_text()) or {}), **(MODE_VARS[mode] if mode else {}), **more}
    path.write_text(f"# A variant of {group_vars}/all.yml (tests/harness/matrix.py: mode {mode})\n"
                    + yaml.safe_dump(values, sort_keys=False, default_flow_style=False))
    return dest


def slots_inventory(hosts_file: Path, group_vars: Path, dest: Path, slots: Mapping[str, int]) -> Path:
    """A copy of a YAML inventory whose hosts run ``slots`` ranks each (the rest as they are)."""
    import yaml

    inv = mode_inventory(hosts_file, group_vars, dest, None)
    doc = yaml.safe_load(hosts_file.read_text())
    for name, n in slots.items():
        doc["all"]["hosts"][name]["slots"] = int(n)
    (inv / hosts_file.name).write_text(f"# {hosts_file} with slots {dict(slots)} (tests/harness/matrix.py)\n"
                                        + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000))
    return inv


def record(cell: Cell) -> None:
    """One row for the suite's closing report (nothing when no report folder is set)."""
    folder = os.environ.get("DISTRUN_TEST_REPORT_DIR")
    if folder:
        with Path(folder, f"matrix-{os.getpid()}.jsonl").open("a") as fh:
            fh.write(json.dumps(asdict(cell)) + "\n")


def record_step(what: str, seconds: float) -> None:
    """A timed step around the cells (a cluster's setup, a switch of its shared folder)."""
    folder = os.environ.get("DISTRUN_TEST_REPORT_DIR")
    if folder:
        with Path(folder, f"steps-{os.getpid()}.jsonl").open("a") as fh:
            fh.write(json.dumps({"step": what, "seconds": round(seconds, 1)}) + "\n")


def inventories_by_mode(base: str, hosts_file: Path, group_vars: Path, mktemp: Callable[[str], Path],
                        cluster: str) -> dict[str, str]:
    """Mode -> inventory: ``base`` (sync mode) and a copy of it for every other mode this kernel can run."""
    out = {"sync": base}
    for mode in ("sshfs", "external"):
        out[mode] = str(mode_inventory(hosts_file, group_vars, mktemp(f"inventory-{cluster.lower()}-{mode}"), mode))
    return out


class ModeSwitch:
    """One provisioned cluster taken through the shared folder modes: 'distrun setup --tags
    shared_fs,hostfile' with the inventory of the next mode (the hostfile lives in the shared
    folder); every other role stays as it is. As a context manager it ends in the mode it began in."""

    def __init__(self, distrun: Callable[..., Any], inventories: Mapping[str, str], current: str, cluster: str) -> None:
        self.distrun = distrun
        self.inventories = dict(inventories)
        self.current = current
        self.cluster = cluster
        self.start = current

    def __enter__(self) -> ModeSwitch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.to(self.start)

    def to(self, mode: str) -> str:
        """Switch to mode (if not there yet); returns that mode's inventory."""
        inventory = self.inventories[mode]
        if mode != self.current:
            started = time.monotonic()
            result = self.distrun("setup", "--inventory", inventory, "--tags", "shared_fs,hostfile", timeout=900)
            assert result.rc == 0, f"switching to {mode} failed:\n{result.stdout[-5000:]}\n{result.stderr[-2000:]}"
            self.current = mode
            record_step(f"cluster {self.cluster}: shared folder {mode} (setup --tags shared_fs,hostfile)",
                        time.monotonic() - started)
        return inventory


def latest_run(home: Path) -> Path:
    runs = sorted((home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)
    assert runs, f"no train run recorded in {home}"
    return runs[-1]


def launcher_env(launcher: str) -> dict[str, str]:
    """What distrun's environment needs for a column's launcher: for one from outside distrun,
    its registration and where its package is."""
    if launcher not in OUTSIDE:
        return {}
    return {"DISTRUN_LAUNCHERS": OUTSIDE[launcher], "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def run_cell(distrun: Callable[..., Any], inventory: str, launcher: str, mode: str, kind: str, home: Path,
             script: Path, hosts: Mapping[str, str], slots: Mapping[str, int] | None = None) -> Cell:
    """Run one cell and check what a user would: exit 0, every rank's allreduce and last epoch,
    the rank layout every rank was told (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), the file
    the last rank wrote in the run directory read back by 'distrun logs', collected in the record.

    ``hosts``: inventory name -> the machine's hostname, in rank order; ``slots``: inventory name
    -> the ranks it runs (one each when not given). ``launcher`` is a column (COLUMNS).
    Raises AssertionError naming what went wrong; records the cell either way."""
    started = time.monotonic()
    cell = Cell(launcher, mode, kind, "failed: did not finish", 0.0)
    slots = dict(slots or dict.fromkeys(hosts, 1))
    world = sum(slots.values())
    last = world - 1
    args = ["--launcher", "slurm", "--slurm-mode", "multi-job"] if launcher == "slurm multi-job" else ["--launcher", launcher]
    env = launcher_env(launcher)
    try:
        result = distrun("train", "--inventory", inventory, *args, "--script", str(script), env_extra=env, timeout=600)
        shown = result.stdout[-4000:] + result.stderr[-2000:]
        assert result.rc == 0, f"train exited {result.rc}:\n{shown}"
        run = latest_run(home)
        cell.run_id = run.name
        plan = json.loads((run / "plan.json").read_text())
        assert [h["name"] for h in plan["hosts"]] == list(hosts), plan["hosts"]
        assert plan["shared_dir"] and plan["world_size"] == world
        # The attempt's record: every state on the way to running ranks, in time order, ending launched.
        states = json.loads((run / "attempts" / "0" / "states.json").read_text())
        reached = [s["state"] for s in states["states"]]
        assert states["end"] == "launched" and reached[0] == "planned" and reached[-1] == "launched", states
        assert {"uploaded", "staged"} <= set(reached), states
        logs = distrun("logs", run.name, "--rank", str(last), env_extra=env, timeout=120)
        assert logs.rc == 0, f"distrun logs exited {logs.rc}: {logs.stderr[-2000:]}"
        lines = {int(m[1]): m for m in CELL_LINE.finditer(logs.stdout)}
        assert set(lines) == {last}, f"'distrun logs --rank {last}' shows ranks {sorted(lines)}:\n{logs.stdout[-3000:]}"
        m = lines[last]
        machine = list(hosts.values())[-1]
        run_dir = f"{plan['shared_dir'].rstrip('/')}/runs/{run.name}"
        total = str(world * (world + 1) // 2)
        assert (m[2], m[3], m[4], m[5]) == (str(world), machine, total, run_dir), m.group(0)
        assert m[6] == f"rank {last} of {world} on {machine} sum {total}", m.group(0)
        assert EPOCH_LINE.search(logs.stdout), f"rank {last} did not reach epoch {EPOCHS}:\n{logs.stdout[-2000:]}"
        ranks = _rank_lines(run)
        # every rank through every epoch of its DistributedSampler, on the node the plan put it
        assert sorted(ranks) == list(range(world)) and {r[0] for r in ranks.values()} == set(hosts.values()), ranks
        assert all(r[1] == EPOCHS for r in ranks.values()), ranks
        assert_layout(run, hosts, slots)
        files = {p.read_text() for p in (run / "nodes").rglob(f"cell-rank{last}.txt")}
        assert files == {f"rank {last} of {world} on {machine} sum {total}"}, \
            f"the record holds {files or 'no'} cell-rank{last}.txt"
        cell.status = "passed"
        return cell
    except AssertionError as exc:
        cell.status = "failed: " + " ".join(str(exc).split())[:300]
        raise
    except subprocess.TimeoutExpired:
        # The CLI was killed, its run was not: stop it, or it holds the hosts for every later test.
        distrun("stop", "last", env_extra=env, timeout=300)
        cell.status = "failed: did not finish in 600 s (stopped with 'distrun stop last')"
        raise
    finally:
        cell.seconds = round(time.monotonic() - started, 1)
        record(cell)


def assert_layout(run: Path, hosts: Mapping[str, str], slots: Mapping[str, int]) -> None:
    """Every node holds local ranks 0..slots-1 exactly once, global ranks are 0..world-1 in the
    order of ``hosts``, and each rank's RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE say so."""
    world = sum(slots.values())
    seen: dict[int, tuple[str, ...]] = {}
    for f in rank_logs(run):
        for m in LAYOUT_LINE.finditer(f.read_text(errors="replace")):
            seen[int(m[1])] = tuple(m.groups()[1:])
    assert sorted(seen) == list(range(world)), f"layout lines of ranks {sorted(seen)}, expected 0..{world - 1}"
    expected_rank = 0
    for name, machine in hosts.items():
        mine = sorted((r, v) for r, v in seen.items() if v[1] == machine)
        assert [r for r, _ in mine] == list(range(expected_rank, expected_rank + slots[name])), \
            f"{name} ({machine}) holds ranks {[r for r, _ in mine]}, expected {slots[name]} from {expected_rank}"
        assert sorted(v[3] for _, v in mine) == [str(i) for i in range(slots[name])], f"{name}: LOCAL_RANK {mine}"
        for r, (w, _, env_rank, _, env_world, local_world) in mine:
            assert (w, env_rank, env_world, local_world) == (str(world), str(r), str(world), str(slots[name])), \
                f"rank {r} on {name}: world={w} RANK={env_rank} WORLD_SIZE={env_world} LOCAL_WORLD_SIZE={local_world}"
        expected_rank += slots[name]


def rank_log_patterns() -> set[str]:
    """Where every column's launcher says its ranks' logs are (Launcher.rank_log_files), those
    from outside distrun (OUTSIDE) too."""
    from distrun.launchers import LAUNCHERS

    launchers = list(LAUNCHERS.values())
    for entry in OUTSIDE.values():
        module, name = entry.split(":")
        launchers.append(getattr(importlib.import_module(module), name)())
    return {p for launcher in launchers for p in launcher.rank_log_files}


def rank_logs(run: Path) -> Iterator[Path]:
    """Every rank log collected in the run's record."""
    patterns = rank_log_patterns()
    for f in (run / "nodes").rglob("*"):
        rel = f.relative_to(run / "nodes").as_posix()
        if f.is_file() and any(fnmatch.fnmatch(rel, f"*/{p}") for p in patterns):
            yield f


def _rank_lines(run: Path) -> dict[int, tuple[str, int]]:
    """Rank -> (machine, epochs done) from every collected rank log of the run."""
    found: dict[int, tuple[str, int]] = {}
    for f in rank_logs(run):
        text = f.read_text(errors="replace")
        for m in CELL_LINE.finditer(text):
            found[int(m[1])] = (m[3], len(re.findall(rf"CELL epoch \d+/{EPOCHS} rank={m[1]} ", text)))
    return found


def table(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The matrix as Markdown: one row per inventory and shared folder mode, one column per
    launcher; a cell is its result and seconds, or why it cannot run here ("-": not a cell of that row)."""
    got = {(r["launcher"], r["mode"], r["inventory"]): r for r in rows}
    out = ["| inventory | shared folder | " + " | ".join(TABLE_COLUMNS) + " |", "|---|---|" + "---|" * len(TABLE_COLUMNS)]
    for kind in INVENTORIES:
        modes, columns = ROWS[kind]
        for mode in modes:
            cells = []
            for launcher in TABLE_COLUMNS:
                r = got.get((launcher, mode, kind))
                if launcher not in columns or mode not in COLUMN_MODES.get(launcher, modes):
                    cells.append("-")
                elif mode in NOT_RUNNABLE:
                    cells.append("not runnable here (1)")
                elif r is None:
                    cells.append("NOT RUN")
                else:
                    cells.append(f"passed {r['seconds']:.0f}s" if r["status"] == "passed" else "FAILED")
            out.append(f"| {kind} | {mode} | " + " | ".join(cells) + " |")
    out.append("")
    out += [f"({i}) {mode}: {why}" for i, (mode, why) in enumerate(NOT_RUNNABLE.items(), 1)]
    out += [f"{kind}: {what}" for kind, what in INVENTORIES.items()]
    out += [f"FAILED {r['launcher']} / {r['mode']} / {r['inventory']}: {r['status']}"
            for r in got.values() if r["status"] != "passed"]
    return out


def read_rows(folder: Path, kind: str = "matrix") -> list[dict[str, Any]]:
    """The rows every pytest run wrote: the cells ("matrix") or the timed steps ("steps")."""
    rows: list[dict[str, Any]] = []
    for f in sorted(folder.glob(f"{kind}-*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows
