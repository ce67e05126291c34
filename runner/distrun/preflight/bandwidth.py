"""The all-reduce check's verdict: what workloads/allreduce_bw.py measured, read back safely,
and the node (or pair of nodes) far below the rest.

The program times an all-reduce over every rank per message size (nccl-tests' all_reduce_perf)
and then one between each pair of nodes. A node is named when even its best pair is far below
the cluster's usual pair (the median, over the nodes, of each node's best pair): every link it
has is slow, so the node's own NIC, cable or switch port is the suspect. A pair is named when
the two nodes are fine with the others but slow together. Two nodes make one pair and nothing
to compare it with: then nothing is named. Pure: no I/O; what a node sent is data, checked here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from distrun.errors import UserError

PROGRAM = "allreduce_bw.py"  # under workloads/
# "Far below the rest": under this fraction of the usual pair's bus bandwidth. Pairs of the same
# cluster measured within a factor of 1.4 of each other on the loaded 2-core test machine; a
# throttled NIC is ten times slower or more.
FAR_BELOW = 0.5


@dataclass(frozen=True)
class Size:
    bytes: int
    count: int
    time_us: float
    algbw: float  # GB/s (1e9 bytes)
    busbw: float
    wrong: int


@dataclass(frozen=True)
class Pair:
    hosts: tuple[str, str]
    ranks: int
    time_us: float
    algbw: float
    busbw: float


@dataclass(frozen=True)
class Measurement:
    backend: str
    device: str
    ranks: int
    type: str  # nccl-tests' name: float, half, ...
    redop: str
    hosts: tuple[str, ...]
    nics: Mapping[str, str]
    sizes: tuple[Size, ...]
    pair_bytes: int
    pairs: tuple[Pair, ...]


@dataclass(frozen=True)
class Verdict:
    reference: float | None  # GB/s: the usual pair's bus bandwidth, None without pairs to compare
    slow_nodes: Mapping[str, float] = field(default_factory=dict)  # node -> its best pair's busbw
    slow_pairs: Mapping[tuple[str, str], float] = field(default_factory=dict)
    wrong: int = 0  # elements an all-reduce got wrong, over every size
    note: str = ""  # why nothing could be compared

    @property
    def ok(self) -> bool:
        return not self.slow_nodes and not self.slow_pairs and not self.wrong


def _number(data: Mapping[str, Any], key: str, what: str, whole: bool = False) -> Any:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: {key} is {value!r}, not a {'whole ' if whole else ''}number >= 0")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 255 or not value.isprintable():
        raise ValueError(f"{what}: {value!r} is not a name")
    return value


def read(result: Mapping[str, Any] | None, nodes: Sequence[str]) -> Measurement:
    """The program's result (the record's result.json), checked: numbers are numbers and every
    host is one of ``nodes`` (the run's). A result that is not the program's is one UserError line."""
    try:
        if not isinstance(result, Mapping) or result.get("workload") != "allreduce_bw":
            raise ValueError("the run printed no all-reduce result (DISTRUN_RESULT of allreduce_bw)")
        hosts = tuple(_text(h, "hosts") for h in result.get("hosts") or ())
        stray = [h for h in hosts if h not in nodes]
        if not hosts or stray:
            raise ValueError(f"hosts {list(hosts)} are not the run's nodes {list(nodes)}")
        sizes = tuple(Size(_number(s, "bytes", "sizes", True), _number(s, "count", "sizes", True),
                           _number(s, "time_us", "sizes"), _number(s, "algbw", "sizes"),
                           _number(s, "busbw", "sizes"), _number(s, "wrong", "sizes", True))
                      for s in _list(result, "sizes"))
        pairs = []
        for p in _list(result, "pairs"):
            two = tuple(_text(h, "pairs") for h in p.get("hosts") or ())
            if len(two) != 2 or two[0] == two[1] or any(h not in hosts for h in two):
                raise ValueError(f"pair {list(two)} is not two of the measured hosts")
            pairs.append(Pair((two[0], two[1]), _number(p, "ranks", "pairs", True), _number(p, "time_us", "pairs"),
                              _number(p, "algbw", "pairs"), _number(p, "busbw", "pairs")))
        nics = result.get("nics") or {}
        if not isinstance(nics, Mapping):
            raise ValueError("nics is not a mapping")
        return Measurement(
            backend=_text(result.get("backend"), "backend"), device=_text(result.get("device"), "device"),
            ranks=_number(result, "ranks", "ranks", True), type=_text(result.get("type"), "type"),
            redop=_text(result.get("redop"), "redop"), hosts=hosts,
            nics={h: _text(nics[h], "nics") for h in hosts if nics.get(h)}, sizes=sizes,
            pair_bytes=_number(result, "pair_bytes", "pair_bytes", True), pairs=tuple(pairs))
    except (ValueError, TypeError, AttributeError) as exc:
        raise UserError(f"the all-reduce check's result cannot be read: {exc}; see the run's launcher log "
                        "('distrun logs last')") from None


def _list(result: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = result.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ValueError(f"{key} is not a list of objects")
    return value


def judge(m: Measurement, far_below: float = FAR_BELOW) -> Verdict:
    """The nodes and pairs far below the rest (see the module's docstring)."""
    wrong = sum(s.wrong for s in m.sizes)
    if len(m.hosts) < 3 or not m.pairs:
        why = ("one node: no link between nodes to measure" if len(m.hosts) < 2 else
               "two nodes make one pair: nothing to compare it with (three or more name a slow node)"
               if len(m.hosts) == 2 else "no pair was measured")
        return Verdict(None, wrong=wrong, note=why)
    best: dict[str, float] = {}
    for p in m.pairs:
        for h in p.hosts:
            best[h] = max(best.get(h, 0.0), p.busbw)
    reference = statistics.median(best.values())
    bar = far_below * reference
    slow_nodes = {h: bw for h, bw in best.items() if bw < bar}
    slow_pairs = {p.hosts: p.busbw for p in m.pairs
                  if p.busbw < bar and not any(h in slow_nodes for h in p.hosts)}
    return Verdict(reference, slow_nodes, slow_pairs, wrong)


def problems(m: Measurement, v: Verdict) -> list[tuple[str, str]]:
    """(what, fix) per problem, the slow nodes first: the lines check prints and --json lists."""
    out: list[tuple[str, str]] = []
    nic = lambda h: f" over {m.nics[h]}" if h in m.nics else ""  # noqa: E731
    for h, bw in sorted(v.slow_nodes.items()):
        out.append((f"{h}: bus bandwidth {bw:.3f} GB/s{nic(h)} at best, far below the other nodes' "
                    f"{v.reference or 0:.3f} GB/s ({m.pair_bytes} bytes per all-reduce, every pair {h} is in)",
                    f"look at {h}'s NIC{nic(h)}: its link speed and errors (ethtool), a traffic shaper (tc qdisc), "
                    "its cable or switch port; 'distrun train --exclude " + h + "' runs without it meanwhile"))
    for (a, b), bw in sorted(v.slow_pairs.items()):
        out.append((f"{a} - {b}: bus bandwidth {bw:.3f} GB/s between them, far below the usual "
                    f"{v.reference or 0:.3f} GB/s, while each is fast with the other nodes",
                    f"look at the path between {a} and {b}: the switches or routes between them"))
    if v.wrong:
        out.append((f"{v.wrong} element(s) of the all-reduce results were wrong",
                    "a wrong sum means a broken NIC, driver or GPU: run 'distrun check' and the vendor's diagnostics"))
    return out


def as_json(m: Measurement, v: Verdict, run_id: str) -> dict[str, Any]:
    """'distrun check --bandwidth --json'."""
    return {
        "schema": 1,  # docs/guide/distrun-json.schema.json's, as every --json
        "ok": v.ok, "run_id": run_id, "backend": m.backend, "device": m.device, "ranks": m.ranks,
        "hosts": list(m.hosts), "nics": dict(m.nics), "type": m.type, "redop": m.redop,
        "sizes": [vars(s) for s in m.sizes],
        "pairs": [{**vars(p), "hosts": list(p.hosts)} for p in m.pairs], "pair_bytes": m.pair_bytes,
        "reference_busbw": v.reference, "slow_nodes": dict(v.slow_nodes),
        "slow_pairs": [{"hosts": list(k), "busbw": bw} for k, bw in v.slow_pairs.items()],
        "wrong": v.wrong, "note": v.note,
        "problems": [{"detail": d, "fix": f} for d, f in problems(m, v)],
    }
