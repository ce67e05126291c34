"""The distrun command line: the verbs, their options and what each runs. How the command line
is read and its mistakes told is cli_parse.py; what each value may be, cli_params.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from . import __version__, paths
from . import cli_launcher as L
from . import cli_params as P
from .cli_parse import Command, Group, ProgramCommand, exit_now
from .errors import ExitCode, UserError
from .ui import console

inventory_option = click.option(
    "--inventory", "-i", "inventory", envvar=P.INVENTORY_ENV, show_envvar=True, metavar="NAME|PATH",
    callback=P.inventory, shell_complete=P.complete_inventory,
    help=f"A name under inventory/ (e.g. local, test, prod) or a path to an inventory file or directory "
         f"(default: ${P.INVENTORY_ENV}).",
)
run_argument = P.run_argument
json_option = P.json_option


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
@inventory_option
@click.option("--check", "check_mode", is_flag=True, help="Ansible check mode: report what would change, change nothing.")
@click.option("--tags", default=None, callback=P.tags,
              help="Only run roles/steps with these Ansible tags (comma-separated; each must exist).")
@click.option("--limit", default=None, callback=P.limit, help="Only these hosts (Ansible --limit pattern).")
def setup(inventory: P.Inventory, check_mode: bool, tags: str | None, limit: str | None) -> None:
    """Provision the cluster: packages, user, ssh mesh, MPI env, shared folder, hostfile."""
    from .ansible_bridge import run_playbook
    from .inventory import load_cluster, read_inventory_json
    from .runs import new_run
    from .slurm_site import refuse_setup
    from .ui import PlaybookProgress, print_summary

    inv = inventory.path
    cluster = load_cluster(inv)
    refuse_setup(inv, cluster.slurm_existing)
    # Every group of the inventory (ansible-inventory's answer is kept: no second call to Ansible).
    groups = [g for g in read_inventory_json(inv) if not g.startswith("_")]
    P.check_limit(inv, limit, [n.name for n in cluster.nodes], ["all", "head", "workers", "ungrouped", *groups])
    run = new_run("setup", inv)
    started = time.monotonic()
    with PlaybookProgress(f"setup.yml on {len(cluster.nodes)} node(s) from {inv}", [n.name for n in cluster.nodes]) as progress:
        result = run_playbook("setup.yml", inv, run.dir, on_event=progress, tags=tags, limit=limit, check=check_mode)
    print_summary(result, time.monotonic() - started)
    run.finish(0 if result.ok else 1, f"changed={result.changed}")
    console.print(f"run record: {run.dir}", markup=False, soft_wrap=True)
    if not result.ok:
        sys.exit(ExitCode.FAILED)


@main.command(cls=Command)
@inventory_option
def hostfile(inventory: P.Inventory) -> None:
    """Print the MPI hostfile the inventory describes (head first, `host slots=N`)."""
    from .inventory import load_cluster, render_hostfile
    from .slurm_site import refuse_hostfile

    cluster = load_cluster(inventory.path, paths.fact_cache_dir(inventory.path))
    refuse_hostfile(inventory.path, cluster.slurm_existing)
    click.echo(render_hostfile(cluster), nl=False)


def gdc_options(fn):  # noqa: ANN001,ANN201
    """--use-gdc and its two settings, shared by train and partition."""
    fn = click.option("--gdc-topk", type=P.Bounded(1), default=128, show_default=True,
                      help="With --use-gdc: entries kept per node.")(fn)
    fn = click.option("--gdc-alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05,
                      show_default=True, help="With --use-gdc: PPR teleport probability.")(fn)
    return click.option("--use-gdc", is_flag=True,
                        help="Train on the graph diffusion (GDC, personalized PageRank) instead of the graph; "
                             "the partition follows the diffused graph.")(fn)


@main.command(cls=ProgramCommand)
@inventory_option
@L.launcher_option
@click.option("--np", "np", type=P.RANKS, default=None, help="Number of ranks (default: the sum of the workers' slots).")
@click.option("--workload", type=P.OneOf(["gcn", "gcn-torch", "gcn-tp", "ddp"]), default="gcn", show_default=True,
              help="A reference workload (not with --script).")
@click.option("--script", type=click.Path(path_type=Path), default=None, callback=P.script_file,
              help="Your own program: copied to the run directory and started on every rank.")
@click.option("--dataset", type=P.OneOf(["synthetic", "cora", "reddit"]), default="synthetic", show_default=True,
              help="The reference workloads' dataset (not with --script).")
@click.option("--data-dir", default=None, callback=P.data_dir,
              help="Absolute path of the dataset files on the head node (not with --script).")
@gdc_options
@click.option("--epochs", type=P.EPOCHS, default=None, help="Training epochs of the reference workloads (not with --script).")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", callback=P.env_pairs,
              help="Extra variable for every rank (repeatable); values never reach argv or logs.")
@click.option("--port", type=P.PORT, default=29500, show_default=True, help="Rendezvous / MASTER_PORT on the head node.")
@click.option("--dry-run", is_flag=True, help="Print the plan and the exact commands; touch no node.")
@click.option("--skip-preflight", is_flag=True, help="Do not run the preflight checks before launching.")
@L.launcher_opt_options
@click.option("--allow-gpu-mismatch", is_flag=True,
              help="Launch even where a node's slots differ from its detected GPU count.")
@click.option("--detach", is_flag=True,
              help="Return once every rank started, printing the run id; the run goes on by itself "
                   "(follow it with 'distrun attach', 'status', 'logs -f').")
@click.option("--max-restarts", type=P.Bounded(0, 100), default=0, show_default=True, metavar="N",
              help="When a rank fails or a node is lost, stop what is left and start the job again, up to N times "
                   "(ranks get DISTRUN_RESTART and DISTRUN_CHECKPOINT_DIR to resume from).")
@click.option("--exclude-failed", is_flag=True,
              help="With --max-restarts: restart without the node that failed, when the job still fits.")
@click.option("--allow-concurrent", is_flag=True,
              help="Launch even on hosts another run is using (by default such a run is refused).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Your project folder: synced to every rank host (rsync, honouring .gitignore and .distrunignore); "
                   "ranks start in it and run the command after --.")
@click.option("--prepare", "prepare_text", default=None, metavar="COMMAND",
              help="With --workdir: run once on the head, in the workdir, before the launch ({np} and the other "
                   "run variables filled in); a non-zero exit refuses the launch.")
@click.option("--launcher-args", "launcher_args_text", default=None, metavar="ARGS",
              help="Extra arguments appended to mpirun, torchrun or srun, split like a shell would (no shell runs).")
@click.option("--hosts", "hosts", multiple=True, metavar="A,B", help="Run ranks only on these workers of the inventory.")
@click.option("--exclude", "exclude", multiple=True, metavar="C", help="Run no ranks on these workers.")
@click.option("--image", default=None, metavar="REF",
              help="Run every rank inside a container of this image (default: the inventory's distrun_image).")
@click.option("--container-runtime", type=P.OneOf(["podman", "docker"]), default=None,
              help="With an image: the runtime on the nodes (default: the inventory's distrun_container_runtime, "
                   "else podman).")
@json_option
def train(inventory: P.Inventory, launcher: str, np: int | None, workload: str, script: Path | None, dataset: str,
          data_dir: str | None, use_gdc: bool, gdc_alpha: float, gdc_topk: int, epochs: int | None,
          env: dict[str, str], port: int, dry_run: bool, skip_preflight: bool, slurm_mode: str | None,
          launcher_opt: tuple[str, ...], allow_gpu_mismatch: bool, detach: bool, max_restarts: int,
          exclude_failed: bool, allow_concurrent: bool, workdir: Path | None,
          prepare_text: str | None, launcher_args_text: str | None, hosts: tuple[str, ...], exclude: tuple[str, ...],
          image: str | None, container_runtime: str | None, as_json: bool, program_args: tuple[str, ...] = ()) -> None:
    """Run a training job on every rank of the cluster and follow it to the end.

    \b
    Arguments after `--` go to the program, and only those:
      distrun train -i prod --script train.py -- --lr 0.1
      distrun train -i prod --epochs 50 -- --hidden 64     (to the reference workload)
      distrun train -i prod --workdir . -- python -m mypkg.train --lr 0.1   (your own project)

    With --json, stdout holds one JSON object when the run ends (run_id, status, exit_code,
    result, ...; see docs/guide/cli.md) and the progress goes to stderr. Exit codes: 0 success,
    1 the job failed, 2 bad usage, 3 preflight refused, 4 staging failed, 5 launch failed,
    6 contact lost, 130 interrupted, 143 terminated; Slurm's final states 124, 137, 143, 255
    ('distrun --help' lists every code).
    """
    t0 = time.monotonic()
    P.check_train(click.get_current_context())
    launcher_options = L.launcher_options(click.get_current_context())
    if exclude_failed and not max_restarts:
        raise click.UsageError("--exclude-failed only goes with --max-restarts N: distrun train ... --max-restarts 1 "
                               "--exclude-failed")
    if detach and max_restarts:
        raise click.UsageError("--detach and --max-restarts: restarts need a distrun process that follows the run; "
                               "drop --detach (keep the terminal in tmux or screen) or drop --max-restarts")
    # run.yml's ansible-playbook starts before the rest of the runner is even imported (it takes
    # a third of a second to import Ansible); train.run_job gives it its arguments or stops it.
    from .early_playbook import EarlyPlaybook

    early = None if dry_run else EarlyPlaybook.for_training_run(inventory.path, bool(workdir))
    try:
        from . import planning, records
        from .planning import JobRequest
        from .printable import printable
        from .project import check_flags
        from .selection import host_names
        from .train import run_job
        from .ui import configure
        from .ui_run import TrainView, dry_run_json, dry_run_text
        from .variables import split_words

        check_flags(workdir, script, prepare_text, program_args)
        L.check_launcher_args(launcher, split_words(launcher_args_text, "--launcher-args"))
        request = JobRequest(
            inventory=inventory.path, launcher=launcher, np=np, workload=workload,
            script=script, script_args=program_args, dataset=dataset, data_dir=data_dir, epochs=epochs,
            env=env, port=port, preflight=not skip_preflight, launcher_options=launcher_options,
            allow_gpu_mismatch=allow_gpu_mismatch, gdc=(gdc_alpha, gdc_topk) if use_gdc else None,
            detach=detach, max_restarts=max_restarts, exclude_failed=exclude_failed, allow_concurrent=allow_concurrent,
            workdir=workdir, prepare=split_words(prepare_text, "--prepare"),
            launcher_args=split_words(launcher_args_text, "--launcher-args"), hosts=host_names(hosts),
            exclude=host_names(exclude), image=image, container_runtime=container_runtime,
        )
        if not dry_run:
            if as_json:
                configure(progress_to_stderr=True)
            view = TrainView()
    except BaseException:
        if early is not None:
            early.discard()
        raise
    if dry_run:
        dry = planning.dry_run(request)
        if as_json:
            click.echo(json.dumps(dry_run_json(dry), indent=2))
        else:
            click.echo(printable(dry_run_text(dry)), nl=False)
        return
    if not as_json:
        sys.exit(run_job(request, view, early, t0))
    try:
        code = run_job(request, view, early, t0)
    except UserError as exc:
        click.echo(json.dumps(records.train_outcome(view.run, exc.exit_code, str(exc)), indent=2))
        raise
    click.echo(json.dumps(records.train_outcome(view.run, code), indent=2))
    sys.exit(code)


@main.command(cls=Command)
@inventory_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON: ok, checks (check -> node -> ok, detail, fix), hosts.")
def check(inventory: P.Inventory, as_json: bool) -> None:
    """Check every node can run a job; report each check per node, with a fix for each failure.

    \b
    As the training user, on the real nodes (the full preflight):
      reach          every node answers over ssh (a stopped node fails within seconds)
      env, mpi4py    the env's bin/python exists; mpi4py loads Open MPI
      versions       python, Open MPI, mpi4py, torch, jittor ("absent" counts) and a
                     digest of the env's package list are the same on every node
      ports          the rendezvous port (29500) is free on the head; a process holding
                     it is named
      ssh            every node reaches every other node in batch mode
      names          every node resolves every node name to the same address
      shared folder  writable by the training user; a file written on the head is seen
                     on every node (nfs, sshfs) or arrives by rsync (sync: "synced")
      gpus vs slots  a node with GPUs has slots equal to its GPU count
    'distrun train' runs the fast part first (env, mpi4py, versions, ports, head -> node
    ssh, shared folder writable, gpus vs slots). Exit 0 when every check passes, else 1.
    """
    from .check import run_check
    from .ui import print_check_report

    inv = inventory.path
    if as_json:
        report, _ = run_check(inv, inventory.label)
        click.echo(json.dumps(report, indent=2))
    else:
        from .ui import PlaybookProgress

        report, _ = run_check(inv, inventory.label, progress=lambda names: PlaybookProgress(
            f"distrun check on {len(names)} node(s) from {inv}", names))
        print_check_report(report)
    sys.exit(ExitCode.OK if report["ok"] else ExitCode.FAILED)


@main.command(cls=Command)
@inventory_option
@click.option("--dataset", type=P.OneOf(["synthetic", "cora", "reddit"]), default="synthetic", show_default=True)
@click.option("--data-dir", default=None, callback=P.data_dir, help="Absolute path of the dataset files on the head node.")
@click.option("--np", "np", type=P.RANKS, default=None, help="Parts (default: the world size the inventory gives).")
@gdc_options
def partition(inventory: P.Inventory, dataset: str, data_dir: str | None, np: int | None, use_gdc: bool,
              gdc_alpha: float, gdc_topk: int) -> None:
    """Partition a graph with Metis on the head node into one part per rank."""
    from .planning import JobRequest
    from .train import run_partition_only
    from .ui_run import TrainView

    P.check_gdc(click.get_current_context())
    request = JobRequest(inventory=inventory.path, np=np, dataset=dataset, data_dir=data_dir,
                         gdc=(gdc_alpha, gdc_topk) if use_gdc else None)
    sys.exit(run_partition_only(request, TrainView()))


@main.command(cls=Command)
@run_argument
@click.option("--rank", type=P.RANK, default=None, help="Show this rank's log (default: the launcher's log).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing as the log grows, until the run ends.")
def logs(run_id: str, rank: int | None, follow: bool) -> None:
    """Print a train run's logs: the launcher's, or one rank's with --rank. RUN_ID: an id
    from 'distrun runs', a unique prefix or suffix of one, or 'last' (the last train run)."""
    from .logs import log_text
    from .printable import Stream

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
    from .fetch import fetch as fetch_paths

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
    from .runs import load_run
    from .stop import stop_run
    from .ui_run import print_stop_report

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


# Verbs that live beside this module: run records, runs that outlive the terminal, a new inventory.
from .cli_init import init  # noqa: E402
from .cli_long import attach, status  # noqa: E402
from .cli_records import runs, show  # noqa: E402

for _verb in (init, runs, show, status, attach):
    main.add_command(_verb)


def run() -> None:
    """The ``distrun`` program (pyproject.toml's script): the verbs, then exit_now."""
    try:
        main()
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(0)


if __name__ == "__main__":  # pragma: no cover
    run()
