"""The verb check's parts beyond the full preflight: --bandwidth (a timed all-reduce across the
nodes, nccl-tests' table, the node or pair far below the rest), --clear NODE (a drained node
brought back), and the drained nodes said after the report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from distrun.errors import ExitCode, UserError
from distrun.ui.console import console

_SIZE = re.compile(r"([1-9][0-9]*)([KMG]?)B?", re.I)


def size(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--max-bytes: bytes, or a whole number with K, M or G (1024-based), as bytes."""
    if value is None:
        return None
    m = _SIZE.fullmatch(value.strip())
    if not m:
        raise click.BadParameter(f"{value!r} is not a size: give bytes or a whole number with K, M or G (64M, 1G)",
                                 ctx, param)
    number = int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2].upper()]
    if number > 16 << 30:
        raise click.BadParameter(f"{value}: at most 16G per message", ctx, param)
    return str(number)


def refuse_mixed(ctx: click.Context) -> None:
    """What check's options mean together: --bandwidth, --clear and the full check's own."""
    p = ctx.params
    given = {name for name in p if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE,
                                                                       ParameterSource.ENVIRONMENT)}
    if p.get("clear") and (given - {"clear", "inventory", "as_json"}):
        raise click.UsageError("--clear NODE only brings a drained node back: drop the other options "
                               "(distrun check --clear NODE)", ctx)
    if p.get("bandwidth") and "ssh_logins" in given:
        raise click.UsageError("--ssh-logins belongs to the full check, not to --bandwidth: run them one after the other",
                               ctx)
    if not p.get("bandwidth"):
        for name in ("launcher", "max_bytes"):
            if name in given:
                flag = "--" + name.replace("_", "-")
                raise click.UsageError(f"{flag} only goes with --bandwidth: distrun check --bandwidth {flag} ...", ctx)


def clear(inventory: Path, node: str, as_json: bool) -> None:
    """--clear NODE: its drained mark removed, said in one line; a name the inventory does not
    have and no mark holds is a mistake (exit 2, the inventory's nodes named)."""
    from distrun.inventory.cluster import load_cluster
    from distrun.store import drained

    gone = drained.undrain(inventory, node)
    if gone is None:
        names = [n.name for n in load_cluster(inventory).nodes]
        if node not in names:
            raise UserError(f"--clear {node}: no such node in {inventory} (its nodes: {', '.join(names)})",
                            exit_code=ExitCode.USAGE)
    if as_json:
        click.echo(json.dumps({"schema": 1, "node": node, "cleared": gone.as_dict() if gone else None}, indent=2))
    elif gone is None:
        console.print(f"{node} was not drained: nothing to clear", markup=False)
    else:
        console.print(f"{node} is back: cleared its drain from {gone.when()} ({gone.source}: {gone.reason})",
                      markup=False, soft_wrap=True)


def say_drained(report: dict[str, Any]) -> None:
    """After check's report: one line per node still drained, and how it comes back."""
    from distrun.store.drained import Drain

    for node, d in sorted((report.get("drained") or {}).items()):
        console.print(f"drained: {Drain(node=node, **d).line()}", markup=False, soft_wrap=True)


def bandwidth(inventory: Path, launcher: str, max_bytes: str | None, as_json: bool) -> int:
    """--bandwidth: the all-reduce program run on every rank through train's path, its progress
    on stderr; then nccl-tests' table and the verdict (or --json) on stdout. Check's exit code."""
    from distrun.preflight import allreduce
    from distrun.preflight.bandwidth import as_json as result_json
    from distrun.ui.bandwidth import pair_lines, table, verdict_lines
    from distrun.ui.console import configure
    from distrun.ui.run import TrainView

    configure(progress_to_stderr=True)
    view = TrainView()
    out = allreduce.measure(inventory, launcher, view, max_bytes)
    configure(progress_to_stderr=False)
    if out.measured is None or out.verdict is None:
        raise UserError(f"the all-reduce check did not run to its end (exit {out.code}); "
                        f"see 'distrun logs {out.run_id or 'last'}'", exit_code=out.code or ExitCode.FAILED)
    if as_json:
        click.echo(json.dumps(result_json(out.measured, out.verdict, out.run_id or ""), indent=2))
        return out.exit_code
    for line in [*table(out.measured), *pair_lines(out.measured, out.verdict), *verdict_lines(out.measured, out.verdict)]:
        click.echo(line)
    click.echo(f"run record: {out.run_dir}")
    return out.exit_code
