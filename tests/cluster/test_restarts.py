"""A node lost mid-run with --max-restarts 1 --exclude-failed: the run restarts on the two nodes
left, resumes from its last checkpoint, and ends exactly where a run resumed from the same
checkpoint ends (exactness, not timing). It kills a node, so it runs after the tests that need
every node (phase 1) and brings the node back.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time

import pytest

from tests.harness import matrix

from .conftest import REPO, bring_back, distrun, run_processes

pytestmark = pytest.mark.phase(1)

# The reference DDP workload on a small synthetic graph under torchrun. An epoch takes tens of
# ms; paced to 0.3 s, the run goes on for 7.5 s after its first checkpoint, time enough to see it
# and stop a node on a loaded machine (podman commands wait on each other's locks while
# molecule's containers run). Pacing changes no result: the uninterrupted reference run is not paced.
EPOCHS = 30
TRAIN = ["--inventory", "test", "--launcher", "torchrun", "--workload", "ddp", "--epochs", str(EPOCHS)]
WORKLOAD = ["--syn-nodes", "1000", "--syn-edges", "8000", "--checkpoint-every", "5"]
PACED = ["--min-epoch-seconds", "0.3"]
RESUMED = re.compile(r"resumed from epoch (\d+) \(checkpoint (\S+)\)")


def test_a_lost_node_restarts_the_run_without_it_and_it_resumes_exactly(provisioned, distrun_home):
    before = set((distrun_home / "runs").glob("*-train-*"))
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", distrun(
        "train", *TRAIN, "--max-restarts", "1", "--exclude-failed", "--", *WORKLOAD, *PACED, timeout=1200)))
    worker.start()
    try:
        started = time.monotonic()
        deadline = started + 600
        run = None
        while time.monotonic() < deadline and worker.is_alive():
            new = sorted(set((distrun_home / "runs").glob("*-train-*")) - before)
            if new:
                run = new[-1]
                # Over ssh, not podman exec: podman's lock may be held by another test's containers.
                ls = provisioned.ssh(1, f"ls /srv/distrun/checkpoints/{run.name} 2>/dev/null; true").stdout
                if "epoch-" in ls:
                    break
            time.sleep(0.3)
        else:
            raise AssertionError(f"no checkpoint was written: {box.get('r')}")
        assert run is not None
        print(f"node3 stopped {time.monotonic() - started:.1f} s into the run", flush=True)
        provisioned.kill_node(3)
        worker.join(timeout=900)
        assert not worker.is_alive(), "the restarted run did not end"
        result = box["r"]
        assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert "restart 1 of 1 on node1, node2" in result.stderr.replace("\n", " "), result.stderr[-2000:]

        meta = json.loads((run / "meta.json").read_text())
        assert meta["status"] == "succeeded" and meta["restarts"] == 1, meta
        plan = json.loads((run / "plan.json").read_text())  # the last attempt's
        assert [h["name"] for h in plan["hosts"]] == ["node1", "node2"] and plan["world_size"] == 2
        assert ["DISTRUN_RESTART", "1"] in plan["env"]
        log = (run / "launcher.log").read_text(errors="replace")
        after_restart = log.split("DISTRUN_RESTART 1", 1)[1]
        found = RESUMED.search(after_restart)
        assert found, after_restart[-3000:]
        epoch, checkpoint = int(found[1]), found[2]
        print(f"the restarted run resumed from epoch {epoch} ({checkpoint})", flush=True)
        assert epoch >= 5 and checkpoint == f"/srv/distrun/checkpoints/{run.name}/epoch-{epoch:06d}.ckpt"
        restarted = json.loads((run / "result.json").read_text())
        assert restarted["ranks"] == 2 and restarted["epochs"] == EPOCHS
        assert not run_processes(provisioned, run.name, (1, 2))
    finally:
        worker.join(timeout=900)
        bring_back(provisioned, 3)

    # The same two nodes, uninterrupted, from the same checkpoint: the same final loss, exactly.
    reference = distrun("train", *TRAIN, "--np", "2", "--", *WORKLOAD, "--resume-from", checkpoint, timeout=900)
    assert reference.rc == 0, reference.stdout[-4000:] + reference.stderr[-2000:]
    assert f"resumed from epoch {epoch}" in reference.stdout
    ref_run = sorted((distrun_home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)[-1]
    uninterrupted = json.loads((ref_run / "result.json").read_text())
    assert uninterrupted["ranks"] == 2
    assert restarted["loss"] == uninterrupted["loss"], (restarted, uninterrupted)
    assert restarted["test_acc"] == uninterrupted["test_acc"]


# A user's own fault-tolerant DDP program (--workdir): gloo, a DistributedSampler, a snapshot
# rank 0 writes every few epochs and every rank resumes from. Paced, like the workload above, so
# a node can be stopped while it runs.
SNAPSHOT_TRAIN = textwrap.dedent("""
    import glob, os, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    EPOCHS = 40
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    folder = os.environ["DISTRUN_CHECKPOINT_DIR"]
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    snaps = sorted(glob.glob(os.path.join(folder, "snap-*.pt")))
    if snaps:
        state = torch.load(snaps[-1])
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"]
        print(f"SNAPSHOT resumed at epoch {start} restart={os.environ.get('DISTRUN_RESTART')}", flush=True)
    sampler = DistributedSampler(data, shuffle=False)
    for epoch in range(start, EPOCHS):
        t0 = time.monotonic()
        sampler.set_epoch(epoch)
        for xb, yb in DataLoader(data, batch_size=32, sampler=sampler):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
        if rank == 0 and (epoch + 1) % 5 == 0:
            tmp = os.path.join(folder, "snap.tmp")
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1}, tmp)
            os.replace(tmp, os.path.join(folder, f"snap-{epoch + 1:04d}.pt"))
        time.sleep(max(0.0, 0.3 - (time.monotonic() - t0)))
    print(f"SNAPSHOT done epochs={EPOCHS}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def sshfs_inventory(provisioned, tmp_path_factory):
    """The cluster's shared folder over sshfs (every node writes into one run directory) for the
    module's sshfs tests; back to sync after them."""
    inventories = matrix.inventories_by_mode("test", provisioned.inventory, REPO / "inventory" / "test" / "group_vars",
                                             tmp_path_factory.mktemp, "restarts")
    with matrix.ModeSwitch(distrun, inventories, "sync", "A") as switch:
        yield switch.to("sshfs")


def test_a_lost_node_on_a_shared_folder_restarts_a_workdir_program_from_its_snapshot(provisioned, distrun_home,
                                                                                      sshfs_inventory, tmp_path):
    """One run directory for every node: the failed attempt's launchers, still shutting down as
    the restart begins, must not write into the next attempt's files, and their logs are kept."""
    (tmp_path / "train.py").write_text(SNAPSHOT_TRAIN)
    before = set((distrun_home / "runs").glob("*-train-*"))
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", distrun(
        "train", "--inventory", sshfs_inventory, "--launcher", "torchrun", "--workdir", str(tmp_path),
        "--max-restarts", "1", "--exclude-failed", "--", "python", "train.py", timeout=1200)))
    worker.start()
    try:
        deadline = time.monotonic() + 600
        run = None
        while time.monotonic() < deadline and worker.is_alive():
            new = sorted(set((distrun_home / "runs").glob("*-train-*")) - before)
            if new:
                run = new[-1]
                ls = provisioned.ssh(1, f"ls /srv/distrun/checkpoints/{run.name} 2>/dev/null; true").stdout
                if "snap-" in ls:
                    break
            time.sleep(0.3)
        else:
            raise AssertionError(f"no snapshot was written: {box.get('r')}")
        assert run is not None
        provisioned.kill_node(3)
        worker.join(timeout=900)
        assert not worker.is_alive(), "the restarted run did not end"
        result = box["r"]
        assert result.rc == 0, result.stdout[-4000:] + result.stderr[-3000:]
        assert "restart 1 of 1 on node1, node2" in result.stderr.replace("\n", " "), result.stderr[-2000:]
        log = (run / "launcher.log").read_text(errors="replace")
        after = log.split("DISTRUN_RESTART 1", 1)[1]
        resumed = re.search(r"SNAPSHOT resumed at epoch (\d+) restart=1", after)
        assert resumed and int(resumed[1]) >= 5, after[-3000:]
        assert "SNAPSHOT done epochs=40" in after
        # The failed attempt's launcher logs came home, from its own folder attempts/0/.
        kept = {p.name for p in (run / "nodes").rglob("attempts/0/launcher-*.log") if p.stat().st_size}
        assert {"launcher-node1.log", "launcher-node2.log"} <= kept, sorted(kept)
        assert not run_processes(provisioned, run.name, (1, 2))
    finally:
        worker.join(timeout=900)
        bring_back(provisioned, 3, sshfs_inventory)


# A job that fails once on purpose: rank 0 of the first try exits 3 after a few seconds (every rank
# started: --detach lets the run go) while the others still run, so torchrun's agents restart
# every worker: node1's for its failed rank, the others for the new rendezvous (torch does not
# count those in TORCHELASTIC_RESTART_COUNT). Every rank of the next try must see restart 1, runs
# 10 s (the run outlives --detach's wait) and ends 0; a rank that saw 0 would wait 60 s and fail.
FAILS_ONCE = textwrap.dedent("""
    import os, sys, time
    restart, rank = int(os.environ["DISTRUN_RESTART"]), os.environ["RANK"]
    print(f"ONCE rank={rank} restart={restart} torch={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
    if restart == 0:
        time.sleep(4 if rank == "0" else 60)
        sys.exit(3)
    time.sleep(10)
""")
ONCE = re.compile(r"ONCE rank=(\d+) restart=(\d+) torch=(\d+)")


def test_a_detached_torchrun_run_restarts_by_itself_with_no_follower(provisioned, distrun_home, tmp_path):
    started = time.monotonic()
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    detach = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(script),
                     "--detach", "--max-restarts", "1", timeout=600)
    assert detach.rc == 0, detach.stdout[-3000:] + detach.stderr[-2000:]
    run_id = detach.stdout.strip().splitlines()[-1]
    run = distrun_home / "runs" / run_id
    left = ["not looked for"]
    try:
        assert json.loads((run / "meta.json").read_text())["controller"] is None  # nothing follows it here
        deadline, state = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            status = distrun("status", run_id, "--json", timeout=120)
            assert status.rc == 0, status.stderr
            state = json.loads(status.stdout)
            if state["state"] != "running":
                break
            time.sleep(1)
        ended = time.monotonic() - started
        assert (state["state"], state.get("rc")) == ("succeeded", 0), state
        # The controller comes back: attach brings every node's logs home and ends as the run did.
        attach = distrun("attach", run_id, timeout=300)
        assert attach.rc == 0, attach.stdout[-3000:] + attach.stderr[-2000:]
        logs = distrun("logs", run_id, timeout=120)
        assert "ONCE rank=0 restart=0" in logs.stdout and "ONCE rank=0 restart=1" in logs.stdout, logs.stdout[-3000:]
        # Every node's launcher log (torchrun tees its ranks' lines there; the rank log of a start
        # torch did not count is replaced by the next one's): (rank, DISTRUN_RESTART, torch's count).
        starts = {(int(rank), int(restart), int(count)) for f in (run / "nodes").rglob("*") if f.is_file()
                  for rank, restart, count in ONCE.findall(f.read_text(errors="replace"))}
        seen: dict[int, set[int]] = {}
        for rank, restart, _ in starts:
            seen.setdefault(restart, set()).add(rank)
        assert seen == {0: {0, 1, 2}, 1: {0, 1, 2}}, sorted(starts)  # every rank ran twice, the second time as restart 1
        shown = json.loads(distrun("show", run_id, "--json", timeout=120).stdout)
        # show lists what happened, as the job's rank wrappers reported it: every node's rank
        # started twice in attempt 0, and the run ended on restart 1.
        assert shown["starts"] == {"reported_by": "the job", "attempt": 0, "ended_on_restart": 1, "unreadable_files": 0,
                                   "hosts": {f"node{k}": {"starts": 2, "local_ranks": {"0": 2}} for k in (1, 2, 3)}}, shown
        text = distrun("show", run_id, timeout=120).stdout
        assert ("starts:     node1 2 time(s); node2 2 time(s); node3 2 time(s) (in attempt 0, as the job's rank "
                "wrapper reported them)\nended on:   restart 1 (DISTRUN_RESTART") in text, text
        print(f"\nthe detached torchrun run restarted by itself and ended {ended:.1f} s after train started "
              f"({time.monotonic() - started:.1f} s with attach); (rank, DISTRUN_RESTART, TORCHELASTIC_RESTART_COUNT) "
              f"of every start: {sorted(starts)}; show --json: {json.dumps(shown)[:600]}", flush=True)
        left = run_processes(provisioned, run_id, over_ssh=True)
        assert not left
    finally:
        if left:  # the hosts idle again for the tests after this one
            distrun("stop", run_id, timeout=300)


# A long job whose ranks talk all the time (gloo all-reduce): a rank whose peer went away fails.
TALKS = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    print(f"TALKS rank={dist.get_rank()} restart={os.environ['DISTRUN_RESTART']}", flush=True)
    t, end = torch.ones(1), time.time() + 240
    while time.time() < end:
        dist.all_reduce(t)
        time.sleep(0.2)
""")


def _detach_talking(tmp_path) -> str:
    script = tmp_path / "talks.py"
    script.write_text(TALKS)
    detach = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(script),
                     "--detach", "--max-restarts", "1", timeout=600)
    assert detach.rc == 0, detach.stdout[-3000:] + detach.stderr[-2000:]
    return detach.stdout.strip().splitlines()[-1]


def _status(run_id: str) -> tuple[int, dict]:
    status = distrun("status", run_id, "--json", timeout=120)
    return status.rc, json.loads(status.stdout)


def _stop_unit(provisioned, k: int, run_id: str) -> tuple[int, dict, float]:
    """Root stops the run's unit on node k; status's exit code and answer once the run is no
    longer running (or after 45 s), and the seconds that took."""
    stopped = time.monotonic()
    provisioned.exec(k, f"systemctl stop 'distrun:{run_id}:0:node{k}.service'")
    deadline, (rc, state) = time.monotonic() + 45, (0, {})
    while time.monotonic() < deadline:
        rc, state = _status(run_id)
        if state["state"] != "running":
            break
        time.sleep(1)
    return rc, state, time.monotonic() - stopped


def test_a_detached_run_whose_head_unit_is_stopped_is_lost_with_the_reason(provisioned, distrun_home, tmp_path):
    """Root stops the run's unit on the head (its torchrun agent holds the rendezvous): the run's
    supervision is gone, and status says lost with why, at once, never running for ever."""
    run_id = _detach_talking(tmp_path)
    try:
        rc, state, took = _stop_unit(provisioned, 1, run_id)
        assert (rc, state["state"], state["rc"]) == (0, "lost", None), state
        assert "the launcher on node1 was stopped by signal TERM before the job ended" in state["detail"], state
        assert state["hosts"]["node1"]["launcher"] == "exited" and state["hosts"]["node1"]["rc"] == 143, state
        shown = json.loads(distrun("show", run_id, "--json", timeout=120).stdout)
        assert shown["status"] == "lost" and shown["summary"].startswith("lost: the launcher on node1 was stopped"), shown
        print(f"\nhead unit stopped: status said lost {took:.1f} s later; detail: {state['detail']}; "
              f"hosts: {json.dumps(state['hosts'])}", flush=True)
    finally:
        distrun("stop", run_id, timeout=300)
    assert not run_processes(provisioned, run_id, over_ssh=True)


def test_a_detached_run_whose_worker_unit_is_stopped_is_lost_while_its_head_still_runs(provisioned, distrun_home,
                                                                                        tmp_path):
    """Root stops node2's unit only. torchrun's group needs all three nodes (--nnodes 3) and nothing
    starts node2's agent again: the ranks left wait in their all-reduce for node2's (gloo's timeout
    is 30 min), their agents still run and never restart them. status says lost at once, naming
    node2's stopped launcher and the ones still running, and stop ends those."""
    run_id = _detach_talking(tmp_path)
    try:
        rc, state, took = _stop_unit(provisioned, 2, run_id)
        assert (rc, state["state"], state["rc"]) == (0, "lost", None), state
        assert "the launcher on node2 was stopped by signal TERM before the job ended" in state["detail"], state
        assert f"its launchers on node1, node3 still run: 'distrun stop {run_id}' ends them" in state["detail"], state
        assert [state["hosts"][f"node{k}"]["launcher"] for k in (1, 2, 3)] == ["running", "exited", "running"], state
        # The head's agent did not restart its workers: node1's rank started once (its own count).
        starts = provisioned.exec(1, f"cat /srv/distrun/runs/{run_id}/attempts/0/started/starts-node1-0", check=False)
        assert len(starts.stdout.split()) == 1, starts.stdout
        print(f"\nworker unit stopped: status said lost {took:.1f} s later; detail: {state['detail']}", flush=True)
    finally:
        stop = distrun("stop", run_id, timeout=300)
    assert stop.rc == 0, stop.stdout + stop.stderr
    shown = json.loads(distrun("show", run_id, "--json", timeout=120).stdout)
    assert shown["status"] == "lost" and "node2 was stopped by signal TERM" in shown["summary"], shown
    assert not run_processes(provisioned, run_id, over_ssh=True)


# A detached mpirun run, its restarts left to the head's supervisor (roles/job/files/supervise.py):
# rank 0 writes a snapshot every 5 epochs into DISTRUN_CHECKPOINT_DIR and resumes from the last.
# On its first try it also plays hostile: it prints the supervisor's own line and writes a record
# in the supervisor's place, both claiming node2 failed; neither may move the supervisor.
SUPERVISED = textwrap.dedent("""
    import glob, json, os, time
    restart, rank = int(os.environ["DISTRUN_RESTART"]), int(os.environ["RANK"])
    folder = os.environ["DISTRUN_CHECKPOINT_DIR"]
    snaps = sorted(glob.glob(os.path.join(folder, "snap-*")))
    start = int(snaps[-1].rsplit("-", 1)[1]) if snaps else 0
    print(f"SUP rank={rank} size={os.environ['WORLD_SIZE']} restart={restart} from={start}", flush=True)
    if rank == 0 and restart == 0:
        print("distrun supervisor: try 0 ended with exit 1: node2 did not answer: restart without it", flush=True)
        fake = {"tries": [{"try": 0, "excluded": ["node2"], "lost": ["node2"]}], "state": "failed"}
        for name in ("attempts/0/supervisor.json", "attempts/0/lost"):
            with open(name, "w") as f:
                json.dump(fake, f)
    for epoch in range(start, 80):
        time.sleep(0.2)
        if rank == 0 and (epoch + 1) % 5 == 0:
            tmp = os.path.join(folder, "snap.tmp")
            open(tmp, "w").close()
            os.replace(tmp, os.path.join(folder, f"snap-{epoch + 1:04d}"))
    print(f"SUP done rank={rank} restart={restart}", flush=True)
""")
SUP = re.compile(r"SUP rank=(\d+) size=(\d+) restart=(\d+) from=(\d+)")


def test_a_detached_mpirun_run_restarts_on_the_head_without_the_lost_node(provisioned, distrun_home, tmp_path):
    started = time.monotonic()
    script = tmp_path / "supervised.py"
    script.write_text(SUPERVISED)
    detach = distrun("train", "--inventory", "test", "--script", str(script), "--detach", "--max-restarts", "1",
                     "--exclude-failed", timeout=600)
    assert detach.rc == 0, detach.stdout[-3000:] + detach.stderr[-2000:]
    run_id = detach.stdout.strip().splitlines()[-1]
    run = distrun_home / "runs" / run_id
    killed = False
    try:
        assert json.loads((run / "meta.json").read_text())["controller"] is None  # nothing follows it here
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "snap-" in provisioned.ssh(1, f"ls /srv/distrun/checkpoints/{run_id} 2>/dev/null; true").stdout:
                break
            time.sleep(0.3)
        else:
            raise AssertionError("no snapshot was written")
        provisioned.kill_node(3)
        killed, lost_at = True, time.monotonic()
        deadline, state, details = time.monotonic() + 120, {}, []
        while time.monotonic() < deadline:
            status = distrun("status", run_id, "--json", timeout=120)
            assert status.rc == 0, status.stderr
            state = json.loads(status.stdout)
            details.append((state["state"], state["detail"], len((state.get("supervisor") or {}).get("tries") or [])))
            if state["state"] != "running":
                break
            time.sleep(1)
        ended = time.monotonic() - lost_at
        assert (state["state"], state.get("rc")) == ("succeeded", 0), (state, details)
        # While it ran, status said which try of the supervisor's it was in, and without which node.
        assert any("the supervisor's try 1 (restart 1 of 1) runs on node1, node2; left out: node3" in d
                   for _, d, _ in details), details
    finally:
        if killed:
            bring_back(provisioned, 3)
    attach = distrun("attach", run_id, timeout=300)
    assert attach.rc == 0, attach.stdout[-3000:] + attach.stderr[-2000:]
    shown = json.loads(distrun("show", run_id, "--json", timeout=120).stdout)
    sup = shown["supervisor"]
    assert sup["state"] == "succeeded" and sup["excluded"] == ["node3"], sup
    first, second = sup["tries"]
    assert first["hosts"] == ["node1", "node2", "node3"] and first["excluded"] == ["node3"] and first["rc"] != 0, sup
    assert first["decision"] == "node3 did not answer: restart without it", sup
    assert second["hosts"] == ["node1", "node2"] and (second["restart"], second["rc"]) == (1, 0), sup
    text = distrun("show", run_id, timeout=120).stdout
    assert "try 0:      on node1, node2, node3: exit" in text and "node3 did not answer: restart without it" in text, text
    # The second try resumed from the last snapshot, on the two nodes left (a world of 2).
    seen = {(int(r), int(n), int(k), int(f)) for p in run.rglob("*") if p.is_file()
            for r, n, k, f in SUP.findall(p.read_text(errors="replace"))}
    resumed = [f for r, n, k, f in seen if (r, n, k) == (0, 2, 1)]
    assert resumed and resumed[0] >= 5, sorted(seen)
    print(f"\nthe detached mpirun run lost node3 and ended {ended:.1f} s later on node1, node2 "
          f"({time.monotonic() - started:.1f} s in all); resumed from epoch {resumed[0]}; supervisor: "
          f"{json.dumps(sup)[:700]}", flush=True)
    assert not run_processes(provisioned, run_id, over_ssh=True)


def test_a_supervised_mpirun_run_whose_head_unit_is_stopped_is_lost_with_the_reason(provisioned, distrun_home,
                                                                                     tmp_path):
    """The supervisor itself stopped (root stops the head's unit): no try follows, and status
    says lost with why, as for any launcher a signal ended."""
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(120)\n")
    detach = distrun("train", "--inventory", "test", "--script", str(script), "--detach", "--max-restarts", "1",
                     timeout=600)
    assert detach.rc == 0, detach.stdout[-3000:] + detach.stderr[-2000:]
    run_id = detach.stdout.strip().splitlines()[-1]
    try:
        rc, state, took = _stop_unit(provisioned, 1, run_id)
        assert (rc, state["state"], state["rc"]) == (0, "lost", None), state
        assert "the launcher on node1 was stopped by signal TERM before the job ended" in state["detail"], state
        print(f"\nsupervised head unit stopped: status said lost {took:.1f} s later; detail: {state['detail']}", flush=True)
    finally:
        distrun("stop", run_id, timeout=300)
    assert not run_processes(provisioned, run_id, over_ssh=True)
