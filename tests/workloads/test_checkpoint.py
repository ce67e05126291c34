"""Checkpoints of the reference workloads: a run resumed from a checkpoint ends exactly where
the uninterrupted run ends (same world size: the same sums in the same order)."""

from __future__ import annotations

from conftest import free_port, run_workload

SMALL = ["--dataset", "synthetic", "--syn-nodes", "300", "--syn-edges", "2400", "--epochs", "6", "--seed", "1"]


def test_ddp_resumed_from_its_newest_checkpoint_ends_exactly_as_the_uninterrupted_run(tmp_path, work_env):
    folder = tmp_path / "checkpoints"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "DISTRUN_CHECKPOINT_DIR": str(folder)}
    whole = run_workload("gcn_ddp.py", [*SMALL, "--checkpoint-every", "2"], work_env, ranks=2, extra_env=env)
    assert whole.rc == 0, whole.stderr[-2000:]
    # Rank 0 saved after epochs 2 and 4 into $DISTRUN_CHECKPOINT_DIR; not after the last.
    assert sorted(p.name for p in folder.iterdir()) == ["epoch-000002.ckpt", "epoch-000004.ckpt"]

    # A restart finds the newest checkpoint in the same folder and goes on from it.
    env["MASTER_PORT"] = str(free_port())
    again = run_workload("gcn_ddp.py", SMALL, work_env, ranks=2, extra_env={**env, "DISTRUN_RESTART": "1"})
    assert again.rc == 0, again.stderr[-2000:]
    assert "resumed from epoch 4" in again.stdout
    assert again.lines("DISTRUN_RESUMED") == [{"checkpoint": str(folder / "epoch-000004.ckpt"), "epoch": 4, "restart": "1"}]
    assert [e["epoch"] for e in again.lines("DISTRUN_EPOCH")] == [5, 6]
    # Exactly, not approximately: model, optimizer and the dropout generator were restored.
    assert [e["loss"] for e in again.lines("DISTRUN_EPOCH")] == [e["loss"] for e in whole.lines("DISTRUN_EPOCH")][4:]
    assert again.result["loss"] == whole.result["loss"]


def test_a_paced_run_lasts_at_least_its_pace_and_computes_the_same(work_env):
    """--min-epoch-seconds stretches a small run for failure drills without changing a number."""
    plain = run_workload("gcn_ddp.py", SMALL, work_env)
    paced = run_workload("gcn_ddp.py", [*SMALL, "--min-epoch-seconds", "0.25"], work_env)
    assert plain.rc == 0 and paced.rc == 0, plain.stderr[-2000:] + paced.stderr[-2000:]
    assert paced.result["wall_s"] >= 6 * 0.25, paced.result
    assert [e["loss"] for e in paced.lines("DISTRUN_EPOCH")] == [e["loss"] for e in plain.lines("DISTRUN_EPOCH")]
    assert paced.result["loss"] == plain.result["loss"]
