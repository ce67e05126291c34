"""Mistakes a user can make with the trainers: one clear line, non-zero exit, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import free_port, run_workload


def one_clear_line(run, needle: str) -> None:  # noqa: ANN001
    assert run.rc != 0
    ours = [l for l in run.stderr.splitlines() if l.startswith("gcn_")]
    assert len(ours) == 1, run.stderr[-2000:]
    assert needle in ours[0] and "Traceback" not in run.stderr


@pytest.fixture(scope="module")
def parts3(cora_parts) -> Path:  # noqa: ANN001
    return cora_parts(3)


@pytest.mark.jittor
def test_rank_count_differs_from_partition(parts3: Path, work_env):
    r = run_workload("gcn_jittor.py", ["--dataset", "cora", "--part-dir", str(parts3), "--epochs", "1"], work_env, ranks=2)
    one_clear_line(r, "has 3 parts but MPI started 2 ranks")


@pytest.mark.jittor
def test_num_parts_flag_differs_from_ranks(parts3: Path, work_env):
    r = run_workload("gcn_jittor.py", ["--dataset", "cora", "--num_parts", "3", "--part-dir", str(parts3)], work_env, ranks=2)
    one_clear_line(r, "--num-parts 3 but MPI started 2 ranks")


@pytest.mark.jittor
def test_missing_partition_says_what_to_run(tmp_path: Path, work_env):
    r = run_workload("gcn_jittor.py", ["--dataset", "reddit", "--num-parts", "2"], work_env, ranks=2, cwd=tmp_path)
    one_clear_line(r, "run partition.py")
    assert "partitions/reddit-2/manifest.json" in r.stderr


def test_ddp_without_rendezvous_address(cora_raw: Path, work_env):
    r = run_workload("gcn_ddp.py", ["--dataset", "cora", "--data-dir", str(cora_raw)], work_env, ranks=2)
    one_clear_line(r, "MASTER_ADDR is not set")


def test_bad_flag_values(cora_raw: Path, work_env):
    r = run_workload("gcn_ddp.py", ["--dataset", "cora", "--data-dir", str(cora_raw), "--epochs", "0"], work_env)
    one_clear_line(r, "--epochs must be at least 1")
    assert r.rc == 2
    r = run_workload("gcn_ddp.py", ["--dataset", "cora", "--data-dir", str(cora_raw), "--min-epoch-seconds", "-1"], work_env)
    one_clear_line(r, "--min-epoch-seconds -1: give 0 (no pacing) to 3600")
    assert r.rc == 2


@pytest.mark.jittor
def test_tensor_parallel_needs_a_hidden_unit_per_rank(cora_raw: Path, work_env):
    r = run_workload("gcn_tp.py", ["--dataset", "cora", "--data-dir", str(cora_raw), "--hidden", "2"], work_env, ranks=3)
    one_clear_line(r, "--hidden 2 is smaller than the 3 ranks")


def test_gdc_flags_must_match_the_partition(parts3: Path, work_env):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    r = run_workload("gcn_torch.py", ["--dataset", "cora", "--part-dir", str(parts3), "--use-gdc", "--epochs", "1"],
                     work_env, ranks=3, extra_env=env)
    one_clear_line(r, "was partitioned without --use-gdc but the trainer runs with --use-gdc")

