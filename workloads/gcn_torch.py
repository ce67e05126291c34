#!/usr/bin/env python3
"""2-layer GCN in PyTorch, one graph partition per rank, halo rows exchanged with all-to-all.

    python partition.py --dataset cora --num-parts 2
    torchrun --nproc-per-node 2 gcn_torch.py --dataset cora --num-parts 2
    mpirun -n 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python gcn_torch.py --dataset cora --num-parts 2

Each rank owns the nodes of one Metis part and holds their rows of the propagation matrix
(Â = D^-1/2 (A + I) D^-1/2, or the GDC diffusion when partitioned with --use-gdc), whose columns
are its own nodes followed by its halo: the neighbours owned elsewhere. A layer computes
A_rows · [H_own; H_halo] · W through Propagate, an autograd function: forward, one
torch.distributed.all_to_all_single sends every rank the rows it needs (the partitioner wrote the
send and receive lists in matching order) while the product over the own columns runs; backward,
the gradient of each halo row goes back to the rank that owns the node, while the product with
the own columns' transpose runs, and is added to that node's gradient.
The first layer takes the cheaper order of Â·X·W1: with features no wider than the hidden layer,
Â·X first; the input features need no gradient, so their halo rows travel once, before training,
and each epoch only the owners' dropout masks of those rows (as bits, while the product over the
own columns runs); with wide features
(Cora's 1433 against 16), X·W1 first and the exchange as above.

Why the gradients are those of single-process training. Rank r's loss is
L_r = sum over its training nodes of CE / N_train, so the global loss is L = sum_r L_r. Through
the halo exchange's backward, the gradient rank r computes for the shared weights is exactly
dL_r/dW including every path through other parts; one all_reduce (sum) of the gradients gives
dL/dW on every rank. Every rank starts from the same --seed and applies the same Adam step
(weight decay on the first layer, as Kipf & Welling) to the same gradient, so the parameters
stay identical without any broadcast. Dropout masks are drawn per rank, as per node.

Runs under torchrun, mpirun (Open MPI's variables are mapped to torch's; MASTER_ADDR and
MASTER_PORT come from the environment) and Slurm (distrun's rank wrapper exports torch's
variables). Under NCCL (a GPU that torch sees, --backend auto or nccl) its tensors live on
cuda:LOCAL_RANK; only the halo rows' dropout masks are packed into bits on the CPU. The result
reports, per rank, compute and communication time per epoch (for the
exchanges that overlap a product, the time spent starting them and waiting for them after it)
and the bytes its halo exchanges and gradient allreduce sent.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

import common
import torch_dist
from common import EpochStats, Reporter
from graph import SparseRows, init_params
from halo import pack_bits, unpack_bits

PROG = "gcn_torch.py"


def csr_tensor(torch, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]):  # noqa: ANN001,ANN201
    idx_dtype = np.int32 if max(indptr[-1], shape[1]) < 2**31 else np.int64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        return torch.sparse_csr_tensor(
            torch.from_numpy(np.ascontiguousarray(indptr, dtype=idx_dtype)),
            torch.from_numpy(np.ascontiguousarray(indices, dtype=idx_dtype)),
            torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)),
            size=shape, check_invariants=False,
        )


def sparse(torch, m: SparseRows):  # noqa: ANN001,ANN201
    """A sparse matrix as a torch CSR tensor."""
    return csr_tensor(torch, m.indptr, m.indices, m.values, m.shape)


def transpose(torch, m: SparseRows):  # noqa: ANN001,ANN201
    """The transpose of a sparse matrix as a torch CSR tensor (how a product's gradient flows back)."""
    return csr_tensor(torch, m.t_indptr, m.t_indices, m.t_values, (m.shape[1], m.shape[0]))


def build_ops(td: torch_dist.Dist, adj: SparseRows, part: dict[str, np.ndarray], stats: dict):  # noqa: ANN201
    torch, dist, dev = td.torch, td.dist, td.device
    a = sparse(torch, adj).to(dev)  # Â·X, and the products of a rank that is alone
    n_own = int(part["owned_gid"].size)
    send_idx = torch.from_numpy(part["send_idx"].astype(np.int64)).to(dev)
    send_counts = [int(c) for c in part["send_counts"]]
    recv_counts = [int(c) for c in part["recv_counts"]]
    num_halo = sum(recv_counts)

    def exchange(send, in_split: list[int], out_split: list[int], rows: int):  # noqa: ANN001,ANN202
        out = send.new_empty((rows, send.shape[1]))
        if td.world > 1:
            finish(start(out, send, in_split, out_split))
        return out

    def start(out, send, in_split: list[int], out_split: list[int]):  # noqa: ANN001,ANN202
        t0 = time.perf_counter()
        work = dist.all_to_all_single(out, send.contiguous(), output_split_sizes=out_split,
                                      input_split_sizes=in_split, async_op=True)
        stats["comm_s"] += time.perf_counter() - t0
        stats["halo_bytes"] += send.numel() * send.element_size()
        return work

    def finish(work) -> None:  # noqa: ANN001
        t0 = time.perf_counter()
        work.wait()
        stats["comm_s"] += time.perf_counter() - t0

    if td.world == 1:
        a_t = transpose(torch, adj).to(dev)
    else:  # the products that overlap the exchanges: own columns, halo columns
        a_own, a_halo = adj.split_columns(n_own)
        own, own_t = sparse(torch, a_own).to(dev), transpose(torch, a_own).to(dev)
        halo, halo_t = sparse(torch, a_halo).to(dev), transpose(torch, a_halo).to(dev)

    class Propagate(torch.autograd.Function):
        """A · [h; the halo's rows of h]. Forward: the halo rows travel while the product over the
        own columns runs; backward: the halo rows' gradients travel back to their owners (who add
        them to their nodes' gradients) while the product with the own columns' transpose runs."""

        @staticmethod
        def forward(ctx, h):  # noqa: ANN001,ANN205
            if td.world == 1:
                return a @ h
            recv = h.new_empty((num_halo, h.shape[1]))
            work = start(recv, h[send_idx], send_counts, recv_counts)
            y = own @ h
            finish(work)
            return y.add_(halo @ recv)

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001,ANN205
            if td.world == 1:
                return a_t @ g
            back = g.new_empty((int(send_idx.numel()), g.shape[1]))
            work = start(back, halo_t @ g, recv_counts, send_counts)
            grad = own_t @ g
            finish(work)
            return grad.index_add_(0, send_idx, back)

    def propagate(h):  # noqa: ANN001,ANN202
        return Propagate.apply(h)

    def halo_rows(h):  # noqa: ANN001,ANN202
        """[h; the halo's rows of h] for a tensor no gradient flows into."""
        return torch.cat([h, exchange(h[send_idx], send_counts, recv_counts, num_halo)]) if td.world > 1 else h

    def halo_mask(keep):  # noqa: ANN001,ANN202
        """The owners' dropout masks of the halo rows, sent as bits (8 bytes per 64 features)."""
        if td.world == 1:
            return keep
        bits = torch.from_numpy(pack_bits(keep[send_idx].cpu().numpy())).to(dev)
        got = exchange(bits, send_counts, recv_counts, num_halo)
        return torch.cat([keep, torch.from_numpy(unpack_bits(got.cpu().numpy(), keep.shape[1])).to(dev)])

    def aggregate(h, keep=None, out=None):  # noqa: ANN001,ANN202
        """A · h for [own; halo] rows h; with ``keep`` (this rank's dropout mask of its own rows),
        A · (h masked by the owners' masks) into the buffer ``out``, the halo rows' masks
        travelling (as bits) while the product over the own columns runs."""
        if keep is None:
            return a @ h
        if td.world == 1:
            return a @ torch.mul(h, keep, out=out)
        bits = torch.from_numpy(pack_bits(keep[send_idx].cpu().numpy())).to(dev)
        got = bits.new_empty((num_halo, bits.shape[1]))
        work = start(got, bits, send_counts, recv_counts)
        y = own @ torch.mul(h[:n_own], keep, out=out[:n_own])
        finish(work)
        halo_keep = torch.from_numpy(unpack_bits(got.cpu().numpy(), keep.shape[1])).to(dev)
        return y.add_(halo @ torch.mul(h[n_own:], halo_keep, out=out[n_own:]))

    return propagate, halo_rows, halo_mask, aggregate


def main() -> int:
    ap = common.parser(__doc__.split("\n\n")[0], partitioned=True)
    torch_dist.add_args(ap)
    args = ap.parse_args()
    common.validate(args)
    td = torch_dist.start(args)
    try:
        return train(args, td)
    finally:
        td.close()


def train(args, td: torch_dist.Dist) -> int:  # noqa: ANN001
    torch, dist, rank, world = td.torch, td.dist, td.rank, td.world
    import torch.nn.functional as F

    man, p, adj = common.load_partition(args, rank, world, td.allgather)
    stats = {"comm_s": 0.0, "halo_bytes": 0}
    propagate, halo_rows, halo_mask, aggregate = build_ops(td, adj, p, stats)
    num_train = int(man["num_train"])
    num_classes = int(man["num_classes"])

    init = init_params(args.seed, int(man["num_features"]), args.hidden, num_classes)
    dev = td.device  # the CPU, or cuda:LOCAL_RANK under NCCL: .to(dev) and .cpu() do nothing on the CPU
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy()).to(dev)) for k, v in init.items()}
    names = list(params)
    opt = torch.optim.Adam(
        [{"params": [params["W1"]], "weight_decay": args.weight_decay},
         {"params": [params["b1"], params["W2"], params["b2"]], "weight_decay": 0.0}],
        lr=args.lr,
    )
    gen = torch.Generator(device=dev).manual_seed(args.seed * 1000 + rank)
    x = torch.from_numpy(p["features"].astype(np.float32)).to(dev)
    labels_np = p["labels"].astype(np.int64)
    labels = torch.from_numpy(labels_np).to(dev)
    train_mask = p["train_mask"].astype(bool)
    train_idx = torch.from_numpy(np.flatnonzero(train_mask)).to(dev)

    def dropout(h, training: bool):  # noqa: ANN001,ANN202
        if not (training and args.dropout):
            return h
        keep = torch.rand(h.shape, generator=gen, device=dev) >= args.dropout
        return h * keep / (1.0 - args.dropout)

    # Â·X first (narrow features): the backward pass has neither a sparse product nor an
    # exchange for this layer, and the halo's features are exchanged once, here.
    aggregate_first = x.shape[1] <= args.hidden
    if aggregate_first:
        x_all = halo_rows(x)
        ax_eval = aggregate(x_all)
        if args.dropout:  # scaled once; each epoch masks it into one buffer (no fresh pages per epoch)
            x_all = x_all / (1.0 - args.dropout)
            x_masked = torch.empty_like(x_all)

    def first_layer(training: bool):  # noqa: ANN202
        if not aggregate_first:
            return propagate(dropout(x, training) @ params["W1"])
        if not (training and args.dropout):
            return ax_eval @ params["W1"]
        keep = torch.rand(x.shape, generator=gen, device=dev) >= args.dropout
        return aggregate(x_all, keep, x_masked) @ params["W1"]

    def forward(training: bool):  # noqa: ANN202
        h = torch.relu(first_layer(training) + params["b1"])
        h = dropout(h, training)
        return propagate(h @ params["W2"]) + params["b2"]

    def local_loss(logits):  # noqa: ANN001,ANN202
        # Sum over this rank's training nodes / all training nodes: sum_r L_r is the mean loss.
        return F.cross_entropy(logits[train_idx], labels[train_idx], reduction="sum") / num_train

    def allreduce_grads() -> int:
        flat = torch.cat([params[k].grad.reshape(-1) for k in names])
        if world > 1:
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            stats["comm_s"] += time.perf_counter() - t0
        offset = 0
        for k in names:
            n = params[k].numel()
            params[k].grad.copy_(flat[offset : offset + n].view_as(params[k]))
            offset += n
        return flat.numel() * flat.element_size() if world > 1 else 0

    def global_sum(v: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)).to(dev)
        if world > 1:
            dist.all_reduce(t)
        return t.cpu().numpy()

    if args.check_exact is not None:
        logits = forward(training=False)
        loss = local_loss(logits)
        loss.backward()
        allreduce_grads()
        total = float(global_sum(np.array([loss.item()]))[0])
        gathered = td.allgather((p["owned_gid"], logits.detach().cpu().numpy()))
        if rank == 0:
            full = np.zeros((int(man["num_nodes"]), num_classes), dtype=np.float32)
            for gid, lg in gathered:
                full[gid] = lg
            common.write_check(args.check_exact, full, total,
                               {k: params[k].grad.cpu().numpy() for k in names}, str(dev))
        return 0

    rep = Reporter("gcn_torch", args, rank, world)
    masks = [train_mask, p["val_mask"].astype(bool), p["test_mask"].astype(bool)]
    comm_s: list[float] = []
    halo_bytes = grad_bytes = 0
    for epoch in range(1, args.epochs + 1):
        stats["comm_s"], stats["halo_bytes"] = 0.0, 0
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = local_loss(forward(training=True))
        loss.backward()
        grad_bytes = allreduce_grads()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # the GPU's kernels run after their launch: the epoch ends with them
        epoch_time = time.perf_counter() - t0
        comm_s.append(stats["comm_s"])
        halo_bytes = stats["halo_bytes"]
        with torch.no_grad():
            pred = forward(training=False).argmax(1).cpu().numpy()
        totals = global_sum(np.concatenate([[loss.item()], common.counts(pred, labels_np, masks)]))
        acc = common.accuracies(totals[1:])
        rep.epoch(EpochStats(epoch, args.epochs, float(totals[0]), acc[0], acc[1], epoch_time), test_acc=acc[2])
    per_rank = common.rank_profile(rep, comm_s, halo_bytes, grad_bytes, td.allgather)
    rep.result(acc[2], {"num_nodes": int(man["num_nodes"]), "num_edges": int(man["num_edges"]),
                        "edge_cut": man["edge_cut"], "propagation": man.get("propagation", "gcn"),
                        "threads": torch.get_num_threads(), "ranks_profile": per_rank, "device": str(dev)})
    return 0


if __name__ == "__main__":
    torch_dist.run_main(PROG, main)
