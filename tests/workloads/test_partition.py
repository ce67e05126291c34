"""The partitioner: a correct partition of a 1M-edge graph, reuse, rebuild, and crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import datasets
import partition
from conftest import PYTHON, WORKLOADS, run_workload

SYN_1M = ["--dataset", "synthetic", "--syn-nodes", "100000", "--syn-edges", "1000000", "--syn-features", "8"]


def load_parts(out: Path) -> tuple[dict, list[dict[str, np.ndarray]]]:
    man = json.loads((out / "manifest.json").read_text())
    parts = []
    for i in range(man["num_parts"]):
        with np.load(out / f"part-{i}.npz", allow_pickle=False) as z:
            parts.append({k: z[k] for k in z.files})
    return man, parts


def test_one_million_edges_into_four_parts_is_a_correct_partition(tmp_path: Path, work_env):
    out = tmp_path / "syn-4"
    r = run_workload("partition.py", [*SYN_1M, "--num-parts", "4", "--out", str(out)], work_env)
    assert r.rc == 0, r.stderr
    g = datasets.make_synthetic(datasets.SyntheticSpec(num_nodes=100000, num_edges=1000000, num_features=8))
    man, parts = load_parts(out)
    assert man["num_parts"] == 4 and man["num_nodes"] == g.num_nodes and man["num_edges"] == g.num_edges
    assert man["dataset_digest"] == g.digest and {"python", "numpy", "pymetis"} <= set(man["tools"])

    # Every node in exactly one part.
    owned = np.concatenate([p["owned_gid"] for p in parts])
    assert owned.size == g.num_nodes and np.array_equal(np.sort(owned), np.arange(g.num_nodes))
    owner = np.empty(g.num_nodes, np.int64)
    for i, p in enumerate(parts):
        owner[p["owned_gid"]] = i
    assert max(man["part_sizes"]) <= 1.05 * g.num_nodes / 4  # Metis keeps parts balanced

    # Edges preserved: the local CSRs, mapped back to global ids, are exactly the graph's edges.
    keys = []
    for p in parts:
        local_to_global = np.concatenate([p["owned_gid"], p["halo_gid"]])
        rows = np.repeat(p["owned_gid"], np.diff(p["indptr"]))
        keys.append(rows * g.num_nodes + local_to_global[p["indices"]])
    keys = np.sort(np.concatenate(keys))
    assert np.array_equal(keys, np.sort(g.src * g.num_nodes + g.dst))
    cut = np.count_nonzero(owner[g.src] != owner[g.dst]) // 2
    assert man["edge_cut"] == cut and 0 < cut < g.num_edges // 4  # Metis beats a random split (3/4)

    full_degree = np.bincount(g.src, minlength=g.num_nodes)
    for i, p in enumerate(parts):
        n_own = p["owned_gid"].size
        # Halos: exactly the remote neighbours, with their true owner and global degree.
        local_to_global = np.concatenate([p["owned_gid"], p["halo_gid"]])
        remote = np.unique(local_to_global[p["indices"]][p["indices"] >= n_own])
        assert np.array_equal(np.sort(p["halo_gid"]), remote)
        assert np.array_equal(p["halo_owner"], owner[p["halo_gid"]]) and not np.any(p["halo_owner"] == i)
        assert np.array_equal(p["degree"], full_degree[local_to_global])
        assert np.array_equal(p["recv_counts"], np.bincount(p["halo_owner"], minlength=4))
        assert np.array_equal(p["features"], g.features[p["owned_gid"]])
        assert np.array_equal(p["labels"], g.labels[p["owned_gid"]])
        assert np.array_equal(p["train_mask"], g.train_mask[p["owned_gid"]])
        # What i sends to j is, in order, j's halo rows owned by i.
        starts = np.concatenate([[0], np.cumsum(p["send_counts"])])
        for j, q in enumerate(parts):
            sent_gid = p["owned_gid"][p["send_idx"][starts[j]:starts[j + 1]]]
            assert np.array_equal(sent_gid, q["halo_gid"][q["halo_owner"] == i])


def test_same_inputs_reuse_and_different_inputs_rebuild(tmp_path: Path, work_env):
    out = tmp_path / "p"
    base = ["--dataset", "synthetic", "--syn-nodes", "3000", "--syn-edges", "30000", "--out", str(out)]
    first = run_workload("partition.py", [*base, "--num-parts", "2"], work_env)
    assert first.rc == 0 and "writing partition" in first.stdout
    stamp = (out / "part-0.npz").stat().st_mtime_ns
    again = run_workload("partition.py", [*base, "--num_parts", "2"], work_env)
    assert again.rc == 0 and "reusing existing partition" in again.stdout
    assert (out / "part-0.npz").stat().st_mtime_ns == stamp

    other_seed = run_workload("partition.py", [*base, "--num-parts", "2", "--syn-seed", "1"], work_env)
    assert other_seed.rc == 0 and "replacing partition" in other_seed.stdout
    assert json.loads((out / "manifest.json").read_text())["params"]["synthetic"]["seed"] == 1

    three = run_workload("partition.py", [*base, "--num-parts", "3"], work_env)
    assert three.rc == 0 and "replacing" in three.stdout
    man = json.loads((out / "manifest.json").read_text())
    assert man["num_parts"] == 3 and sorted(os.listdir(out)) == ["manifest.json", "part-0.npz", "part-1.npz", "part-2.npz"]

    # A damaged part is never trusted: the digest in the manifest catches it.
    with open(out / "part-1.npz", "r+b") as f:
        f.seek(200)
        f.write(b"\0" * 16)
    fixed = run_workload("partition.py", [*base, "--num-parts", "3"], work_env)
    assert fixed.rc == 0 and "replacing" in fixed.stdout
    assert partition.existing_is_valid(out, man["input_key"])


def test_killed_run_leaves_nothing_a_later_run_trusts(tmp_path: Path, work_env):
    out = tmp_path / "big"
    args = [PYTHON, str(WORKLOADS / "partition.py"), "--dataset", "synthetic", "--syn-nodes", "200000",
            "--syn-edges", "4000000", "--num-parts", "4", "--out", str(out)]
    proc = subprocess.Popen(args, env=work_env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "writing partition" in proc.stdout.readline()  # graph generated, partitioning under way
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Either the run was killed before its final rename (no partition at all), or it had
    # finished: a half-written folder under the final name is impossible.
    assert not out.exists() or partition.read_manifest(out) is not None
    leftovers = list(tmp_path.glob(".big.tmp-*"))
    r = run_workload("partition.py", args[2:], work_env)
    assert r.rc == 0
    assert "writing partition" in r.stdout or "reusing" in r.stdout
    assert not any(p.exists() for p in leftovers)  # the dead run's temp folder was cleaned up
    man = json.loads((out / "manifest.json").read_text())
    assert partition.existing_is_valid(out, man["input_key"])


def test_gdc_is_refused_clearly(tmp_path: Path, work_env):
    r = run_workload("partition.py", ["--dataset", "cora", "--num-parts", "2", "--use_gdc"], work_env, cwd=tmp_path)
    assert r.rc == 2 and "not implemented" in r.stderr and "Traceback" not in r.stderr


def test_foreign_output_folder_is_not_overwritten(tmp_path: Path, work_env):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    r = run_workload("partition.py", [*SYN_1M[:2], "--num-parts", "2", "--out", str(tmp_path / "mine")], work_env)
    assert r.rc == 2 and "not a partition written by this tool" in r.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
