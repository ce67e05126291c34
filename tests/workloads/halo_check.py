"""Run under mpirun by test_exactness: a trainer's first-layer halo, rank by rank.

    halo_check.py torch|numpy PART_DIR

torch: gcn_torch's halo_rows and halo_mask (torch.distributed over gloo); numpy: halo.Halo's rows
and mask_rows (mpi4py), which gcn_jittor uses. Each rank draws its own dropout mask, as the
trainers do, and passes it through the halo; rank 0 then checks that every rank's halo rows carry
exactly the mask (and the features) that the node's owner holds. Prints one line: the rows checked.
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


def torch_halo(part_dir: Path) -> tuple[int, dict, Any, Any, Callable[[Any], list], Callable[[], None]]:
    import gcn_torch
    import torch_dist
    from graph import propagation_rows

    td = torch_dist.start(argparse.Namespace(backend="gloo", threads=1, num_parts=None))
    torch = td.torch
    _, p = partition.load_part(part_dir, td.rank)
    stats = {"comm_s": 0.0, "halo_bytes": 0}
    _, halo_rows, halo_mask, _ = gcn_torch.build_ops(td, propagation_rows(p), p, stats)
    x = torch.from_numpy(p["features"].astype(np.float32))
    keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(100 + td.rank)) >= 0.5
    return td.rank, p, halo_mask(keep).numpy(), halo_rows(x).numpy(), td.allgather, td.close


def numpy_halo(part_dir: Path) -> tuple[int, dict, Any, Any, Callable[[Any], list], Callable[[], None]]:
    from halo import Halo
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    _, p = partition.load_part(part_dir, rank)
    halo = Halo(comm, int(p["owned_gid"].size), p["send_idx"], p["send_counts"], p["recv_counts"])
    x = p["features"].astype(np.float32)
    keep = np.random.default_rng(100 + rank).random(x.shape) >= 0.5
    return rank, p, halo.mask_rows(keep), halo.rows(x), comm.allgather, lambda: None


def main() -> int:
    backend, part_dir = sys.argv[1], Path(sys.argv[2])
    rank, p, masks, feats, allgather, close = {"torch": torch_halo, "numpy": numpy_halo}[backend](part_dir)
    everyone = allgather((p["owned_gid"], p["halo_gid"], masks, feats))
    close()
    if rank != 0:
        return 0
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
    print(f"halo rows checked: {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
