"""Graph loaders: Cora (Planetoid), Reddit (DGL/PyG npz) and a synthetic planted-partition graph.

Every loader returns a :class:`Graph` in CSR form with the edge list already symmetrised and
de-duplicated (no self loops: the model adds those), so the partitioner and the trainers agree
on one graph. Node ids fit in int32 (Reddit has 233k nodes); offsets are int64.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import datasets
from datasets import DatasetError, SyntheticSpec
from digests import DigestMemo

_CHUNK = 1 << 23  # elements per step where a whole-array temporary would cost too much memory


@dataclass
class Graph:
    name: str
    digest: str  # identifies the exact input: file digests or generator parameters
    num_nodes: int
    indptr: np.ndarray  # int64 [N + 1]
    indices: np.ndarray  # int32: neighbours of each node, ascending; both directions, no duplicates, no self loops
    features: np.ndarray  # float32 [N, F]
    labels: np.ndarray  # int64 [N]
    train_mask: np.ndarray  # bool [N]
    val_mask: np.ndarray
    test_mask: np.ndarray

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.labels.max()) + 1

    @property
    def degree(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def src(self) -> np.ndarray:
        """Source node of every edge (int32), in CSR order; built on demand."""
        return np.repeat(np.arange(self.num_nodes, dtype=np.int32), np.diff(self.indptr))

    @property
    def dst(self) -> np.ndarray:
        return self.indices


def index_dtype(num_nodes: int) -> type:
    return np.int32 if num_nodes < 2**31 else np.int64


def symmetrise(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr, indices) of both directions of every edge, once each, self loops dropped.

    One int64 key per directed edge, sorted in place and compacted in place, so the peak is about
    two keys per input edge (the key array, and the int32 indices built from it).
    """
    n = int(num_nodes)
    m = int(src.shape[0])
    keys = np.empty(2 * m, dtype=np.int64)
    used = 0
    for a in range(0, m, _CHUNK):
        s = np.asarray(src[a : a + _CHUNK], dtype=np.int64)
        d = np.asarray(dst[a : a + _CHUNK], dtype=np.int64)
        keep = s != d
        s, d = s[keep], d[keep]
        k = s.size
        np.multiply(s, n, out=keys[used : used + k])
        keys[used : used + k] += d
        np.multiply(d, n, out=keys[used + k : used + 2 * k])
        keys[used + k : used + 2 * k] += s
        used += 2 * k
    keys = keys[:used]
    keys.sort()
    # Compact the distinct keys to the front, chunk by chunk (the write position never passes
    # the read position, so only one chunk is ever copied aside).
    w = 0
    prev = None
    for a in range(0, used, _CHUNK):
        chunk = keys[a : a + _CHUNK]
        first = np.empty(chunk.size, dtype=bool)
        first[0] = prev is None or chunk[0] != prev
        np.not_equal(chunk[1:], chunk[:-1], out=first[1:])
        prev = int(chunk[-1])
        kept = chunk[first]
        keys[w : w + kept.size] = kept
        w += kept.size
    keys = keys[:w]
    indptr = np.searchsorted(keys, np.arange(n + 1, dtype=np.int64) * n).astype(np.int64)
    indices = np.empty(w, dtype=index_dtype(n))
    for a in range(0, w, _CHUNK):
        np.remainder(keys[a : a + _CHUNK], n, out=indices[a : a + _CHUNK], casting="unsafe")
    return indptr, indices


# ---------------------------------------------------------------------------------------- Cora
class _CsrStub:
    """Stands in for scipy's csr_matrix while unpickling, so scipy is not a dependency."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def toarray(self) -> np.ndarray:
        rows, cols = self._shape if "_shape" in self.__dict__ else self.shape
        out = np.zeros((rows, cols), dtype=np.float32)
        counts = np.diff(self.indptr)
        r = np.repeat(np.arange(rows), counts)
        out[r, self.indices] = self.data
        return out


class _PlanetoidUnpickler(pickle.Unpickler):
    # The Planetoid files are Python 2 pickles. Only the classes they actually contain are
    # allowed, so a tampered file cannot run code even before its digest is compared.
    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "defaultdict"),
        ("__builtin__", "list"),
        ("builtins", "list"),
    }

    def find_class(self, module: str, name: str):  # type: ignore[override]
        if (module, name) == ("scipy.sparse.csr", "csr_matrix"):
            return _CsrStub
        if (module, name) in self._ALLOWED:
            if module == "__builtin__":
                module = "builtins"
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected class {module}.{name}")


def load_cora(data_dir: Path | None = None, download: bool = True) -> Graph:
    d = datasets.ensure_cora(data_dir, download)
    memo = DigestMemo()
    digests = datasets.verified_cora_digests(d, memo)
    memo.save()
    objs: dict[str, object] = {}
    for name in datasets.CORA_SHA256:
        raw = (d / name).read_bytes()
        if name == "ind.cora.test.index":
            objs[name] = np.array([int(line) for line in raw.split()], dtype=np.int64)
        else:
            objs[name] = _PlanetoidUnpickler(io.BytesIO(raw), encoding="latin1").load()

    x, tx, allx = (objs[f"ind.cora.{k}"] for k in ("x", "tx", "allx"))
    y, ty, ally = (objs[f"ind.cora.{k}"] for k in ("y", "ty", "ally"))
    test_idx = objs["ind.cora.test.index"]
    graph = objs["ind.cora.graph"]
    # The Planetoid convention: allx holds train+unlabelled nodes, tx the test nodes which sit
    # at the indices listed in test.index (some missing: those rows stay zero).
    n_all = allx.toarray().shape[0]
    n = max(int(test_idx.max()) + 1, n_all)
    feats = np.zeros((n, allx.toarray().shape[1]), dtype=np.float32)
    feats[:n_all] = allx.toarray()
    feats[test_idx] = tx.toarray()
    onehot = np.zeros((n, ally.shape[1]), dtype=np.float32)
    onehot[:n_all] = ally
    onehot[test_idx] = ty
    labels = onehot.argmax(1).astype(np.int64)

    src_l = [np.full(len(v), k, dtype=np.int64) for k, v in graph.items()]
    dst_l = [np.asarray(v, dtype=np.int64) for v in graph.values()]
    indptr, indices = symmetrise(np.concatenate(src_l), np.concatenate(dst_l), n)

    train = np.zeros(n, bool)
    train[: y.shape[0]] = True
    val = np.zeros(n, bool)
    val[y.shape[0] : y.shape[0] + 500] = True
    test = np.zeros(n, bool)
    test[test_idx] = True
    # Row-normalise the bag-of-words features, as Kipf & Welling's preprocessing (and PyG's
    # NormalizeFeatures) does: the published 81.5% is measured with it.
    rowsum = feats.sum(1, keepdims=True)
    feats = np.divide(feats, rowsum, out=np.zeros_like(feats), where=rowsum > 0)
    return Graph("cora", datasets.cora_digest(digests), n, indptr, indices, feats, labels, train, val, test)


# -------------------------------------------------------------------------------------- Reddit
def load_reddit(data_dir: Path | None = None) -> Graph:
    d = datasets.reddit_dir(data_dir)
    paths = [d / f for f in datasets.REDDIT_FILES]
    for p in paths:
        if not p.is_file():
            raise DatasetError(
                f"{p}: missing; download {datasets.REDDIT_URL}, unzip reddit_data.npz and "
                f"reddit_graph.npz into one folder and pass it as --data-dir"
            )
    memo = DigestMemo()
    digest = datasets.reddit_digest([memo.sha256(p) for p in paths])
    memo.save()
    try:
        with np.load(paths[0], allow_pickle=False) as data:
            feats = np.ascontiguousarray(data["feature"], dtype=np.float32)
            labels = np.asarray(data["label"], dtype=np.int64)
            types = np.asarray(data["node_types"])
        with np.load(paths[1], allow_pickle=False) as g:
            fmt = g["format"].item() if "format" in g.files else b"coo"
            fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
            shape = tuple(int(s) for s in g["shape"])
            if fmt == "coo":
                src, dst = g["row"], g["col"]
            elif fmt == "csr":
                indptr = g["indptr"]
                src = np.repeat(np.arange(shape[0], dtype=np.int64), np.diff(indptr))
                dst = g["indices"]
            else:
                raise DatasetError(f"{paths[1]}: sparse format {fmt!r} not supported (coo or csr)")
    except (OSError, ValueError, KeyError) as exc:
        raise DatasetError(
            f"{d}: reddit_data.npz/reddit_graph.npz unreadable ({exc}); download them again"
        ) from None
    n = feats.shape[0]
    if labels.shape[0] != n or types.shape[0] != n or shape[0] != n:
        raise DatasetError(f"{d}: node counts of reddit_data.npz and reddit_graph.npz disagree")
    indptr, indices = symmetrise(src, dst, n)
    # DGL's node_types: 1 train, 2 validation, 3 test.
    return Graph("reddit", digest, n, indptr, indices, feats, labels, types == 1, types == 2, types == 3)


# ----------------------------------------------------------------------------------- synthetic
def make_synthetic(spec: SyntheticSpec) -> Graph:
    """A planted-partition graph whose communities are the classes, with class-centred features.

    Vectorised end to end with 32-bit temporaries, so a Reddit-sized graph (233k nodes, 114M
    edges) takes seconds and about two bytes of key per edge beyond the result.
    """
    if spec.num_nodes < spec.num_classes * 2 or spec.num_edges < 2:
        raise DatasetError("--syn-nodes must be at least 2 per class and --syn-edges at least 2")
    if not 0.0 <= spec.homophily <= 1.0:
        raise DatasetError("--syn-homophily must lie in [0, 1]")
    if spec.num_nodes >= 2**31:
        raise DatasetError("--syn-nodes must stay below 2**31")
    rng = np.random.default_rng(spec.seed)
    n, c = spec.num_nodes, spec.num_classes
    labels = rng.integers(0, c, n)
    labels[:c] = np.arange(c)  # every class present
    order = np.argsort(labels, kind="stable").astype(np.int32)
    counts = np.bincount(labels, minlength=c)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    labels32 = labels.astype(np.int32)

    # Draw a little more than half the target (each undirected edge becomes two entries),
    # so duplicates removed by symmetrise still leave about num_edges entries.
    m = int(spec.num_edges * 0.5 * 1.02) + 1
    src = rng.integers(0, n, m, dtype=np.int32)
    dst = rng.integers(0, n, m, dtype=np.int32)  # the edges drawn outside the class
    inside = np.flatnonzero(rng.random(m, dtype=np.float32) < spec.homophily)
    cls = labels32[src[inside]]
    pick = starts[cls] + (rng.random(inside.size) * counts[cls]).astype(np.int64)
    dst[inside] = order[pick]
    del inside, cls, pick
    indptr, indices = symmetrise(src, dst, n)
    del src, dst

    centres = rng.normal(0.0, 1.0, (c, spec.num_features)).astype(np.float32)
    feats = centres[labels] + rng.normal(0.0, 2.0, (n, spec.num_features)).astype(np.float32)
    split = rng.random(n)
    train, val = split < 0.6, (split >= 0.6) & (split < 0.8)
    test = split >= 0.8
    return Graph("synthetic", datasets.synthetic_digest(spec), n, indptr, indices, feats, labels.astype(np.int64),
                 train, val, test)


def load(name: str, data_dir: Path | None = None, synthetic: SyntheticSpec | None = None) -> Graph:
    if name == "cora":
        return load_cora(data_dir)
    if name == "reddit":
        return load_reddit(data_dir)
    if name == "synthetic":
        return make_synthetic(synthetic or SyntheticSpec())
    raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(datasets.DATASETS)}")
