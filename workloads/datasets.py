"""Graph datasets for the reference workloads: Cora (Planetoid), Reddit (DGL/PyG npz) and synthetic.

Every loader returns a :class:`Graph` with the edge list already symmetrised and de-duplicated
(no self loops: the model adds those), so the partitioner and the trainers agree on one graph.
Files on disk are verified against known digests where we know them; a missing or corrupt file
raises :class:`DatasetError` whose message names the file and the fix.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Digests of the upstream Planetoid files (kimiyoung/planetoid, data/ind.cora.*). The same bytes
# live in shared/datasets/cora/SHA256SUMS; a download is only trusted when it matches these.
CORA_SHA256: dict[str, str] = {
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
}
CORA_URL = "https://github.com/kimiyoung/planetoid/raw/master/data/{name}"

REDDIT_FILES = ("reddit_data.npz", "reddit_graph.npz")
# DGL's archive holding both files. Its digest could not be fetched from the build machine, so
# Reddit is never downloaded automatically: the user places the files and names --data-dir.
REDDIT_URL = "https://data.dgl.ai/dataset/reddit.zip"

SYNTHETIC_VERSION = 1  # bump when the generator changes: it is part of the dataset digest
DATASETS = ("cora", "reddit", "synthetic")


class DatasetError(Exception):
    """A problem the user can fix (missing/corrupt file, bad flag); printed as one line."""


@dataclass(frozen=True)
class SyntheticSpec:
    num_nodes: int = 2000
    num_edges: int = 20000  # directed entries after symmetrising, as Reddit's 114M counts them
    num_features: int = 32
    num_classes: int = 4
    homophily: float = 0.8  # share of edges drawn inside the source node's class
    seed: int = 0


@dataclass
class Graph:
    name: str
    digest: str  # identifies the exact input: file digests or generator parameters
    num_nodes: int
    src: np.ndarray  # int64, both directions present, no duplicates, no self loops
    dst: np.ndarray
    features: np.ndarray  # float32 [N, F]
    labels: np.ndarray  # int64 [N]
    train_mask: np.ndarray  # bool [N]
    val_mask: np.ndarray
    test_mask: np.ndarray

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.labels.max()) + 1


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def symmetrise(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of every edge, once each, self loops dropped, sorted by (src, dst)."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # One int64 key per directed edge makes de-duplication a single np.unique.
    keys = np.unique(np.concatenate([src * num_nodes + dst, dst * num_nodes + src]))
    return keys // num_nodes, keys % num_nodes


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


def default_data_dir(name: str) -> Path:
    base = os.environ.get("DISTRUN_DATA_DIR")
    if base:
        return Path(base) / name
    return Path.home() / ".cache" / "distrun" / "datasets" / name


def _cora_dir(data_dir: Path | None, download: bool) -> Path:
    if data_dir is not None:
        # Accept both the folder holding ind.cora.* and its parent (shared/datasets/cora).
        d = Path(data_dir)
        if not (d / "ind.cora.x").exists() and (d / "raw" / "ind.cora.x").exists():
            d = d / "raw"
        return d
    d = default_data_dir("cora") / "raw"
    missing = [n for n in CORA_SHA256 if not (d / n).exists()]
    if missing and download:
        d.mkdir(parents=True, exist_ok=True)
        for name in missing:
            _download(CORA_URL.format(name=name), d / name, CORA_SHA256[name])
    return d


def _download(url: str, dest: Path, sha256: str) -> None:
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as f:
            f.write(resp.read())
    except OSError as exc:
        raise DatasetError(
            f"could not download {url} ({exc}); fetch it by hand into {dest.parent} or pass --data-dir"
        ) from None
    got = sha256_file(tmp)
    if got != sha256:
        tmp.unlink()
        raise DatasetError(f"downloaded {url} has sha256 {got}, expected {sha256}; not using it")
    tmp.replace(dest)


def load_cora(data_dir: Path | None = None, download: bool = True) -> Graph:
    d = _cora_dir(data_dir, download)
    objs: dict[str, object] = {}
    for name, expected in CORA_SHA256.items():
        path = d / name
        if not path.is_file():
            raise DatasetError(
                f"{path}: missing; pass --data-dir with the Planetoid ind.cora.* files "
                f"or leave it out to download them"
            )
        got = sha256_file(path)
        if got != expected:
            raise DatasetError(
                f"{path}: sha256 {got[:12]}... does not match the Planetoid file "
                f"({expected[:12]}...); delete it and download again"
            )
        raw = path.read_bytes()
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
    src, dst = symmetrise(np.concatenate(src_l), np.concatenate(dst_l), n)

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
    digest = hashlib.sha256(("".join(sorted(CORA_SHA256.values())) + "|rownorm").encode()).hexdigest()
    return Graph("cora", digest, n, src, dst, feats, labels, train, val, test)


# -------------------------------------------------------------------------------------- Reddit
def load_reddit(data_dir: Path | None = None) -> Graph:
    d = Path(data_dir) if data_dir is not None else default_data_dir("reddit")
    paths = [d / f for f in REDDIT_FILES]
    for p in paths:
        if not p.is_file():
            raise DatasetError(
                f"{p}: missing; download {REDDIT_URL}, unzip reddit_data.npz and "
                f"reddit_graph.npz into one folder and pass it as --data-dir"
            )
    h = hashlib.sha256()
    for p in paths:
        h.update(sha256_file(p).encode())
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
    src, dst = symmetrise(src, dst, n)
    # DGL's node_types: 1 train, 2 validation, 3 test.
    return Graph("reddit", h.hexdigest(), n, src, dst, feats, labels, types == 1, types == 2, types == 3)


# ----------------------------------------------------------------------------------- synthetic
def make_synthetic(spec: SyntheticSpec) -> Graph:
    """A planted-partition graph whose communities are the classes, with class-centred features.

    Vectorised end to end so Reddit-sized graphs (233k nodes, 114M edges) take seconds.
    """
    if spec.num_nodes < spec.num_classes * 2 or spec.num_edges < 2:
        raise DatasetError("--syn-nodes must be at least 2 per class and --syn-edges at least 2")
    if not 0.0 <= spec.homophily <= 1.0:
        raise DatasetError("--syn-homophily must lie in [0, 1]")
    rng = np.random.default_rng(spec.seed)
    n, c = spec.num_nodes, spec.num_classes
    labels = rng.integers(0, c, n)
    labels[:c] = np.arange(c)  # every class present
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=c)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])

    # Draw a little more than half the target (each undirected edge becomes two entries),
    # so duplicates removed by symmetrise still leave about num_edges entries.
    m = int(spec.num_edges * 0.5 * 1.02) + 1
    src = rng.integers(0, n, m)
    inside = rng.random(m) < spec.homophily
    cls = labels[src]
    pick = starts[cls] + (rng.random(m) * counts[cls]).astype(np.int64)
    dst = np.where(inside, order[pick], rng.integers(0, n, m))
    src, dst = symmetrise(src, dst, n)

    centres = rng.normal(0.0, 1.0, (c, spec.num_features)).astype(np.float32)
    feats = centres[labels] + rng.normal(0.0, 2.0, (n, spec.num_features)).astype(np.float32)
    split = rng.random(n)
    train, val = split < 0.6, (split >= 0.6) & (split < 0.8)
    test = split >= 0.8
    digest = hashlib.sha256(repr((SYNTHETIC_VERSION, spec)).encode()).hexdigest()
    return Graph("synthetic", digest, n, src, dst, feats, labels.astype(np.int64), train, val, test)


def load(name: str, data_dir: Path | None = None, synthetic: SyntheticSpec | None = None) -> Graph:
    if name == "cora":
        return load_cora(data_dir)
    if name == "reddit":
        return load_reddit(data_dir)
    if name == "synthetic":
        return make_synthetic(synthetic or SyntheticSpec())
    raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
