"""GDC's approximate PPR against the exact diffusion computed with a matrix inverse.

The push (workloads/gdc.py) leaves at most tol * d~(v) of residual at every node v of every
source's PPR vector, so its error shrinks in proportion to tol. Stated tolerances, measured on a
120-node random graph with hubs (degrees 1 to ~30), alpha 0.05, every entry kept:
  - every entry of P within 300 * tol of the exact P (1.5e-3 at tol 1e-5, 1.5e-4 at 1e-6), and
    ten times closer for a ten times smaller tol;
  - at the default tol 1e-4, every row within 0.1 of the exact row in L1 (out of 2).
Sparsified (top-k or eps), the same entries are kept wherever the exact values are not within
that error of the cut (relative gap > 5e-3 at tol 1e-6), and the kept values agree to the same
tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

import gdc
import loaders
from datasets import GdcSpec
from reference import dense_gdc

N = 120


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201
    rng = np.random.default_rng(11)
    # A random graph plus a few hubs: degrees from 1 to ~30, as in real graphs.
    src = np.concatenate([rng.integers(0, N, 3 * N), rng.integers(0, 5, N // 2)])
    dst = rng.integers(0, N, src.size)
    indptr, indices = loaders.symmetrise(src, dst, N)
    rows = np.repeat(np.arange(N), np.diff(indptr))
    return indptr, indices, rows


def as_dense(d: gdc.Diffusion) -> np.ndarray:
    out = np.zeros((N, N))
    out[np.repeat(np.arange(N), np.diff(d.indptr)), d.indices] = d.weights
    return out


def test_push_converges_to_the_exact_diffusion(graph):
    indptr, indices, rows = graph
    exact = dense_gdc(N, rows, indices, 0.05, topk=N)
    errors = {}
    for tol in (1e-4, 1e-5, 1e-6):
        approx = as_dense(gdc.diffuse(indptr, indices, GdcSpec(topk=N, tol=tol), batch=32))
        assert np.allclose(approx.sum(1), 1.0, atol=1e-5)
        errors[tol] = np.abs(approx - exact)
    assert errors[1e-4].sum(1).max() < 0.1
    for tol in (1e-5, 1e-6):
        assert errors[tol].max() < 300 * tol, (tol, errors[tol].max())
    assert errors[1e-6].max() < 0.2 * errors[1e-5].max() < 0.2 * 0.2 * errors[1e-4].max()


@pytest.mark.parametrize("alpha,topk", [(0.05, 16), (0.2, 4)])
def test_top_k_rows_match_the_exact_ones(graph, alpha: float, topk: int):
    indptr, indices, rows = graph
    tol = 1e-6
    exact = dense_gdc(N, rows, indices, alpha, topk=topk)
    full = dense_gdc(N, rows, indices, alpha, topk=N)  # only for the margins below
    approx = as_dense(gdc.diffuse(indptr, indices, GdcSpec(alpha=alpha, topk=topk, tol=tol)))
    ordered = -np.sort(-full, axis=1)
    # Rows whose k-th and (k+1)-th exact values differ by more than the push's relative error
    # (about 1e-3 at this tol) have one right answer; near-ties may go either way.
    clear = (ordered[:, topk - 1] - ordered[:, topk]) > 5e-3 * ordered[:, topk - 1]
    assert clear.mean() > 0.5
    assert np.array_equal(approx[clear] > 0, exact[clear] > 0)
    assert np.abs(approx[clear] - exact[clear]).max() < 300 * tol
    assert (np.count_nonzero(approx, axis=1) <= topk).all()


def test_threshold_rows_match_the_exact_ones(graph):
    indptr, indices, rows = graph
    eps, tol = 2e-3, 1e-6
    exact = dense_gdc(N, rows, indices, 0.05, eps=eps)
    approx = as_dense(gdc.diffuse(indptr, indices, GdcSpec(topk=None, eps=eps, tol=tol)))
    # S itself, to tell clear cases from entries within rounding of eps.
    s = 0.05 * np.linalg.inv(np.eye(N) - 0.95 * _sym_norm(rows, indices))
    clear = np.abs(s - eps) > 1e-4
    assert np.array_equal((approx > 0)[clear], (exact > 0)[clear])
    assert ((approx > 0) != (exact > 0)).sum() <= 0.01 * (exact > 0).sum()


def _sym_norm(rows: np.ndarray, indices: np.ndarray) -> np.ndarray:
    from reference import dense_norm_adj

    return dense_norm_adj(N, rows, indices)


def test_top_per_row_breaks_ties_by_column():
    row = np.array([0, 0, 0, 0, 1, 1, 2])
    score = np.array([0.5, 0.2, 0.5, 0.5, 0.1, 0.3, 0.7])
    keep = gdc.top_per_row(row, score, 3, 2)
    # Row 0 has three tied at 0.5: the two lowest columns (first in CSR order) win.
    assert keep.tolist() == [True, False, True, False, True, True, True]


def test_forked_workers_give_the_same_rows(graph):
    indptr, indices, _ = graph
    one = gdc.diffuse(indptr, indices, GdcSpec(topk=16), batch=8)
    two = gdc.diffuse(indptr, indices, GdcSpec(topk=16), batch=8, workers=2)
    assert np.array_equal(one.indptr, two.indptr) and np.array_equal(one.indices, two.indices)
    assert np.array_equal(one.weights, two.weights)


def test_isolated_node_keeps_only_itself():
    indptr = np.array([0, 1, 2, 2], dtype=np.int64)  # 0-1 joined, 2 alone
    indices = np.array([1, 0], dtype=np.int32)
    d = gdc.diffuse(indptr, indices, GdcSpec(topk=4))
    assert d.indices[d.indptr[2]:d.indptr[3]].tolist() == [2] and d.weights[-1] == pytest.approx(1.0)
