"""The numpy sparse product the Jittor trainers run on (graph.spmm): equal to the dense product,
with empty rows anywhere in a chunk, for any width and chunk size."""

from __future__ import annotations

import graph
import numpy as np
import pytest


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 64])
@pytest.mark.parametrize("width", [1, 8, 64])
def test_spmm_equals_the_dense_product_with_empty_rows(monkeypatch, chunk_bytes, width):
    monkeypatch.setattr(graph, "_SPMM_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(width)
    dense = rng.random((300, 120)) * (rng.random((300, 120)) < 0.05)
    dense[[0, 7, 8, 150, 298, 299]] = 0.0  # empty rows: first, adjacent, middle, last two
    rows, cols = np.nonzero(dense)
    m = graph.SparseRows.build(graph.csr_from_sorted(rows, cols, 300)[0], cols, dense[rows, cols].astype(np.float32),
                               (300, 120))
    h = rng.random((120, width)).astype(np.float32)
    g = rng.random((300, width)).astype(np.float32)
    np.testing.assert_allclose(m.matmul(h), dense @ h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.rmatmul_t(g), dense.T @ g, rtol=1e-5, atol=1e-6)
