"""Halo exchange over MPI with numpy buffers: forward fills halo rows, backward returns their grads.

Forward: part p sends rows ``send_idx`` (grouped by destination) and receives its halo rows
grouped by owner; the partitioner wrote both lists in the same order, so one Alltoallv suffices.
Backward is the adjoint of that gather: the gradient arriving at a halo row goes back to the rank
that owns the node and is *added* to that node's gradient (a node can be a halo on several parts,
and is also used locally, so contributions accumulate rather than overwrite).

A layer that aggregates its input first (Â·X before ·W) needs the halo's rows of X, which take
no gradient: they travel once (``rows``); dropout then needs, each epoch, the mask the owner drew
for each of those rows, which travels as bits (``mask_rows``, 8 bytes per 64 features).
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

    @property
    def alone(self) -> bool:
        return self.comm is None or self.comm.Get_size() == 1

    def _alltoallv(self, send: np.ndarray, scounts: np.ndarray, rcounts: np.ndarray, width: int) -> np.ndarray:
        recv = np.empty((int(rcounts.sum()), width), dtype=send.dtype)
        if self.alone:
            return recv  # nothing to exchange: every count is zero
        sc = scounts * width
        rc = rcounts * width
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
        self.comm.Alltoallv([np.ascontiguousarray(send), (sc, sd)], [recv, (rc, rd)])
        return recv

    def add_back(self, grad: np.ndarray, back: np.ndarray) -> np.ndarray:
        """Adds the rows the backward exchange brought (``back``) to the owned rows' gradient ``grad`` (in place)."""
        # A node may be sent to several parts, but at most once to each: within one
        # destination's slice the indices are distinct, so a plain += per slice adds them all
        # (np.add.at would too, many times slower).
        start = 0
        for count in self.send_counts:
            end = start + int(count)
            grad[self.send_idx[start:end]] += back[start:end]
            start = end
        return grad

    def gather(self, owned_rows: np.ndarray) -> np.ndarray:
        """Rows of the halo nodes, in halo order."""
        width = owned_rows.shape[1]
        return self._alltoallv(owned_rows[self.send_idx], self.send_counts, self.recv_counts, width)

    def rows(self, owned_rows: np.ndarray) -> np.ndarray:
        """[owned rows; the halo's rows], for an array no gradient flows into. Collective: every
        rank calls it, also one whose halo is empty (others may need its rows)."""
        if self.alone:
            return owned_rows
        return np.concatenate([owned_rows, self.gather(owned_rows)])

    def mask_rows(self, keep: np.ndarray) -> np.ndarray:
        """[this rank's boolean mask; the owners' masks of the halo rows], sent as bits. Collective."""
        if self.alone:
            return keep
        bits = pack_bits(keep[self.send_idx])
        got = self._alltoallv(bits, self.send_counts, self.recv_counts, bits.shape[1])
        return np.concatenate([keep, unpack_bits(got, keep.shape[1])])

    def scatter_add_back(self, halo_grad: np.ndarray, grad: np.ndarray | None = None) -> np.ndarray:
        """Gradient w.r.t. the owned rows contributed by other ranks' use of them as halo, added to
        ``grad`` (in place; zeros when not given). Collective."""
        width = halo_grad.shape[1]
        back = self._alltoallv(halo_grad, self.recv_counts, self.send_counts, width)
        if grad is None:
            grad = np.zeros((self.num_owned, width), dtype=halo_grad.dtype)
        return self.add_back(grad, back)


def pack_bits(keep: np.ndarray) -> np.ndarray:
    """Boolean rows as bytes, 8 columns per byte (the last byte of a row may be partial)."""
    return np.packbits(keep, axis=1)


def unpack_bits(bits: np.ndarray, width: int) -> np.ndarray:
    """The boolean rows ``pack_bits`` packed, ``width`` columns each."""
    return np.unpackbits(bits, axis=1, count=width).view(np.bool_)
