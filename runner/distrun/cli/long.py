"""The command line of runs that outlive the terminal: 'distrun status' and 'distrun attach'
(registered on the main group by cli/main.py, which owns output and exit codes the same way)."""

from __future__ import annotations

import json
import sys

import click

from distrun.cli.parse import Command
from distrun.errors import ExitCode, UserError


@click.command(cls=Command)
@click.argument("run_id", default="last")
@click.option("--json", "as_json", is_flag=True,
              help="Print the state as JSON: state, rc, detail, record, controller, hosts (per host: launcher, rc, processes).")
def status(run_id: str, as_json: bool) -> None:
    """A train run's state, read from its nodes: per host, the launcher running or its exit code,
    the run's processes and the ranks that started; a record nothing follows is corrected.

    Exits 0 once the state is known, whatever it is (running, succeeded, failed, stopped, lost);
    6 when no node of the run answers (state 'unreachable', in --json too): the run may still
    be going, and a script must not take the record's word for it.

    RUN_ID: an id from 'distrun runs', a unique prefix or suffix of one, or 'last'."""
    from distrun.run.liveness import UNREACHABLE
    from distrun.run.reconcile import view
    from distrun.store.runs import load_run
    from distrun.ui.run import print_status

    run = load_run(run_id, verb="train")
    if run.meta.verb != "train":
        raise UserError(f"run {run.id} is a '{run.meta.verb}' run: 'distrun status' reads train runs")
    now = view(run, ask_nodes=True)
    if as_json:
        from distrun.ui.data import SCHEMA

        click.echo(json.dumps({"schema": SCHEMA, **now.as_dict()}, indent=2))
    else:
        print_status(now)
    if now.state == UNREACHABLE:
        sys.exit(ExitCode.CONTACT_LOST)


@click.command(cls=Command)
@click.argument("run_id", default="last")
def attach(run_id: str) -> None:
    """Follow a train run again (detached, or whose distrun process ended) to its end: its output
    live, then its logs collected and its exit code recorded. Exits as 'distrun train' would.

    Ctrl-C leaves the run running. RUN_ID: an id from 'distrun runs', a unique prefix or
    suffix of one, or 'last'."""
    from distrun.run.attach import attach as attach_run
    from distrun.ui.run import TrainView

    sys.exit(attach_run(run_id, TrainView()))
