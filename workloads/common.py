"""What the three GCN trainers share: flags, the output protocol, metrics and error handling.

Output protocol (parsed by the distrun runner), printed by rank 0 only, one line each, flushed:
  DISTRUN_EPOCH {"epoch", "epochs", "loss", "train_acc", "val_acc", "epoch_time_s"}
  DISTRUN_RESULT {"workload", "dataset", "ranks", "epochs", "loss", "train_acc", "val_acc",
                  "test_acc", "epoch_time_s" (mean), "first_epoch_time_s", "wall_s", ...}
  DISTRUN_CHECK {"loss", "path", "device"}  only with --check-exact
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

import datasets
import partition
from datasets import DatasetError
from graph import SparseRows, gcn_norm_local, propagation_rows

T = TypeVar("T")
UserError = DatasetError  # one exception type for every mistake a user can fix


class CollectiveError(UserError):
    """A mistake every rank detects alike (rank count, flags): only rank 0 prints it."""


def parser(description: str, partitioned: bool) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    datasets.add_dataset_args(ap)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="weights, dropout and synthetic data")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--weight-decay", type=float, default=5e-4, help="L2 on the first layer (Kipf & Welling)")
    ap.add_argument("--num-parts", "--num_parts", dest="num_parts", type=int, default=None,
                    help="expected number of ranks; checked against the MPI world size")
    ap.add_argument("--result-file", type=Path, default=None,
                    help="write the DISTRUN_RESULT JSON here (default $DISTRUN_RUN_DIR/result.json)")
    ap.add_argument("--min-epoch-seconds", type=float, default=0.0, metavar="S",
                    help="spend at least S seconds per epoch, sleeping after it: a small graph lasts as long "
                         "as a drill needs (stopping a node mid-run); results are unchanged")
    ap.add_argument("--check-exact", type=Path, default=None, metavar="NPZ",
                    help="no training: write logits, loss and gradients of the initial model (dropout off) and exit")
    if partitioned:
        ap.add_argument("--part-dir", type=Path, default=None,
                        help="partition folder written by partition.py (default partitions/<dataset>-<ranks>)")
    return ap


def validate(args: argparse.Namespace) -> None:
    datasets.gdc_spec(args)  # raises on bad GDC values
    if args.epochs < 1:
        raise UserError("--epochs must be at least 1")
    if not 0 <= args.min_epoch_seconds <= 3600:
        raise UserError(f"--min-epoch-seconds {args.min_epoch_seconds:g}: give 0 (no pacing) to 3600")
    if args.hidden < 1:
        raise UserError("--hidden must be at least 1")
    if not 0.0 <= args.dropout < 1.0:
        raise UserError("--dropout must lie in [0, 1)")


def check_world(args: argparse.Namespace, world: int) -> None:
    if args.num_parts is not None and args.num_parts != world:
        raise CollectiveError(f"--num-parts {args.num_parts} but MPI started {world} ranks; they must be equal (mpirun -n {args.num_parts})")


@dataclass
class FullGraph:
    """The whole graph on one process: what tensor parallelism and DDP use."""

    adj: SparseRows
    features: np.ndarray
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    name: str


def load_full_graph(args: argparse.Namespace) -> FullGraph:
    """The whole graph and its propagation matrix: the GCN's normalised adjacency, or with
    --use-gdc the sparsified diffusion (computed here, in this process)."""
    g = datasets.load(args.dataset, args.data_dir, datasets.synthetic_spec(args))
    gdc_spec = datasets.gdc_spec(args)
    if gdc_spec is not None:
        import gdc

        diff = gdc.diffuse(g.indptr, g.indices, gdc_spec)
        adj = SparseRows.build(diff.indptr, diff.indices, diff.weights, (g.num_nodes, g.num_nodes))
    else:
        adj = gcn_norm_local(g.indptr, g.indices, g.degree, g.num_nodes)
    return FullGraph(adj, g.features, g.labels, g.train_mask, g.val_mask, g.test_mask, g.num_classes, g.name)


def load_partition(args: argparse.Namespace, rank: int, world: int, allgather: Callable[[object], list]) -> tuple[dict, dict, SparseRows]:
    """This rank's part (every rank agrees on any error), checked against the world size and the
    trainer's flags: (manifest, arrays, rows of the propagation matrix)."""
    part_dir = args.part_dir or partition.default_out(args.dataset, world)
    man, p = agree(lambda: partition.load_part(part_dir, rank), allgather)
    if man["num_parts"] != world:
        raise CollectiveError(
            f"{part_dir} has {man['num_parts']} parts but MPI started {world} ranks; "
            f"run mpirun -n {man['num_parts']} or partition again with --num-parts {world}"
        )
    try:
        partition.check_matches(man, part_dir, args.dataset, datasets.gdc_spec(args))
    except DatasetError as exc:
        raise CollectiveError(str(exc)) from None
    return man, p, propagation_rows(p)


def counts(pred: np.ndarray, labels: np.ndarray, masks: list[np.ndarray]) -> np.ndarray:
    """[correct, total] per mask, as float64 so one allreduce sums them all."""
    hit = pred == labels
    return np.array([[hit[m].sum(), m.sum()] for m in masks], dtype=np.float64).ravel()


def accuracies(c: np.ndarray) -> list[float]:
    return [float(c[i] / c[i + 1]) if c[i + 1] else 0.0 for i in range(0, len(c), 2)]


def rank_profile(rep: "Reporter", comm_s: list[float], halo_bytes: int, allreduce_bytes: int,
                 allgather: Callable[[object], list]) -> list[dict]:
    """Every rank's mean training-step time split into communication (halo exchanges, gradient
    allreduce where the trainer runs it) and the rest, and the bytes it sent per epoch. The
    first epoch carries one-time work (kernel compilation, allocator warm-up) and is left out."""
    times = [h.epoch_time_s for h in rep.history]
    skip = 1 if len(times) > 1 else 0
    epoch = float(np.mean(times[skip:]))
    comm = float(np.mean(comm_s[skip:])) if comm_s else 0.0
    mine = {"rank": rep.rank, "epoch_s": epoch, "comm_s": comm, "compute_s": epoch - comm,
            "halo_bytes": int(halo_bytes), "allreduce_bytes": int(allreduce_bytes)}
    return allgather(mine)


@dataclass
class EpochStats:
    epoch: int
    epochs: int
    loss: float
    train_acc: float
    val_acc: float
    epoch_time_s: float


class Reporter:
    """Prints the protocol lines on rank 0 and assembles the final result."""

    def __init__(self, workload: str, args: argparse.Namespace, rank: int, ranks: int) -> None:
        self.workload, self.args, self.rank, self.ranks = workload, args, rank, ranks
        self.t0 = time.perf_counter()
        self.paced = self.t0  # when the last epoch's pacing ended
        self.history: list[EpochStats] = []
        self.best: tuple[float, int, float] | None = None  # (val_acc, epoch, test_acc)

    def epoch(self, stats: EpochStats, test_acc: float | None = None) -> None:
        """Record an epoch; ``test_acc`` (not printed per epoch) feeds the model selection below."""
        self.history.append(stats)
        if test_acc is not None and (self.best is None or stats.val_acc > self.best[0]):
            self.best = (stats.val_acc, stats.epoch, test_acc)
        if self.rank == 0:
            emit("DISTRUN_EPOCH", asdict(stats))
        pause = self.args.min_epoch_seconds - (time.perf_counter() - self.paced)
        if pause > 0:
            time.sleep(pause)
        self.paced = time.perf_counter()

    def result(self, test_acc: float, extra: dict | None = None) -> dict:
        last = self.history[-1]
        times = [h.epoch_time_s for h in self.history]
        res = {
            "workload": self.workload,
            "dataset": self.args.dataset,
            "ranks": self.ranks,
            "epochs": last.epochs,
            "loss": last.loss,
            "train_acc": last.train_acc,
            "val_acc": last.val_acc,
            "test_acc": test_acc,
            "epoch_time_s": float(np.mean(times)),
            # The first epoch includes one-time work (Jittor kernel compilation, allocator
            # warm-up), so it is reported apart rather than hidden in the mean.
            "first_epoch_time_s": times[0],
            "wall_s": time.perf_counter() - self.t0,
            **(extra or {}),
        }
        if self.best is not None:
            # Model selection on the validation set, as Kipf & Welling and Klicpera et al.
            # evaluate: the test accuracy of the epoch with the best validation accuracy.
            res.update(best_val_acc=self.best[0], best_epoch=self.best[1], test_acc_at_best_val=self.best[2])
        if self.rank == 0:
            emit("DISTRUN_RESULT", res)
            path = self.args.result_file
            if path is None and os.environ.get("DISTRUN_RUN_DIR"):
                path = Path(os.environ["DISTRUN_RUN_DIR"]) / "result.json"
            if path is not None:
                write_json_atomic(Path(path), res)
        return res


def emit(tag: str, payload: dict) -> None:
    print(f"{tag} {json.dumps(payload, sort_keys=True)}", flush=True)


def write_json_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def write_check(path: Path, logits: np.ndarray, loss: float, grads: dict[str, np.ndarray],
                device: str = "cpu") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, logits=logits, loss=np.float64(loss), **{f"grad_{k}": v for k, v in grads.items()})
    emit("DISTRUN_CHECK", {"loss": float(loss), "path": str(path), "device": device})


def run_main(prog: str, body: Callable[[], int]) -> None:
    """Run ``body``; a user error becomes one line on stderr and exit status 2, no traceback."""
    try:
        code = body()
    except UserError as exc:
        quiet = isinstance(exc, CollectiveError) and env_rank() != 0
        if not quiet:
            print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        if quiet and launcher_world_size() > 1:
            # mpirun stops the whole job as soon as any rank exits non-zero; give rank 0 the
            # moment it needs to print the message everyone agreed on.
            time.sleep(3)
        if mpi_env_size() > 1:
            # Other ranks may be waiting in a collective: skip MPI_Finalize (which would wait
            # for them) and let mpirun see the non-zero status and stop the job.
            sys.stdout.flush()
            os._exit(2)
        sys.exit(2)
    sys.stdout.flush()
    sys.exit(code)


def mpi_env_size() -> int:
    """World size as the launcher announced it, read before any MPI library is loaded."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


def launcher_world_size() -> int:
    return max(mpi_env_size(), int(os.environ.get("WORLD_SIZE", "1")))


def agree(fn: Callable[[], T], allgather: Callable[[object], list]) -> T:
    """Run a step that may fail on some ranks only (a file missing on one node) and turn any
    failure into the same CollectiveError on every rank, so exactly one line is printed."""
    try:
        value, err = fn(), None
    except UserError as exc:
        value, err = None, str(exc)
    errors = allgather(err)
    for r, e in enumerate(errors):
        if e:
            raise CollectiveError(e if r == 0 else f"rank {r}: {e}")
    return value  # type: ignore[return-value]


def env_rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 0
