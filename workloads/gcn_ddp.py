#!/usr/bin/env python3
"""2-layer GCN in PyTorch with DistributedDataParallel on the full graph.

    torchrun --nproc-per-node 2 gcn_ddp.py --dataset cora
    mpirun -n 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python gcn_ddp.py --dataset cora

Every rank holds the whole graph and computes all logits (dropout masks are identical on every
rank: the torch generator is seeded with --seed alone), but each rank's loss covers only its own
disjoint share of the training nodes:  L_r = sum over its share of CE / N_train, so sum_r L_r is
the full-graph mean loss. DDP averages gradients over ranks, so each rank back-propagates
R * L_r and the averaged gradient is exactly that of single-process training; the parameters
then stay identical on every rank, step after step.

Under mpirun the Open MPI variables OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK are mapped to torch's
RANK/WORLD_SIZE/LOCAL_RANK; MASTER_ADDR and MASTER_PORT must come from the environment. Without
any launcher variables the program trains in one process without a process group.
"""

from __future__ import annotations

import time

import numpy as np

import checkpoint
import common
import torch_dist
from common import CollectiveError, EpochStats, Reporter
from graph import init_params

PROG = "gcn_ddp.py"


def main() -> int:
    ap = common.parser(__doc__.split("\n\n")[0], partitioned=False)
    torch_dist.add_args(ap)
    checkpoint.add_args(ap)
    args = ap.parse_args()
    common.validate(args)
    td = torch_dist.start(args)
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    try:
        g = common.agree(lambda: common.load_full_graph(args), td.allgather)
        n = g.features.shape[0]
        train_idx = np.flatnonzero(g.train_mask)
        if train_idx.size == 0:
            raise CollectiveError(f"dataset {g.name} has no training nodes")
        mine = np.array_split(train_idx, td.world)[td.rank]
        return train(args, g, n, train_idx, mine, td.world, td.rank, td.device, td.distributed, td.torch, td.dist, F, DDP)
    finally:
        td.close()


def train(args, g, n, train_idx, mine, world, rank, device, distributed, torch, dist, F, DDP) -> int:  # noqa: ANN001,PLR0913
    counts_per_row = np.diff(g.adj.indptr)
    rows = np.repeat(np.arange(n), counts_per_row)
    adj = torch.sparse_coo_tensor(
        torch.from_numpy(np.stack([rows, g.adj.indices])), torch.from_numpy(g.adj.values), (n, n)
    ).coalesce().to(device)
    x = torch.from_numpy(g.features.astype(np.float32)).to(device)
    labels = torch.from_numpy(g.labels).to(device)
    mine_t = torch.from_numpy(mine).to(device)

    class GCN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            init = init_params(args.seed, g.features.shape[1], args.hidden, g.num_classes)
            for k, v in init.items():
                self.register_parameter(k, torch.nn.Parameter(torch.from_numpy(v)))

        def forward(self, h):  # noqa: ANN001,ANN201
            h = F.dropout(h, args.dropout, self.training)
            h = torch.relu(torch.sparse.mm(adj, h @ self.W1) + self.b1)
            h = F.dropout(h, args.dropout, self.training)
            return torch.sparse.mm(adj, h @ self.W2) + self.b2

    model = GCN().to(device)
    ddp = DDP(model) if distributed else model
    opt = torch.optim.Adam(
        [{"params": [model.W1], "weight_decay": args.weight_decay},
         {"params": [model.b1, model.W2, model.b2], "weight_decay": 0.0}],
        lr=args.lr,
    )
    torch.manual_seed(args.seed)  # same dropout masks on every rank, and as a single process

    def local_loss(logits):  # noqa: ANN001,ANN202
        return F.cross_entropy(logits[mine_t], labels[mine_t], reduction="sum") / train_idx.size

    def global_sum(t):  # noqa: ANN001,ANN202
        t = t.detach().clone()
        if distributed:
            dist.all_reduce(t)
        return t

    if args.check_exact is not None:
        ddp.eval()
        logits = ddp(x)
        loss = local_loss(logits)
        (loss * world).backward()  # DDP averages: the mean of R * dL_r is dL
        total = float(global_sum(loss).item())
        if rank == 0:
            grads = {k: p.grad.detach().cpu().numpy() for k, p in model.named_parameters()}
            common.write_check(args.check_exact, logits.detach().cpu().numpy(), total, grads, str(device))
        return 0

    rep = Reporter("gcn_ddp", args, rank, world)
    masks = [g.train_mask, g.val_mask, g.test_mask]
    first = resume(args, model, opt, rank, world, distributed, torch, dist) + 1
    for epoch in range(first, args.epochs + 1):
        t0 = time.perf_counter()
        ddp.train()
        opt.zero_grad()
        loss = local_loss(ddp(x))
        (loss * world).backward()
        opt.step()
        loss_value = float(global_sum(loss).item())
        epoch_time = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            pred = model(x).argmax(1).cpu().numpy()
        acc = common.accuracies(common.counts(pred, g.labels, masks))
        rep.epoch(EpochStats(epoch, args.epochs, loss_value, acc[0], acc[1], epoch_time), test_acc=acc[2])
        if rank == 0 and checkpoint.due(args, epoch):
            state = {"epoch": epoch, "model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state()}
            checkpoint.save(args, epoch, lambda path, state=state: torch.save(state, path))
    rep.result(acc[2], {"num_nodes": n, "num_edges": int(g.adj.indices.size - n), "backend": dist.get_backend() if distributed else "none",
                         "device": str(device)})
    return 0


def resume(args, model, opt, rank, world, distributed, torch, dist) -> int:  # noqa: ANN001,PLR0913
    """Load the checkpoint to resume from (model, optimizer, dropout generator): the epoch it
    holds, 0 without one. Every rank must find the same one, or none starts."""
    path = checkpoint.to_resume(args)
    found = [path.name if path else None] * world
    if distributed:
        dist.all_gather_object(found, path.name if path else None)
    if len(set(found)) > 1:
        raise CollectiveError(f"ranks found different checkpoints to resume from ({found}): put the checkpoint folder "
                              "on every node (distrun copies the head's to every node when it restarts a run)")
    if path is None:
        return 0
    state = torch.load(path)
    if int(state["epoch"]) >= args.epochs:
        raise CollectiveError(f"{path} holds epoch {state['epoch']}: --epochs {args.epochs} leaves nothing to train")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    torch.set_rng_state(state["rng"])
    checkpoint.announce(int(state["epoch"]), path, rank)
    return int(state["epoch"])


if __name__ == "__main__":
    torch_dist.run_main(PROG, main)
