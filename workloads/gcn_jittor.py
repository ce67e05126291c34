#!/usr/bin/env python3
"""2-layer GCN in Jittor, one graph partition per MPI rank, halo rows exchanged with mpi4py.

    python partition.py --dataset cora --num-parts 2
    mpirun -n 2 python gcn_jittor.py --dataset cora --num-parts 2

Why the gradients are right under Jittor's MPI optimizer. Each rank computes the logits of the
nodes it owns; its loss is  L_r = sum over its training nodes of CE / N_train, so the global loss
is  L = sum_r L_r. Rows needed from other parts arrive through a custom jt.Function whose backward
sends the halo gradients back to their owners, so the gradient each rank computes for the shared
weights is exactly dL_r/dW including every cross-partition path, and dL/dW = sum_r dL_r/dW.
Jittor's optimizer, when run under mpirun, replaces each gradient by its MEAN over ranks; we
therefore hand it R * L_r, whose mean over ranks is sum_r dL_r/dW = dL/dW: the same step as
single-process full-graph training. Jittor also broadcasts rank 0's parameters at the first step;
every rank initialises from the same --seed, so that broadcast changes nothing. Weight decay is
applied by the optimizer to the (identical) parameters after the averaging, so it is not scaled.
--check-exact writes the gradients taken from that same optimizer path.
"""

from __future__ import annotations

import os
import sys
import time

# Jittor reads these at import: a CUDA nvcc without its runtime makes it fail, and MKL/oneDNN
# would be downloaded. The user's own settings win.
os.environ.setdefault("nvcc_path", "")
os.environ.setdefault("use_mkl", "0")

import numpy as np

import common
import partition
from common import CollectiveError, EpochStats, Reporter
from graph import SparseRows, gcn_norm_local, init_params
from halo import Halo

PROG = "gcn_jittor.py"


def build_functions(jt):  # noqa: ANN001,ANN201 - jittor is imported lazily
    class HaloExchange(jt.Function):
        def __init__(self, halo: Halo) -> None:
            self.halo = halo

        def execute(self, h):  # noqa: ANN001,ANN201
            a = h.numpy()
            return jt.array(np.concatenate([a, self.halo.gather(a)]))

        def grad(self, g):  # noqa: ANN001,ANN201
            g = g.numpy()
            n = self.halo.num_owned
            return jt.array(g[:n] + self.halo.scatter_add_back(g[n:]))

    class SpMM(jt.Function):
        def __init__(self, adj: SparseRows) -> None:
            self.adj = adj

        def execute(self, h):  # noqa: ANN001,ANN201
            return jt.array(self.adj.matmul(h.numpy()))

        def grad(self, g):  # noqa: ANN001,ANN201
            return jt.array(self.adj.rmatmul_t(g.numpy()))

    return HaloExchange, SpMM


def main() -> int:
    args = common.parser(__doc__.split("\n\n")[0], partitioned=True).parse_args()
    common.validate(args)
    jt, MPI, comm, rank, world = common.start_jittor_mpi(args)
    part_dir = args.part_dir or partition.default_out(args.dataset, world)
    man, p = common.agree(lambda: partition.load_part(part_dir, rank), comm.allgather)
    if man["num_parts"] != world:
        raise CollectiveError(
            f"{part_dir} has {man['num_parts']} parts but MPI started {world} ranks; "
            f"run mpirun -n {man['num_parts']} or partition again with --num-parts {world}"
        )
    if man["dataset"] != args.dataset:
        raise CollectiveError(f"{part_dir} holds dataset {man['dataset']!r}, not --dataset {args.dataset}")

    HaloExchange, SpMM = build_functions(jt)
    n_own = int(p["owned_gid"].size)
    halo = Halo(comm if world > 1 else None, n_own, p["send_idx"], p["send_counts"], p["recv_counts"])
    adj = gcn_norm_local(p["indptr"], p["indices"], p["degree"], n_own)
    num_train = int(man["num_train"])
    num_classes = int(man["num_classes"])

    init = init_params(args.seed, int(man["num_features"]), args.hidden, num_classes)
    params = {k: jt.array(v) for k, v in init.items()}
    jt.set_global_seed(args.seed * 1000 + rank)  # dropout masks differ per rank, as per node

    x = jt.array(p["features"].astype(np.float32))
    labels = p["labels"].astype(np.int64)
    train_mask = p["train_mask"].astype(bool)
    onehot_train = np.zeros((n_own, num_classes), dtype=np.float32)
    onehot_train[np.flatnonzero(train_mask), labels[train_mask]] = 1.0
    onehot_train = jt.array(onehot_train)

    def forward(training: bool):  # noqa: ANN202
        h = jt.nn.dropout(x, args.dropout, is_train=True) if training and args.dropout else x
        h = SpMM(adj)(HaloExchange(halo)(jt.matmul(h, params["W1"]))) + params["b1"]
        h = jt.nn.relu(h)
        if training and args.dropout:
            h = jt.nn.dropout(h, args.dropout, is_train=True)
        return SpMM(adj)(HaloExchange(halo)(jt.matmul(h, params["W2"]))) + params["b2"]

    def local_loss(logits):  # noqa: ANN001,ANN202
        # The one-hot rows of non-training nodes are zero, so every rank's loss depends on all
        # its logits, and every rank takes part in every backward exchange even with no
        # training nodes of its own.
        z = logits - logits.max(dim=1, keepdims=True).stop_grad()
        logp = z - jt.log(jt.exp(z).sum(dim=1, keepdims=True))
        return -(onehot_train * logp).sum() / num_train

    opt = jt.optim.Adam(
        [{"params": [params["W1"]], "weight_decay": args.weight_decay},
         {"params": [params["b1"], params["W2"], params["b2"]], "weight_decay": 0.0}],
        lr=args.lr,
    )

    def global_sum(v: np.ndarray) -> np.ndarray:
        v = np.ascontiguousarray(v, dtype=np.float64)
        if world == 1:
            return v
        out = np.empty_like(v)
        comm.Allreduce(v, out, op=MPI.SUM)
        return out

    if args.check_exact is not None:
        logits = forward(training=False)
        loss = local_loss(logits)
        opt.backward(loss * world)  # the training path: Jittor's MPI mean of the gradients
        grads = {}
        for pg in opt.param_groups:
            for var, g in zip(pg["params"], pg["grads"]):
                name = next(k for k, v in params.items() if v is var)
                grads[name] = g.numpy()
        total = float(global_sum(np.array([loss.item()]))[0])
        parts = comm.gather((p["owned_gid"], logits.numpy()), root=0) if world > 1 else [(p["owned_gid"], logits.numpy())]
        if rank == 0:
            full = np.zeros((int(man["num_nodes"]), num_classes), dtype=np.float32)
            for gid, lg in parts:
                full[gid] = lg
            common.write_check(args.check_exact, full, total, grads)
        return 0

    rep = Reporter("gcn_jittor", args, rank, world)
    masks = [train_mask, p["val_mask"].astype(bool), p["test_mask"].astype(bool)]
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        loss = local_loss(forward(training=True))
        opt.step(loss * world)
        loss_local = loss.item()
        epoch_time = time.perf_counter() - t0
        with jt.no_grad():
            pred = np.argmax(forward(training=False).numpy(), axis=1)
        stats = global_sum(np.concatenate([[loss_local], common.counts(pred, labels, masks)]))
        acc = common.accuracies(stats[1:])
        rep.epoch(EpochStats(epoch, args.epochs, float(stats[0]), acc[0], acc[1], epoch_time))
    rep.result(acc[2], {"num_nodes": int(man["num_nodes"]), "num_edges": int(man["num_edges"]), "edge_cut": man["edge_cut"]})
    return 0


if __name__ == "__main__":
    common.run_main(PROG, main)
