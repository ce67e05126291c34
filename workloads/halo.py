"""Halo exchange over MPI with numpy buffers: forward fills halo rows, backward returns their grads.

Forward: part p sends rows ``send_idx`` (grouped by destination) and receives its halo rows
grouped by owner; the partitioner wrote both lists in the same order, so one Alltoallv suffices.
Backward is the adjoint of that gather: the gradient arriving at a halo row goes back to the rank
that owns the node and is *added* to that node's gradient (a node can be a halo on several parts,
and is also used locally, so contributions accumulate rather than overwrite).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Halo:
    comm: Any  # mpi4py communicator; unused when there is one rank
    num_owned: int
    send_idx: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray

    @property
    def num_halo(self) -> int:
        return int(self.recv_counts.sum())

    def _alltoallv(self, send: np.ndarray, scounts: np.ndarray, rcounts: np.ndarray, width: int) -> np.ndarray:
        recv = np.empty((int(rcounts.sum()), width), dtype=send.dtype)
        if self.comm is None or self.comm.Get_size() == 1:
            return recv  # nothing to exchange: every count is zero
        sc = scounts * width
        rc = rcounts * width
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
        self.comm.Alltoallv([np.ascontiguousarray(send), (sc, sd)], [recv, (rc, rd)])
        return recv

    def gather(self, owned_rows: np.ndarray) -> np.ndarray:
        """Rows of the halo nodes, in halo order."""
        width = owned_rows.shape[1]
        return self._alltoallv(owned_rows[self.send_idx], self.send_counts, self.recv_counts, width)

    def scatter_add_back(self, halo_grad: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. the owned rows contributed by other ranks' use of them as halo."""
        width = halo_grad.shape[1]
        back = self._alltoallv(np.ascontiguousarray(halo_grad), self.recv_counts, self.send_counts, width)
        out = np.zeros((self.num_owned, width), dtype=halo_grad.dtype)
        # A node may be sent to several parts, but at most once to each: within one
        # destination's slice the indices are distinct, so a plain += per slice adds them all
        # (np.add.at would too, many times slower).
        start = 0
        for count in self.send_counts:
            end = start + int(count)
            out[self.send_idx[start:end]] += back[start:end]
            start = end
        return out
