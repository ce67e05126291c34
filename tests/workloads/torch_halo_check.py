"""Run under mpirun by test_exactness: gcn_torch's first-layer halo, rank by rank.

Each rank draws its own dropout mask, as the trainer does, and passes it through the trainer's
halo_mask; rank 0 then checks that every rank's halo rows carry exactly the mask (and, through
halo_rows, the features) that the node's owner holds. Prints one line: the rows checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workloads"))

import gcn_torch  # noqa: E402
import partition  # noqa: E402
import torch_dist  # noqa: E402
from graph import propagation_rows  # noqa: E402


def main() -> int:
    part_dir = Path(sys.argv[1])
    td = torch_dist.start(argparse.Namespace(backend="gloo", threads=1, num_parts=None))
    torch = td.torch
    _, p = partition.load_part(part_dir, td.rank)
    stats = {"comm_s": 0.0, "halo_bytes": 0}
    _, halo_rows, halo_mask, _ = gcn_torch.build_ops(td, propagation_rows(p), p, stats)
    x = torch.from_numpy(p["features"].astype(np.float32))
    keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(100 + td.rank)) >= 0.5
    masks = halo_mask(keep).numpy()
    feats = halo_rows(x).numpy()
    mine = (p["owned_gid"], p["halo_gid"], masks, feats, stats["halo_bytes"])
    everyone = td.allgather(mine)
    td.close()
    if td.rank != 0:
        return 0
    owner_mask, owner_feat = {}, {}
    for owned, _, m, f, _ in everyone:
        n = owned.size
        owner_mask.update(zip(owned.tolist(), m[:n], strict=True))
        owner_feat.update(zip(owned.tolist(), f[:n], strict=True))
    checked = 0
    for rank, (owned, halo, m, f, sent) in enumerate(everyone):
        n = owned.size
        assert m.shape == (n + halo.size, x.shape[1]) and f.shape == m.shape, (rank, m.shape, f.shape)
        for j, gid in enumerate(halo.tolist()):
            assert np.array_equal(m[n + j], owner_mask[gid]), f"rank {rank}: halo row {j} (node {gid}) has another mask"
            assert np.array_equal(f[n + j], owner_feat[gid]), f"rank {rank}: halo row {j} (node {gid}) has other features"
            checked += 1
        assert sent > 0, f"rank {rank} sent nothing"
    print(f"halo rows checked: {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
