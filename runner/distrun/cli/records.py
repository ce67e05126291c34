"""The command line of run records: 'distrun runs' (every record, running ones checked against
their nodes) and 'distrun show' (one record); registered on the main group by cli/main.py."""

from __future__ import annotations

import json

import click

from distrun import paths
from distrun.cli import params as P
from distrun.cli.parse import Command
from distrun.store.runs import RunStatus
from distrun.ui.console import console


@click.command(cls=Command)
@click.option("--prune", is_flag=True, help="Delete the records of finished runs (running ones stay).")
@click.option("--older-than", default=None, metavar="DURATION", callback=P.duration,
              help="With --prune: only runs started longer ago than this (30d, 12h, 90m, 2w; default 30d).")
@P.json_option
def runs(prune: bool, older_than: float | None, as_json: bool) -> None:
    """List run records, oldest first (the newest is last); --prune deletes old ones.

    --json prints {"schema": 1, "runs": [{run_id, verb, status, rc, inventory, started,
    finished, duration_s, summary, dir, drained}, ...]}."""
    from distrun.store.runs import list_runs, prune_runs
    from distrun.ui import data as records
    from distrun.ui.records import print_runs

    if older_than is not None and not prune:
        raise click.UsageError("--older-than only goes with --prune: distrun runs --prune --older-than 30d")
    if prune:
        if as_json:
            raise click.UsageError("--json lists runs; it does not go with --prune")
        removed = prune_runs(30 * 86400 if older_than is None else older_than)
        for r in removed:
            console.print(f"removed {r.id} ({r.meta.verb}, {r.meta.status})", markup=False)
        console.print(f"pruned {len(removed)} run record(s) from {paths.runs_dir()}", markup=False, soft_wrap=True)
        return
    from distrun.run.reconcile import views
    from distrun.store.runs import RecordError
    from distrun.ui.console import warn
    from distrun.ui.run import state_text

    unreadable: dict[str, RecordError] = {}
    found = list_runs(unreadable)
    listing = records.listing(found)
    now = views(found)  # a running record whose distrun process is gone is checked on its nodes
    for entry in listing["runs"]:
        v = now[entry["run_id"]]
        if v.state != entry["status"] or v.state == RunStatus.RUNNING:
            entry.update(status=v.state if as_json else state_text(v), rc=v.rc, summary=v.detail or entry["summary"])
    for exc in unreadable.values():
        warn(str(exc))
    if as_json:
        click.echo(json.dumps(listing, indent=2))
    else:
        print_runs(listing)


@click.command(cls=Command)
@P.run_argument
@P.json_option
def show(run_id: str, as_json: bool) -> None:
    """Show one run's record: status, result, timings, the exact commands and where its logs are.

    RUN_ID: an id from 'distrun runs', a unique prefix or suffix of one, or 'last' (the newest
    run of any verb)."""
    from distrun.store.runs import load_run
    from distrun.ui import data as records
    from distrun.ui.records import print_show

    detail = records.detail(load_run(run_id))
    if as_json:
        click.echo(json.dumps(detail, indent=2))
    else:
        print_show(detail)
