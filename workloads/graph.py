"""Graph pieces shared by the trainers: CSR, GCN normalisation, numpy SpMM.

The GCN propagation matrix is Kipf & Welling's  = D^-1/2 (A + I) D^-1/2, where D counts each
node's neighbours plus its self loop; with GDC it is the sparsified diffusion P (gdc.py). On a
partition a rank holds the rows of that matrix for the nodes it owns; columns are local ids:
owned nodes first, then halo nodes (owned elsewhere). For Â each halo node's *global* degree
travels in the part file, so the local rows equal the global rows exactly; P's rows travel with
their weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Rows per SpMM chunk are chosen so the gathered neighbour rows of one chunk, [nnz_chunk, F], take
# about this many bytes: small enough to stay in cache and be reused by the allocator (a fresh
# gigabyte-sized temporary costs more in page faults than the arithmetic), large enough that the
# Python loop over chunks costs nothing. Measured: 4x faster than 4M-entry chunks at F = 64.
_SPMM_CHUNK_BYTES = 1 << 20


def csr_from_sorted(src: np.ndarray, dst: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of an edge list already sorted by src."""
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=num_rows), out=indptr[1:])
    return indptr, np.asarray(dst, dtype=np.int64)


@dataclass
class SparseRows:
    """A CSR matrix with float values and its transpose (needed for the backward pass)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    shape: tuple[int, int]
    t_indptr: np.ndarray
    t_indices: np.ndarray
    t_values: np.ndarray

    @classmethod
    def build(cls, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> "SparseRows":
        rows = np.repeat(np.arange(shape[0], dtype=np.int64), np.diff(indptr))
        order = np.argsort(indices, kind="stable")
        t_indptr, t_indices = csr_from_sorted(indices[order], rows[order], shape[1])
        return cls(indptr, indices, values, shape, t_indptr, t_indices, values[order])

    def split_columns(self, at: int) -> tuple["SparseRows", "SparseRows"]:
        """The columns before ``at`` and those from ``at`` on, as two matrices with these rows (a
        part's own nodes and its halo)."""
        rows = np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))
        out = []
        for keep, first, width in ((self.indices < at, 0, at), (self.indices >= at, at, self.shape[1] - at)):
            indptr, _ = csr_from_sorted(rows[keep], self.indices[keep], self.shape[0])
            out.append(SparseRows.build(indptr, self.indices[keep] - first, self.values[keep], (self.shape[0], width)))
        return out[0], out[1]

    def matmul(self, h: np.ndarray) -> np.ndarray:
        return spmm(self.indptr, self.indices, self.values, h, self.shape[0])

    def rmatmul_t(self, g: np.ndarray) -> np.ndarray:
        """Aᵀ g: how the gradient of A h flows back to h."""
        return spmm(self.t_indptr, self.t_indices, self.t_values, g, self.shape[1])


def spmm(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, h: np.ndarray, num_rows: int) -> np.ndarray:
    h = np.asarray(h)
    out = np.zeros((num_rows, h.shape[1]), dtype=h.dtype)
    nnz = int(indptr[-1])
    if nnz == 0:
        return out
    # Row boundaries so that each chunk covers about chunk_nnz entries.
    chunk_nnz = max(256, _SPMM_CHUNK_BYTES // max(1, h.shape[1] * h.itemsize))
    cuts = np.unique(np.searchsorted(indptr, np.arange(0, nnz, chunk_nnz), side="right") - 1)
    cuts = np.append(cuts[cuts < num_rows], num_rows)
    vals = values.astype(h.dtype, copy=False)
    # One buffer for every chunk's neighbour rows, filled and scaled in place, and each chunk's
    # sums written straight into its rows of the result: no temporaries per chunk.
    buf = np.empty((int(np.max(indptr[cuts[1:]] - indptr[cuts[:-1]])), h.shape[1]), dtype=h.dtype)
    for r0, r1 in zip(cuts[:-1], cuts[1:], strict=True):
        a, b = int(indptr[r0]), int(indptr[r1])
        if a == b:
            continue
        msgs = buf[: b - a]
        np.take(h, indices[a:b], axis=0, out=msgs)
        np.multiply(msgs, vals[a:b, None], out=msgs)
        starts = indptr[r0:r1] - a
        if starts[-1] < b - a and np.all(starts[1:] > starts[:-1]):  # no empty row (Â: every row has its self loop)
            np.add.reduceat(msgs, starts, axis=0, out=out[r0:r1])
            continue
        # reduceat over the starts of non-empty rows only: an empty row would otherwise
        # receive its neighbour's first entry instead of zero.
        nonempty = np.diff(indptr[r0 : r1 + 1]) > 0
        out[r0:r1][nonempty] = np.add.reduceat(msgs, starts[nonempty], axis=0)
    return out


def gcn_norm_local(
    indptr: np.ndarray, indices: np.ndarray, degree: np.ndarray, num_owned: int, dtype: type = np.float32
) -> SparseRows:
    """Rows of  for the owned nodes, with self loops added; columns are local ids.

    ``degree`` is the global neighbour count (without self loop) of every local node.
    """
    num_local = degree.shape[0]
    counts = np.diff(indptr)
    rows = np.repeat(np.arange(num_owned, dtype=np.int64), counts)
    # Append one self loop per owned row and re-sort by row so the result is CSR again.
    all_rows = np.concatenate([rows, np.arange(num_owned, dtype=np.int64)])
    all_cols = np.concatenate([indices, np.arange(num_owned, dtype=np.int64)])
    order = np.lexsort((all_cols, all_rows))
    all_rows, all_cols = all_rows[order], all_cols[order]
    d = degree.astype(np.float64) + 1.0
    inv_sqrt = 1.0 / np.sqrt(d)
    values = (inv_sqrt[all_rows] * inv_sqrt[all_cols]).astype(dtype)
    new_indptr, _ = csr_from_sorted(all_rows, all_cols, num_owned)
    return SparseRows.build(new_indptr, all_cols, values, (num_owned, num_local))


def propagation_rows(part: dict[str, np.ndarray]) -> SparseRows:
    """The rows of the propagation matrix a part holds (see partition.py for the arrays)."""
    n_own = int(part["owned_gid"].size)
    n_local = n_own + int(part["halo_gid"].size)
    if "weights" in part:
        return SparseRows.build(part["indptr"], part["indices"], part["weights"], (n_own, n_local))
    return gcn_norm_local(part["indptr"], part["indices"], part["degree"], n_own)


def glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)


def init_params(seed: int, num_features: int, hidden: int, num_classes: int) -> dict[str, np.ndarray]:
    """The one initialisation every workload uses, so all of them start from the same weights."""
    rng = np.random.default_rng(seed)
    return {
        "W1": glorot(rng, num_features, hidden),
        "b1": np.zeros(hidden, dtype=np.float32),
        "W2": glorot(rng, hidden, num_classes),
        "b2": np.zeros(num_classes, dtype=np.float32),
    }
