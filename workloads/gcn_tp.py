#!/usr/bin/env python3
"""2-layer GCN in Jittor with tensor parallelism over MPI: no partition, weights sharded.

    mpirun -n 2 python gcn_tp.py --dataset cora

Every rank holds the whole graph and features. The hidden dimension is split across ranks:
rank r owns the columns S_r of W1 and b1 and the rows S_r of W2. Because ReLU and dropout act
element-wise, rank r computes H[:, S_r] = relu(Â X W1[:, S_r] + b1[S_r]) without talking to
anyone; then  Â H W2 = Â (sum_r H[:, S_r] W2[S_r, :]), one allreduce of an N x C matrix.
The loss is computed redundantly (identically) on every rank from the reduced logits, so the
gradient reaching each rank's partial product is the full dL/dZ: the allreduce's backward is the
identity. Gradients of a shard are therefore exact as computed locally.

Jittor's optimizer would be wrong here: under mpirun it averages every gradient over ranks and
broadcasts rank 0's parameters, which would mix unrelated shards. So this program takes the
gradients with jt.grad (which does no MPI communication) and applies its own Adam step
(ShardAdam) to the shards; only the replicated b2, whose gradient is identical on all ranks,
needs no communication either.

The input dropout mask is drawn from a generator seeded identically on every rank (every rank
multiplies the same X); hidden dropout masks are per rank, since each rank holds distinct columns.
"""

from __future__ import annotations

import time

import jittor_ops  # first: sets Jittor's import-time environment

import numpy as np

import common
from common import EpochStats, Reporter
from graph import init_params

PROG = "gcn_tp.py"


def shard_columns(hidden: int, world: int) -> list[np.ndarray]:
    if hidden < world:
        raise common.CollectiveError(f"--hidden {hidden} is smaller than the {world} ranks; each rank needs at least one hidden unit")
    return np.array_split(np.arange(hidden), world)


def main() -> int:
    args = common.parser(__doc__.split("\n\n")[0], partitioned=False).parse_args()
    common.validate(args)
    jm = jittor_ops.start(args)
    jt, comm, rank, world = jm.jt, jm.comm, jm.rank, jm.world
    cols = shard_columns(args.hidden, world)[rank]
    g = common.agree(lambda: common.load_full_graph(args), comm.allgather)
    n = g.features.shape[0]
    num_train = int(g.train_mask.sum())
    if num_train == 0:
        raise common.CollectiveError(f"dataset {g.name} has no training nodes")
    SpMM, _, AllReduceSum = jittor_ops.functions(jt)

    full = init_params(args.seed, g.features.shape[1], args.hidden, g.num_classes)
    params = {
        "W1": jt.array(full["W1"][:, cols]),
        "b1": jt.array(full["b1"][cols]),
        "W2": jt.array(full["W2"][cols, :]),
        "b2": jt.array(full["b2"]),
    }
    weight_decay = {"W1": args.weight_decay}
    jt.set_global_seed(args.seed * 1000 + rank)
    x_np = g.features.astype(np.float32)
    x = jt.array(x_np)
    onehot = jt.array(jittor_ops.onehot_train(g.labels, g.train_mask, g.num_classes))

    def forward(training: bool, epoch: int = 0):  # noqa: ANN202
        h = x
        if training and args.dropout:
            keep = np.random.default_rng([args.seed, epoch]).random(x_np.shape, dtype=np.float32) >= args.dropout
            h = jt.array(x_np * keep / np.float32(1.0 - args.dropout))
        h = jt.nn.relu(SpMM(g.adj)(jt.matmul(h, params["W1"])) + params["b1"])
        if training and args.dropout:
            h = jt.nn.dropout(h, args.dropout, is_train=True)
        return SpMM(g.adj)(AllReduceSum(comm, jm.MPI)(jt.matmul(h, params["W2"]))) + params["b2"]

    def loss_of(logits):  # noqa: ANN001,ANN202
        return jittor_ops.masked_cross_entropy(jt, logits, onehot, num_train)

    names = list(params)
    if args.check_exact is not None:
        logits = forward(training=False)
        loss = loss_of(logits)
        grads = dict(zip(names, (v.numpy() for v in jt.grad(loss, [params[k] for k in names]))))
        gathered = comm.gather(grads, root=0) if world > 1 else [grads]
        if rank == 0:
            full_grads = {
                "W1": np.concatenate([gr["W1"] for gr in gathered], axis=1),
                "b1": np.concatenate([gr["b1"] for gr in gathered]),
                "W2": np.concatenate([gr["W2"] for gr in gathered], axis=0),
                "b2": grads["b2"],
            }
            common.write_check(args.check_exact, logits.numpy(), float(loss.item()), full_grads)
        return 0

    # Adam on the local shards: the same update torch.optim.Adam makes (L2 added to the gradient).
    state = {k: (jt.zeros_like(params[k]).stop_grad(), jt.zeros_like(params[k]).stop_grad()) for k in names}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    rep = Reporter("gcn_tp", args, rank, world)
    masks = [g.train_mask, g.val_mask, g.test_mask]
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        loss = loss_of(forward(training=True, epoch=epoch))
        grads = jt.grad(loss, [params[k] for k in names])
        for k, gr in zip(names, grads):
            p = params[k]
            if weight_decay.get(k):
                gr = gr + weight_decay[k] * p
            m, v = state[k]
            m.update(beta1 * m + (1 - beta1) * gr)
            v.update(beta2 * v + (1 - beta2) * gr * gr)
            step = args.lr * np.sqrt(1 - beta2**epoch) / (1 - beta1**epoch)
            p.update(p - step * m / (jt.sqrt(v) + eps * np.sqrt(1 - beta2**epoch)))
        jt.sync([params[k] for k in names])
        loss_value = float(loss.item())
        epoch_time = time.perf_counter() - t0
        with jt.no_grad():
            pred = np.argmax(forward(training=False).numpy(), axis=1)
        # Every rank holds the same logits, so the accuracies need no communication.
        acc = common.accuracies(common.counts(pred, g.labels, masks))
        rep.epoch(EpochStats(epoch, args.epochs, loss_value, acc[0], acc[1], epoch_time), test_acc=acc[2])
    rep.result(acc[2], {"num_nodes": n, "num_edges": int(g.adj.indices.size - n), "hidden_shard": int(cols.size)})
    return 0


if __name__ == "__main__":
    common.run_main(PROG, main)
