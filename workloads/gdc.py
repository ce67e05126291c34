"""Graph diffusion convolution (Klicpera, Weissenberger & Guennemann, NeurIPS 2019), PPR kernel.

The diffusion is  S = alpha (I - (1 - alpha) T)^-1  with  T = D~^-1/2 (A + I) D~^-1/2  (self
loops added, d~ = degree + 1). Each node i keeps the ``topk`` largest entries of S[i, :] (or the
entries >= ``eps``) and its kept weights are normalised to sum to one; the result P replaces the
GCN's propagation matrix, so a layer computes  P H W  (as in the paper's experiments and PyG's
``GDC(normalization_out="col")`` followed by GCNConv without renormalisation). P is not symmetric.

Computing S exactly costs an N x N inverse. Instead, every node's PPR vector is approximated by
a synchronous push (Andersen, Chung & Lang 2006), run for a batch of source nodes at once: with
the random-walk form  pi_s = alpha sum_t ((1 - alpha) W)^t e_s,  W = (A + I) D~^-1,  a residual
entry r(v) is pushed (alpha r(v) kept, the rest spread over v's neighbours) while
r(v) >= tol * d~(v). Whatever residual is left is kept in place, so the error of every column is
at most the residual mass left unpushed, and tol -> 0 gives the exact diffusion. Because S is
symmetric and  S[v, s] = pi_s(v) sqrt(d~_s / d~_v),  the push from s yields row s of S; the
sqrt(d~_s) factor cancels in the normalisation and the top-k ranks pi_s(v) / sqrt(d~_v).

Memory is bounded by the batch: the accumulators hold N x BATCH values (float64) and the
residual about BATCH x (2-hop neighbourhood) entries; the result holds N x topk entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datasets import GdcSpec

BATCH = 64  # source nodes pushed together: N x BATCH accumulators, about 120 MB for Reddit's N
MAX_ROUNDS = 100_000


@dataclass
class Diffusion:
    """Row-normalised sparsified PPR matrix P in CSR form; row i = the weights node i aggregates."""

    indptr: np.ndarray  # int64 [N + 1]
    indices: np.ndarray  # int32, ascending within each row, diagonal included
    weights: np.ndarray  # float32, each row sums to 1
    rounds: int  # largest number of push rounds any batch needed
    pushes: int  # total residual entries pushed

    @property
    def nnz(self) -> int:
        return int(self.indices.size)


def ragged_gather(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the CSR entries of ``rows`` (concatenated) and each row's entry count."""
    counts = indptr[rows + 1] - indptr[rows]
    total = int(counts.sum())
    ends = np.cumsum(counts)
    pos = np.repeat(indptr[rows] - (ends - counts), counts) + np.arange(total, dtype=np.int64)
    return pos, counts


class _Scratch:
    """Dense B x N state of one batch (residual, estimate) plus a slot per cell used to list the
    distinct cells a set of keys touches. A cell's key is column * N + node, so the cells of one
    source stay within one N-long stretch (cache-friendly). Reused from batch to batch: only
    touched cells are read back and cleared, so a batch costs what its pushes cost."""

    def __init__(self, num_nodes: int, batch: int) -> None:
        self.n = num_nodes
        self.r = np.zeros(num_nodes * batch, dtype=np.float64)
        self.p = np.zeros(num_nodes * batch, dtype=np.float64)
        self.claim = np.zeros(num_nodes * batch, dtype=np.int64)
        self.seen = np.zeros(num_nodes * batch, dtype=bool)

    def distinct(self, keys: np.ndarray) -> np.ndarray:
        order = np.arange(keys.size, dtype=np.int64)
        self.claim[keys] = order
        return keys[self.claim[keys] == order]


def with_self_loops(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of A + I: every row's neighbours followed by the node itself."""
    n = indptr.size - 1
    counts = np.diff(indptr) + 1
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=out_ptr[1:])
    out = np.empty(int(out_ptr[-1]), dtype=np.int64)
    selfpos = out_ptr[1:] - 1
    mask = np.ones(out.size, dtype=bool)
    mask[selfpos] = False
    out[mask] = indices
    out[selfpos] = np.arange(n)
    return out_ptr, out


def push_batch(loop_ptr: np.ndarray, loop_idx: np.ndarray, dtil: np.ndarray, sources: np.ndarray, alpha: float,
               tol: float, st: _Scratch) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Approximate PPR vectors of ``sources``: (keys = column * N + node, pi), keys ascending.

    ``loop_ptr``/``loop_idx`` is the CSR of A + I. Synchronous push: each round pushes every
    cell whose residual reached its threshold; only cells that received something in the last
    round can have crossed it, so only those are looked at.
    """
    beta = 1.0 - alpha
    n = np.int64(st.n)
    act = np.arange(sources.size, dtype=np.int64) * n + sources
    st.r[act] = 1.0
    st.seen[act] = True
    touched = [act]
    rounds = pushes = 0
    while act.size and rounds < MAX_ROUNDS:
        rounds += 1
        pushes += int(act.size)
        val = st.r[act]
        st.p[act] += alpha * val
        st.r[act] = 0.0
        node = act % n
        # Spread beta * r(v) evenly over v's neighbours and v itself (the self loop).
        pos, counts = ragged_gather(loop_ptr, node)
        nb = loop_idx[pos]
        msg = np.repeat(act - node, counts)
        msg += nb
        np.add.at(st.r, msg, np.repeat(beta * val / dtil[node], counts))
        new = msg[~st.seen[msg]]
        if new.size:
            new = st.distinct(new)
            st.seen[new] = True
            touched.append(new)
        over = msg[st.r[msg] >= tol * dtil[nb]]
        act = st.distinct(over) if over.size else over
    keys = np.sort(np.concatenate(touched))
    # What was never pushed still belongs to its node: alpha * r is its first-order share.
    pi = st.p[keys] + alpha * st.r[keys]
    st.p[keys] = 0.0
    st.r[keys] = 0.0
    st.seen[keys] = False
    return keys, pi, rounds, pushes


def top_per_row(row: np.ndarray, score: np.ndarray, num_rows: int, k: int) -> np.ndarray:
    """Mask of the k largest scores of every row (entries sorted by row, then by column); ties at
    the boundary go to the lower column, as a stable descending sort would choose."""
    counts = np.bincount(row, minlength=num_rows)
    if counts.max(initial=0) <= k:
        return np.ones(row.size, dtype=bool)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(row.size) - starts[row]
    grid = np.full((num_rows, int(counts.max())), -np.inf)
    grid[row, pos] = score
    kth = -np.partition(-grid, k - 1, axis=1)[:, k - 1]  # k-th largest; -inf where a row has < k
    above = score > kth[row]
    tie = score == kth[row]
    # Ties fill what the strictly larger entries leave of k, in column order.
    room = k - np.bincount(row, weights=above, minlength=num_rows).astype(np.int64)
    tie_cum = np.cumsum(tie)
    tie_before = tie_cum - tie - (tie_cum - tie)[starts][row]
    return above | (tie & (tie_before < room[row]))


def _rows(indptr: np.ndarray, indices: np.ndarray, spec: GdcSpec, lo: int, hi: int, batch: int) -> tuple:
    """Rows lo..hi-1 of P: (row_counts, indices, weights, rounds, pushes)."""
    num_nodes = int(indptr.size - 1)
    dtil = np.diff(indptr).astype(np.float64) + 1.0
    inv_sqrt = 1.0 / np.sqrt(dtil)
    st = _Scratch(num_nodes, batch)
    loop_ptr, loop_idx = with_self_loops(indptr, indices)
    row_counts = np.zeros(hi - lo, dtype=np.int64)
    out_idx: list[np.ndarray] = []
    out_w: list[np.ndarray] = []
    max_rounds = total_pushes = 0
    for b0 in range(lo, hi, batch):
        sources = np.arange(b0, min(b0 + batch, hi), dtype=np.int64)
        keys, pi, rounds, pushes = push_batch(loop_ptr, loop_idx, dtil, sources, spec.alpha, spec.tol, st)
        max_rounds, total_pushes = max(max_rounds, rounds), total_pushes + pushes
        row, node = keys // num_nodes, keys % num_nodes  # row of P = the source of the push
        score = pi * inv_sqrt[node]  # S[source, node] / sqrt(d~_source): the ranking within the row
        if spec.eps is not None:
            keep = score * np.sqrt(dtil[sources[row]]) >= spec.eps
            keep |= node == sources[row]  # the diagonal, the largest entry of a row, always stays
        else:
            keep = top_per_row(row, score, sources.size, int(spec.topk))
        row, node, score = row[keep], node[keep], score[keep]
        sums = np.bincount(row, weights=score, minlength=sources.size)
        row_counts[sources - lo] = np.bincount(row, minlength=sources.size)
        out_idx.append(node.astype(np.int32))
        out_w.append((score / sums[row]).astype(np.float32))
    empty_i, empty_w = np.zeros(0, np.int32), np.zeros(0, np.float32)
    return (row_counts, np.concatenate(out_idx) if out_idx else empty_i,
            np.concatenate(out_w) if out_w else empty_w, max_rounds, total_pushes)


_FORKED: dict = {}


def _rows_in_child(bounds: tuple[int, int]) -> tuple:
    g = _FORKED
    return _rows(g["indptr"], g["indices"], g["spec"], bounds[0], bounds[1], g["batch"])


def diffuse(indptr: np.ndarray, indices: np.ndarray, spec: GdcSpec, batch: int = BATCH, workers: int = 1) -> Diffusion:
    """The sparsified, row-normalised PPR diffusion of a symmetric graph without self loops.

    ``workers`` > 1 splits the rows over that many forked processes (each with its own
    N x BATCH scratch); only for callers that may fork (not under MPI).
    """
    spec.validate()
    num_nodes = int(indptr.size - 1)
    indptr = np.asarray(indptr, dtype=np.int64)
    batch = max(1, min(batch, num_nodes))
    # Enough slices per worker that an unlucky slice of heavy rows does not leave a core idle.
    workers = max(1, min(workers, num_nodes // (batch * 4) or 1))
    if workers == 1:
        chunks = [_rows(indptr, indices, spec, 0, num_nodes, batch)]
    else:
        import multiprocessing

        step = -(-num_nodes // (workers * 8) // batch) * batch
        bounds = [(lo, min(lo + step, num_nodes)) for lo in range(0, num_nodes, step)]
        _FORKED.update(indptr=indptr, indices=indices, spec=spec, batch=batch)
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                chunks = pool.map(_rows_in_child, bounds, chunksize=1)
        finally:
            _FORKED.clear()
    out_indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.concatenate([c[0] for c in chunks]), out=out_indptr[1:])
    return Diffusion(out_indptr, np.concatenate([c[1] for c in chunks]), np.concatenate([c[2] for c in chunks]),
                     max(c[3] for c in chunks), sum(c[4] for c in chunks))
