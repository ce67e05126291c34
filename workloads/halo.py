"""Halo exchange over MPI with numpy buffers: forward fills halo rows, backward returns their grads.

Forward: part p sends rows ``send_idx`` (grouped by destination) and receives its halo rows
grouped by owner; the partitioner wrote both lists in the same order, so one Alltoallv suffices.
Backward is the adjoint of that gather: the gradient arriving at a halo row goes back to the rank
that owns the node and is *added* to that node's gradient (a node can be a halo on several parts,
and is also used locally, so contributions accumulate rather than overwrite).

``start_gather`` and ``start_scatter`` begin the same exchanges without waiting, so a product that
does not need the halo rows (the one over the rank's own columns) runs while they travel.

A layer that aggregates its input first (Â·X before ·W) needs the halo's rows of X, which take
no gradient: they travel once (``rows``); dropout then needs, each epoch, the mask the owner drew
for each of those rows, which travels as bits (``mask_rows``, 8 bytes per 64 features).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Pending:
    """A non-blocking exchange under way: the MPI request (None: nothing to exchange) and the send
    buffer, which must live until the request completes."""

    request: Any
    send: np.ndarray

    def wait(self) -> None:
        if self.request is not None:
            self.request.Wait()
            self.request = None


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
        recv, pending = self._start(send, scounts, rcounts, width)
        pending.wait()
        return recv

    def _start(self, send: np.ndarray, scounts: np.ndarray, rcounts: np.ndarray, width: int) -> tuple[np.ndarray, Pending]:
        """(receive buffer, its pending exchange) of a non-blocking Alltoallv."""
        recv = np.empty((int(rcounts.sum()), width), dtype=send.dtype)
        if self.alone:
            return recv, Pending(None, send)  # nothing to exchange: every count is zero
        sc = scounts * width
        rc = rcounts * width
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
        send = np.ascontiguousarray(send)
        return recv, Pending(self.comm.Ialltoallv([send, (sc, sd)], [recv, (rc, rd)]), send)

    def start_gather(self, owned_rows: np.ndarray) -> tuple[np.ndarray, Pending]:
        """``gather`` begun: (the halo rows' buffer, to read after its exchange's ``wait``)."""
        return self._start(owned_rows[self.send_idx], self.send_counts, self.recv_counts, owned_rows.shape[1])

    def start_scatter(self, halo_grad: np.ndarray) -> tuple[np.ndarray, Pending]:
        """``scatter_add_back`` begun: (the owners' incoming rows, their exchange); ``add_back`` after ``wait``."""
        return self._start(halo_grad, self.recv_counts, self.send_counts, halo_grad.shape[1])

    def add_back(self, grad: np.ndarray, back: np.ndarray) -> np.ndarray:
        """Adds the rows ``start_scatter`` received to the owned rows' gradient ``grad`` (in place)."""
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

    def start_mask_rows(self, keep: np.ndarray) -> tuple[np.ndarray, Pending]:
        """``mask_rows`` begun: (the halo rows' masks as bits, to read with ``unpack_bits`` after
        the exchange's ``wait``). Collective."""
        return self._start(pack_bits(keep[self.send_idx]), self.send_counts, self.recv_counts, (keep.shape[1] + 7) // 8)

    def scatter_add_back(self, halo_grad: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. the owned rows contributed by other ranks' use of them as halo."""
        width = halo_grad.shape[1]
        back = self._alltoallv(np.ascontiguousarray(halo_grad), self.recv_counts, self.send_counts, width)
        return self.add_back(np.zeros((self.num_owned, width), dtype=halo_grad.dtype), back)


def pack_bits(keep: np.ndarray) -> np.ndarray:
    """Boolean rows as bytes, 8 columns per byte (the last byte of a row may be partial)."""
    return np.packbits(keep, axis=1)


def unpack_bits(bits: np.ndarray, width: int) -> np.ndarray:
    """The boolean rows ``pack_bits`` packed, ``width`` columns each."""
    return np.unpackbits(bits, axis=1, count=width).view(np.bool_)
