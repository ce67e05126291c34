"""A user's own project on the provisioned 3-node cluster, through the real CLI: --workdir (a
package with two modules, a config file, a data file), --prepare, the rank environment's three
sources, --launcher-args under mpirun and torchrun, --exclude; and 'distrun init' writing an
inventory that 'distrun setup' converges without a change and 'distrun train' runs the default
workload with."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import textwrap
from pathlib import Path

import pytest
import yaml

from . import jittor_nodes
from .conftest import distrun, run_processes

TOKEN = f"tok-{secrets.token_hex(8)}"

TRAIN = textwrap.dedent("""
    import hashlib, json, os, socket, sys
    import torch
    import torch.distributed as dist
    from mypkg import model

    args = sys.argv[1:]
    config = json.load(open(args[args.index("--config") + 1]))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    token = os.environ.get("PROJECT_TOKEN", "")
    sys.stdout.write("PROJECT " + json.dumps({
        "rank": rank, "world": world, "parts_arg": args[args.index("--parts") + 1], "host": socket.gethostname(),
        "cwd": os.getcwd(), "part": open(f"prepared/part-{rank}.txt").read().strip(), "sum": int(total.item()),
        "score": model.score("data/points.csv", config), "version": model.VERSION,
        "token": hashlib.sha256(token.encode()).hexdigest()[:12], "nccl_debug": os.environ.get("NCCL_DEBUG"),
        "omp": os.environ.get("OMP_NUM_THREADS"), "site": os.environ.get("SITE"), "scratch": os.path.exists("scratch"),
        "env_file": os.path.exists(".distrun_env"), "log": os.path.exists("notes.log")}) + "\\n")  # one write
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
""")

MODEL = textwrap.dedent("""
    import os

    VERSION = 1


    def score(path, config):
        rows = [line.split(",") for line in open(path) if line.strip()]
        return sum(int(a) * int(b) for a, b in rows) * int(os.environ[config["scale_from"]])
""")

PREPARE = textwrap.dedent("""
    import os, sys
    parts = int(sys.argv[sys.argv.index("--parts") + 1])
    out = sys.argv[sys.argv.index("--out") + 1]
    os.makedirs(out, exist_ok=True)
    for i in range(parts):
        with open(os.path.join(out, f"part-{i}.txt"), "w") as f:
            f.write(f"part {i} of {parts}\\n")
    print(f"prepared {parts} parts in {os.getcwd()}/{out} token={len(os.environ.get('PROJECT_TOKEN', ''))}", flush=True)
""")

PROJECT = {
    "mypkg/__init__.py": "",
    "mypkg/model.py": MODEL,
    "mypkg/train.py": TRAIN,
    "config.json": json.dumps({"scale_from": "MODEL_SCALE"}),
    "data/points.csv": "1,2\n3,4\n5,6\n",
    "prepare.py": PREPARE,
    ".gitignore": "prepared/\n*.log\n__pycache__/\n",
    ".distrunignore": "scratch/\n",
    "scratch/big.bin": "x" * 4096,
    "notes.log": "ignored by .gitignore",
    ".distrun_env": f"# the project's secrets\nPROJECT_TOKEN={TOKEN}\nMODEL_SCALE=2\nexport OMP_NUM_THREADS=1\n",
}
SENT = {"mypkg/__init__.py", "mypkg/model.py", "mypkg/train.py", "config.json", "data/points.csv", "prepare.py",
        ".gitignore", ".distrunignore"}
COMMAND = ["--", "python", "-m", "mypkg.train", "--config", "config.json", "--parts", "{np}"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    for rel, text in PROJECT.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ".distrun_env").chmod(0o600)
    return root


def _latest_run(home: Path) -> Path:
    return sorted((home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)[-1]


def _ranks(run: Path) -> dict[int, dict]:
    found: dict[int, dict] = {}
    for f in (run / "nodes").rglob("*"):
        if f.is_file() and f.name in ("stdout", "stdout.log"):
            for m in re.finditer(r"^PROJECT (\{.*\})$", f.read_text(errors="replace"), re.M):
                line = json.loads(m.group(1))
                found[line["rank"]] = line
    return found


def _files_with(root: Path, needle: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_text(errors="replace"))


def test_a_project_runs_on_three_nodes_with_its_prepare_step_env_and_launcher_args(provisioned, distrun_home, project):
    result = distrun("train", "--inventory", "test", "--workdir", str(project),
                     "--prepare", "python prepare.py --parts {np} --out prepared",
                     "--launcher-args", "--mca btl_base_verbose 0", "--env", "NCCL_DEBUG=INFO", *COMMAND)
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    record = json.loads((run / "workdir.json").read_text())
    where = record["node_path"]
    # The prepare step ran once, on the head, in the workdir, with the project's env, streamed.
    assert f"  prepare| prepared 3 parts in {where}/prepared token={len(TOKEN)}" in result.stdout
    assert (run / "prepare.log").read_text().startswith("prepared 3 parts")
    assert f"workdir: {len(SENT)} files" in result.stdout
    ranks = _ranks(run)
    assert sorted(ranks) == [0, 1, 2], ranks
    assert {r["host"] for r in ranks.values()} == {"node1", "node2", "node3"}
    token_digest = hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    for rank, r in ranks.items():
        assert (r["world"], r["parts_arg"], r["cwd"], r["sum"], r["version"]) == (3, "3", where, 6, 1), r
        # What --prepare wrote on the head reached every node (sync mode) and is read there.
        assert r["part"] == f"part {rank} of 3"
        # The data file, the config file and MODEL_SCALE from the project's env file: (2 + 12 + 30) * 2.
        assert r["score"] == 88
        # The inventory's distrun_env (SITE), the project's .distrun_env (a secret, OMP_NUM_THREADS),
        # and --env over the inventory's NCCL_DEBUG=WARN.
        assert (r["site"], r["token"], r["omp"], r["nccl_debug"]) == ("test-cluster", token_digest, "1", "INFO")
        assert not r["scratch"] and not r["env_file"] and not r["log"], r  # ignored files never sent
    # rsync's report: every project file to the head, then each other node pulled the head's copy.
    assert sorted(record["push"]["changed"]) == sorted(SENT) and record["push"]["files_transferred"] == len(SENT)
    assert set(record["pulls"]) == {"node2", "node3"}
    for pull in record["pulls"].values():
        assert set(pull["changed"]) == SENT | {f"prepared/part-{i}.txt" for i in range(3)}
    mpirun = next(ln for ln in (run / "commands.txt").read_text().splitlines() if "/bin/mpirun " in ln)
    assert "--mca btl_base_verbose 0 " in mpirun and mpirun.endswith(
        "python -m mypkg.train --config config.json --parts 3 > launcher-node1.log 2>&1 < /dev/null")
    # The secret is only ever in env.sh: the controller's 0600 copy and the nodes' (collected before it was removed).
    assert {Path(f).name for f in _files_with(run, TOKEN)} == {"env.sh"}
    listing = provisioned.exec(2, f"stat -c '%U %a' {where}; ls -A {where}").stdout.split()
    # The training user's; others may not read the project.
    assert listing[0] == "distrun" and listing[1].endswith("0"), listing
    # The run has ended: its env file (the secret) has left the node.
    kept = provisioned.exec(2, f"test -e /srv/distrun/runs/{run.name}/env.sh", check=False).returncode == 0
    assert not kept, f"the ended run's env.sh stays on node2: /srv/distrun/runs/{run.name}/env.sh"
    assert ".distrun_env" not in listing and "scratch" not in listing and "notes.log" not in listing
    assert not run_processes(provisioned, run.name)


def test_one_changed_file_is_all_a_second_run_sends_and_exclude_leaves_a_node_out(provisioned, distrun_home, project):
    """torchrun this time, with its own extra argument, on node1 and node2 only."""
    model = project / "mypkg" / "model.py"
    model.write_text(model.read_text().replace("VERSION = 1", "VERSION = 2"))
    result = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--exclude", "node3",
                     "--workdir", str(project), "--launcher-args", "--rdzv-conf join_timeout=120", *COMMAND)
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    ranks = _ranks(run)
    assert sorted(ranks) == [0, 1] and {r["host"] for r in ranks.values()} == {"node1", "node2"}, ranks
    assert {(r["world"], r["parts_arg"], r["version"], r["sum"]) for r in ranks.values()} == {(2, "2", 2, 3)}
    record = json.loads((run / "workdir.json").read_text())
    assert record["push"]["changed"] == ["mypkg/model.py"] and record["push"]["files_transferred"] == 1, record
    assert list(record["pulls"]) == ["node2"], record  # node3 is not part of this run
    assert record["pulls"]["node2"]["changed"] == ["mypkg/model.py"], record
    assert (run / "nodes" / "node1" / "hostfile").read_text().splitlines()[1:] == ["node1 slots=1", "node2 slots=1"]
    commands = (run / "commands.txt").read_text()
    torchrun = [ln for ln in commands.splitlines() if "/bin/torchrun " in ln]
    assert len(torchrun) == 2 and all("--tee=3 --rdzv-conf join_timeout=120 --no-python " in ln for ln in torchrun)


def test_a_failing_prepare_step_refuses_the_launch_with_one_line(provisioned, distrun_home, project):
    result = distrun("train", "--inventory", "test", "--workdir", str(project), "--prepare",
                     "python -c \"import sys; print('no dataset here'); sys.exit(3)\"", *COMMAND)
    assert result.rc == 4, result.stdout[-3000:] + result.stderr[-2000:]
    assert "  prepare| no dataset here" in result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and " exited 3 on node1: nothing was launched (its output: " in lines[0], lines
    run = _latest_run(distrun_home)
    assert json.loads((run / "meta.json").read_text())["status"] == "failed"
    assert not (run / "launcher.log").exists()
    assert provisioned.exec(1, f"ls /srv/distrun/runs/{run.name}").stdout.split() == []


def _changed_tasks(setup_output: str) -> set[str]:
    """The tasks that reported a change, from setup's per-task lines ('[  1.2s] Task' then 'changed: host')."""
    changed: set[str] = set()
    task = ""
    for line in setup_output.splitlines():
        m = re.match(r"\[\s*[\d.]+s\] (.+)$", line.strip())
        if m:
            task = m[1]
        elif line.strip().startswith("changed:") and task:
            changed.add(task)
    return changed


# A 2-node inventory renames the cluster for the nodes it names (their /etc/hosts block, the
# hostfile): the other cluster tests' 3-node inventory no longer matches, so this runs last.
@pytest.mark.phase(3)
def test_init_writes_a_two_node_inventory_that_setup_converges_and_train_runs(provisioned, distrun_home, tmp_path):
    """Two of the provisioned nodes, described afresh by 'distrun init': its group_vars describe
    this cluster's setup exactly (setup changes only the list of nodes: /etc/hosts and the
    hostfile), and the default workload runs on the 2 nodes."""
    node1, node2 = provisioned.nodes[0], provisioned.nodes[1]
    init = distrun("init", "lab", "--head", f"node1={node1.ip}", "--workers", f"node1={node1.ip},node2={node2.ip}",
                   "--user", "root", "--dir", str(tmp_path))
    assert init.rc == 0, init.stderr
    inventory = tmp_path / "lab"
    assert f"distrun setup --inventory {inventory}" in init.stdout
    # What a user keeps in ~/.ssh/config (the key, the trusted host keys) is this controller's
    # harness's: added as the connection's settings, nothing else changed.
    harness = yaml.safe_load(provisioned.inventory.read_text())["all"]["vars"]
    with (inventory / "group_vars" / "all.yml").open("a") as f:
        f.write("\n# This controller's ssh settings for these nodes.\n" + yaml.safe_dump(
            {k: harness[k] for k in ("ansible_ssh_private_key_file", "ansible_ssh_common_args", "ansible_host_key_checking")}))
    setup = distrun("setup", "--inventory", str(inventory))
    assert setup.rc == 0, setup.stdout[-4000:]
    assert setup.recap()["hosts"] == 2, setup.stdout[-3000:]
    # Sync mode copies whatever the earlier tests left in the shared folder: content, not setup.
    # Root's node key is certified for the nodes of the list by name.
    node_list = ("/etc/hosts", "hostfile", "Copy the shared folder", "Certify root's node key for the nodes")
    unexpected = {t for t in _changed_tasks(setup.stdout) if not any(word in t for word in node_list)}
    assert not unexpected, f"setup changed more than the node list: {sorted(unexpected)}\n" + setup.stdout[-6000:]
    print(f"Jittor on the nodes: {jittor_nodes.wait(provisioned)}", flush=True)
    train = distrun("train", "--inventory", str(inventory), "--epochs", "3", timeout=1800)
    assert train.rc == 0, train.stdout[-4000:] + train.stderr[-2000:]
    outcome = json.loads((_latest_run(distrun_home) / "result.json").read_text())
    assert outcome["ranks"] == 2 and outcome["epochs"] == 3, outcome
