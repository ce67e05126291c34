"""A PyTorch DDP training script of the usual shape, with a snapshot it resumes from.

    distrun train -i prod --launcher torchrun --script docs/guide/examples/ddp_snapshot.py -- --epochs 20

Every rank reads its place from the environment torchrun (or distrun's rank wrapper, under the
other launchers) sets: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. The snapshot goes to
--snapshot (default: snapshot.pt in the working directory, which is the run directory); point it at
a folder that outlives the run (e.g. under distrun_shared_dir) to resume a later run from it.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--snapshot", default="snapshot.pt")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)  # one GPU per rank: slots = GPUs per host
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")

    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(data)  # each rank gets its own share of every epoch
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    model = DDP(torch.nn.Linear(16, 1).to(device), device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    start = 0
    if os.path.exists(args.snapshot):  # every rank loads it: the model starts the same everywhere
        snap = torch.load(args.snapshot, map_location=device)
        model.module.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        start = snap["epoch"] + 1
        if rank == 0:
            print(f"resuming after epoch {start} from {args.snapshot}", flush=True)

    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
            loss.backward()
            opt.step()
        if rank == 0:  # one writer; written whole, then renamed, so a crash never leaves half a file
            tmp = args.snapshot + ".tmp"
            torch.save({"epoch": epoch, "model": model.module.state_dict(), "optimizer": opt.state_dict()}, tmp)
            os.replace(tmp, args.snapshot)
            print(f"epoch {epoch + 1}/{args.epochs} loss {loss.item():.4f}", flush=True)
    dist.barrier()  # no rank leaves while another still needs the process group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
