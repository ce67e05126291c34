"""The datasets the workloads know: their names and files, the flags that choose one, and the
digest that identifies an input without loading it.

Imports only the standard library (and digests.py), so the partitioner can decide that an
existing partition still matches its inputs in milliseconds, before numpy is even imported.
Loading a graph lives in loaders.py; ``load`` below imports it on first use.

Files on disk are verified against known digests where we know them; a missing or corrupt file
raises :class:`DatasetError`, whose message names the file and the fix.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from digests import DigestMemo

if TYPE_CHECKING:
    from loaders import Graph

# Digests of the upstream Planetoid files (kimiyoung/planetoid, data/ind.cora.*); a download or a
# folder named with --data-dir is only trusted when its files match these.
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
# DGL's archive holding both files. Its digest is not pinned here, so Reddit is never downloaded
# automatically: the user places the files and names --data-dir.
REDDIT_URL = "https://data.dgl.ai/dataset/reddit.zip"

SYNTHETIC_VERSION = 2  # bump when the generator changes: it is part of the dataset digest
DATASETS = ("cora", "reddit", "synthetic")

# Metis' memory grows with the edges it sees (about 50 bytes per directed entry with pymetis'
# 64-bit indices: 5.7 GiB for 114M). Above this many entries it sees a uniform sample of the
# undirected edges; the parts and halos are still built from every edge. At Reddit's size (114M)
# a 24M sample cuts as few edges as a 32M one (10.29% and 10.28% at 2 parts) in 1.6 s less.
METIS_MAX_EDGES = 24_000_000


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


@dataclass(frozen=True)
class GdcSpec:
    """Graph diffusion convolution (Klicpera, Weissenberger & Guennemann, NeurIPS 2019), PPR kernel.

    S = alpha (I - (1 - alpha) T)^-1 with T = D^-1/2 (A + I) D^-1/2; each node keeps its ``topk``
    largest entries (or, with ``eps``, those >= eps), and its kept weights are normalised to sum
    to one. ``tol`` is the approximate PPR's precision (gdc.py): residual per unit of degree left
    unpropagated.
    """

    alpha: float = 0.05
    topk: int | None = 128
    eps: float | None = None
    tol: float = 1e-4

    def validate(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise DatasetError(f"--gdc-alpha {self.alpha}: the teleport probability must lie in (0, 1)")
        if self.eps is None and (self.topk is None or self.topk < 1):
            raise DatasetError(f"--gdc-topk {self.topk}: keep at least 1 entry per node")
        if self.eps is not None and not 0.0 < self.eps < 1.0:
            raise DatasetError(f"--gdc-eps {self.eps}: the threshold must lie in (0, 1)")
        if not 0.0 < self.tol < 1.0:
            raise DatasetError(f"GDC precision {self.tol} must lie in (0, 1)")

    def describe(self) -> str:
        keep = f"eps {self.eps:g}" if self.eps is not None else f"top-{self.topk}"
        return f"GDC (PPR alpha {self.alpha:g}, {keep} per node)"


# ----------------------------------------------------------------------------------- flags
def add_dataset_args(ap: argparse.ArgumentParser) -> None:
    """The flags that choose the graph, shared by the partitioner and every trainer."""
    ap.add_argument("--dataset", choices=DATASETS, default="cora")
    ap.add_argument("--data-dir", type=Path, default=None, help="folder with the dataset's files")
    g = ap.add_argument_group("synthetic dataset")
    d = SyntheticSpec()
    g.add_argument("--syn-nodes", type=int, default=d.num_nodes)
    g.add_argument("--syn-edges", type=int, default=d.num_edges, help="directed edge entries (Reddit: 114M)")
    g.add_argument("--syn-features", type=int, default=d.num_features)
    g.add_argument("--syn-classes", type=int, default=d.num_classes)
    g.add_argument("--syn-homophily", type=float, default=d.homophily)
    g.add_argument("--syn-seed", type=int, default=d.seed)
    gd = ap.add_argument_group("graph diffusion convolution (GDC)")
    dg = GdcSpec()
    gd.add_argument("--use-gdc", "--use_gdc", dest="use_gdc", action="store_true",
                    help="train on the PPR diffusion of the graph instead of its adjacency")
    gd.add_argument("--gdc-alpha", type=float, default=dg.alpha, help="teleport probability of the PPR")
    gd.add_argument("--gdc-topk", type=int, default=dg.topk, help="entries kept per node")
    gd.add_argument("--gdc-eps", type=float, default=None,
                    help="keep entries >= this instead of the top-k (Klicpera et al.'s threshold variant)")


def synthetic_spec(args: argparse.Namespace) -> SyntheticSpec:
    return SyntheticSpec(args.syn_nodes, args.syn_edges, args.syn_features, args.syn_classes, args.syn_homophily, args.syn_seed)


def gdc_spec(args: argparse.Namespace) -> GdcSpec | None:
    """The GDC settings the flags ask for, validated; None without --use-gdc."""
    if not getattr(args, "use_gdc", False):
        return None
    spec = GdcSpec(alpha=args.gdc_alpha, topk=None if args.gdc_eps is not None else args.gdc_topk, eps=args.gdc_eps)
    spec.validate()
    return spec


def gdc_params(spec: GdcSpec | None) -> dict | None:
    return None if spec is None else asdict(spec)


# ------------------------------------------------------------------------------- locations
def default_data_dir(name: str) -> Path:
    base = os.environ.get("DISTRUN_DATA_DIR")
    if base:
        return Path(base) / name
    return Path.home() / ".cache" / "distrun" / "datasets" / name


def cora_dir(data_dir: Path | None) -> Path:
    """The folder that holds (or will hold) the ind.cora.* files."""
    if data_dir is not None:
        # Accept both the folder holding ind.cora.* and its parent (a checkout's datasets/cora).
        d = Path(data_dir)
        if not (d / "ind.cora.x").exists() and (d / "raw" / "ind.cora.x").exists():
            d = d / "raw"
        return d
    return default_data_dir("cora") / "raw"


def reddit_dir(data_dir: Path | None) -> Path:
    return Path(data_dir) if data_dir is not None else default_data_dir("reddit")


def ensure_cora(data_dir: Path | None, download: bool = True) -> Path:
    """The Cora folder, downloading missing files into the default folder when none was named."""
    d = cora_dir(data_dir)
    if data_dir is None and download:
        missing = [n for n in CORA_SHA256 if not (d / n).exists()]
        if missing:
            d.mkdir(parents=True, exist_ok=True)
            for name in missing:
                _download(CORA_URL.format(name=name), d / name, CORA_SHA256[name])
    return d


def _download(url: str, dest: Path, sha256: str) -> None:
    import urllib.request  # here, not at the top: the partitioner's reuse check never needs it

    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as f:
            f.write(resp.read())
    except OSError as exc:
        raise DatasetError(
            f"could not download {url} ({exc}); fetch it by hand into {dest.parent} or pass --data-dir"
        ) from None
    got = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if got != sha256:
        tmp.unlink()
        raise DatasetError(f"downloaded {url} has sha256 {got}, expected {sha256}; not using it")
    tmp.replace(dest)


# --------------------------------------------------------------------------------- digests
def cora_digest(file_digests: dict[str, str]) -> str:
    return hashlib.sha256(("".join(sorted(file_digests.values())) + "|rownorm").encode()).hexdigest()


def reddit_digest(file_digests: list[str]) -> str:
    h = hashlib.sha256()
    for d in file_digests:
        h.update(d.encode())
    return h.hexdigest()


def synthetic_digest(spec: SyntheticSpec) -> str:
    return hashlib.sha256(repr((SYNTHETIC_VERSION, spec)).encode()).hexdigest()


def verified_cora_digests(d: Path, memo: DigestMemo | None = None) -> dict[str, str]:
    """Digest of every ind.cora.* file in ``d``, each checked against the Planetoid original."""
    memo = memo or DigestMemo()
    out: dict[str, str] = {}
    for name, expected in CORA_SHA256.items():
        path = d / name
        if not path.is_file():
            raise DatasetError(
                f"{path}: missing; pass --data-dir with the Planetoid ind.cora.* files "
                f"or leave it out to download them"
            )
        got = memo.sha256(path)
        if got != expected:
            raise DatasetError(
                f"{path}: sha256 {got[:12]}... does not match the Planetoid file "
                f"({expected[:12]}...); delete it and download again"
            )
        out[name] = got
    return out


def source_digest(name: str, data_dir: Path | None, synthetic: SyntheticSpec | None = None,
                  memo: DigestMemo | None = None) -> str | None:
    """What identifies the dataset's input, from its spec or its files' memoised digests, without
    loading it. None when that needs the loader (files missing or to be downloaded): the caller
    then loads the graph and uses its ``digest``, which is computed the same way."""
    memo = memo or DigestMemo()
    try:
        if name == "synthetic":
            return synthetic_digest(synthetic or SyntheticSpec())
        if name == "cora":
            return cora_digest(verified_cora_digests(cora_dir(data_dir), memo))
        if name == "reddit":
            d = reddit_dir(data_dir)
            return reddit_digest([memo.sha256(d / f) for f in REDDIT_FILES])
    except (OSError, DatasetError):
        return None
    return None


def describe(name: str, synthetic: SyntheticSpec | None) -> dict:
    """The dataset part of a partition's recorded parameters."""
    out: dict = {"dataset": name}
    if name == "synthetic":
        out["synthetic"] = asdict(synthetic or SyntheticSpec())
    return out


def load(name: str, data_dir: Path | None = None, synthetic: SyntheticSpec | None = None) -> "Graph":
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    import loaders

    return loaders.load(name, data_dir, synthetic)


def json_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
