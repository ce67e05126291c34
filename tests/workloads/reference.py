"""An independent single-process GCN in float64 numpy with a dense Â and hand-written gradients.

Deliberately shares no code with workloads/ beyond the parameter initialisation (the thing under
comparison is the computation, not the random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Reference:
    logits: np.ndarray
    loss: float
    grads: dict[str, np.ndarray]


def dense_norm_adj(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    a = np.zeros((num_nodes, num_nodes))
    a[src, dst] = 1.0
    a = np.maximum(a, a.T)
    np.fill_diagonal(a, 1.0)
    d = a.sum(1)
    return a / np.sqrt(d)[:, None] / np.sqrt(d)[None, :]


def gcn_reference(adj: np.ndarray, x: np.ndarray, labels: np.ndarray, train: np.ndarray,
                  params: dict[str, np.ndarray]) -> Reference:
    w1, b1, w2, b2 = (params[k].astype(np.float64) for k in ("W1", "b1", "W2", "b2"))
    ax = adj @ x.astype(np.float64)
    a1 = ax @ w1 + b1
    h = np.maximum(a1, 0.0)
    ah = adj @ h
    z = ah @ w2 + b2
    zs = z - z.max(1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
    idx = np.flatnonzero(train)
    loss = -logp[idx, labels[idx]].sum() / idx.size
    dz = np.exp(logp)
    dz[np.arange(len(labels)), labels] -= 1.0
    dz *= train[:, None] / idx.size
    dh = adj.T @ dz @ w2.T
    da1 = dh * (a1 > 0)
    grads = {"W1": ax.T @ da1, "b1": da1.sum(0), "W2": ah.T @ dz, "b2": dz.sum(0)}
    return Reference(z, float(loss), grads)


def dense_gdc(num_nodes: int, src: np.ndarray, dst: np.ndarray, alpha: float, topk: int | None = None,
              eps: float | None = None) -> np.ndarray:
    """GDC's propagation matrix by the matrix inverse (Klicpera et al. 2019, PPR kernel):
    S = alpha (I - (1 - alpha) T)^-1 with T the symmetric normalisation of A + I; row i keeps its
    top-k entries (ties to the lower column) or those >= eps (and always its diagonal), then is
    normalised to sum to one."""
    t = dense_norm_adj(num_nodes, src, dst)
    s = alpha * np.linalg.inv(np.eye(num_nodes) - (1.0 - alpha) * t)
    p = np.zeros_like(s)
    for i in range(num_nodes):
        row = s[i]
        if eps is not None:
            keep = np.union1d(np.flatnonzero(row >= eps), [i])
        else:
            keep = np.argsort(-row, kind="stable")[:topk]
        p[i, keep] = row[keep] / row[keep].sum()
    return p
