"""Timed all-reduce across every rank, then between each pair of nodes: bus bandwidth per message size.

    distrun check --bandwidth -i prod                  # what runs this program on every rank
    torchrun --nproc-per-node 2 allreduce_bw.py         # by hand, on one machine

The measurement of nccl-tests' all_reduce_perf (in place, sum), with torch.distributed: gloo on
CPU nodes over GLOO_SOCKET_IFNAME (distrun's rank wrapper sets it to the node's chosen NIC),
NCCL on cuda:LOCAL_RANK where torch sees a GPU. For each message size, ``warmup`` untimed
all-reduces, then ``iters`` timed ones; the time of one all-reduce is the mean over the timed
ones, averaged over the ranks (nccl-tests' default ``-a 1``). algbw = bytes / time; busbw =
algbw * 2 (n - 1) / n, the bytes each rank's link carries in a ring, so the number is
comparable across rank counts. Each size is checked once more with known values (rank r
contributes r + 1 everywhere, the sum is n (n + 1) / 2): ``#wrong`` counts the elements off.

Then every pair of nodes all-reduces ``--pair-bytes`` on its own (all the ranks of the two
nodes, in a group of their own), disjoint pairs at the same time (a round-robin schedule:
nodes - 1 rounds), so a node (or one link) far slower than the rest shows in the pairs it is
in. The runner judges which (distrun.preflight.bandwidth).

Standalone: the standard library and torch only (the runner sends this one file). Rank 0 prints
one line per size in nccl-tests' layout, then ``DISTRUN_RESULT {json}`` (kept as the run
record's result.json). A mistake in the flags is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# The largest message by default: enough to reach a NIC's bandwidth with gloo on CPU nodes, and
# NVLink's or InfiniBand's with NCCL (nccl-tests' users go up to a few GB).
DEFAULT_MAX = {"gloo": 16 << 20, "nccl": 1 << 30}
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# nccl-tests' names for the types, as its table prints them.
NCCL_TYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double"}


def size_bytes(text: str) -> int:
    """'1024', '64K', '16M', '1G' -> bytes."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in UNITS and t[-1:] else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"{text!r} is not a size: give bytes, or a number with K, M or G (64K, 16M)")
    return int(number) * UNITS[unit]


def sizes(min_bytes: int, max_bytes: int, factor: int, elem: int) -> list[int]:
    """The message sizes from min to max (both included), each ``factor`` times the last,
    rounded down to whole elements (at least one)."""
    out: list[int] = []
    s = min_bytes
    while s <= max_bytes:
        out.append(max(elem, s // elem * elem))
        s *= factor
    if out and out[-1] != max_bytes // elem * elem and max_bytes >= min_bytes:
        out.append(max(elem, max_bytes // elem * elem))
    return sorted(set(out))


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus factor: 2 (n - 1) / n."""
    return 2.0 * (ranks - 1) / ranks if ranks > 1 else 0.0


def rounds(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """Every pair of nodes exactly once, in rounds of disjoint pairs (the circle method:
    n - 1 rounds for an even n, n rounds for an odd one, one node resting each round)."""
    ring: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    n = len(ring)
    out: list[list[tuple[str, str]]] = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = ring[i], ring[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b) if nodes.index(a) < nodes.index(b) else (b, a))
        out.append(pairs)
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="allreduce_bw.py", description=__doc__.split("\n")[0])
    ap.add_argument("--min-bytes", default="1K", help="smallest message (default 1K)")
    ap.add_argument("--max-bytes", default=None, help="largest message (default 16M with gloo, 1G with NCCL)")
    ap.add_argument("--factor", type=int, default=4, help="each size this many times the last (default 4)")
    ap.add_argument("--iters", type=int, default=10, help="timed all-reduces per size (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed all-reduces before them (default 3)")
    ap.add_argument("--pair-bytes", default="4M", help="the message each node pair all-reduces (default 4M; 0: no pairs)")
    ap.add_argument("--pair-iters", type=int, default=5, help="timed all-reduces per pair (default 5)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                    help="auto: nccl where torch sees a GPU, else gloo")
    ap.add_argument("--result-file", default=None, help="also write the result JSON here")
    args = ap.parse_args(argv)
    try:
        args.min_bytes = size_bytes(args.min_bytes)
        args.max_bytes = None if args.max_bytes is None else size_bytes(args.max_bytes)
        args.pair_bytes = 0 if args.pair_bytes.strip() == "0" else size_bytes(args.pair_bytes)
    except ValueError as exc:
        ap.error(str(exc))
    if args.max_bytes is not None and args.min_bytes > args.max_bytes:
        ap.error(f"--min-bytes {args.min_bytes} is above --max-bytes {args.max_bytes}")
    for name in ("factor", "iters", "pair_iters"):
        if getattr(args, name) < (2 if name == "factor" else 1):
            ap.error(f"--{name.replace('_', '-')} must be at least {2 if name == 'factor' else 1}")
    if args.warmup < 0:
        ap.error("--warmup must be 0 or more")
    return args


class Comm:
    """The process group, the device and the clock that waits for the device."""

    def __init__(self, backend: str) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl" and not torch.cuda.is_available():
            raise SystemExit("allreduce_bw.py: error: --backend nccl needs a GPU torch can see; use --backend gloo")
        self.backend = backend
        self.device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
        bound: dict[str, Any] = {}
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            bound["device_id"] = self.device
        dist.init_process_group(backend=backend, init_method="env://", **bound)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def timed(self, buf: Any, iters: int, warmup: int, group: Any = None) -> float:
        """Seconds per all-reduce of ``buf`` in ``group``, this rank's mean over ``iters``."""
        for _ in range(warmup):
            self.dist.all_reduce(buf, group=group)
        self.sync()
        self.dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            self.dist.all_reduce(buf, group=group)
        self.sync()
        return (time.perf_counter() - t0) / iters

    def total(self, value: float, group: Any = None) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, group=group)
        return float(t.item())

    def mean(self, value: float, group: Any = None, members: int | None = None) -> float:
        return self.total(value, group) / (members or self.world)


def measure(args: argparse.Namespace, c: Comm) -> dict[str, Any]:
    torch, dist = c.torch, c.dist
    dtype, elem = getattr(torch, args.dtype), DTYPES[args.dtype]
    host = os.environ.get("DISTRUN_HOST") or socket.gethostname()
    where = dist.all_gather_object if c.world > 1 else None
    mine = {"host": host, "nic": os.environ.get("NCCL_SOCKET_IFNAME" if c.backend == "nccl" else "GLOO_SOCKET_IFNAME", "")}
    everyone: list[Any] = [None] * c.world
    if where:
        where(everyone, mine)
    else:
        everyone = [mine]
    hosts = [e["host"] for e in everyone]
    nodes = list(dict.fromkeys(hosts))
    if c.rank == 0:
        print(f"# all-reduce (sum, in place), {c.world} rank(s) on {len(nodes)} node(s), {c.backend} on "
              f"{c.device.type}, {args.iters} timed after {args.warmup} warm-up per size", flush=True)
        print("#       size         count      type   redop     time   algbw   busbw #wrong", flush=True)
        print("#        (B)    (elements)                       (us)  (GB/s)  (GB/s)", flush=True)
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes, args.factor, elem):
        count = nbytes // elem
        buf = torch.zeros(count, dtype=dtype, device=c.device)  # zeros stay zeros: no overflow while timed
        seconds = c.mean(c.timed(buf, args.iters, args.warmup))
        buf.fill_(c.rank + 1)
        dist.all_reduce(buf)
        expect = c.world * (c.world + 1) / 2
        wrong = int(c.total(float((buf != expect).sum().item())))
        algbw = nbytes / seconds / 1e9
        row = {"bytes": nbytes, "count": count, "time_us": seconds * 1e6, "algbw": algbw,
               "busbw": algbw * bus_factor(c.world), "wrong": wrong}
        rows.append(row)
        if c.rank == 0:
            print(f"{nbytes:12d}  {count:12d}  {NCCL_TYPE[args.dtype]:>8s}  {'sum':>6s}  {row['time_us']:7.1f}  "
                  f"{algbw:6.2f}  {row['busbw']:6.2f}  {wrong:5d}", flush=True)
    pairs = measure_pairs(args, c, hosts, nodes, dtype, elem) if args.pair_bytes and len(nodes) > 1 else []
    nics = {}
    for e in everyone:
        nics.setdefault(e["host"], e["nic"])
    return {"workload": "allreduce_bw", "backend": c.backend, "device": str(c.device), "ranks": c.world,
            "dtype": args.dtype, "type": NCCL_TYPE[args.dtype], "redop": "sum", "iters": args.iters,
            "warmup": args.warmup, "hosts": nodes, "ranks_per_host": {n: hosts.count(n) for n in nodes},
            "nics": nics, "sizes": rows, "pair_bytes": args.pair_bytes if pairs else 0, "pairs": pairs}


def measure_pairs(args: argparse.Namespace, c: Comm, hosts: list[str], nodes: list[str], dtype: Any,
                  elem: int) -> list[dict[str, Any]]:
    """Each pair of nodes all-reduces on its own; disjoint pairs at once, one round at a time."""
    dist = c.dist
    schedule = rounds(nodes)
    # Every rank creates every group, in the same order (torch requires it of new_group).
    groups = {}
    for pairs in schedule:
        for a, b in pairs:
            groups[(a, b)] = dist.new_group([r for r, h in enumerate(hosts) if h in (a, b)])
    count = max(1, args.pair_bytes // elem)
    mine: list[dict[str, Any]] = []
    for pairs in schedule:
        for a, b in pairs:
            if hosts[c.rank] not in (a, b):
                continue
            members = sum(1 for h in hosts if h in (a, b))
            buf = c.torch.zeros(count, dtype=dtype, device=c.device)
            seconds = c.mean(c.timed(buf, args.pair_iters, max(1, args.warmup), group=groups[(a, b)]),
                             group=groups[(a, b)], members=members)
            if c.rank == min(r for r, h in enumerate(hosts) if h in (a, b)):
                algbw = count * elem / seconds / 1e9
                mine.append({"hosts": [a, b], "ranks": members, "time_us": seconds * 1e6, "algbw": algbw,
                             "busbw": algbw * bus_factor(members)})
        dist.barrier()  # the next round starts together: no pair measures while another still runs
    found: list[Any] = [None] * c.world
    dist.all_gather_object(found, mine)
    return sorted((p for part in found for p in part), key=lambda p: [nodes.index(h) for h in p["hosts"]])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "WORLD_SIZE" not in os.environ:
        # One process with no launcher: a group of one still times the local all-reduce path.
        os.environ.update({"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": os.environ.get("MASTER_PORT", "29500")})
    c = Comm(args.backend)
    if args.max_bytes is None:
        args.max_bytes = max(args.min_bytes, DEFAULT_MAX[c.backend])
    result = measure(args, c)
    if c.rank == 0:
        avg = sum(r["busbw"] for r in result["sizes"]) / max(1, len(result["sizes"]))
        print(f"# Avg bus bandwidth    : {avg:.3f} GB/s", flush=True)
        for p in result["pairs"]:
            print(f"# pair {p['hosts'][0]} - {p['hosts'][1]}: {p['busbw']:.3f} GB/s bus bandwidth "
                  f"({result['pair_bytes']} bytes, {p['ranks']} ranks)", flush=True)
        text = json.dumps(result)
        out = args.result_file or (os.path.join(os.environ["DISTRUN_RUN_DIR"], "result.json")
                                   if os.environ.get("DISTRUN_RUN_DIR") else None)
        if out:
            with open(out, "w") as fh:
                fh.write(text + "\n")
        print("DISTRUN_RESULT " + text, flush=True)
    # The barrier keeps a rank from tearing the group down while another is in its last
    # collective (testbed.md: torch programs aborted at exit without it).
    c.dist.barrier()
    c.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # As the torch trainers do (torch_dist.run_main): gloo's threads can race the interpreter's
    # teardown after the group is gone; nothing is left to finalize.
    os._exit(code)
