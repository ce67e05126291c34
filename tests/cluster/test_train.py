"""`distrun train` on the provisioned 3-node cluster: the user's own script, every launcher."""

from __future__ import annotations

import json
import re
import shutil
import signal
import textwrap
import threading
import time
from pathlib import Path

import yaml

from . import jittor_nodes
from .conftest import REPO, distrun, rank_headers, run_processes, start_distrun

MPI_SCRIPT = textwrap.dedent("""
    import os, socket, sys
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.Get_rank() + 1)
    print(f"SCRIPT rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} "
          f"mpi_rank={comm.Get_rank()} host={socket.gethostname()} sum={total} args={sys.argv[1:]}", flush=True)
    if comm.Get_rank() == 0:
        print("DISTRUN_RESULT " + '{"test_acc": %.4f, "ranks": %d}' % (total / 6, comm.Get_size()), flush=True)
    fail_rank = os.environ.get("FAIL_RANK")
    if fail_rank is not None and int(fail_rank) == comm.Get_rank():
        sys.exit(3)
    if os.environ.get("SLEEP"):
        import time
        time.sleep(float(os.environ["SLEEP"]))
""")

TORCH_SCRIPT = textwrap.dedent("""
    import os, socket
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"SCRIPT rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} local={os.environ['LOCAL_RANK']} "
          f"host={socket.gethostname()} sum={int(t.item())} gloo_if={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")

LINE = re.compile(r"SCRIPT rank=(\d+) world=(\d+) \S+ host=(\S+) sum=(\d+)")


def _latest_run(home: Path) -> Path:
    runs = sorted((home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)
    assert runs, "no train run recorded"
    return runs[-1]


def _rank_lines(run: Path) -> dict[int, tuple[int, str, int]]:
    """Rank -> (world, host, sum) read from the collected per-rank logs."""
    found: dict[int, tuple[int, str, int]] = {}
    for f in (run / "nodes").rglob("*"):
        if f.is_file() and f.name in ("stdout", "stdout.log"):
            for m in LINE.finditer(f.read_text(errors="replace")):
                found[int(m[1])] = (int(m[2]), m[3], int(m[4]))
    return found


def test_user_script_runs_on_every_rank_with_the_right_rank_and_world_size(provisioned, distrun_home, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(MPI_SCRIPT)
    # --json, as a script runs it: one JSON object on stdout when the run ends, progress on stderr.
    result = distrun("train", "--inventory", "test", "--script", str(script), "--json", "--", "--lr", "0.1")
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    lines = _rank_lines(run)
    assert sorted(lines) == [0, 1, 2], f"per-rank logs found: {lines}"
    assert {w for w, _, _ in lines.values()} == {3}
    assert {s for _, _, s in lines.values()} == {6}
    assert {h for _, h, _ in lines.values()} == {"node1", "node2", "node3"}
    assert "--lr" in result.stderr and "0.1" in result.stderr
    out = json.loads(result.stdout)  # the whole of stdout
    assert out["run_id"] == run.name and out["status"] == "succeeded" and out["exit_code"] == 0 and out["error"] is None
    assert out["result"] == {"test_acc": 1.0, "ranks": 3}
    assert out["plan"]["world_size"] == 3 and sorted(out["logs"]["ranks"]) == ["0", "1", "2"]
    assert out["commands"]["launch"]["node1"][0].endswith("/mpirun")
    assert out == json.loads(distrun("show", run.name, "--json").stdout) | {"exit_code": 0, "error": None}
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "succeeded" and meta["rc"] == 0
    assert (run / "plan.json").is_file() and (run / "commands.txt").is_file()
    assert not run_processes(provisioned, run.name)


def test_a_failing_rank_fails_the_run_and_leaves_nothing_running(provisioned, distrun_home, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(MPI_SCRIPT)
    # The other ranks would sleep 10 minutes: the run ends only if they are stopped.
    result = distrun("train", "--inventory", "test", "--script", str(script), "--env", "FAIL_RANK=1", "--env", "SLEEP=600",
                     timeout=300)
    assert result.rc == 1
    assert "first failing rank 1 on node2" in result.stdout.replace("\n", " "), result.stdout[-3000:]
    run = _latest_run(distrun_home)
    assert json.loads((run / "meta.json").read_text())["status"] == "failed"
    # Every rank's log is kept, the failed one included.
    assert sorted(_rank_lines(run)) == [0, 1, 2]
    assert not run_processes(provisioned, run.name)


def _signal_a_sleeping_run(tmp_path: Path, seen: str, sig: int, within_s: float, poll_s: float,
                           end_s: float) -> tuple[int, str]:
    """Start `distrun train` of a job whose ranks sleep 10 minutes, send it ``sig`` once ``seen`` is in
    its output (within ``within_s``); its exit status (within ``end_s`` of the signal) and output."""
    script = tmp_path / "sleeps.py"
    script.write_text(MPI_SCRIPT)
    log = tmp_path / "cli.log"
    with log.open("w") as out:
        proc = start_distrun("train", "--inventory", "test", "--script", str(script), "--env", "SLEEP=600", log=out)
        try:
            deadline = time.monotonic() + within_s
            while seen not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(poll_s)
            assert seen in log.read_text(), log.read_text()[-3000:]
            proc.send_signal(sig)
            rc = proc.wait(timeout=end_s)
        finally:
            if proc.poll() is None:
                proc.kill()
    return rc, log.read_text()


def test_ctrl_c_while_the_run_starts_ends_it_as_interrupted(provisioned, distrun_home, tmp_path):
    """SIGINT while run.yml checks and stages the nodes: exit 130 'interrupted', whatever had
    started is stopped, and no step is blamed for it (no 'staging failed', no refused collect)."""
    rc, text = _signal_a_sleeping_run(tmp_path, "Probe env", signal.SIGINT, within_s=120, poll_s=0.02, end_s=120)
    assert rc == 130, text[-3000:]
    assert "interrupted" in text and "staging failed" not in text and "refused" not in text, text[-3000:]
    run = _latest_run(distrun_home)
    meta = json.loads((run / "meta.json").read_text())
    assert (meta["status"], meta["rc"]) == ("stopped", 130), meta
    assert not run_processes(provisioned, run.name)


def test_sigterm_while_the_run_is_followed_ends_it_as_ctrl_c_does(provisioned, distrun_home, tmp_path):
    """SIGTERM ('timeout 1200 distrun train ...') once every rank runs: every rank is stopped on
    every node, the logs are collected, the record says stopped, and distrun exits 143."""
    rc, text = _signal_a_sleeping_run(tmp_path, "SCRIPT rank=2", signal.SIGTERM, within_s=240, poll_s=0.1, end_s=180)
    assert rc == 143, text[-3000:]
    assert "stopping every rank on every node" in text, text[-3000:]
    run = _latest_run(distrun_home)
    meta = json.loads((run / "meta.json").read_text())
    assert (meta["status"], meta["rc"]) == ("stopped", 143), meta
    assert sorted(_rank_lines(run)) == [0, 1, 2]  # every rank's log came home
    assert not run_processes(provisioned, run.name)


def test_logs_follow_reads_a_running_ranks_output_live_from_its_node(provisioned, distrun_home, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(MPI_SCRIPT)
    box: dict = {}

    def train() -> None:
        box["train"] = distrun("train", "--inventory", "test", "--script", str(script), "--env", "SLEEP=10", timeout=300)

    before = set((distrun_home / "runs").glob("*-train-*"))
    worker = threading.Thread(target=train)
    worker.start()
    try:
        deadline = time.monotonic() + 240
        run = None
        while time.monotonic() < deadline:
            runs = sorted(set((distrun_home / "runs").glob("*-train-*")) - before, key=lambda p: p.stat().st_mtime)
            log = runs[-1] / "launcher.log" if runs else None
            if log and log.is_file() and "SCRIPT rank=2" in log.read_text(errors="replace"):
                run = runs[-1]
                break
            time.sleep(0.3)
        assert run is not None, "the job never started on every rank"
        assert not (run / "nodes").exists() or not list((run / "nodes").rglob("stdout")), "collected before the end"
        logs = distrun("logs", run.name, "--rank", "2", "--follow", timeout=120)
        assert logs.rc == 0, logs.stderr
        # Rank 2 runs on node3: its own output, read from node3 while the run was going.
        assert re.search(r"SCRIPT rank=2 world=3 \S+ host=node3", logs.stdout), logs.stdout
        # --follow returns when the run is over, not before.
        assert json.loads((run / "meta.json").read_text())["status"] != "running"
    finally:
        worker.join(timeout=300)
    assert box["train"].rc == 0, box["train"].stdout[-3000:]


def test_torchrun_launcher_gives_each_node_its_ranks(provisioned, distrun_home, tmp_path):
    script = tmp_path / "torch_allreduce.py"
    script.write_text(TORCH_SCRIPT)
    result = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(script))
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    lines = _rank_lines(run)
    assert sorted(lines) == [0, 1, 2], lines
    assert {s for _, _, s in lines.values()} == {6}
    assert {h for _, h, _ in lines.values()} == {"node1", "node2", "node3"}


def test_jittor_gcn_trains_over_all_three_nodes(provisioned, distrun_home):
    """The reference job of the seed pages: Metis partition into 3 parts, 3 MPI ranks of the
    Jittor GCN, one per node. Jittor is compiled once for the node image (on node1, minutes when
    cold) and given to every node (tests/cluster/jittor_nodes.py); distrun's own warm-up still runs."""
    print(f"Jittor on the nodes: {jittor_nodes.wait(provisioned)}", flush=True)
    result = distrun("train", "--inventory", "test", "--workload", "gcn", "--epochs", "30", timeout=2400)
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    logs = _rank_headers(run)
    assert sorted(logs) == [0, 1, 2], f"per-rank logs: {logs}"
    assert set(logs.values()) == {"node1", "node2", "node3"}
    outcome = json.loads((run / "result.json").read_text())
    assert outcome["ranks"] == 3 and outcome["epochs"] == 30
    # The synthetic graph has clear communities: a working 3-part GCN separates them.
    assert outcome["test_acc"] > 0.8, outcome
    plan = json.loads((run / "plan.json").read_text())
    assert plan["partition"] and "--num-parts" in plan["partition"] and plan["partition"][-3] == "3"
    # Sync mode: the head holds every part; each other node pulled only its own rank's part.
    for k in (1, 2, 3):
        names = provisioned.exec(k, f"ls {plan['partition_dir']}").stdout.split()
        parts = sorted(n for n in names if n.startswith("part-"))
        assert "manifest.json" in names and parts == (["part-0.npz", "part-1.npz", "part-2.npz"] if k == 1
                                                       else [f"part-{k - 1}.npz"]), (k, names)
    assert not run_processes(provisioned, run.name)
    kept = jittor_nodes.keep_richer(provisioned)
    print(f"Jittor: node1's build after the run {'is now kept' if kept else 'adds nothing to the kept one'}", flush=True)


def test_torchrun_ddp_workload_trains_over_all_three_nodes(provisioned, distrun_home):
    result = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--workload", "ddp", "--epochs", "30")
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    logs = _rank_headers(run)
    assert sorted(logs) == [0, 1, 2] and set(logs.values()) == {"node1", "node2", "node3"}, logs
    outcome = json.loads((run / "result.json").read_text())
    assert outcome["ranks"] == 3 and outcome["test_acc"] > 0.8, outcome


def test_torch_partitioned_gcn_on_the_gdc_diffusion_over_all_three_nodes(provisioned, distrun_home):
    """The torch partitioned workload under mpirun, its partition made of the GDC diffusion on the
    head: the runner passes --use-gdc to the partitioner and the trainer alike."""
    result = distrun("train", "--inventory", "test", "--workload", "gcn-torch", "--use-gdc", "--gdc-topk", "32",
                     "--epochs", "30")
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    logs = _rank_headers(run)
    assert sorted(logs) == [0, 1, 2] and set(logs.values()) == {"node1", "node2", "node3"}, logs
    outcome = json.loads((run / "result.json").read_text())
    assert outcome["ranks"] == 3 and outcome["propagation"] == "gdc" and outcome["test_acc"] > 0.8, outcome
    assert all(p["halo_bytes"] > 0 for p in outcome["ranks_profile"])
    plan = json.loads((run / "plan.json").read_text())
    assert plan["partition_dir"].endswith("-3parts-gdc") and "--use-gdc" in plan["partition"]


def test_torchrun_numbers_its_ranks_by_address_and_each_node_pulls_that_ranks_part(provisioned, distrun_home, tmp_path):
    """With node3 as the head the plan lists node3, node1, node2; torchrun's rendezvous numbers
    its agents by address (.11, .12, .13), so rank 0 runs on node1. In sync mode each node pulls
    only the part its own rank reads: a wrong guess at the order would fail the run."""
    inv = tmp_path / "head-node3"
    shutil.copytree(REPO / "inventory" / "test" / "group_vars", inv / "group_vars")
    hosts = yaml.safe_load(provisioned.inventory.read_text())
    # The user CA stays where setup made it (node1, the setup's head): it signs the run's certificate.
    hosts["all"]["children"]["head"]["hosts"] = {"node3": {"ssh_mesh_key_host": "node1"}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    result = distrun("train", "--inventory", str(inv), "--launcher", "torchrun", "--workload", "gcn-torch",
                     "--epochs", "5", timeout=900)
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    plan = json.loads((run / "plan.json").read_text())
    assert [h["name"] for h in plan["hosts"]] == ["node3", "node1", "node2"]
    assert _rank_headers(run) == {0: "node1", 1: "node2", 2: "node3"}
    for k in (1, 2, 3):
        names = provisioned.exec(k, f"ls {plan['partition_dir']}").stdout.split()
        parts = sorted(n for n in names if n.startswith("part-"))
        assert "manifest.json" in names and parts == (["part-0.npz", "part-1.npz", "part-2.npz"] if k == 3
                                                       else [f"part-{k - 1}.npz"]), (k, names)


def _rank_headers(run: Path) -> dict[int, str]:
    """Rank -> host (its inventory name)."""
    return {rank: host for rank, (_, host, _) in rank_headers(run).items()}


def test_a_plan_made_from_stale_facts_is_made_again_before_anything_is_staged(provisioned, distrun_home, tmp_path):
    """distrun plans from cached facts; the preflight play checks the planned interface still
    carries its address. Here node2's cached facts name an interface it does not have."""
    caches = list((distrun_home / "facts").glob("test-*/s1_node2"))  # one folder per inventory
    assert len(caches) == 1, caches
    cache = caches[0]
    wrapped = json.loads(cache.read_text())
    facts = json.loads(wrapped["__payload__"])
    iface = facts["ansible_default_ipv4"]["interface"]
    facts["ansible_interfaces"] = [("stale0" if i == iface else i) for i in facts["ansible_interfaces"]]
    facts["ansible_stale0"] = {**facts.pop(f"ansible_{iface}"), "device": "stale0"}
    facts["ansible_default_ipv4"]["interface"] = "stale0"
    cache.write_text(json.dumps({**wrapped, "__payload__": json.dumps(facts)}))

    script = tmp_path / "allreduce.py"
    script.write_text(MPI_SCRIPT)
    result = distrun("train", "--inventory", "test", "--script", str(script))
    assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "planning again" in result.stdout
    plan = json.loads((_latest_run(distrun_home) / "plan.json").read_text())
    assert {h["name"]: h["iface"] for h in plan["hosts"]}["node2"] == iface
