"""A node's GPU health, judged from what roles/preflight/files/gpuhealth.py read there: nvidia-smi's
CSV (count, driver, persistence mode, uncorrected ECC errors, remapped rows) and the kernel log's
Xid events, each problem with its fix, and whether it drains the node (a fault of the GPU or the
driver that the next run would meet again) or only fails the check (a setting to change).

Xid events count from this boot and the last ``XID_WINDOW_S`` (the node's own clock); those a
program causes (13, 31, 43, 45, 94) never drain: the next run is not hurt by the last one's bug.
Pure: what a node sent is data, parsed here defensively; no I/O.
"""

from __future__ import annotations

import collections
import csv
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from distrun.preflight.report import Item

XID_WINDOW_S = 24 * 3600
# Xid -> (what NVIDIA's Xid catalog says it is, whether it drains the node, the fix).
RESET = "reset the GPU (nvidia-smi -r with nothing running on it) or reboot the node"
XIDS: Mapping[int, tuple[str, bool, str]] = {
    13: ("graphics engine exception (usually the program)", False, "look at the failing program"),
    31: ("GPU memory page fault (usually the program)", False, "look at the failing program"),
    43: ("GPU stopped processing (usually the program)", False, "look at the failing program"),
    45: ("preemptive cleanup after an earlier error", False, "look at the Xid before it"),
    48: ("double-bit ECC error", True, RESET + "; if it comes back, have the GPU replaced"),
    61: ("internal micro-controller breakpoint", True, RESET),
    62: ("internal micro-controller halt", True, RESET),
    63: ("ECC page retirement or row remapping recorded", True, RESET + " so the remapping takes effect"),
    64: ("ECC page retirement or row remapping failed", True, "have the GPU replaced"),
    74: ("NVLink error", True, RESET + "; if it comes back, have the NVLink checked"),
    79: ("GPU has fallen off the bus", True, "reboot the node; if it comes back, reseat the GPU or check its power"),
    92: ("high single-bit ECC error rate", False, "watch it; have the GPU replaced if double-bit errors follow"),
    94: ("contained ECC error (the program using that memory was stopped)", False, "run the program again"),
    95: ("uncontained ECC error", True, RESET),
    119: ("GSP RPC timeout", True, RESET),
    120: ("GSP error", True, RESET),
    121: ("C2C link error", True, RESET),
    140: ("unrecovered ECC error", True, RESET),
    154: ("GPU recovery action changed", True, "do the recovery action the Xid names (reset, reboot or drain)"),
}
_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+)\): (?P<code>\d+),\s*(?P<text>.*)")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?)\s")
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]\s")
_LOST = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+)\s*:\s*(.*)")
_NA = {"", "[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]"}


@dataclass(frozen=True)
class Gpu:
    index: int
    bus: str
    name: str
    driver: str
    persistence: bool | None  # None: not reported
    ecc_volatile: int | None  # uncorrected errors since the driver loaded
    ecc_aggregate: int | None  # over the GPU's life


@dataclass(frozen=True)
class Xid:
    code: int
    bus: str
    text: str
    age_s: float | None  # None: no time on the line

    def meaning(self) -> tuple[str, bool, str]:
        return XIDS.get(self.code, (f"Xid {self.code}, not in distrun's list", False,
                                    "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)"))


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str
    drains: bool


@dataclass
class Health:
    expected: int  # GPUs the node should have: setup's count or the devices present, the larger
    gpus: list[Gpu] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be read, without failing

    @property
    def has_gpus(self) -> bool:
        return self.expected > 0 or bool(self.gpus)

    def drain_reason(self) -> str:
        """Why the node is drained ('' when nothing drains it)."""
        return "; ".join(p.what for p in self.problems if p.drains)

    def item(self) -> Item:
        if not self.problems:
            drivers = sorted({g.driver for g in self.gpus})
            text = f"{len(self.gpus)} GPU(s), driver {', '.join(drivers) or '?'}, no uncorrected ECC error, no Xid"
            return Item(True, "; ".join([text, *self.notes]))
        drains = any(p.drains for p in self.problems)
        fixes = list(dict.fromkeys(p.fix for p in self.problems))
        after = "; then 'distrun check' again (a check that passes brings the node back)" if drains else ""
        return Item(False, ("DRAINED: " if drains else "") + "; ".join(p.what for p in self.problems),
                    "; ".join(fixes) + after)


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def parse_query(text: str) -> tuple[list[Gpu], list[tuple[str, str]]]:
    """nvidia-smi --query-gpu=... --format=csv (a header, then one row per GPU): the GPUs, and
    the GPUs nvidia-smi could not reach (bus id, its words) from the lines it writes for them."""
    rows = [ln for ln in text.splitlines() if ln.strip()]
    gpus: list[Gpu] = []
    lost: list[tuple[str, str]] = []
    if not rows:
        return gpus, lost
    header = [h.strip().split(" [")[0] for h in next(csv.reader([rows[0]], skipinitialspace=True))]
    if "index" not in header:
        raise ValueError(f"not nvidia-smi's CSV: the first line is {rows[0][:80]!r}")
    for line in rows[1:]:
        m = _LOST.search(line)
        if m:
            lost.append((m[1], m[2].strip()))
            continue
        cells = [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
        if len(cells) != len(header):
            raise ValueError(f"a row of {len(cells)} fields under {len(header)} columns: {line[:80]!r}")
        row = dict(zip(header, cells, strict=True))
        pm = row.get("persistence_mode", "")
        gpus.append(Gpu(
            index=int(row["index"]), bus=row.get("pci.bus_id", ""), name=row.get("name", ""),
            driver=row.get("driver_version", ""),
            persistence=None if pm in _NA else pm.lower() == "enabled",
            ecc_volatile=_int(row.get("ecc.errors.uncorrected.volatile.total", "")),
            ecc_aggregate=_int(row.get("ecc.errors.uncorrected.aggregate.total", ""))))
    return gpus, lost


def parse_remap(text: str) -> dict[str, tuple[bool, bool]]:
    """nvidia-smi --query-remapped-rows=gpu_bus_id,...,pending,failure --format=csv: bus id ->
    (a remapping waits for a reset, a remapping failed). GPUs without row remapping are absent."""
    rows = [ln for ln in text.splitlines() if ln.strip()]
    if len(rows) < 2:
        return {}
    header = [h.strip() for h in next(csv.reader([rows[0]], skipinitialspace=True))]
    out = {}
    for line in rows[1:]:
        cells = [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
        if len(cells) != len(header):
            continue
        row = dict(zip(header, cells, strict=True))
        pending, failed = (row.get(k, "").lower() in ("yes", "1", "true")
                           for k in ("remapped_rows.pending", "remapped_rows.failure"))
        out[row.get("gpu_bus_id", "")] = (pending, failed)
    return out


def parse_xids(lines: Sequence[str], now: float, boot: float) -> list[Xid]:
    """The kernel log's Xid lines (journalctl -o short-iso, dmesg --time-format iso, or plain
    dmesg's seconds since boot), each with its age against the node's clock."""
    out = []
    for line in lines:
        m = _XID_LINE.search(str(line))
        if not m:
            continue
        at: float | None = None
        if (t := _ISO.match(line)) is not None:
            try:
                at = datetime.fromisoformat(t[1].replace(",", ".")).timestamp()
            except ValueError:
                at = None
        elif (t := _MONO.match(line)) is not None and boot:
            at = boot + float(t[1])
        out.append(Xid(int(m["code"]), m["bus"], m["text"].strip()[:200], None if at is None else max(0.0, now - at)))
    return out


def _smi_failure(query: Mapping[str, Any]) -> Problem:
    said = " ".join(f"{query.get('out', '')} {query.get('err', '')}".split())[:300] or f"exit {query.get('rc')}"
    if "version mismatch" in said:
        fix = "reboot the node: the loaded kernel module is older than the driver's libraries (an upgrade without reboot)"
    elif "couldn't communicate with the NVIDIA driver" in said or "NVML" in said:
        fix = "load the driver (modprobe nvidia) or reinstall it ('distrun setup' with nvidia_driver_enabled), then reboot"
    else:
        fix = "run nvidia-smi on the node and fix what it says"
    return Problem(f"nvidia-smi fails: {said}", fix, True)


def judge(reading: Mapping[str, Any], setup_gpus: int, driver_reference: str | None = None,
          window_s: float = XID_WINDOW_S, *, declared: int | None = None, host: str = "the node") -> Health:
    """One node's health from its reading and the GPUs setup counted there; ``declared``: the
    inventory's ``gpus`` for ``host`` (None: it declares none), compared with what nvidia-smi detects."""
    devices = reading.get("devices")
    h = Health(expected=max(int(setup_gpus or 0), devices if isinstance(devices, int) else 0))
    query = reading.get("query")
    if not reading.get("smi"):
        if declared and not devices:  # maybe only the inventory's mistake: the check fails, nothing drains
            h.problems.append(Problem(f"gpus: {declared} declared in the inventory, none detected (no nvidia-smi, no "
                                      f"/dev/nvidia*)", "install the NVIDIA driver ('distrun setup' with "
                                      f"nvidia_driver_enabled: true), or set gpus: 0 for {host} in the inventory if it "
                                      "has no GPU", False))
        elif h.expected:
            h.problems.append(Problem(f"{h.expected} GPU(s) but no nvidia-smi", "install the NVIDIA driver ('distrun setup' "
                                      "with nvidia_driver_enabled: true)", True))
        return h
    if not isinstance(query, Mapping):
        return h
    lost: list[tuple[str, str]] = []
    try:
        h.gpus, lost = parse_query(str(query.get("out", "")))
    except ValueError as exc:
        h.notes.append(f"nvidia-smi's answer not understood ({exc})")
    if query.get("rc") != 0 and not h.gpus and not lost:
        if "No devices were found" in str(query.get("out", "")) and not h.expected:
            return h  # the driver's tools on a node without GPUs
        h.problems.append(_smi_failure(query))
        return h
    for bus, said in lost:
        h.problems.append(Problem(f"GPU {bus} does not answer ({said[:120]})", "reboot the node; if it comes back, "
                                  "reseat the GPU or check its power", True))
    if h.expected and len(h.gpus) < h.expected and not lost:
        said = f" (gpus: {declared} declared)" if declared == h.expected else ""
        fix = "reboot the node; if a GPU is still missing, look for Xid 79 in its kernel log and reseat it"
        fix += f" (or set gpus: {len(h.gpus)} for {host} in the inventory if it has no more)" if said else ""
        h.problems.append(Problem(f"{len(h.gpus)} of {h.expected} GPU(s) answer nvidia-smi{said}", fix, True))
    if declared is not None and len(h.gpus) > declared and not lost:
        h.problems.append(Problem(f"nvidia-smi detects {len(h.gpus)} GPU(s), gpus: {declared} declared in the inventory",
                                  f"set gpus: {len(h.gpus)} for {host} in the inventory (runs place ranks only on the "
                                  "GPUs it declares)", False))
    for g in h.gpus:
        if g.ecc_volatile:
            h.problems.append(Problem(f"GPU {g.index} ({g.bus}): {g.ecc_volatile} uncorrected ECC error(s) since the "
                                      "driver loaded", RESET, True))
        if g.persistence is False:
            h.problems.append(Problem(f"GPU {g.index}: persistence mode off", "turn it on: 'nvidia-smi -pm 1', or "
                                      "enable nvidia-persistenced (role nvidia does)", False))
    if driver_reference and any(g.driver != driver_reference for g in h.gpus):
        drivers = sorted({g.driver for g in h.gpus})
        h.problems.append(Problem(f"driver {', '.join(drivers)}, while most nodes have {driver_reference}",
                                  f"install driver {driver_reference} here (or upgrade every node alike)", False))
    remap = reading.get("remap")
    if isinstance(remap, Mapping) and remap.get("rc") == 0:
        for bus, (pending, failed) in sorted(parse_remap(str(remap.get("out", ""))).items()):
            if failed:
                h.problems.append(Problem(f"GPU {bus}: a row remapping failed", "have the GPU replaced", True))
            elif pending:
                h.problems.append(Problem(f"GPU {bus}: a row remapping waits for a reset", RESET, True))
    kernel: Mapping[str, Any] = reading.get("kernel") or {}
    if not isinstance(kernel, Mapping):
        kernel = {}
    if kernel.get("error"):
        h.notes.append(f"kernel log not read ({str(kernel['error'])[:200]})")
    xids = parse_xids([str(x) for x in kernel.get("lines") or []], float(reading.get("now") or 0),
                      float(reading.get("boot") or 0))
    seen: dict[tuple[int, str], int] = collections.Counter(
        (x.code, x.bus) for x in xids if x.age_s is None or x.age_s <= window_s)
    for (code, bus), n in sorted(seen.items()):
        meaning, drains, fix = Xid(code, bus, "", None).meaning()
        if code in XIDS and not drains and code != 92:
            continue  # a program's fault: not the node's
        h.problems.append(Problem(f"Xid {code} on GPU {bus} ({meaning}{f', {n} times' if n > 1 else ''})", fix, drains))
    return h


def judge_all(readings: Mapping[str, Mapping[str, Any]], setup_gpus: Mapping[str, int],
              declared: Mapping[str, int] | None = None) -> dict[str, Health]:
    """Every node's health; the driver most nodes with GPUs have is the reference for the others.
    ``declared``: the inventory's ``gpus`` of the nodes that declare it."""
    first = {n: judge(r, setup_gpus.get(n, 0)) for n, r in readings.items()}
    drivers = collections.Counter(g.driver for h in first.values() for g in h.gpus[:1])
    reference = drivers.most_common(1)[0][0] if len(drivers) > 1 else None
    return {n: judge(r, setup_gpus.get(n, 0), reference, declared=(declared or {}).get(n), host=n)
            for n, r in readings.items()}
