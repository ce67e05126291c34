"""Dataset loaders: Cora's standard numbers, clear errors for bad files, Reddit's npz layout, synthetic."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import datasets
import loaders
from conftest import run_workload


def test_cora_has_the_standard_planetoid_numbers(cora_raw: Path):
    g = loaders.load_cora(cora_raw, download=False)
    assert (g.num_nodes, g.num_edges, g.features.shape[1], g.num_classes) == (2708, 10556, 1433, 7)
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == (140, 500, 1000)
    assert np.flatnonzero(g.test_mask).min() == 1708 and np.flatnonzero(g.test_mask).max() == 2707
    # Symmetric, no self loops, no duplicates; CSR with int32 columns ascending in each row.
    src, dst = g.src.astype(np.int64), g.dst.astype(np.int64)
    keys = src * g.num_nodes + dst
    assert np.unique(keys).size == keys.size and not np.any(src == dst)
    assert np.array_equal(np.sort(keys), np.sort(dst * g.num_nodes + src))
    assert g.indices.dtype == np.int32 and np.all(np.diff(keys) > 0)
    # Row-normalised bag of words; the rows of the few isolated, missing test nodes stay zero.
    sums = g.features.sum(1)
    assert np.allclose(sums[sums > 0], 1.0, atol=1e-5) and (sums == 0).sum() < 20


def test_cora_also_found_from_its_parent_folder(cora_raw: Path):
    assert loaders.load_cora(cora_raw.parent, download=False).num_nodes == 2708


def test_corrupt_cora_file_is_one_clear_line(tmp_path: Path, cora_raw: Path, work_env):
    bad = tmp_path / "raw"
    shutil.copytree(cora_raw, bad)
    data = bytearray((bad / "ind.cora.graph").read_bytes())
    data[100] ^= 0xFF
    (bad / "ind.cora.graph").write_bytes(bytes(data))
    r = run_workload("partition.py", ["--dataset", "cora", "--data-dir", str(bad), "--num-parts", "2",
                                      "--out", str(tmp_path / "p")], work_env)
    assert r.rc == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(bad / "ind.cora.graph") in r.stderr and "sha256" in r.stderr
    assert not (tmp_path / "p").exists()


def test_missing_cora_file_names_the_file(tmp_path: Path, cora_raw: Path, work_env):
    shutil.copytree(cora_raw, tmp_path / "raw")
    (tmp_path / "raw" / "ind.cora.ty").unlink()
    r = run_workload("gcn_ddp.py", ["--dataset", "cora", "--data-dir", str(tmp_path / "raw"), "--epochs", "1"], work_env)
    assert r.rc == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "ind.cora.ty: missing" in r.stderr


def _fabricate_reddit(folder: Path, fmt: str) -> dict[str, np.ndarray]:
    """A 6-node graph in DGL's reddit_data.npz / reddit_graph.npz layout (scipy save_npz keys)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    feature = rng.normal(size=(6, 5)).astype(np.float32)
    label = np.array([0, 1, 2, 0, 1, 2])
    node_types = np.array([1, 1, 2, 3, 3, 1])
    np.savez(folder / "reddit_data.npz", feature=feature, label=label, node_types=node_types,
             node_ids=np.arange(6))
    row = np.array([0, 1, 2, 3, 4, 0, 5])  # one direction only, plus a self loop at 5
    col = np.array([1, 2, 3, 4, 5, 0, 5])
    if fmt == "coo":
        np.savez(folder / "reddit_graph.npz", row=row, col=col, data=np.ones(7), shape=np.array([6, 6]),
                 format=np.array(b"coo"))
    else:
        order = np.argsort(row, kind="stable")
        indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=6))])
        np.savez(folder / "reddit_graph.npz", indices=col[order], indptr=indptr, data=np.ones(7),
                 shape=np.array([6, 6]), format=np.array(b"csr"))
    return {"feature": feature, "label": label}


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_reddit_loader_reads_the_dgl_layout(tmp_path: Path, fmt: str):
    made = _fabricate_reddit(tmp_path / "reddit", fmt)
    g = loaders.load_reddit(tmp_path / "reddit")
    assert g.num_nodes == 6 and np.array_equal(g.features, made["feature"])
    assert np.array_equal(g.labels, made["label"])
    assert g.train_mask.tolist() == [True, True, False, False, False, True]
    assert g.val_mask.tolist() == [False, False, True, False, False, False]
    assert g.test_mask.tolist() == [False, False, False, True, True, False]
    # Symmetrised, self loops and the (0,0) entry dropped: a path 0-1-2-3-4-5.
    edges = set(zip(g.src.tolist(), g.dst.tolist()))
    path = {(i, i + 1) for i in range(5)}
    assert edges == path | {(b, a) for a, b in path}


def test_reddit_partitions_and_missing_reddit_is_clear(tmp_path: Path, work_env):
    _fabricate_reddit(tmp_path / "reddit", "coo")
    r = run_workload("partition.py", ["--dataset", "reddit", "--data-dir", str(tmp_path / "reddit"),
                                      "--num-parts", "2", "--out", str(tmp_path / "p")], work_env)
    assert r.rc == 0, r.stderr
    r = run_workload("partition.py", ["--dataset", "reddit", "--data-dir", str(tmp_path / "none"),
                                      "--num_parts", "2"], work_env, cwd=tmp_path)
    assert r.rc == 2 and r.stderr.count("\n") == 1 and "reddit_data.npz: missing" in r.stderr


def test_synthetic_is_deterministic_sized_and_homophilous():
    spec = datasets.SyntheticSpec(num_nodes=5000, num_edges=60000, num_features=8, num_classes=5, homophily=0.9, seed=4)
    a, b = loaders.make_synthetic(spec), loaders.make_synthetic(spec)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.features, b.features) and a.digest == b.digest
    assert a.digest == datasets.source_digest("synthetic", None, spec)  # known without generating
    c = loaders.make_synthetic(datasets.SyntheticSpec(**{**spec.__dict__, "seed": 5}))
    assert c.digest != a.digest and not np.array_equal(a.labels, c.labels)
    assert 0.95 * 60000 <= a.num_edges <= 1.05 * 60000
    same = (a.labels[a.src] == a.labels[a.dst]).mean()
    assert 0.85 < same < 0.95  # 0.9 inside + 0.1 * 1/5 by chance, minus duplicates
    # Features carry the class: class means are far apart relative to their spread.
    means = np.stack([a.features[a.labels == k].mean(0) for k in range(5)])
    assert np.linalg.norm(means[0] - means[1]) > 0.5


class _FakeResponse:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data

    def __enter__(self) -> "_FakeResponse":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_cora_download_is_verified_against_the_embedded_digests(tmp_path: Path, cora_raw: Path, monkeypatch):
    # The upstream host is unreachable here: serve the same bytes from the shared copy, once
    # intact and once with one file altered, through the loader's real download path.
    served: list[str] = []

    def fake_urlopen(url: str, timeout: float = 0) -> _FakeResponse:
        name = url.rsplit("/", 1)[-1]
        served.append(url)
        data = (cora_raw / name).read_bytes()
        if tamper and name == "ind.cora.tx":
            data = data[:-1] + bytes([data[-1] ^ 1])
        return _FakeResponse(data)

    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setenv("DISTRUN_DATA_DIR", str(tmp_path / "cache"))
    tamper = True
    with pytest.raises(datasets.DatasetError, match=r"ind\.cora\.tx has sha256 .* expected"):
        loaders.load_cora()
    assert not (tmp_path / "cache" / "cora" / "raw" / "ind.cora.tx").exists()
    tamper = False
    g = loaders.load_cora()
    assert g.num_nodes == 2708
    assert all(u.startswith("https://github.com/kimiyoung/planetoid/raw/master/data/ind.cora.") for u in served)
    assert sorted(p.name for p in (tmp_path / "cache" / "cora" / "raw").iterdir()) == sorted(datasets.CORA_SHA256)
