"""A minimal PyTorch DDP program that runs unchanged under every distrun launcher.

    distrun train -i prod --launcher torchrun --script docs/guide/examples/ddp_minimal.py -- --epochs 3
    distrun train -i prod --script docs/guide/examples/ddp_minimal.py -- --epochs 3     # mpirun

distrun's rank wrapper sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT whichever
launcher started the rank, so init_process_group reads them with init_method="env://".
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)  # one GPU per rank: slots = GPUs per host
    # env:// reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from the environment.
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")

    torch.manual_seed(0)
    x = torch.randn(1024, 16)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=64, sampler=sampler)

    model = DDP(torch.nn.Linear(16, 1).to(device), device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    loss = torch.zeros((), device=device)
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb.to(device)), yb.to(device))
            loss.backward()
            opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if rank == 0:
            # distrun prints DISTRUN_EPOCH lines as one progress line each.
            print("DISTRUN_EPOCH " + json.dumps({"epoch": epoch, "epochs": args.epochs, "loss": mean.item()}), flush=True)
    if rank == 0:
        # Kept as result.json in the run record on the controller.
        print("DISTRUN_RESULT " + json.dumps({"workload": "ddp_minimal", "ranks": world, "loss": mean.item(),
                                                 "device": str(device)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
