"""The command line of a training run: 'distrun train' and 'distrun partition' (registered on
the main group by cli/main.py), their options, and what those options mean together, refused while
the command line is read rather than ignored later."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from click.core import ParameterSource

from distrun.cli import launcher as L
from distrun.cli import params as P
from distrun.cli.parse import Command, ProgramCommand
from distrun.errors import UserError


def gdc_options(fn):  # noqa: ANN001,ANN201
    """--use-gdc and its two settings, shared by train and partition."""
    fn = click.option("--gdc-topk", type=P.Bounded(1), default=128, show_default=True,
                      help="With --use-gdc: entries kept per node.")(fn)
    fn = click.option("--gdc-alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05,
                      show_default=True, help="With --use-gdc: PPR teleport probability.")(fn)
    return click.option("--use-gdc", is_flag=True,
                        help="Train on the graph diffusion (GDC, personalized PageRank) instead of the graph; "
                             "the partition follows the diffused graph.")(fn)


@click.command(cls=ProgramCommand)
@P.inventory_option
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
                   "(ranks get DISTRUN_RESTART and DISTRUN_CHECKPOINT_DIR to resume from); with --detach, "
                   "torchrun's agents restart the run on the nodes by themselves, and mpirun's supervisor on the "
                   "head restarts it (with --exclude-failed, without a node that stopped answering).")
@click.option("--exclude-failed", is_flag=True,
              help="With --max-restarts: restart without the node that failed, when the job still fits.")
@click.option("--allow-concurrent", is_flag=True,
              help="Launch even on hosts another run is using (by default such a run is refused).")
@click.option("--wait", "wait_s", type=P.Bounded(1, 86400, " (seconds)"), is_flag=False, flag_value=600, default=None,
              metavar="[SECONDS]", help="Where another run holds the hosts or GPUs, wait up to SECONDS (alone: 600) for "
                                        "them instead of being refused.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Your project folder: synced to every rank host (rsync, honouring .gitignore and .distrunignore); "
                   "ranks start in it and run the command after --.")
@click.option("--prepare", "prepare_text", default=None, metavar="COMMAND",
              help="With --workdir: run once on the head, in the workdir, before the launch ({np} and the other "
                   "run variables filled in); a non-zero exit refuses the launch.")
@click.option("--launcher-args", "launcher_args_text", default=None, metavar="ARGS",
              help="Extra arguments appended to mpirun, torchrun or srun, split like a shell would (no shell runs).")
@click.option("--hosts", "hosts", multiple=True, metavar="A,B",
              help="Run ranks only on these workers of the inventory; A:0,1,B:2,3 also names the GPUs each uses "
                   "(nvidia-smi's indices).")
@click.option("--gpus", "gpus", type=P.Bounded(0), default=None, metavar="N",
              help="GPUs used on each node: its first N free ones (default: every GPU the node declares; 0: none).")
@click.option("--exclude", "exclude", multiple=True, metavar="C", help="Run no ranks on these workers.")
@click.option("--image", default=None, metavar="REF",
              help="Run every rank inside a container of this image (default: the inventory's distrun_image).")
@click.option("--container-runtime", type=P.OneOf(["podman", "docker"]), default=None,
              help="With an image: the runtime on the nodes (default: the inventory's distrun_container_runtime, "
                   "else podman).")
@P.json_option
def train(inventory: P.Inventory, launcher: str, np: int | None, workload: str, script: Path | None, dataset: str,
          data_dir: str | None, use_gdc: bool, gdc_alpha: float, gdc_topk: int, epochs: int | None,
          env: dict[str, str], port: int, dry_run: bool, skip_preflight: bool, slurm_mode: str | None,
          launcher_opt: tuple[str, ...], allow_gpu_mismatch: bool, detach: bool, max_restarts: int,
          exclude_failed: bool, allow_concurrent: bool, wait_s: int | None, workdir: Path | None,
          prepare_text: str | None, launcher_args_text: str | None, hosts: tuple[str, ...], exclude: tuple[str, ...],
          gpus: int | None, image: str | None, container_runtime: str | None, as_json: bool, program_args: tuple[str, ...] = ()) -> None:
    """Run a training job on every rank of the cluster and follow it to the end.

    \b
    Arguments after `--` go to the program, and only those:
      distrun train -i prod --script train.py -- --lr 0.1
      distrun train -i prod --epochs 50 -- --hidden 64     (to the reference workload)
      distrun train -i prod --workdir . -- python -m mypkg.train --lr 0.1   (your own project)

    With --json, stdout holds one JSON object when the run ends (run_id, status, exit_code,
    result, ...; see docs/guide/cli.md) and the progress goes to stderr. Exit codes: 0 success,
    1 the job failed, 2 bad usage, 3 preflight refused, 4 staging failed, 5 launch failed,
    6 contact lost, 8 busy hosts, 130 interrupted or stopped, 143 terminated; Slurm's final
    states 124, 137, 143, 255
    ('distrun --help' lists every code).
    """
    t0 = time.monotonic()
    check_train(click.get_current_context())
    launcher_options = L.launcher_options(click.get_current_context())
    if exclude_failed and not max_restarts:
        raise click.UsageError("--exclude-failed only goes with --max-restarts N: distrun train ... --max-restarts 1 "
                               "--exclude-failed")
    if detach and max_restarts:
        L.check_detached_restarts(launcher, exclude_failed)
    # run.yml's ansible-playbook starts before the rest of the runner is even imported (it takes
    # a third of a second to import Ansible); train.run_job gives it its arguments or stops it.
    from distrun.transport.early_playbook import EarlyPlaybook

    early = None if dry_run else EarlyPlaybook.for_training_run(inventory.path, bool(workdir))
    try:
        from distrun.planning.dryrun import dry_run as planned_dry_run
        from distrun.planning.request import JobRequest, LaunchRequest, PlacementRequest, ProgramRequest, RunPolicy
        from distrun.planning.selection import host_gpus, host_names
        from distrun.planning.variables import split_words
        from distrun.printable import printable
        from distrun.project.ready import check_flags
        from distrun.run.train import run_job
        from distrun.ui import data as records
        from distrun.ui.console import configure
        from distrun.ui.run import TrainView, dry_run_json, dry_run_refused, dry_run_text

        check_flags(workdir, script, prepare_text, program_args)
        L.check_launcher_args(launcher, split_words(launcher_args_text, "--launcher-args"))
        request = JobRequest(
            inventory=inventory.path,
            program=ProgramRequest(workload=workload, script=script, args=program_args, dataset=dataset,
                                   data_dir=data_dir, epochs=epochs, gdc=(gdc_alpha, gdc_topk) if use_gdc else None,
                                   workdir=workdir, prepare=split_words(prepare_text, "--prepare"), env=env),
            placement=PlacementRequest(np=np, hosts=host_names(hosts), exclude=host_names(exclude, "--exclude"),
                                       port=port, allow_gpu_mismatch=allow_gpu_mismatch, gpus=gpus,
                                       gpu_ids=tuple((n, ids) for n, ids in host_gpus(hosts) if ids is not None)),
            launch=LaunchRequest(launcher=launcher, options=launcher_options,
                                 args=split_words(launcher_args_text, "--launcher-args"), image=image,
                                 container_runtime=container_runtime),
            policy=RunPolicy(preflight=not skip_preflight, detach=detach, max_restarts=max_restarts,
                             exclude_failed=exclude_failed, allow_concurrent=allow_concurrent, wait_s=wait_s),
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
        try:
            dry = planned_dry_run(request)
        except UserError as exc:  # the inventory or the plan refused: with --json, said as JSON too
            if as_json:
                click.echo(json.dumps(dry_run_refused(inventory.path, exc), indent=2))
            raise
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


@click.command(cls=Command)
@P.inventory_option
@click.option("--dataset", type=P.OneOf(["synthetic", "cora", "reddit"]), default="synthetic", show_default=True)
@click.option("--data-dir", default=None, callback=P.data_dir, help="Absolute path of the dataset files on the head node.")
@click.option("--np", "np", type=P.RANKS, default=None, help="Parts (default: the world size the inventory gives).")
@gdc_options
def partition(inventory: P.Inventory, dataset: str, data_dir: str | None, np: int | None, use_gdc: bool,
              gdc_alpha: float, gdc_topk: int) -> None:
    """Partition a graph with Metis on the head node into one part per rank."""
    from distrun.planning.request import JobRequest, PlacementRequest, ProgramRequest
    from distrun.run.train import run_partition_only
    from distrun.ui.run import TrainView

    check_gdc(click.get_current_context())
    request = JobRequest(inventory=inventory.path, placement=PlacementRequest(np=np),
                         program=ProgramRequest(dataset=dataset, data_dir=data_dir,
                                                gdc=(gdc_alpha, gdc_topk) if use_gdc else None))
    sys.exit(run_partition_only(request, TrainView()))


def given(ctx: click.Context, name: str) -> bool:
    """Whether the user set an option (on the command line or through its variable)."""
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _flag(name: str) -> str:
    return "--" + name.replace("_text", "").replace("_", "-")


def check_gdc(ctx: click.Context) -> None:
    """--gdc-alpha and --gdc-topk say how --use-gdc diffuses: without it they would do nothing."""
    if ctx.params.get("use_gdc"):
        return
    for name in ("gdc_alpha", "gdc_topk"):
        if given(ctx, name):
            raise click.UsageError(f"{_flag(name)} only matters with --use-gdc: add --use-gdc or drop {_flag(name)}", ctx)


def check_train(ctx: click.Context) -> None:
    """What train's options mean together: refused now rather than ignored later."""
    params = ctx.params
    for owner, flag in (("script", "--script"), ("workdir", "--workdir")):
        if params.get(owner) is None:
            continue
        for name in ("workload", "dataset", "data_dir", "epochs", "use_gdc"):
            if given(ctx, name):
                raise click.UsageError(
                    f"{_flag(name)} is an option of the reference workloads, not of {flag}; pass your program's own "
                    f"options after '--' (e.g. -- {_flag(name)} ...)", ctx)
    check_gdc(ctx)
    if params.get("image") is not None:
        from distrun.planning.containers import check_image
        try:
            check_image(params["image"], "--image")
        except UserError as exc:
            raise click.UsageError(str(exc), ctx) from None
    if params.get("dry_run") and params.get("detach"):
        raise click.UsageError("--detach and --dry-run: a dry run starts nothing, so --detach would do nothing; "
                               "drop one of them", ctx)
    if params.get("wait_s") is not None:
        for name, what in (("dry_run", "a dry run claims nothing"), ("allow_concurrent", "--allow-concurrent claims nothing")):
            if params.get(name):
                raise click.UsageError(f"--wait and {_flag(name)}: {what}, so there is nothing to wait for; drop one of "
                                       "them", ctx)
    for name in ("prepare_text", "launcher_args_text"):
        value = params.get(name)
        if value is not None and not value.strip():
            raise click.UsageError(f"{_flag(name)} is empty: give it a command (words as a shell would split them) "
                                   f"or drop {_flag(name)}", ctx)
    from distrun.planning.selection import host_gpus
    for name in ("hosts", "exclude"):
        for value in params.get(name) or ():
            if not value.strip(", \t"):
                raise click.UsageError(f"--{name} {value!r} names no host: give worker names (--{name} w1,w2) or "
                                       f"drop --{name}", ctx)
        try:
            host_gpus(params.get(name) or (), f"--{name}")
        except UserError as exc:
            raise click.UsageError(str(exc), ctx) from None
