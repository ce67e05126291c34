#!/usr/bin/env python3
"""2-layer GCN in Jittor, one graph partition per MPI rank, halo rows exchanged with mpi4py.

    python partition.py --dataset cora --num-parts 2
    mpirun -n 2 python gcn_jittor.py --dataset cora --num-parts 2

Why the gradients are right under Jittor's MPI optimizer. Each rank computes the logits of the
nodes it owns; its loss is  L_r = sum over its training nodes of CE / N_train, so the global loss
is  L = sum_r L_r. Rows needed from other parts arrive through a custom jt.Function (Propagate)
whose backward sends the halo gradients back to their owners, so the gradient each rank computes for the shared
weights is exactly dL_r/dW including every cross-partition path, and dL/dW = sum_r dL_r/dW.
Jittor's optimizer, when run under mpirun, replaces each gradient by its MEAN over ranks; we
therefore hand it R * L_r, whose mean over ranks is sum_r dL_r/dW = dL/dW: the same step as
single-process full-graph training. Jittor also broadcasts rank 0's parameters at the first step;
every rank initialises from the same --seed, so that broadcast changes nothing. Weight decay is
applied by the optimizer to the (identical) parameters after the averaging, so it is not scaled.
--check-exact writes the gradients taken from that same optimizer path.

The result reports, per rank, the time spent in the halo exchange (forward and backward) and
the bytes it sent per epoch; the gradient allreduce runs inside Jittor's optimizer step and is
counted in bytes only.

The first layer takes the cheaper order of Â·X·W1, as gcn_torch.py does: with features no wider
than the hidden layer, Â·X first, the halo's feature rows exchanged once before training and each
epoch only the owners' dropout masks of those rows (as bits); with wide features (Cora's 1433
against 16), X·W1 first, through the exchange above. Each rank draws the masks of the nodes it
owns, so a node is dropped the same way wherever it is aggregated.
"""

from __future__ import annotations

import time

import jittor_ops  # first: sets Jittor's import-time environment

import numpy as np

import common
from common import EpochStats, Reporter
from graph import init_params
from halo import Halo

PROG = "gcn_jittor.py"


def main() -> int:
    args = common.parser(__doc__.split("\n\n")[0], partitioned=True).parse_args()
    common.validate(args)
    jm = jittor_ops.start(args)
    jt, comm, rank, world = jm.jt, jm.comm, jm.rank, jm.world
    man, p, adj = common.load_partition(args, rank, world, comm.allgather)

    stats = jittor_ops.CommStats()
    _, Propagate, _ = jittor_ops.functions(jt, stats)
    n_own = int(p["owned_gid"].size)
    halo = Halo(comm if world > 1 else None, n_own, p["send_idx"], p["send_counts"], p["recv_counts"])

    def propagate(h):  # noqa: ANN001,ANN202
        return Propagate(adj, halo)(h)
    num_train = int(man["num_train"])
    num_classes = int(man["num_classes"])

    init = init_params(args.seed, int(man["num_features"]), args.hidden, num_classes)
    params = {k: jt.array(v) for k, v in init.items()}
    jt.set_global_seed(args.seed * 1000 + rank)  # dropout masks differ per rank, as per node

    features = p["features"].astype(np.float32)
    labels = p["labels"].astype(np.int64)
    train_mask = p["train_mask"].astype(bool)
    onehot = jt.array(jittor_ops.onehot_train(labels, train_mask, num_classes))

    # Â·X first (narrow features): the backward pass has neither a sparse product nor an
    # exchange for this layer, and the halo's features are exchanged once, here.
    aggregate_first = features.shape[1] <= args.hidden
    if aggregate_first:
        x_all = halo.rows(features)
        ax_eval = jt.array(adj.matmul(x_all))
        if args.dropout:
            x_all = x_all / np.float32(1.0 - args.dropout)
        masks_rng = np.random.default_rng(args.seed * 1000 + rank)
    else:
        x = jt.array(features)

    def first_layer(training: bool):  # noqa: ANN202
        if not aggregate_first:
            h = jt.nn.dropout(x, args.dropout, is_train=True) if training and args.dropout else x
            return propagate(jt.matmul(h, params["W1"]))
        if not (training and args.dropout):
            return jt.matmul(ax_eval, params["W1"])
        keep = masks_rng.random(features.shape, dtype=np.float32) >= args.dropout
        if world == 1:
            return jt.matmul(jt.array(adj.matmul(x_all * keep)), params["W1"])
        y = jittor_ops.masked_aggregate(halo, adj, x_all, keep, stats)
        return jt.matmul(jt.array(y), params["W1"])

    def forward(training: bool):  # noqa: ANN202
        h = jt.nn.relu(first_layer(training) + params["b1"])
        if training and args.dropout:
            h = jt.nn.dropout(h, args.dropout, is_train=True)
        return propagate(jt.matmul(h, params["W2"])) + params["b2"]

    opt = jt.optim.Adam(
        [{"params": [params["W1"]], "weight_decay": args.weight_decay},
         {"params": [params["b1"], params["W2"], params["b2"]], "weight_decay": 0.0}],
        lr=args.lr,
    )

    if args.check_exact is not None:
        logits = forward(training=False)
        loss = jittor_ops.masked_cross_entropy(jt, logits, onehot, num_train)
        opt.backward(loss * world)  # the training path: Jittor's MPI mean of the gradients
        grads = {}
        for pg in opt.param_groups:
            for var, g in zip(pg["params"], pg["grads"]):
                name = next(k for k, v in params.items() if v is var)
                grads[name] = g.numpy()
        total = float(jm.global_sum(np.array([loss.item()]))[0])
        parts = comm.gather((p["owned_gid"], logits.numpy()), root=0) if world > 1 else [(p["owned_gid"], logits.numpy())]
        if rank == 0:
            full = np.zeros((int(man["num_nodes"]), num_classes), dtype=np.float32)
            for gid, lg in parts:
                full[gid] = lg
            common.write_check(args.check_exact, full, total, grads)
        return 0

    rep = Reporter("gcn_jittor", args, rank, world)
    masks = [train_mask, p["val_mask"].astype(bool), p["test_mask"].astype(bool)]
    comm_s: list[float] = []
    comm_bytes = 0
    for epoch in range(1, args.epochs + 1):
        stats.reset()
        t0 = time.perf_counter()
        loss = jittor_ops.masked_cross_entropy(jt, forward(training=True), onehot, num_train)
        opt.step(loss * world)
        loss_local = loss.item()
        epoch_time = time.perf_counter() - t0
        comm_s.append(stats.seconds)
        comm_bytes = stats.bytes_sent
        with jt.no_grad():
            pred = np.argmax(forward(training=False).numpy(), axis=1)
        totals = jm.global_sum(np.concatenate([[loss_local], common.counts(pred, labels, masks)]))
        acc = common.accuracies(totals[1:])
        rep.epoch(EpochStats(epoch, args.epochs, float(totals[0]), acc[0], acc[1], epoch_time), test_acc=acc[2])
    grad_bytes = sum(int(v.numel()) * 4 for v in params.values()) if world > 1 else 0
    per_rank = common.rank_profile(rep, comm_s, comm_bytes, grad_bytes, comm.allgather)
    rep.result(acc[2], {"num_nodes": int(man["num_nodes"]), "num_edges": int(man["num_edges"]),
                        "edge_cut": man["edge_cut"], "propagation": man.get("propagation", "gcn"),
                        "ranks_profile": per_rank})
    return 0


if __name__ == "__main__":
    common.run_main(PROG, main)
