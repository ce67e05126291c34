"""Run under mpirun by test_exactness: a trainer's first-layer halo, rank by rank.

    halo_check.py torch|numpy PART_DIR

torch: gcn_torch's halo_rows, halo_mask and masked aggregate (torch.distributed over gloo); numpy:
halo.Halo's rows and mask_rows (mpi4py) and jittor_ops.masked_aggregate, which gcn_jittor uses. Each rank draws its own dropout mask, as the
trainers do, and passes it through the halo; rank 0 then checks that every rank's halo rows carry
exactly the mask (and the features) that the node's owner holds, and every rank that the training
step's masked product (masks sent beside the own columns' product) equals A · (those masked rows). Prints one line: the rows checked.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workloads"))

import partition  # noqa: E402


def torch_halo(part_dir: Path) -> tuple[int, dict, Any, Any, float, Callable[[Any], list], Callable[[], None]]:
    import gcn_torch
    import torch_dist
    from graph import propagation_rows

    td = torch_dist.start(argparse.Namespace(backend="gloo", threads=1, num_parts=None))
    torch = td.torch
    _, p = partition.load_part(part_dir, td.rank)
    stats = {"comm_s": 0.0, "halo_bytes": 0}
    _, halo_rows, halo_mask, aggregate = gcn_torch.build_ops(td, propagation_rows(p), p, stats)
    x = torch.from_numpy(p["features"].astype(np.float32))
    keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(100 + td.rank)) >= 0.5
    x_all, masks = halo_rows(x), halo_mask(keep)
    # The training step's masked product (the masks sent beside the own columns' product) against
    # the product of the rows masked by the masks checked below.
    err = float((aggregate(x_all, keep, torch.empty_like(x_all)) - aggregate(x_all * masks)).abs().max())
    return td.rank, p, masks.numpy(), x_all.numpy(), err, td.allgather, td.close


def numpy_halo(part_dir: Path) -> tuple[int, dict, Any, Any, float, Callable[[Any], list], Callable[[], None]]:
    import jittor_ops  # numpy only until Jittor is started
    from graph import propagation_rows
    from halo import Halo
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    _, p = partition.load_part(part_dir, rank)
    halo = Halo(comm, int(p["owned_gid"].size), p["send_idx"], p["send_counts"], p["recv_counts"])
    x = p["features"].astype(np.float32)
    keep = np.random.default_rng(100 + rank).random(x.shape) >= 0.5
    x_all, masks = halo.rows(x), halo.mask_rows(keep)
    adj = propagation_rows(p)
    err = float(np.abs(jittor_ops.masked_aggregate(halo, adj, x_all, keep) - adj.matmul(x_all * masks)).max())
    return rank, p, masks, x_all, err, comm.allgather, lambda: None


def main() -> int:
    backend, part_dir = sys.argv[1], Path(sys.argv[2])
    rank, p, masks, feats, err, allgather, close = {"torch": torch_halo, "numpy": numpy_halo}[backend](part_dir)
    everyone = allgather((p["owned_gid"], p["halo_gid"], masks, feats))
    errors = allgather(err)
    close()
    if rank != 0:
        return 0
    assert max(errors) < 1e-5, f"the masked aggregation differs from A · (masked rows) by {errors} per rank"
    width = p["features"].shape[1]
    owner_mask, owner_feat = {}, {}
    for owned, _, m, f in everyone:
        n = owned.size
        owner_mask.update(zip(owned.tolist(), m[:n], strict=True))
        owner_feat.update(zip(owned.tolist(), f[:n], strict=True))
    checked = 0
    for r, (owned, halo, m, f) in enumerate(everyone):
        n = owned.size
        assert m.shape == (n + halo.size, width) and f.shape == m.shape, (r, m.shape, f.shape)
        assert m[:n].any() and not m[:n].all(), f"rank {r}: its own mask is not a dropout mask"
        for j, gid in enumerate(halo.tolist()):
            assert np.array_equal(m[n + j], owner_mask[gid]), f"rank {r}: halo row {j} (node {gid}) has another mask"
            assert np.array_equal(f[n + j], owner_feat[gid]), f"rank {r}: halo row {j} (node {gid}) has other features"
            checked += 1
    print(f"halo rows checked: {checked} (masked aggregation max error {max(errors):.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
