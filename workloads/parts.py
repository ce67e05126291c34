"""Metis membership, and the part files built and written one part at a time.

A partition is the rows of a propagation structure (CSR: ``indptr``, ``indices``, optional
``weights``) split by the owner of each row. For a plain GCN that structure is the symmetrised
graph itself and each part carries the global degrees, from which the trainer builds the rows of
D^-1/2 (A + I) D^-1/2. With GDC it is the sparsified diffusion P (self loops included, not
symmetric) and each part carries P's weights. Metis always sees an undirected graph: the graph,
or the symmetrised pattern of P.

Memory at Reddit size (114M entries): one int8/int16 owner per entry row, one boolean mask and
the int32 columns of the part being written; nothing holds every part at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datasets import METIS_MAX_EDGES, DatasetError

METHODS = ("kway", "recursive")


@dataclass
class Csr:
    indptr: np.ndarray  # int64 [N + 1]
    indices: np.ndarray  # int32
    weights: np.ndarray | None = None  # float32, aligned with indices (GDC); None: plain GCN

    @property
    def num_rows(self) -> int:
        return int(self.indptr.size - 1)


@dataclass
class Membership:
    owner: np.ndarray  # smallest integer dtype that holds num_parts - 1
    edge_cut: int  # undirected edges of the Metis graph between parts (all of them, not the sample)
    metis_seconds: float
    metis_edges: int  # directed entries Metis saw
    method: str


def owner_dtype(num_parts: int) -> type:
    return np.int8 if num_parts <= 127 else np.int16 if num_parts <= 32767 else np.int32


def sample_edges(g: Csr, max_edges: int, chunk: int = 1 << 23) -> tuple[Csr, float]:
    """Keep each undirected edge with probability max_edges / nnz, both directions or neither.

    A random 32-bit key per node (fixed seed) and the edge key (key[u] ^ key[v]) * odd constant,
    which is the same for (u, v) and (v, u), decide: the sample is deterministic, symmetric, and
    costs a few passes over 32-bit integers.
    """
    nnz = int(g.indices.size)
    if nnz <= max_edges:
        return g, 1.0
    rate = max_edges / nnz
    limit = np.uint32(min(2**32 - 1, int(rate * 2**32)))
    node_key = np.random.default_rng(0x5EED).integers(0, 2**32, g.num_rows, dtype=np.uint32)
    counts = np.zeros(g.num_rows, dtype=np.int64)
    kept: list[np.ndarray] = []
    # Row chunks so the temporaries stay near `chunk` entries.
    row_starts = np.searchsorted(g.indptr, np.arange(0, nnz, chunk), side="right") - 1
    bounds = np.unique(np.append(row_starts, g.num_rows))
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        a, b = int(g.indptr[r0]), int(g.indptr[r1])
        per_row = np.diff(g.indptr[r0 : r1 + 1])
        cols = g.indices[a:b]
        h = np.repeat(node_key[r0:r1], per_row)
        h ^= node_key[cols]
        h *= np.uint32(0x9E3779B1)
        keep = h < limit
        # Kept entries per row: a sum over each non-empty row's slice (reduceat over the starts
        # of non-empty rows only, since an empty row's start would take its neighbour's entry).
        nonempty = per_row > 0
        if keep.size:
            starts = (np.cumsum(per_row) - per_row)[nonempty]
            counts[r0:r1][nonempty] = np.add.reduceat(keep.view(np.uint8), starts, dtype=np.int64)
        kept.append(cols[keep])
    indptr = np.zeros(g.num_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Csr(indptr, np.concatenate(kept)), rate


def metis_membership(g: Csr, num_parts: int, method: str = "kway", max_edges: int = METIS_MAX_EDGES) -> Membership:
    """Metis parts of the undirected graph ``g`` (symmetric, no self loops)."""
    n = g.num_rows
    dtype = owner_dtype(num_parts)
    if num_parts == 1:
        return Membership(np.zeros(n, dtype=dtype), 0, 0.0, 0, method)
    import pymetis

    t0 = time.perf_counter()
    seen, _ = sample_edges(g, max_edges)
    # pymetis' indices are 64-bit: hand it int64 arrays so it does not copy them once more.
    adjacency = pymetis.CSRAdjacency(seen.indptr, seen.indices.astype(np.int64))
    _, parts = pymetis.part_graph(num_parts, adjacency, recursive=method == "recursive")
    metis_edges = int(seen.indices.size)
    del adjacency, seen
    owner = np.asarray(parts, dtype=np.int64).astype(dtype)
    seconds = time.perf_counter() - t0
    sizes = np.bincount(owner, minlength=num_parts)
    if sizes.min() == 0:
        raise DatasetError(f"Metis left a part empty: the graph is too small for {num_parts} parts")
    row_owner = np.repeat(owner, np.diff(g.indptr))
    cut = 0
    for a in range(0, row_owner.size, 1 << 24):
        cut += int(np.count_nonzero(row_owner[a : a + (1 << 24)] != owner[g.indices[a : a + (1 << 24)]]))
    return Membership(owner, cut // 2, seconds, metis_edges, method)


@dataclass
class PartsWritten:
    files: dict[str, dict] = field(default_factory=dict)  # name -> {"sha256", "bytes"}
    part_sizes: list[int] = field(default_factory=list)
    halo_sizes: list[int] = field(default_factory=list)
    nnz: list[int] = field(default_factory=list)
    seconds: float = 0.0


def halos(prop: Csr, owner: np.ndarray, num_parts: int, row_owner: np.ndarray) -> list[np.ndarray]:
    """For each part, the nodes owned elsewhere that its rows reference, sorted by (owner, id)."""
    n = prop.num_rows
    if num_parts == 1:
        return [np.zeros(0, dtype=np.int32)]
    needed = np.zeros((num_parts, n), dtype=bool)
    step = 1 << 24
    for a in range(0, prop.indices.size, step):
        ro = row_owner[a : a + step]
        cols = prop.indices[a : a + step]
        cross = ro != owner[cols]
        needed[ro[cross], cols[cross]] = True
    out = []
    for p in range(num_parts):
        h = np.flatnonzero(needed[p]).astype(np.int32)
        out.append(h[np.argsort(owner[h], kind="stable")])
    return out


def _save(path: Path, arrays: dict[str, np.ndarray], hash_file) -> dict:  # noqa: ANN001
    np.savez(path, **arrays)
    return {"sha256": hash_file(path), "bytes": path.stat().st_size}


def write_parts(folder: Path, prop: Csr, features: np.ndarray, labels: np.ndarray, masks: dict[str, np.ndarray],
                owner: np.ndarray, num_parts: int, hash_file) -> PartsWritten:  # noqa: ANN001
    """Write ``part-<p>.npz`` for every part, one at a time; ``hash_file(path)`` digests each.

    One writer thread saves and hashes part p (zlib and hashlib release the GIL) while part p + 1
    is built, so at most two parts' arrays exist at once.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    t0 = time.perf_counter()
    n = prop.num_rows
    degree = np.diff(prop.indptr)
    row_owner = np.repeat(owner, degree) if num_parts > 1 else np.zeros(0, owner.dtype)
    halo = halos(prop, owner, num_parts, row_owner)
    num_train = int(masks["train_mask"].sum())
    g2l = np.full(n, -1, dtype=np.int32)
    out = PartsWritten()
    pending: list[tuple[str, Future]] = []
    with ThreadPoolExecutor(max_workers=1) as writer:
        for p in range(num_parts):
            own = np.flatnonzero(owner == p).astype(np.int32)
            h = halo[p]
            g2l[own] = np.arange(own.size, dtype=np.int32)
            g2l[h] = own.size + np.arange(h.size, dtype=np.int32)
            if num_parts == 1:
                indices = g2l[prop.indices]
                weights = prop.weights
            else:
                mine = row_owner == p
                indices = g2l[prop.indices[mine]]
                weights = prop.weights[mine] if prop.weights is not None else None
                del mine
            indptr = np.zeros(own.size + 1, dtype=np.int64)
            np.cumsum(degree[own], out=indptr[1:])
            # What p sends to q = q's halo nodes owned by p, in q's order.
            sends = [halo[q][owner[halo[q]] == p] for q in range(num_parts)]
            send_counts = np.array([s.size for s in sends], dtype=np.int64)
            send_idx = g2l[np.concatenate(sends)] if send_counts.sum() else np.zeros(0, np.int32)
            halo_owner = owner[h]
            arrays = {
                "owned_gid": own,
                "halo_gid": h,
                "halo_owner": halo_owner,
                "indptr": indptr,
                "indices": indices,
                "send_idx": send_idx,
                "send_counts": send_counts,
                "recv_counts": np.bincount(halo_owner, minlength=num_parts).astype(np.int64),
                "features": features[own],
                "labels": labels[own],
                **{k: m[own] for k, m in masks.items()},
                "part_id": np.int64(p),
                "num_parts": np.int64(num_parts),
                "num_nodes": np.int64(n),
                "num_train": np.int64(num_train),
            }
            if weights is not None:
                arrays["weights"] = weights
            else:
                arrays["degree"] = degree[np.concatenate([own, h])].astype(np.int32)
            out.part_sizes.append(int(own.size))
            out.halo_sizes.append(int(h.size))
            out.nnz.append(int(indices.size))
            g2l[own] = -1
            g2l[h] = -1
            for _, done in pending:
                done.result()  # the previous part is on disk before this one is queued
            name = f"part-{p}.npz"
            pending.append((name, writer.submit(_save, folder / name, arrays, hash_file)))
            del arrays, indices, weights
        for name, done in pending:
            out.files[name] = done.result()
    out.seconds = time.perf_counter() - t0
    return out


def symmetric_pattern(prop: Csr) -> Csr:
    """The undirected graph Metis partitions for a non-symmetric structure: P's pattern and its
    transpose, diagonal dropped."""
    from loaders import symmetrise

    rows = np.repeat(np.arange(prop.num_rows, dtype=np.int32), np.diff(prop.indptr))
    indptr, indices = symmetrise(rows, prop.indices, prop.num_rows)
    return Csr(indptr, indices)
