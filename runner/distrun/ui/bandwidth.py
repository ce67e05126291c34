"""The all-reduce check as people read it: nccl-tests' table (size, count, type, redop, time,
algbw, busbw, #wrong), the pairs of nodes, and the verdict with its fix. Plain text, never cut."""

from __future__ import annotations

from distrun.preflight.bandwidth import Measurement, Verdict, problems
from distrun.printable import printable


def _time(us: float) -> str:
    """nccl-tests' time column: two decimals while they fit in seven characters."""
    return f"{us:7.2f}" if us < 10000 else f"{us:7.1f}" if us < 100000 else f"{us:7.0f}"


def table(m: Measurement) -> list[str]:
    """The all-reduce per message size, in nccl-tests' layout (all_reduce_perf, in place)."""
    nics = sorted(set(m.nics.values()))
    over = f" over {', '.join(nics)}" if nics else ""
    lines = [f"# all-reduce ({m.redop}, in place): {m.ranks} rank(s) on {len(m.hosts)} node(s) "
             f"({', '.join(m.hosts)}), {m.backend} on {m.device.split(':')[0]}{over}",
             "#       size         count      type   redop     time   algbw   busbw #wrong",
             "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)       "]
    for s in m.sizes:
        lines.append(f"{s.bytes:12d}  {s.count:12d}  {m.type:>8s}  {m.redop:>6s}  {_time(s.time_us)}  "
                     f"{s.algbw:6.2f}  {s.busbw:6.2f}  {s.wrong:5d}")
    avg = sum(s.busbw for s in m.sizes) / len(m.sizes) if m.sizes else 0.0
    lines.append(f"# Avg bus bandwidth    : {avg:.3f} GB/s")
    return [printable(line) for line in lines]


def pair_lines(m: Measurement, v: Verdict) -> list[str]:
    """One line per pair of nodes, each with its bus bandwidth and whether it is far below."""
    if not m.pairs:
        return []
    width = max(len(f"{a} - {b}") for a, b in (p.hosts for p in m.pairs))
    out = [f"# node pairs: {m.pair_bytes} bytes per all-reduce, disjoint pairs at once"]
    for p in m.pairs:
        slow = p.hosts in v.slow_pairs or any(h in v.slow_nodes for h in p.hosts)
        name = f"{p.hosts[0]} - {p.hosts[1]}"
        out.append(f"  {name:<{width}}  {_time(p.time_us)} us  {p.busbw:8.3f} GB/s  {'FAR BELOW' if slow else 'ok'}")
    return [printable(line) for line in out]


def verdict_lines(m: Measurement, v: Verdict) -> list[str]:
    """The verdict: every problem with its fix, or that nothing is far below the rest."""
    found = problems(m, v)
    if not found:
        if v.reference is None:
            return [printable(f"no node named: {v.note}")]
        return [printable(f"no node or pair far below the rest (every pair at least half of the usual "
                          f"{v.reference:.3f} GB/s)")]
    out = []
    for detail, fix in found:
        out += [printable(f"✗ {detail}"), printable(f"    fix: {fix}")]
    return out
