"""The distrun command line: the verbs, their options and what each runs. How the command line
is read and its mistakes told is cli/parse.py; what each value may be, cli/params.py; the verbs
of a training run (train, partition), cli/train.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from distrun import __version__, paths
from distrun.cli import check as C
from distrun.cli import launcher as L
from distrun.cli import params as P
from distrun.cli.edges import exit_now
from distrun.cli.parse import Command, Group
from distrun.errors import ExitCode, UserError
from distrun.ui.console import console

run_argument = P.run_argument


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="distrun")
def main() -> None:
    """Provision a distributed-training cluster with Ansible and run jobs on it.

    \b
    Typical day:
      distrun setup --inventory prod        provision every node (idempotent)
      distrun check --inventory prod        every node: env, versions, ports, ssh, names, shared folder
      distrun train --inventory prod        partition, launch on every rank, follow progress
      distrun logs last --rank 1            one rank's log of the last run
      distrun show last --json              the last run's record, for scripts

    Set DISTRUN_INVENTORY=prod to leave out --inventory. Shell completion: docs/guide/cli.md.
    """


@main.command(cls=Command)
@P.inventory_option
@click.option("--check", "check_mode", is_flag=True, help="Ansible check mode: report what would change, change nothing.")
@click.option("--tags", default=None, callback=P.tags,
              help="Only run roles/steps with these Ansible tags (comma-separated; each must exist).")
@click.option("--limit", default=None, callback=P.limit, help="Only these hosts (Ansible --limit pattern).")
def setup(inventory: P.Inventory, check_mode: bool, tags: str | None, limit: str | None) -> None:
    """Provision the cluster: packages, user, ssh mesh, MPI env, shared folder, hostfile."""
    from distrun.inventory.cluster import load_cluster
    from distrun.inventory.read import read_inventory_json
    from distrun.inventory.slurm_site import refuse_setup
    from distrun.store.runs import new_run
    from distrun.transport.ansible_bridge import run_playbook
    from distrun.ui.console import PlaybookProgress, print_summary

    inv = inventory.path
    cluster = load_cluster(inv, admin=True)
    refuse_setup(inv, cluster.site is not None)
    # Every group of the inventory (ansible-inventory's answer is kept: no second call to Ansible).
    groups = [g for g in read_inventory_json(inv) if not g.startswith("_")]
    P.check_limit(inv, limit, [n.name for n in cluster.nodes], ["all", "head", "workers", "ungrouped", *groups])
    run = new_run("setup", inv)
    started = time.monotonic()
    with PlaybookProgress(f"setup.yml on {len(cluster.nodes)} node(s) from {inv}", [n.name for n in cluster.nodes]) as progress:
        result = run_playbook("setup.yml", inv, run.dir, on_event=progress, tags=tags, limit=limit, check=check_mode)
    print_summary(result, time.monotonic() - started)
    run.finish(ExitCode.OK if result.ok else ExitCode.FAILED, f"changed={result.changed}")
    console.print(f"run record: {run.dir}", markup=False, soft_wrap=True)
    if not result.ok:
        sys.exit(ExitCode.FAILED)


@main.command(cls=Command)
@P.inventory_option
def hostfile(inventory: P.Inventory) -> None:
    """Print the MPI hostfile the inventory describes (head first, `host slots=N`)."""
    from distrun.inventory.cluster import load_cluster, render_hostfile
    from distrun.inventory.slurm_site import refuse_hostfile

    cluster = load_cluster(inventory.path, paths.fact_cache_dir(inventory.path))
    refuse_hostfile(inventory.path, cluster.site is not None)
    click.echo(render_hostfile(cluster), nl=False)


@main.command(cls=Command)
@P.inventory_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON: ok, checks (check -> node -> ok, detail, fix), hosts.")
@click.option("--ssh-logins", is_flag=True,
              help="Log in from every node to every other even where the last check proved those logins "
                   "and nothing they depend on changed (then each node only checks the others' sshd banners).")
@click.option("--bandwidth", is_flag=True,
              help="Instead of the preflight: time an all-reduce across every rank and between each pair of nodes "
                   "(gloo, or NCCL on GPUs), print nccl-tests' table and name a node or pair far below the rest.")
@L.launcher_option
@click.option("--max-bytes", default=None, metavar="SIZE", callback=C.size,
              help="With --bandwidth: the largest message (default 16M with gloo, 1G with NCCL; 1K, 64M, 1G ...).")
@click.option("--clear", default=None, metavar="NODE",
              help="Bring a drained node back (drained by a faulty GPU or a run that lost it), and do nothing else.")
def check(inventory: P.Inventory, as_json: bool, ssh_logins: bool, bandwidth: bool, launcher: str,
          max_bytes: str | None, clear: str | None) -> None:
    """Check every node can run a job; report each check per node, with a fix for each failure.

    \b
    As the training user, on the real nodes (the full preflight):
      reach          every node answers over ssh (a stopped node fails within seconds)
      env, mpi4py    the env's bin/python exists; mpi4py loads Open MPI
      versions       python, Open MPI, mpi4py, torch, jittor ("absent" counts) and a
                     digest of the env's package list are the same on every node
      ports          the rendezvous port (29500) is free on the head; a process holding
                     it is named
      ssh            every node reaches every other node in batch mode (logins; once
                     they were proved and nothing they depend on changed on any node,
                     every node checks the others' sshd banners: --ssh-logins logs in)
      names          every node resolves every node name to the same address
      shared folder  writable by the training user; a file written on the head is seen
                     on every node (nfs, sshfs) or arrives by rsync (sync: "synced")
      gpus vs slots  a node with GPUs has slots equal to its GPU count
      gpu health     where nodes have GPUs: nvidia-smi answers for every GPU, no
                     uncorrected ECC error or pending row remapping, no Xid of a faulty
                     GPU in the kernel log (24 h), persistence mode on, one driver; a
                     faulty GPU drains its node until a check passes there (or --clear)
    'distrun train' runs the fast part first (env, mpi4py, versions, ports, head -> node
    ssh, shared folder writable, gpus vs slots). Exit 0 when every check passes, else 1.

    \b
    --bandwidth runs workloads/allreduce_bw.py on every rank as 'distrun train --script'
    would (train's fast preflight first): bus bandwidth per message size in nccl-tests'
    layout, then each pair of nodes; exit 1 naming a node or pair far below the rest.
    """
    C.refuse_mixed(click.get_current_context())
    if clear is not None:
        C.clear(inventory.path, clear, as_json)
        return
    if bandwidth:
        sys.exit(C.bandwidth(inventory.path, launcher, max_bytes, as_json))
    from distrun.preflight.check import run_check
    from distrun.ui.check import print_check_report

    inv = inventory.path
    if as_json:
        report, _ = run_check(inv, inventory.label, ssh_logins=ssh_logins)
        click.echo(json.dumps(report, indent=2))
    else:
        from distrun.ui.console import PlaybookProgress

        report, _ = run_check(inv, inventory.label, progress=lambda names: PlaybookProgress(
            f"distrun check on {len(names)} node(s) from {inv}", names), ssh_logins=ssh_logins)
        print_check_report(report)
        C.say_drained(report)
    sys.exit(ExitCode.OK if report["ok"] else ExitCode.FAILED)


@main.command(cls=Command)
@run_argument
@click.option("--rank", type=P.RANK, default=None, help="Show this rank's log (default: the launcher's log).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing as the log grows, until the run ends.")
def logs(run_id: str, rank: int | None, follow: bool) -> None:
    """Print a train run's logs: the launcher's, or one rank's with --rank. RUN_ID: an id
    from 'distrun runs', a unique prefix or suffix of one, or 'last' (the last train run)."""
    from distrun.printable import Stream
    from distrun.run.logs import log_text

    shown = Stream()  # what the job wrote is data: no escape sequence reaches the terminal
    for chunk in log_text(run_id, rank, follow):
        sys.stdout.write(shown.feed(chunk))
        sys.stdout.flush()
    sys.stdout.write(shown.end())


@main.command(cls=Command)
@run_argument
@click.argument("run_paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--host", default=None, metavar="HOST", help="Only from this node (default: the nodes the record lists the path on).")
def fetch(run_id: str, run_paths: tuple[str, ...], host: str | None) -> None:
    """Bring files a train run left on its nodes into its record.

    A run brings home its logs and every file up to 1 MiB when it ends; bigger files its job
    wrote into the run directory stay on the nodes, listed in the record's left-on-nodes.json.
    PATH: a file, a folder or a quoted glob, relative to the run directory (out/model.pt, out,
    'out/*.pt'; as in find's -path, a * matches across folders too). The files land in the
    record's nodes/<host>/, beside its logs. Exits 1 naming a node whose files did not all
    arrive, 2 for a path no node holds."""
    from distrun.run.fetch import fetch as fetch_paths

    got = fetch_paths(run_id, run_paths, host)
    for h, (files, size) in sorted(got.brought.items()):
        console.print(f"{h}: {files} file(s), {size / (1 << 20):.1f} MiB into {got.dest / h}", markup=False, soft_wrap=True)
    if got.errors:
        raise UserError("; ".join(f"{h}: {why}" for h, why in sorted(got.errors.items())), exit_code=ExitCode.FAILED)


@main.command(cls=Command)
@run_argument
def stop(run_id: str) -> None:
    """Stop a train run: every process of it on every node, with a count per node.

    RUN_ID: an id from 'distrun runs', a unique prefix or suffix of one, or 'last' (the last
    train run). Exits 1 naming the nodes it could not reach."""
    from distrun.run.stop import stop_run
    from distrun.store.runs import load_run
    from distrun.ui.run import print_stop_report

    run = load_run(run_id, verb="train")
    inventory = Path(run.meta.inventory)
    report = stop_run(run.id)
    if not report.stopped and not report.missed:  # no node was even tried: never a success
        why = (f"its inventory {inventory} is gone, so its nodes could not be reached; put the inventory back there "
               "and run 'distrun stop' again") if not inventory.exists() else \
            f"no node of inventory {inventory} answered the stop"
        raise UserError(f"run {run.id}: {why}; nothing was stopped", exit_code=ExitCode.FAILED)
    print_stop_report(report)
    if report.missed:
        raise report.refusal()


# Verbs that live beside this module: a training run, run records, runs that outlive the terminal,
# a new inventory, an image for the nodes.
from distrun.cli.image import push_image  # noqa: E402
from distrun.cli.init import init  # noqa: E402
from distrun.cli.long import attach, status  # noqa: E402
from distrun.cli.records import runs, show  # noqa: E402
from distrun.cli.train import partition, train  # noqa: E402

for _verb in (train, partition, init, runs, show, status, attach, push_image):
    main.add_command(_verb)


def run() -> None:
    """The ``distrun`` program (pyproject.toml's script): the verbs, then exit_now."""
    try:
        main()
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(ExitCode.OK)


if __name__ == "__main__":  # pragma: no cover
    run()
