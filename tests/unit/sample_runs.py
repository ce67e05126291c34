"""Run records as a real run leaves them (meta, plan, commands, result, timings, logs), with
fixed ids and times: what the golden and JSON tests of `runs` and `show` read."""

from __future__ import annotations

import json
from pathlib import Path

INVENTORY = "/home/alice/clusters/inventories/production-a100-cluster-west"
T0 = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC

TRAIN_OK = "20261118-110640-train-a1b2"
TRAIN_FAILED = "20261118-113740-train-c3d4"
SETUP = "20261118-102000-setup-e5f6"
HOSTS = ("gpu-node-01.west.example.org", "gpu-node-02.west.example.org")


def _write(d: Path, name: str, data: object) -> None:
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2) + "\n")


def _record(runs: Path, run_id: str, verb: str, started: float, status: str, rc: int | None, duration: float | None,
            summary: str) -> Path:
    d = runs / run_id
    d.mkdir(parents=True, mode=0o700)
    _write(d, "meta.json", {"run_id": run_id, "verb": verb, "inventory": INVENTORY, "started": started, "status": status,
                            "rc": rc, "finished": None if duration is None else started + duration, "summary": summary})
    return d


def _train_files(d: Path, run_id: str) -> None:
    run_dir = f"/srv/distrun/runs/{run_id}"
    program = ["/opt/distrun/venv/bin/python", "-m", "mpi4py", "/srv/distrun/workloads/gcn_jittor.py", "--dataset", "cora",
               "--part-dir", "/srv/distrun/partitions/cora-4parts", "--num-parts", "4", "--result-file", f"{run_dir}/result.json"]
    _write(d, "plan.json", {"run_id": run_id, "launcher": "mpirun", "world_size": 4, "shared_dir": "/srv/distrun",
                            "workload": "gcn", "program": program,
                            "hosts": [{"name": h, "address": f"10.0.0.{i}", "slots": 2, "gpus": 2, "iface": "ens5"}
                                      for i, h in enumerate(HOSTS, 11)]})
    launch = ["/usr/bin/mpirun", "-np", "4", "--hostfile", f"{run_dir}/hostfile", "--prefix", "/usr", "--map-by", "slot",
              "--output-filename", f"{run_dir}/ranks", "-x", f"DISTRUN_RUN_ID={run_id}", f"{run_dir}/rank-env.sh", *program]
    partition = ["/opt/distrun/venv/bin/python", "/srv/distrun/workloads/partition.py", "--dataset", "cora",
                 "--num-parts", "4", "--out", "/srv/distrun/partitions/cora-4parts"]
    _write(d, "commands.json", {"partition": partition, "launch": {HOSTS[0]: launch}})
    _write(d, "commands.txt", "# hostfile\n" + "".join(f"{h} slots=2\n" for h in HOSTS))
    _write(d, "timings.json", {"phases": [{"name": "load inventory", "s": 1.2}, {"name": "plan and bundle", "s": 0.03},
                                          {"name": "run.yml (preflight, stage)", "s": 21.4},
                                          {"name": "follow (ranks run)", "s": 95.25}, {"name": "collect", "s": 0.8}],
                               "total_s": 118.68})
    _write(d, "launcher.log", "DISTRUN_RESULT {\"test_acc\": 0.812}\n")
    for rank in range(4):
        host = HOSTS[rank // 2]
        _write(d, f"nodes/{host}/ranks/1/rank.{rank}/stdout",
               f"DISTRUN_RANK rank={rank} local_rank={rank % 2} world_size=4 host={host.split('.')[0]} pid=1{rank}\n")
    (d / "ansible").mkdir()


def make_sample_runs(state: Path) -> dict[str, Path]:
    runs = state / "runs"
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    setup = _record(runs, SETUP, "setup", T0 - 2800, "succeeded", 0, 301.5, "changed=57")
    ok = _record(runs, TRAIN_OK, "train", T0, "succeeded", 0, 118.68, "ok test_acc=0.812")
    _train_files(ok, TRAIN_OK)
    _write(ok, "result.json", {"test_acc": 0.812, "val_acc": 0.79, "final_loss": 0.4123, "epochs": 200,
                               "epoch_time_s": 0.4762, "world_size": 4})
    failed = _record(runs, TRAIN_FAILED, "train", T0 + 1860, "failed", 1, 42.0,
                     f"failed rc=1; first failing rank 3 on {HOSTS[1]} (ModuleNotFoundError: No module named 'torch_geometric')")
    _train_files(failed, TRAIN_FAILED)
    return {"setup": setup, "ok": ok, "failed": failed}
