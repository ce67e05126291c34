"""What the Jittor trainers share: the environment Jittor needs before import, starting Jittor and
MPI, the numpy-backed SpMM and the propagation with its halo exchange as jt.Functions, the allreduce, the masked loss.

Import this module before numpy-heavy work and before Jittor: it sets Jittor's import-time
variables (a CUDA nvcc without its runtime makes Jittor fail, and MKL/oneDNN would be
downloaded). The user's own settings win.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("nvcc_path", "")
os.environ.setdefault("use_mkl", "0")

import numpy as np  # noqa: E402

import common  # noqa: E402
from graph import SparseRows  # noqa: E402
from halo import Halo  # noqa: E402


@dataclass
class JittorMpi:
    jt: Any
    MPI: Any
    comm: Any
    rank: int
    world: int

    def global_sum(self, v: np.ndarray) -> np.ndarray:
        """Sum of a float64 vector over ranks (one Allreduce)."""
        v = np.ascontiguousarray(v, dtype=np.float64)
        if self.world == 1:
            return v
        out = np.empty_like(v)
        self.comm.Allreduce(v, out, op=self.MPI.SUM)
        return out


def start(args: argparse.Namespace) -> JittorMpi:
    """Import Jittor, then mpi4py, and check the world size against --num-parts.

    Jittor first: the other order aborts inside MPI_Init under mpirun (see docs/testbed.md).
    """
    import jittor as jt
    from mpi4py import MPI

    # Dense matmuls run on the GPU when Jittor found CUDA (nvcc_path set by the user); the
    # sparse propagation and the MPI exchanges run in numpy on the host either way.
    jt.flags.use_cuda = 1 if jt.has_cuda else 0
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    common.check_world(args, world)
    return JittorMpi(jt, MPI, comm, rank, world)


@dataclass
class CommStats:
    """Time spent in, and bytes sent by, one rank's exchanges since the last reset."""

    seconds: float = 0.0
    bytes_sent: int = 0

    def reset(self) -> None:
        self.seconds, self.bytes_sent = 0.0, 0


def functions(jt: Any, stats: CommStats | None = None):  # noqa: ANN201
    """(SpMM, Propagate, AllReduceSum) as jt.Function classes bound to this Jittor."""
    stats = stats or CommStats()

    class SpMM(jt.Function):
        """A h for a fixed sparse A (numpy CSR); the gradient is Aᵀ g."""

        def __init__(self, adj: SparseRows) -> None:
            self.adj = adj

        def execute(self, h):  # noqa: ANN001,ANN201
            return jt.array(self.adj.matmul(h.numpy()))

        def grad(self, g):  # noqa: ANN001,ANN201
            return jt.array(self.adj.rmatmul_t(g.numpy()))

    class Propagate(jt.Function):
        """A · [h; the halo's rows of h], A with the rank's own columns first, then its halo's.
        Forward: the halo rows arrive, then one product over every column; backward: one product
        with Aᵀ, whose halo rows' gradients travel back to their owners and are added to their
        nodes' gradients there. mpi4py's non-blocking collectives move data only inside MPI calls,
        so a product run while they are pending does not overlap them: splitting A into its own
        and halo columns to do so cost a second pass over the rows and overlapped nothing."""

        def __init__(self, adj: SparseRows, halo: Halo) -> None:
            self.adj, self.halo = adj, halo

        def execute(self, h):  # noqa: ANN001,ANN201
            a = h.numpy()
            t0 = time.perf_counter()
            recv = self.halo.gather(a)
            stats.seconds += time.perf_counter() - t0
            stats.bytes_sent += int(self.halo.send_idx.size) * a.shape[1] * a.itemsize
            return jt.array(self.adj.matmul(np.concatenate([a, recv]) if recv.shape[0] else a))

        def grad(self, g):  # noqa: ANN001,ANN201
            g = g.numpy()
            full = self.adj.rmatmul_t(g)
            n = self.halo.num_owned
            t0 = time.perf_counter()
            grad = self.halo.scatter_add_back(full[n:], full[:n])
            stats.seconds += time.perf_counter() - t0
            stats.bytes_sent += int(self.halo.num_halo) * g.shape[1] * g.itemsize
            return jt.array(grad)

    class AllReduceSum(jt.Function):
        """Sum over ranks; the backward is the identity (each rank's loss is the replicated total)."""

        def __init__(self, comm: Any, MPI: Any) -> None:  # noqa: N803
            self.comm, self.MPI = comm, MPI

        def execute(self, h):  # noqa: ANN001,ANN201
            a = np.ascontiguousarray(h.numpy())
            if self.comm.Get_size() > 1:
                out = np.empty_like(a)
                t0 = time.perf_counter()
                self.comm.Allreduce(a, out, op=self.MPI.SUM)
                stats.seconds += time.perf_counter() - t0
                stats.bytes_sent += a.nbytes
                a = out
            return jt.array(a)

        def grad(self, g):  # noqa: ANN001,ANN201
            return g

    return SpMM, Propagate, AllReduceSum


def masked_aggregate(halo: Halo, adj: SparseRows, x_all: np.ndarray, keep: np.ndarray,
                     stats: CommStats | None = None) -> np.ndarray:
    """A · (x_all masked by the owners' dropout masks): ``keep`` is this rank's mask of its own rows;
    the halo rows' masks arrive as bits, then one product over every column. Collective."""
    stats = stats or CommStats()
    t0 = time.perf_counter()
    masks = halo.mask_rows(keep)
    stats.seconds += time.perf_counter() - t0
    stats.bytes_sent += int(halo.send_idx.size) * ((keep.shape[1] + 7) // 8)
    return adj.matmul(x_all * masks)


def onehot_train(labels: np.ndarray, train_mask: np.ndarray, num_classes: int) -> np.ndarray:
    out = np.zeros((labels.shape[0], num_classes), dtype=np.float32)
    idx = np.flatnonzero(train_mask)
    out[idx, labels[idx]] = 1.0
    return out


def masked_cross_entropy(jt: Any, logits, onehot, num_train: int):  # noqa: ANN001,ANN201
    """Sum of the cross-entropy over the rows whose one-hot is set, divided by num_train. Rows of
    other nodes are zero, so the loss still depends on every logit (every rank takes part in
    every backward exchange even with no training nodes of its own)."""
    z = logits - logits.max(dim=1, keepdims=True).stop_grad()
    logp = z - jt.log(jt.exp(z).sum(dim=1, keepdims=True))
    return -(onehot * logp).sum() / num_train
