"""The partitioner: a correct partition of a 1M-edge graph, reuse decided before loading, rebuild,
crash safety, GDC parts, and the Metis edge sample."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import datasets
import loaders
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


def check_parts(man: dict, parts: list[dict], num_nodes: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Every node owned once; the parts' rows, mapped back to global ids, are exactly the entries
    (rows, cols); halos, owners and send lists agree. Returns the owner of every node."""
    k = man["num_parts"]
    owned = np.concatenate([p["owned_gid"] for p in parts])
    assert owned.size == num_nodes and np.array_equal(np.sort(owned), np.arange(num_nodes))
    owner = np.empty(num_nodes, np.int64)
    for i, p in enumerate(parts):
        owner[p["owned_gid"]] = i
    keys = []
    for p in parts:
        local_to_global = np.concatenate([p["owned_gid"], p["halo_gid"]]).astype(np.int64)
        r = np.repeat(p["owned_gid"].astype(np.int64), np.diff(p["indptr"]))
        keys.append(r * num_nodes + local_to_global[p["indices"]])
    keys = np.sort(np.concatenate(keys))
    assert np.array_equal(keys, np.sort(rows.astype(np.int64) * num_nodes + cols))
    for i, p in enumerate(parts):
        assert p["indices"].dtype == np.int32 and p["owned_gid"].dtype == np.int32
        assert p["halo_owner"].dtype == np.int8 and p["send_idx"].dtype == np.int32
        n_own = p["owned_gid"].size
        local_to_global = np.concatenate([p["owned_gid"], p["halo_gid"]])
        remote = np.unique(local_to_global[p["indices"]][p["indices"] >= n_own])
        assert np.array_equal(np.sort(p["halo_gid"]), remote)
        assert np.array_equal(p["halo_owner"], owner[p["halo_gid"]]) and not np.any(p["halo_owner"] == i)
        assert np.array_equal(p["recv_counts"], np.bincount(p["halo_owner"], minlength=k))
        # What i sends to j is, in order, j's halo rows owned by i.
        starts = np.concatenate([[0], np.cumsum(p["send_counts"])])
        for j, q in enumerate(parts):
            sent_gid = p["owned_gid"][p["send_idx"][starts[j]:starts[j + 1]]]
            assert np.array_equal(sent_gid, q["halo_gid"][q["halo_owner"] == i])
    return owner


def test_one_million_edges_into_four_parts_is_a_correct_partition(tmp_path: Path, work_env):
    out = tmp_path / "syn-4"
    r = run_workload("partition.py", [*SYN_1M, "--num-parts", "4", "--out", str(out)], work_env)
    assert r.rc == 0, r.stderr
    g = loaders.make_synthetic(datasets.SyntheticSpec(num_nodes=100000, num_edges=1000000, num_features=8))
    man, parts = load_parts(out)
    assert man["num_parts"] == 4 and man["num_nodes"] == g.num_nodes and man["num_edges"] == g.num_edges
    assert man["format_version"] == 2 and man["propagation"] == "gcn" and man["metis"]["method"] == "kway"
    assert man["dataset_digest"] == g.digest and {"python", "numpy", "pymetis"} <= set(man["tools"])
    owner = check_parts(man, parts, g.num_nodes, g.src, g.dst)
    assert max(man["part_sizes"]) <= 1.05 * g.num_nodes / 4  # Metis keeps parts balanced
    cut = np.count_nonzero(owner[g.src] != owner[g.dst]) // 2
    assert man["edge_cut"] == cut and 0 < cut < g.num_edges // 4  # Metis beats a random split (3/4)

    full_degree = np.diff(g.indptr)
    for p in parts:
        local_to_global = np.concatenate([p["owned_gid"], p["halo_gid"]])
        assert "weights" not in p and np.array_equal(p["degree"], full_degree[local_to_global])
        assert np.array_equal(p["features"], g.features[p["owned_gid"]])
        assert np.array_equal(p["labels"], g.labels[p["owned_gid"]])
        assert np.array_equal(p["train_mask"], g.train_mask[p["owned_gid"]])


def test_same_inputs_reuse_and_different_inputs_rebuild(tmp_path: Path, work_env):
    out = tmp_path / "p"
    base = ["--dataset", "synthetic", "--syn-nodes", "3000", "--syn-edges", "30000", "--out", str(out)]
    first = run_workload("partition.py", [*base, "--num-parts", "2"], work_env)
    assert first.rc == 0 and "writing partition" in first.stdout
    stamp = (out / "part-0.npz").stat().st_mtime_ns
    again = run_workload("partition.py", [*base, "--num_parts", "2"], work_env)
    assert again.rc == 0 and "reusing existing partition" in again.stdout
    assert (out / "part-0.npz").stat().st_mtime_ns == stamp

    for changed in (["--syn-seed", "1"], ["--metis-method", "recursive"], ["--use-gdc"]):
        other = run_workload("partition.py", [*base, "--num-parts", "2", *changed], work_env)
        assert other.rc == 0 and "replacing partition" in other.stdout, changed
    man = json.loads((out / "manifest.json").read_text())
    assert man["params"]["synthetic"]["seed"] == 0 and man["propagation"] == "gdc"

    three = run_workload("partition.py", [*base, "--num-parts", "3"], work_env)
    assert three.rc == 0 and "replacing" in three.stdout
    man = json.loads((out / "manifest.json").read_text())
    assert man["num_parts"] == 3 and sorted(os.listdir(out)) == ["manifest.json", "part-0.npz", "part-1.npz", "part-2.npz"]

    # A damaged part is never trusted: its times changed, so it is hashed again and mismatches.
    with open(out / "part-1.npz", "r+b") as f:
        f.seek(200)
        f.write(b"\0" * 16)
    fixed = run_workload("partition.py", [*base, "--num-parts", "3"], work_env)
    assert fixed.rc == 0 and "replacing" in fixed.stdout
    assert partition.existing_is_valid(out, man["input_key"])


def test_reuse_is_decided_without_loading_the_data(tmp_path: Path, cora_raw: Path, work_env):
    """The reuse check reads specs, file stats and the manifest only: numpy is never imported, so
    it costs the same on Cora as on Reddit. Changed input files are noticed all the same."""
    import shutil

    data = tmp_path / "cora"
    shutil.copytree(cora_raw, data)
    out = tmp_path / "p"
    args = ["--dataset", "cora", "--data-dir", str(data), "--num-parts", "2", "--out", str(out)]
    assert run_workload("partition.py", args, work_env).rc == 0
    probe = (f"import sys; sys.path.insert(0, {str(WORKLOADS)!r}); import partition; "
             f"rc = partition.main({args!r}); "
             f"print('numpy imported' if 'numpy' in sys.modules else 'numpy not imported'); sys.exit(rc)")
    r = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, env=work_env, timeout=120)
    assert r.returncode == 0 and "reusing existing partition" in r.stdout and "numpy not imported" in r.stdout, r.stdout + r.stderr

    # A dataset file rewritten in place (same size, same mtime) is hashed again and refused.
    target = data / "ind.cora.y"
    st = target.stat()
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 1
    target.write_bytes(bytes(raw))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    bad = run_workload("partition.py", args, work_env)
    assert bad.rc == 2 and "ind.cora.y: sha256" in bad.stderr and "reusing" not in bad.stdout


def _temp_part_written(parent: Path) -> bool:
    return any(parent.glob(".big.tmp-*/part-0.npz"))


def test_killed_run_leaves_nothing_a_later_run_trusts(tmp_path: Path, work_env):
    """Kill the partitioner after its first part file exists and before the folder is renamed
    into place: every run of this test exercises that path, or fails saying it could not."""
    out = tmp_path / "big"
    args = [PYTHON, str(WORKLOADS / "partition.py"), "--dataset", "synthetic", "--syn-nodes", "100000",
            "--syn-edges", "1000000", "--syn-features", "128", "--num-parts", "8", "--out", str(out)]
    killed_midway = False
    for _attempt in range(3):
        proc = subprocess.Popen(args, env=work_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None and not _temp_part_written(tmp_path):
            time.sleep(0.002)
        if proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)  # freeze it where it is, then look
            killed_midway = partition.read_manifest(out) is None
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        if killed_midway:
            break
        # Too late (it finished meanwhile): start over from nothing.
        subprocess.run(["rm", "-rf", str(out)], check=True)
    assert killed_midway, "the partitioner finished before it could be killed midway, three times"
    assert not out.exists()  # nothing under the final name
    leftovers = list(tmp_path.glob(".big.tmp-*"))
    assert leftovers and any((d / "part-0.npz").exists() for d in leftovers)
    r = run_workload("partition.py", args[2:], work_env)
    assert r.rc == 0 and "writing partition" in r.stdout
    assert not any(p.exists() for p in leftovers)  # the dead run's temp folder was cleaned up
    man = json.loads((out / "manifest.json").read_text())
    assert partition.existing_is_valid(out, man["input_key"])


def test_gdc_parts_hold_the_diffusion(tmp_path: Path, work_env):
    import gdc

    out = tmp_path / "gdc"
    spec = ["--dataset", "synthetic", "--syn-nodes", "600", "--syn-edges", "4000", "--syn-features", "4"]
    r = run_workload("partition.py", [*spec, "--num-parts", "3", "--out", str(out), "--use-gdc",
                                      "--gdc-alpha", "0.1", "--gdc-topk", "20"], work_env)
    assert r.rc == 0, r.stderr
    assert "GDC (PPR alpha 0.1, top-20 per node)" in r.stdout
    g = loaders.make_synthetic(datasets.SyntheticSpec(num_nodes=600, num_edges=4000, num_features=4))
    diff = gdc.diffuse(g.indptr, g.indices, datasets.GdcSpec(alpha=0.1, topk=20))
    man, parts = load_parts(out)
    assert man["propagation"] == "gdc" and man["gdc"]["alpha"] == 0.1 and man["gdc"]["topk"] == 20
    rows = np.repeat(np.arange(g.num_nodes), np.diff(diff.indptr))
    check_parts(man, parts, g.num_nodes, rows, diff.indices)
    dense = np.zeros((g.num_nodes, g.num_nodes), np.float32)
    dense[rows, diff.indices] = diff.weights
    for p in parts:
        assert "degree" not in p and p["weights"].dtype == np.float32
        local_to_global = np.concatenate([p["owned_gid"], p["halo_gid"]])
        r_ = np.repeat(p["owned_gid"], np.diff(p["indptr"]))
        assert np.array_equal(p["weights"], dense[r_, local_to_global[p["indices"]]])
        assert np.allclose(np.add.reduceat(p["weights"], p["indptr"][:-1]), 1.0, atol=1e-5)
    # The halos follow the diffused graph: far more than the graph's own neighbours.
    assert sum(man["halo_sizes"]) > 1.3 * sum(h.size for h in _plain_halos(g, parts))


def _plain_halos(g, parts):  # noqa: ANN001,ANN202
    owner = np.empty(g.num_nodes, np.int64)
    for i, p in enumerate(parts):
        owner[p["owned_gid"]] = i
    src = g.src
    return [np.unique(g.dst[(owner[src] == i) & (owner[g.dst] != i)]) for i in range(len(parts))]


def test_metis_sees_a_sample_of_a_graph_too_dense_for_it(tmp_path: Path, work_env):
    out = tmp_path / "s"
    spec = datasets.SyntheticSpec(num_nodes=4000, num_edges=80000, num_features=4)
    r = run_workload("partition.py", ["--dataset", "synthetic", "--syn-nodes", "4000", "--syn-edges", "80000",
                                      "--syn-features", "4", "--num-parts", "2", "--out", str(out),
                                      "--metis-max-edges", "20000"], work_env)
    assert r.rc == 0, r.stderr
    g = loaders.make_synthetic(spec)
    man, parts = load_parts(out)
    assert 0.8 * 20000 < man["metis"]["edges_seen"] < 1.2 * 20000 < g.num_edges
    owner = check_parts(man, parts, g.num_nodes, g.src, g.dst)  # every edge still in the parts
    cut = np.count_nonzero(owner[g.src] != owner[g.dst]) // 2
    # The planted classes make a good cut easy: the sample still finds one far below random (1/2).
    assert man["edge_cut"] == cut and cut < 0.3 * g.num_edges / 2


def test_bad_gdc_values_are_one_clear_line(tmp_path: Path, work_env):
    r = run_workload("partition.py", ["--dataset", "synthetic", "--num-parts", "2", "--use-gdc", "--gdc-alpha", "1.5"],
                     work_env, cwd=tmp_path)
    assert r.rc == 2 and r.stderr.count("\n") == 1 and "--gdc-alpha 1.5" in r.stderr and "Traceback" not in r.stderr


def test_old_format_partition_is_rebuilt_and_refused_by_trainers(tmp_path: Path, work_env):
    out = tmp_path / "old"
    base = ["--dataset", "synthetic", "--syn-nodes", "2000", "--syn-edges", "20000", "--num-parts", "2", "--out", str(out)]
    assert run_workload("partition.py", base, work_env).rc == 0
    man = json.loads((out / "manifest.json").read_text())
    man["format_version"] = 1
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(datasets.DatasetError, match="partition format 1 is not 2; partition again"):
        partition.load_part(out, 0)
    r = run_workload("partition.py", base, work_env)
    assert r.rc == 0 and "replacing partition" in r.stdout


def test_foreign_output_folder_is_not_overwritten(tmp_path: Path, work_env):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    r = run_workload("partition.py", [*SYN_1M[:2], "--num-parts", "2", "--out", str(tmp_path / "mine")], work_env)
    assert r.rc == 2 and "not a partition written by this tool" in r.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
