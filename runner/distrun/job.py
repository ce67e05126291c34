"""Train, check, partition, logs and stop: the flows behind the CLI verbs.

Plan first, then act: a JobRequest and the inventory become a JobPlan (pure), the launchers
turn it into commands (pure), and the playbooks execute exactly those commands.
"""

from __future__ import annotations

import base64
import hashlib
import io
import ipaddress
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.markup import escape

from . import contract, paths
from . import slurm as slurm_run
from .ansible_bridge import PlaybookEvent, PlaybookResult, run_playbook
from .check import ProbeCollector, build_report, refusal
from .collect import CAPPED, FINAL, REFUSED, UNREACHABLE, collect_hosts, pull_run
from .errors import UserError
from .inventory import Cluster, load_cluster, load_facts
from .launchers import mpirun_argv, torchrun_argv
from .launchers.slurm import sbatch_files
from .launchers.torchrun import torchrun_env
from .network import NetworkChoice, choose_interfaces, ifaces_from_facts
from .remote import as_user, shell_argv
from .plan import WORKLOADS, JobPlan, build_plan, preflight_needs, render_env_file, render_hostfile, render_rank_wrapper
from .follow import Outcome, follow
from .runs import Run, load_run, new_run
from .ui import PlaybookProgress, console, err_console, print_summary, warn

EPOCH_RE = re.compile(r"DISTRUN_EPOCH (\{.*\})")
RESULT_RE = re.compile(r"DISTRUN_RESULT (\{.*\})")

# Known error texts of failed runs (regular expressions, matched across lines) and what fixes
# them, shown in the run's summary; a fix may name what its pattern captured ({node}, {exe}).
DIAGNOSES: tuple[tuple[str, str], ...] = (
    (r"could not access\s+or execute an executable:\s+Executable:\s*(?P<exe>\S+)\s+Node:\s*(?P<node>\S+)",
     "{node} cannot run {exe}: is the shared folder mounted there? 'distrun check' names it; "
     "fix: run 'distrun setup --tags shared_fs'"),
    (r"orted: command not found", "remote nodes cannot find Open MPI: run 'distrun setup' so every node has the env, and keep mpirun's --prefix"),
    (r"ssh: Could not resolve hostname (?P<node>[^:\s]+)", "the head cannot resolve {node}: correct /etc/hosts or DNS "
     "(role base manages /etc/hosts: 'distrun setup --tags base')"),
    (r"Permission denied \(publickey", "the training user cannot ssh between nodes: run 'distrun setup --tags ssh_mesh'"),
    (r"Host key verification failed", "a node's host key is not in known_hosts (a node was rebuilt?): run 'distrun setup --tags ssh_mesh'"),
    (r"unable to reach each other for\s+MPI communications",
     "two ranks cannot reach each other over MPI: a firewall or a wrong interface between nodes; run 'distrun check'"),
    (r"RendezvousTimeoutError", "not every node joined the torchrun rendezvous: check 'distrun check' (ports, firewall, interface)"),
    (r"RendezvousConnectionError", "nodes cannot reach the rendezvous on the head: check the port and the network interface ('distrun check')"),
    (r"There are not enough slots available", "more ranks than slots: lower --np or raise 'slots' in the inventory"),
    (r"ModuleNotFoundError", "a Python package is missing in the env on a node: add it to mpi_env_packages and run 'distrun setup'"),
    (r"does not match the number of MPI ranks", "the partition has a different part count than ranks: distrun re-partitions when --np changes"),
)
# Said only when nothing above explains the failure: Open MPI's catch-all for a daemon that did not start.
FALLBACK_DIAGNOSES: tuple[tuple[str, str], ...] = (
    (r"ORTE was unable to reliably start one or more daemons",
     "Open MPI could not start its daemon on a node (ssh, the env or /tmp there): run 'distrun check'"),
)


def diagnose(text: str) -> list[str]:
    """The hints for a failed run's launcher output, most specific first."""
    hints = [fix.format(**m.groupdict()) for pattern, fix in DIAGNOSES if (m := re.search(pattern, text))]
    if not hints:
        hints = [fix.format(**m.groupdict()) for pattern, fix in FALLBACK_DIAGNOSES if (m := re.search(pattern, text))]
    return hints


@dataclass
class JobRequest:
    inventory: Path
    launcher: str = "mpirun"
    np: int | None = None
    workload: str = "gcn"
    script: Path | None = None
    script_args: tuple[str, ...] = ()
    dataset: str = "synthetic"
    data_dir: str | None = None
    epochs: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    port: int = 29500
    preflight: bool = True
    slurm_mode: str | None = None  # --slurm-mode; None: the inventory's slurm_mode
    allow_gpu_mismatch: bool = False
    gdc: tuple[float, int] | None = None  # --use-gdc: (alpha, top-k) for the reference workloads


def _network(cluster: Cluster) -> NetworkChoice | None:
    """The interface per node from cached facts, or None when no facts were gathered yet."""
    cache = paths.fact_cache_dir(cluster.source)
    facts = {n.name: load_facts(cache, n.name) for n in cluster.workers}
    if any(f is None for f in facts.values()):
        return None
    addresses = {n.name: n.address for n in cluster.workers}
    ifaces = {h: ifaces_from_facts(f or {}) for h, f in facts.items()}
    default_ipv4 = {h: ((f or {}).get("ansible_default_ipv4") or {}).get("address", "") for h, f in facts.items()}
    overrides = {n.name: n.iface for n in cluster.workers if n.iface}
    if all(n.connection == "local" for n in cluster.workers):
        return None  # one machine: loopback is the network, nothing to choose
    return choose_interfaces(addresses, ifaces, overrides, default_ipv4)


def make_plan(request: JobRequest, cluster: Cluster, run_id: str, network: NetworkChoice | None) -> JobPlan:
    """The plan for a request; ``network`` is ``_network(cluster)``, which run.yml also checks."""
    return build_plan(
        cluster,
        run_id=run_id,
        launcher=request.launcher,
        np=request.np,
        workload=None if request.script else request.workload,
        script=str(request.script) if request.script else None,
        script_args=request.script_args,
        dataset=request.dataset,
        data_dir=request.data_dir,
        epochs=request.epochs,
        extra_env=request.env,
        network=network,
        master_port=request.port,
        slurm=slurm_run.settings(cluster, request.slurm_mode) if request.launcher == "slurm" else None,
        allow_gpu_mismatch=request.allow_gpu_mismatch,
        gdc=request.gdc,
    )


def _comment(text: str) -> str:
    """Text for one comment line of a script: a newline would start a command."""
    return " ".join(str(text).split())


def launch_scripts(plan: JobPlan) -> dict[str, str]:
    """Host name -> the launch script that host runs (mpirun and slurm: only the head).

    Files carry the host's name: on a shared folder every node writes into the same run dir.
    """

    def script(host: str, body: list[str]) -> str:
        # Host names are checked when the inventory is loaded; quoted here all the same.
        pid, log = shlex.quote(f"launcher-{host}.pid"), shlex.quote(f"launcher-{host}.log")
        pgid = shlex.quote(f"launcher-{host}.pgid")
        tmp, code = shlex.quote(f"exitcode-{host}.tmp"), shlex.quote(f"exitcode-{host}")
        return (
            "#!/bin/bash\n"
            f"# distrun run {plan.run_id}: generated launch script for {_comment(host)}\n"
            f"cd {shlex.quote(plan.run_dir)}\n"
            f"echo $$ > {pid}\n"
            # The launcher leads its own process group (started with setsid): 'distrun stop'
            # stops that group too, even a process that dropped DISTRUN_RUN_ID from its environment.
            f"read -r _ _ _ _ pgid _ < /proc/$$/stat && echo \"$pgid\" > {pgid}\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in launcher_env(plan, host))
            + shlex.join(body) + f" > {log} 2>&1 < /dev/null\n"
            "rc=$?\n"
            f"echo $rc > {tmp} && mv {tmp} {code}\n"
            "exit $rc\n"
        )

    if plan.launcher == "mpirun":
        return {plan.head.name: script(plan.head.name, mpirun_argv(plan))}
    if plan.launcher == "torchrun":
        return {h.name: script(h.name, torchrun_argv(plan, h)) for h in plan.hosts}
    # slurm: the driver submits, follows and maps the final state (distrun.slurm).
    return {plan.head.name: script(plan.head.name, ["bash", f"{plan.run_dir}/slurm-driver.sh"])}


def launcher_env(plan: JobPlan, host: str) -> list[tuple[str, str]]:
    """Variables of the launcher process. DISTRUN_RUN_ID tags it (and every child) for 'distrun stop'."""
    if plan.launcher == "torchrun":
        rank_host = next(h for h in plan.hosts if h.name == host)
        return sorted(torchrun_env(plan, rank_host).items())
    return [("DISTRUN_RUN_ID", plan.run_id)]


def plan_files(plan: JobPlan) -> dict[str, str]:
    files = {"hostfile": render_hostfile(plan), "rank-env.sh": render_rank_wrapper(plan)}
    if plan.launcher == "slurm":
        files.update(sbatch_files(plan))
        files.update(slurm_run.driver_files(plan))
    return files


def dry_run_text(request: JobRequest) -> str:
    cluster = load_cluster(request.inventory, paths.fact_cache_dir(request.inventory))
    plan = make_plan(request, cluster, "DRYRUN", _network(cluster))
    out: list[str] = []
    shown = os.path.relpath(request.inventory) if str(request.inventory).startswith(os.getcwd()) else request.inventory
    out.append(f"# distrun train --dry-run  (inventory: {shown})")
    out.append(f"launcher:    {plan.launcher}")
    out.append(f"world size:  {plan.world_size} rank(s) on {len(plan.hosts)} host(s)")
    out.append(f"training user: {plan.user}    env prefix: {plan.env_prefix}    mpi prefix: {plan.mpi_prefix}")
    out.append(f"run dir:     {plan.run_dir}")
    net = plan.cidr or "not detected yet (run 'distrun check' or 'distrun setup' to gather facts)"
    out.append(f"network:     {net}")
    if plan.launcher == "slurm" and not slurm_run.enabled(cluster):
        out.append(f"note:        slurm_enabled is not true in {shown}: a real run is refused until it is (and 'distrun setup' ran)")
    out.append("hosts:")
    for h in plan.hosts:
        node = next(n for n in cluster.workers if n.name == h.name)
        out.append(f"  {h.name:<16} {h.address:<16} ranks={h.slots} (slots from {node.slots_source}) gpus={h.gpus} iface={h.iface or '-'}")
    if plan.partition:
        out.append("")
        out.append("# partition (on the head node, skipped when its manifest already matches)")
        out.append(shlex.join(plan.partition))
    for name, text in plan_files(plan).items():
        out.append("")
        out.append(f"# {plan.run_dir}/{name}")
        out.append(text.rstrip("\n"))
    if plan.user_env_keys:
        out.append("")
        out.append(f"# {plan.env_file} (0600, values not shown): {' '.join(plan.user_env_keys)}")
    for host, text in launch_scripts(plan).items():
        out.append("")
        out.append(f"# launch on {host}")
        out.append(text.rstrip("\n"))
    return "\n".join(out) + "\n"


# --- acting ------------------------------------------------------------------------------


def _playbook(title: str, playbook: str, request_inv: Path, run: Run, hosts: list[str], extravars: dict,
              limit: str | None = None, probes: dict[str, dict] | None = None) -> PlaybookResult:
    """Run a playbook with live progress; the preflight's probes land in probes when given."""
    started = time.monotonic()
    with PlaybookProgress(title, hosts) as progress:
        collector = ProbeCollector(progress)
        result = run_playbook(playbook, request_inv, run.dir, extravars=extravars, on_event=collector, limit=limit)
    if probes is not None:
        probes.update(collector.probes)
    # A failed preflight is told in one line by the same judge as 'distrun check' (_refuse_preflight).
    if not result.ok and not (collector.probes and _failed_step(result) == "preflight"):
        print_summary(result, time.monotonic() - started)
    return result


def _needs_jittor(plan: JobPlan) -> bool:
    return plan.workload is not None and WORKLOADS[plan.workload].framework == "jittor"


def run_bundle(run: Run, files: dict[str, str], script: Path | None, with_workloads: bool = True) -> tuple[str, str]:
    """Pack what a run needs on its nodes into one archive, sent in one round trip per host.

    ``run/`` holds the rendered files and launch scripts (exact text, 0644; scripts 0755) and
    the user's program; ``workloads/`` the reference workloads, whose digest names a marker on
    the nodes so unchanged workloads are not unpacked again. The archive is stored base64 in
    the run record (it travels as a task's stdin). Returns (bundle path, workloads digest).
    """
    src = paths.project_dir() / "workloads"
    wl_files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if with_workloads else []
    digest = hashlib.sha256()
    for f in wl_files:
        digest.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes() + b"\0")

    def add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            add(tar, f"run/{name}", text.encode(), 0o755 if name.endswith(".sh") else 0o644)
        if script is not None:
            add(tar, f"run/{script.name}", script.read_bytes(), 0o644)
        for f in wl_files:
            add(tar, f"workloads/{f.relative_to(src)}", f.read_bytes(), 0o644)
    path = run.write("bundle.tar.gz.b64", base64.b64encode(buf.getvalue()).decode() + "\n")
    return str(path), digest.hexdigest()[:16]


def _stage_vars(plan: JobPlan, run: Run, files: dict[str, str], scripts: dict[str, str],
                script: Path | None, jittor_warm: bool, env: dict[str, str] | None = None) -> dict:
    """Extravars of run.yml and stage.yml (the launch play reads the same names).

    ``env`` (the user's --env) goes in its own 0600 file, never in the bundle, the plan or an
    extravar: ansible-runner records extravars, and the bundle is a logged task's stdin.
    """
    launch_files = {f"launch-{h}.sh": text for h, text in scripts.items()}
    bundle, digest = run_bundle(run, {**files, **launch_files}, script.resolve() if script else None)
    env_file = str(run.write("env.sh", render_env_file(env), mode=0o600)) if env else ""
    return {
        "distrun_env_file": env_file,
        **_common_vars(plan),
        "distrun_run_bundle": bundle,
        "distrun_workloads_digest": digest,
        "distrun_launch_hosts": sorted(scripts),
        "distrun_jittor_warm": jittor_warm,
        "distrun_partition_argv": list(plan.partition or []),
        "distrun_partition_dir": plan.partition_dir or "",
    }


def _common_vars(plan: JobPlan) -> dict:
    return {
        "distrun_run_id": plan.run_id,
        "distrun_run_dir": plan.run_dir,
        "distrun_rank_hosts": [h.name for h in plan.hosts],
    }


def _preflight(request: JobRequest, cluster: Cluster, run: Run) -> None:
    probes: dict[str, dict] = {}
    result = _playbook("preflight", "playbooks/preflight.yml", request.inventory, run,
                       [n.name for n in cluster.nodes], {"preflight_ports": [request.port]}, probes=probes)
    if not result.ok:
        _refuse_preflight(request, cluster, run, result, probes)


def _refuse_preflight(request: JobRequest, cluster: Cluster, run: Run, result: PlaybookResult,
                      probes: dict[str, dict]) -> None:
    """Refuse in one line: what 'distrun check' says about the same probes, every failing node named."""
    hosts = {h.name: {"state": h.state, "error": h.last_error} for h in result.hosts.values()}
    report = build_report(
        nodes=list(hosts), head=cluster.head.name, probes=probes, seen={}, hosts=hosts,
        shared_mode=str(cluster.group_vars.get("distrun_shared_fs_mode") or contract.DEFAULT_SHARED_FS_MODE),
        shared_dir=cluster.shared_dir, setup=f"distrun setup --inventory {request.inventory}",
        log_dir=str(run.dir / "ansible"),
    )
    line = refusal(report)
    bad = sorted({h for items in report.values() for h, it in items.items() if not it.ok})
    if not line:
        bad = [h.name for h in result.failures()]
        line = "; ".join(f"{h.name}: {h.last_error}" for h in result.failures()) or "a node failed the preflight"
    run.finish(3, "preflight failed")
    raise UserError(f"preflight failed on {', '.join(bad) or 'the cluster'}: {line}; nothing was started "
                    f"(see 'distrun check --inventory {request.inventory}')", exit_code=3)


def _facts_unusable(cluster: Cluster) -> str | None:
    """Why the cached facts cannot be planned from (missing, or about another machine), or None."""
    cache = paths.fact_cache_dir(cluster.source)
    for n in cluster.nodes:
        facts = load_facts(cache, n.name)
        if facts is None:
            return f"no facts cached for {n.name}"
        try:
            ip = ipaddress.ip_address(n.address)
        except ValueError:
            continue  # a name: the preflight play checks what it resolves to
        if n.connection == "local" or n.iface:
            continue
        if not any(ip in ipaddress.ip_network(i.network) for i in ifaces_from_facts(facts)):
            return f"the facts cached for {n.name} hold no interface on the subnet of its address {n.address}"
    return None


def _planned_network(plan: JobPlan, network: NetworkChoice | None) -> dict[str, dict[str, str]]:
    """What run.yml verifies before staging: each rank host's interface still has its address."""
    if network is None:
        return {}
    rank_hosts = {x.name for x in plan.hosts}
    return {h: {"iface": c.name, "address": c.address} for h, c in network.per_host.items() if h in rank_hosts}


def _failed_step(result: PlaybookResult) -> str:
    """Which play of run.yml failed: 'preflight', 'stage' or 'launch'."""
    plays = [h.failed_play.lower() for h in result.failures()]
    for step in ("preflight", "stage", "start"):
        if any(p.startswith(step) for p in plays):
            return "launch" if step == "start" else step
    return "launch" if not plays else "preflight"


class Phases:
    """Wall seconds of each step of a run, kept in timings.json of the run record: where a
    run's time went (the launch overhead benchmark reads it)."""

    def __init__(self, run: Run, t0: float | None = None) -> None:
        self.run = run
        self.t0 = time.monotonic() if t0 is None else t0
        self.last = self.t0
        self.spans: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.spans.append((name, round(now - self.last, 3)))
        self.last = now

    def save(self) -> None:
        data = {"phases": [{"name": n, "s": v} for n, v in self.spans], "total_s": round(self.last - self.t0, 3)}
        self.run.write("timings.json", json.dumps(data, indent=2) + "\n")


def run_job(request: JobRequest) -> int:
    t0 = time.monotonic()
    cluster = load_cluster(request.inventory, paths.fact_cache_dir(request.inventory))  # a bad inventory leaves no record
    if request.launcher == "slurm":
        slurm_run.require_enabled(cluster)
    _collect_limits()  # a bad limit is refused before anything starts
    phases = Phases(new_run("train", request.inventory), t0)
    try:
        return _run_job(request, cluster, phases)
    except UserError as exc:
        if phases.run.meta.status == "running":  # e.g. a plan error: the record says why
            phases.run.finish(exc.exit_code, str(exc))
        raise
    except Exception as exc:
        if phases.run.meta.status == "running":
            phases.run.finish(1, f"internal error: {type(exc).__name__}: {exc}")
        raise
    finally:
        phases.save()


def _run_job(request: JobRequest, cluster: Cluster, phases: Phases) -> int:
    run = phases.run
    console.print(f"run {run.id}: record in {run.dir}", markup=False)
    phases.mark("load inventory")
    if request.preflight and _facts_unusable(cluster):
        # First run against these nodes: the plan needs their interfaces and GPUs, so gather
        # facts first; later runs plan from the cache and run.yml verifies it still holds.
        _preflight(request, cluster, run)
        cluster = load_cluster(request.inventory, paths.fact_cache_dir(request.inventory))
        phases.mark("gather facts (first run)")
    started = time.monotonic()
    rc: int | None = None
    interrupted = False
    lines: list[str] = []
    plan: JobPlan | None = None
    limit = ""
    launched = False  # once run.yml reached its launch play, ranks may run: stop and collect
    lost: str | None = None  # a node the run lost: not waited on again when stopping and collecting
    try:
        for attempt in (1, 2):
            network = _network(cluster)
            plan = make_plan(request, cluster, run.id, network)
            files = plan_files(plan)
            scripts = launch_scripts(plan)
            _record_plan(run, plan, files, scripts)
            rank_hosts = [h.name for h in plan.hosts]
            limit = ",".join(dict.fromkeys([cluster.head.name, *rank_hosts]))
            extravars = {
                **_stage_vars(plan, run, files, scripts, request.script, _needs_jittor(plan), request.env),
                "distrun_planned_network": _planned_network(plan, network),
                "distrun_skip_preflight": not request.preflight,
                "preflight_ports": [request.port],
                **preflight_needs(plan),
            }
            phases.mark("plan and bundle")
            started = time.monotonic()
            title = f"{'preflight, ' if request.preflight else ''}stage, launch {plan.world_size} rank(s) with {plan.launcher}"
            probes: dict[str, dict] = {}
            result = _playbook(title, "playbooks/run.yml", request.inventory, run, limit.split(","), extravars,
                               limit=limit, probes=probes)
            phases.mark("run.yml (preflight, stage, launch)")
            step = "launch" if result.ok else _failed_step(result)
            launched = step == "launch"
            if result.ok:
                break
            if step == "preflight":
                replan = any("DISTRUN_REPLAN" in h.last_error for h in result.failures())
                if replan and attempt == 1:
                    console.print("[yellow]the nodes' network changed since the last run: planning again[/yellow]")
                    cluster = load_cluster(request.inventory, paths.fact_cache_dir(request.inventory))  # facts now fresh
                    continue
                _refuse_preflight(request, cluster, run, result, probes)
            if step == "stage":
                run.finish(4, "staging failed")
                return 4
            rc = 5
            break
        assert plan is not None
        if rc is None:
            outcome = _follow(cluster, plan, run, scripts, lines)
            rc = outcome.rc
            phases.mark("follow (ranks run)")
            if outcome.lost:
                lost = outcome.host
            if outcome.host and outcome.rc != 0:
                err_console.print(f"[red]{escape(outcome.reason)}: stopping every rank on every node[/red]")
                lines.append(f"DISTRUN_FAILED_HOST {outcome.host} {outcome.reason}")
    except KeyboardInterrupt:
        interrupted = True
        err_console.print("[yellow]interrupted: stopping every rank on every node[/yellow]")
    finally:
        if plan is not None and limit and (launched or interrupted):
            if interrupted or rc is None or rc != 0:
                # A lost node is left out: Ansible would wait its connect timeout for it, and its
                # ranks lose their peers and the head's orted with it.
                reachable = ",".join(h for h in limit.split(",") if h != lost)
                _stop(request.inventory, run, plan.run_id, reachable)
                phases.mark("stop")
            _collect(request.inventory, run, plan, cluster, lost)
            phases.mark("collect")
    elapsed = time.monotonic() - started
    if interrupted:
        run.finish(130, "interrupted", status="stopped")
        return 130
    assert rc is not None and plan is not None
    if plan.launcher == "slurm" and rc != 0:
        lines.extend(slurm_run.rank_failure_lines(rank_logs(run)))  # srun names no rank after an MPI_Abort
    summary = _summarise(run, plan, rc, elapsed, lines)
    # slurm: the driver mapped the final Slurm state to rc (distrun.slurm.STATE_EXIT); keep it.
    final = rc if plan.launcher == "slurm" else (0 if rc == 0 else 1)
    run.finish(final, summary)
    phases.mark("summary")
    return final


def _record_plan(run: Run, plan: JobPlan, files: dict[str, str], scripts: dict[str, str]) -> None:
    """plan.json and commands.txt: exactly what this run executes, readable before it starts."""
    run.write("plan.json", json.dumps(asdict(plan), indent=2, default=str) + "\n")
    commands = [f"# {name}\n{text}" for name, text in {**files, **{f'launch-{h}.sh': s for h, s in scripts.items()}}.items()]
    if plan.partition:
        commands.insert(0, "# partition\n" + shlex.join(plan.partition) + "\n")
    run.write("commands.txt", "\n".join(commands))


def _follow(cluster: Cluster, plan: JobPlan, run: Run, scripts: dict[str, str], lines: list[str]) -> Outcome:
    with (run.dir / "launcher.log").open("w") as log:

        def on_line(text: str) -> None:
            log.write(text + "\n")
            log.flush()
            lines.append(text)
            if len(lines) > 4000:
                del lines[:2000]
            _show_line(text, plan)

        return follow(cluster, plan, list(scripts), on_line)


def _show_line(text: str, plan: JobPlan) -> None:
    m = EPOCH_RE.search(text)
    if m:
        try:
            e = json.loads(m.group(1))
            console.print(
                f"epoch {e.get('epoch')}/{e.get('epochs')}  loss {e.get('loss', 0):.4f}  "
                f"train_acc {e.get('train_acc', 0):.3f}  val_acc {e.get('val_acc', 0):.3f}  "
                f"{e.get('epoch_time_s', 0) * 1000:.0f} ms/epoch",
                markup=False,
            )
            return
        except (ValueError, TypeError):
            pass
    console.print(text, markup=False)


def _stop(inventory: Path, run: Run, run_id: str, limit: str | None) -> None:
    run_playbook("playbooks/stop.yml", inventory, run.dir, extravars={"distrun_run_id": run_id}, limit=limit)


def _collect(inventory: Path, run: Run, plan: JobPlan, cluster: Cluster, lost: str | None = None) -> None:
    dest = run.dir / "nodes"
    dest.mkdir(exist_ok=True, mode=0o700)
    hosts = [h for h in collect_hosts(cluster, [h.name for h in plan.hosts]) if h != lost]
    failed = pull_run(cluster, plan.run_dir, hosts, dest, **_collect_limits())
    for h, e in failed.items():
        if e.startswith((REFUSED, CAPPED)):
            what = "refused" if e.startswith(REFUSED) else "incomplete"
            warn(f"collect from {h} {what}: {e.split(': ', 1)[1]}")
    unreachable = {h: e for h, e in failed.items() if e.startswith(UNREACHABLE)}
    retry = [h for h in failed if not failed[h].startswith(FINAL)]
    lost_msgs = [f"{h} ({e[len(UNREACHABLE):]})" for h, e in unreachable.items()]
    if lost:
        lost_msgs.insert(0, f"{lost} (lost during the run)")
    if retry:
        # Whatever a tar over ssh could not bring from a reachable node, the playbook tries file by file.
        result = run_playbook("playbooks/collect.yml", inventory, run.dir,
                              extravars={**_common_vars(plan), "distrun_collect_dest": str(dest)}, limit=",".join(retry))
        lost_msgs += [f"{h.name} ({h.last_error})" for h in result.failures()]
    if lost_msgs:
        warn(f"logs not collected from: {', '.join(lost_msgs)}")


def _collect_limits() -> dict:
    """Bytes and seconds one node's collect may take: DISTRUN_COLLECT_MAX_MB and
    DISTRUN_COLLECT_TIMEOUT_S on the controller, else the defaults."""
    limits: dict = {}
    for var, key, scale in (("DISTRUN_COLLECT_MAX_MB", "max_bytes", 1 << 20), ("DISTRUN_COLLECT_TIMEOUT_S", "timeout_s", 1)):
        text = os.environ.get(var)
        if text:
            if not text.isdigit() or int(text) == 0:
                raise UserError(f"{var}={text!r}: give a positive whole number")
            limits[key] = int(text) * scale
    return limits


def rank_logs(run: Run) -> dict[int, Path]:
    """Rank -> its stdout file in the collected run, from the header line every rank prints."""
    found: dict[int, Path] = {}
    for f in sorted((run.dir / "nodes").rglob("*")):
        if not f.is_file() or f.name not in ("stdout", "stdout.log"):
            continue
        try:
            with f.open(errors="replace") as fh:
                head = fh.readline()
        except OSError:
            continue
        m = re.search(r"DISTRUN_RANK rank=(\d+)", head)
        if m:
            found.setdefault(int(m.group(1)), f)
    return found


def _summarise(run: Run, plan: JobPlan, rc: int, elapsed: float, lines: list[str]) -> str:
    result = None
    for text in reversed(lines):
        m = RESULT_RE.search(text)
        if m:
            try:
                result = json.loads(m.group(1))
            except ValueError:
                result = None
            break
    if result is not None:
        run.write("result.json", json.dumps(result, indent=2) + "\n")
    logs = rank_logs(run)
    console.print(f"per-rank logs: {len(logs)} of {plan.world_size} collected under {run.dir / 'nodes'}", markup=False)
    if rc == 0:
        acc = f" test_acc={result.get('test_acc')}" if result else ""
        console.print(f"[green]run {run.id} succeeded[/green] in {elapsed:.1f}s{escape(acc)}")
        return f"ok{acc}"
    first_bad = _first_failed_rank(lines)
    console.print(f"[red]run {run.id} failed[/red] (launcher exit {rc}) after {elapsed:.1f}s{escape(first_bad)}")
    text = "\n".join(lines)
    for fix in diagnose(text):
        console.print(f"  hint: {fix}", markup=False)
    return f"failed rc={rc}{first_bad}"


def _first_failed_rank(lines: list[str]) -> str:
    """The first failing rank and its host, from what the launchers and the wrapper printed."""
    text = "\n".join(lines)
    hosts = {int(m[1]): m[2] for m in re.finditer(r"DISTRUN_RANK rank=(\d+) \S+ \S+ host=(\S+)", text)}
    patterns = (
        r"MPI_ABORT was invoked on rank (\d+)",
        r"Process name: \[\[\d+,\d+\],(\d+)\]",
        r"rank\s*:\s*(\d+) \(local_rank",  # torchrun's "Root Cause" block
    )
    for pattern in patterns:
        m = re.search(pattern, text)
        if m:
            rank = int(m.group(1))
            host = hosts.get(rank)
            return f"; first failing rank {rank}" + (f" on {host}" if host else "")
    m = re.search(r"DISTRUN_FAILED_HOST (\S+) (.*)", text)
    if m:
        return f"; {m.group(2)}"
    return ""


def run_partition_only(request: JobRequest) -> int:
    cluster = load_cluster(request.inventory, paths.fact_cache_dir(request.inventory))
    run = new_run("partition", request.inventory)
    plan = make_plan(JobRequest(**{**asdict(request), "workload": "gcn", "script": None}), cluster, run.id,
                     _network(cluster))
    assert plan.partition is not None
    result = _playbook("partition", "playbooks/stage.yml", request.inventory, run, [cluster.head.name],
                       _stage_vars(plan, run, {}, {}, None, jittor_warm=False), limit=cluster.head.name)
    run.finish(0 if result.ok else 1)
    return 0 if result.ok else 1


def rank_host(plan: dict, rank: int) -> tuple[str, int] | None:
    """(host, local rank) of a rank in a recorded plan: ranks fill each host's slots in order."""
    first = 0
    for h in plan.get("hosts", []):
        if rank < first + int(h["slots"]):
            return str(h["name"]), rank - first
        first += int(h["slots"])
    return None


def remote_log_command(plan: dict, rank: int) -> str | None:
    """Shell command that waits for a rank's log on its node, then follows it."""
    where = rank_host(plan, rank)
    if where is None:
        return None
    host, local = where
    patterns = {
        "mpirun": f"ranks/*/rank.{int(rank)}/stdout",
        "torchrun": f"torchrun/{shlex.quote(host)}/*/attempt_*/{int(local)}/stdout.log",
        "slurm": f"ranks/{int(rank)}/stdout",
    }.get(str(plan.get("launcher")), f"ranks/*/rank.{int(rank)}/stdout")
    run_dir = f"{str(plan['shared_dir']).rstrip('/')}/runs/{plan['run_id']}"
    user = str(plan.get("user") or contract.DEFAULT_USER)
    d = shlex.quote(run_dir)
    # As the training user, as the launchers: the run dir may be open to that user only (sshfs).
    return as_user(user, (
        f"cd {d} 2>/dev/null || {{ echo \"{host}: cannot enter {run_dir} as user {user}\" >&2; exit 3; }}; "
        f"for i in $(seq 1200); do "
        f"f=$(ls -1 {patterns} 2>/dev/null | tail -n 1); [ -n \"$f\" ] && break; sleep 0.5; done; "
        f"[ -n \"$f\" ] || {{ echo \"{host}: no log of rank {rank} in {run_dir} after 10 minutes\" >&2; exit 4; }}; "
        f"exec tail -n +1 -F -s 0.5 \"$f\""))


def print_logs(run_id: str, rank: int | None, follow: bool) -> None:
    run = load_run(run_id, verb="train")
    if rank is None:
        # The runner writes launcher.log as the run goes: following it is following the run.
        path = run.dir / "launcher.log"
    else:
        logs = rank_logs(run)
        if rank not in logs and run.meta.status == "running" and follow:
            _follow_remote_rank(run, rank)
            return
        if rank not in logs:
            have = ", ".join(str(r) for r in sorted(logs)) or "none"
            state = " (still running: add --follow to read it live from its node)" if run.meta.status == "running" else ""
            raise UserError(f"run {run.id}: no log for rank {rank} (ranks with logs: {have}){state}")
        path = logs[rank]
    if not path.is_file():
        raise UserError(f"run {run.id}: {path.name} does not exist yet")
    with path.open(errors="replace") as fh:
        while True:
            chunk = fh.read()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
            if not follow or load_run(run.id).meta.status != "running":
                break
            time.sleep(0.5)


def _follow_remote_rank(run: Run, rank: int) -> None:
    """Tail a running rank's log on its own node until the run ends."""
    plan_file = run.dir / "plan.json"
    if not plan_file.is_file():
        raise UserError(f"run {run.id}: no plan.json yet (the run is still being planned); try again in a moment")
    plan = json.loads(plan_file.read_text())
    command = remote_log_command(plan, rank)
    if command is None:
        raise UserError(f"run {run.id}: rank {rank} does not exist (world size {plan.get('world_size')})")
    host, _ = rank_host(plan, rank) or ("", 0)
    cluster = load_cluster(Path(run.meta.inventory), paths.fact_cache_dir(Path(run.meta.inventory)))
    node = next((n for n in cluster.nodes if n.name == host), None)
    if node is None:
        raise UserError(f"run {run.id}: host {host} of rank {rank} is no longer in inventory {run.meta.inventory}")
    proc = subprocess.Popen(shell_argv(node, command), stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    done = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        while not done.is_set() and load_run(run.id).meta.status == "running":
            time.sleep(0.5)
        done.wait(1.5)  # the last lines tail printed before the run was marked finished
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


STOPPED_RE = re.compile(r"^DISTRUN_STOPPED (\d+)$", re.M)


@dataclass
class StopReport:
    """What 'distrun stop' did on each node: processes stopped, or why the node was missed."""

    stopped: dict[str, int] = field(default_factory=dict)
    missed: dict[str, str] = field(default_factory=dict)

    @property
    def rc(self) -> int:
        return 1 if self.missed else 0


def stop_report(result: PlaybookResult, outputs: dict[str, str]) -> StopReport:
    """Per node: the count the stop step printed (``outputs``: host -> its stdout), or the
    error of a node that failed or could not be reached."""
    report = StopReport()
    for name in sorted(set(result.hosts) | set(outputs)):
        h = result.hosts.get(name)
        m = STOPPED_RE.search(outputs.get(name, ""))
        if h is not None and (h.unreachable or h.failed):
            report.missed[name] = ("unreachable: " if h.unreachable else "") + (h.last_error or "failed")
        elif m:
            report.stopped[name] = int(m.group(1))
        else:
            report.missed[name] = "no report from the stop step"
    return report


def stop_run(run_id: str) -> int:
    run = load_run(run_id, verb="train")
    if run.meta.verb != "train":
        raise UserError(f"run {run.id} is a '{run.meta.verb}' run: only train runs have processes to stop")
    inv = Path(run.meta.inventory)
    outputs: dict[str, str] = {}

    def on_event(ev: PlaybookEvent) -> None:
        out = str((ev.data or {}).get("stdout") or "") if ev.host else ""
        if ev.host and STOPPED_RE.search(out):
            outputs[ev.host] = out

    result = run_playbook("playbooks/stop.yml", inv, run.dir, extravars={"distrun_run_id": run.id}, on_event=on_event)
    report = stop_report(result, outputs)
    for host, n in report.stopped.items():
        console.print(f"  {host}: stopped {n} process(es)", markup=False)
    for host, why in report.missed.items():
        err_console.print(f"  {host}: NOT stopped: {why}", markup=False, soft_wrap=True)
    if report.missed:
        if run.meta.status == "running":
            run.finish(130, f"stop incomplete: {', '.join(report.missed)} not reached", status="stopped")
        raise UserError(f"run {run.id}: could not stop it on {', '.join(report.missed)}; "
                        "its processes there may still run: bring the node back and run 'distrun stop' again",
                        exit_code=1)
    if run.meta.status == "running":
        run.finish(130, "stopped by 'distrun stop'", status="stopped")
    total = sum(report.stopped.values())
    console.print(f"run {run.id}: stopped {total} process(es) on {len(report.stopped)} node(s)", markup=False)
    return 0
