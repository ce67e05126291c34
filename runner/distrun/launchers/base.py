"""What every launcher answers about a plan: one object per launcher, no branching on its name.

A launcher knows the files it renders into the run directory, the hosts that start it and the
command each runs, where a rank's log lies on its node, how its final state becomes distrun's
exit code, and how to find which rank failed. Everything here is a pure function of the plan
(and, for the cluster-wide checks, of the inventory): no host is contacted.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrun.errors import ExitCode, UserError
from distrun.launchers.options import LauncherOption, resolve
from distrun.transport import nodeprog, rundir
from distrun.transport.nodeprog import RUN_TAG

if TYPE_CHECKING:
    from distrun.inventory.cluster import Cluster, Node
    from distrun.planning.jobplan import JobPlan, RankHost

# What the launchers and Open MPI print about the rank that failed first.
MPI_ABORT = r"MPI_ABORT was invoked on rank (\d+)"
MPI_PROCESS = r"Process name: \[\[\d+,\d+\],(\d+)\]"
TORCHRUN_ROOT_CAUSE = r"rank\s*:\s*(\d+) \(local_rank"  # torchrun's "Root Cause" block


def fill(hosts: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Host name -> its ranks, when ranks fill the hosts in the order given, each its slots."""
    out: dict[str, list[int]] = {}
    first = 0
    for h in hosts:
        out[str(h["name"])] = list(range(first, first + int(h["slots"])))
        first += int(h["slots"])
    return out


# How long a relay waits for each caller (relay.py's WAIT_S, given where the caller count follows it).
RELAY_WAIT_S = 120


class Launcher(ABC):
    """One way to start a plan's ranks (mpirun, torchrun, Slurm)."""

    name: str
    # One line for 'distrun train --help': what starts the ranks.
    summary: str = ""
    # Options of the launcher's own command line that distrun itself gives it (world size,
    # hosts, rendezvous, log folders): --launcher-args may not give them a second time.
    owned_args: tuple[str, ...] = ()
    # Parameters distrun sets through one of those options, which takes the parameter's name first
    # (Open MPI's "--mca NAME VALUE"): option -> {name --launcher-args may not set again: why}.
    owned_params: Mapping[str, Mapping[str, str]] = {}
    # Whether the launcher has a command line of its own that --launcher-args extends.
    takes_args: bool = True
    # Names this launcher's files() writes at the top of a run directory: a user's --script of
    # such a name would replace it (rundir.RUN_DIR_NAMES holds the names every launcher shares).
    run_dir_files: tuple[str, ...] = ()
    # The same as shell patterns, for names that take a number or a host (job-<n>.sbatch).
    run_dir_patterns: tuple[str, ...] = ()
    # What it writes inside an attempt's folder (rundir.py), as shell patterns: its ranks' logs, its
    # scheduler's output. They come home when the run ends; at the top of a collected run they mark
    # a run recorded before attempt folders (store/retiring.py), so a --script may not take such a name.
    attempt_files: tuple[str, ...] = ()
    # Where among those its ranks' logs are, as shell patterns ('*' crosses '/'), each log's first
    # line the rank wrapper's header naming its rank: collected logs are found by them.
    rank_log_files: tuple[str, ...] = ()
    # The ranks form one MPI world, so Python runs under mpi4py's runner: a rank that raises
    # then calls MPI_Abort and the whole job ends at once.
    mpi_world: bool = False
    # Regular expressions whose first group is the rank that failed first, most telling first.
    failed_rank_patterns: tuple[str, ...] = ()
    # The torch-style variables every rank reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
    # each from the launcher's own variables, the first one set winning: the rank wrapper maps
    # them (RANK from OMPI_COMM_WORLD_RANK under mpirun). A launcher that sets torch's names itself
    # (torchrun, ssh) declares none; an unset one falls back to rank 0 of 1 on the node's slots.
    rank_variables: Mapping[str, tuple[str, ...]] = {}
    # Prefixes of the launcher's own variables its ranks need (Open MPI's, PMIx's, Slurm's): with
    # --image they are passed into each rank's container by name, whatever they are.
    env_prefixes: tuple[str, ...] = ()
    # With --image: the node's own launcher starts each rank in a container, so the image's MPI
    # must be the node's (Open MPI's major version: the hybrid model), checked by the preflight.
    image_uses_node_mpi: bool = False
    # The launcher logs in from its host to the run's other hosts over ssh (mpirun's daemons): the
    # attempt then gets an ssh certificate for the run's hosts (run/certificate.py).
    logs_in: bool = False

    # Its scheduler chooses which of a node's GPUs the ranks get (Slurm's gres): distrun asks for
    # their count and leaves CUDA_VISIBLE_DEVICES to it; GPU indices in --hosts are refused.
    picks_gpus: bool = False
    # With --image, one container per rank (True: mpirun, ssh) or one per node holding its
    # launcher and ranks (False): which of a node's GPUs each container is given.
    container_per_rank: bool = False

    # It restarts the run on the nodes by itself, with no distrun process following it, so 'train
    # --detach --max-restarts N' may use it (torchrun's elastic agents); the others restart only
    # while the controller follows the run (run/restarts.py).
    restarts_itself: bool = False
    # A detached run with restarts (train --detach --max-restarts N) is restarted on the head by
    # distrun's supervisor (role job's files/supervise.py) in place of the launcher's own command,
    # inside the head's unit, with the follower's rule (restartrule.py); the relays of the other
    # hosts then serve one caller per try (mpirun).
    supervised: bool = False
    # It restarts every rank in place within an attempt (torchrun's agents, --max-restarts): the
    # rank wrapper counts a node's starts of each local rank into DISTRUN_RESTART, the same number
    # on every rank of a group (the launcher's own count need not be: torchrun's counts only the
    # restarts an agent made for its own failed workers, not those it made for another node's).
    restarts_in_place: bool = False

    # The scheduler of a site distrun does not administer (Cluster.site) that this launcher submits
    # to: it runs there, reaching only the site's login node (``login``).
    site: str | None = None

    # Its own exit codes beside distrun's (errors.ExitCode), code -> what it means, for the ends of
    # its own it maps in ``exit_code``; 'distrun --help' and the CLI guide list them under its name.
    exit_codes: Mapping[int, str] = {}

    # Its own settings (options.py): what 'distrun train --launcher-opt KEY=VALUE' may set, and
    # the inventory key each also reads; the CLI's checks and help come from them.
    options: tuple[LauncherOption, ...] = ()

    def owns_run_dir_file(self, name: str) -> bool:
        """Whether this launcher writes a file of that name at the top of a run directory."""
        return rundir.named(name, self.run_dir_files, (*self.run_dir_patterns, *self.attempt_files))

    def image_modules(self, plan: JobPlan) -> tuple[str, ...]:
        """With --image: what the image's python3 must import for this launcher to start ranks
        in it (an MPI world's ranks run under mpi4py)."""
        return ("mpi4py",) if self.mpi_world else ()

    # --- before planning: the cluster and the CLI's choices ---------------------------------

    def settings(self, cluster: Cluster, given: Mapping[str, str] | None = None) -> dict[str, str]:
        """What this launcher takes from the inventory and the CLI (``plan.launch.options``): its options'
        values (``given`` holds those of --launcher-opt), the unset ones left out."""
        resolved = resolve(self, given or {}, cluster.group_vars, cluster.source)
        return {name: r.value for name, r in resolved.items() if r.value is not None}

    def unready(self, cluster: Cluster) -> str | None:
        """Why the cluster cannot run this launcher (said by --dry-run), or None. On a site distrun
        does not administer (``cluster.site``) only the login node is reached: only the launcher
        of the site's scheduler starts ranks there."""
        if cluster.site and cluster.site != self.site:
            return (f"{cluster.source} describes a {cluster.site} site distrun does not administer (only its login "
                    f"node is reached): run jobs there with --launcher {cluster.site}")
        return None

    def require_ready(self, cluster: Cluster) -> None:
        """Refuse a real run on a cluster that cannot run this launcher (UserError)."""
        why = self.unready(cluster)
        if why:
            raise UserError(f"inventory {why}")

    # --- where it reaches --------------------------------------------------------------------

    def login(self, cluster: Cluster) -> Node | None:
        """The one host distrun reaches where the launcher's scheduler places the ranks itself (a
        site's login node), or None: distrun reaches every rank host."""
        return None

    # --- what is rendered and started ------------------------------------------------------

    def files(self, plan: JobPlan) -> dict[str, str]:
        """Run-directory file name -> content, besides the hostfile and the rank wrapper."""
        return {}

    @abstractmethod
    def launch_hosts(self, plan: JobPlan) -> list[RankHost]:
        """The hosts that start a launcher process: the head alone, or every rank host."""

    def relay_hosts(self, plan: JobPlan) -> list[RankHost]:
        """The hosts where the launcher starts processes over ssh from another node (mpirun's
        daemons): each runs role job's relay in its own unit of the attempt, and what the launcher
        starts there runs inside that unit (``stop`` ends it, a process there cannot leave it)."""
        return []

    def started_hosts(self, plan: JobPlan) -> list[RankHost]:
        """Every host where the attempt starts something of its own: launchers, then relays."""
        return [*self.launch_hosts(plan), *self.relay_hosts(plan)]

    @abstractmethod
    def command(self, plan: JobPlan, host: RankHost) -> list[str]:
        """The argv the launch script on ``host`` runs (a launch host's)."""

    def started_command(self, plan: JobPlan, host: RankHost) -> list[str]:
        """The argv the launch script on ``host`` runs: its launcher, or the relay."""
        if host.name in {h.name for h in self.launch_hosts(plan)}:
            return self.command(plan, host)
        serve = nodeprog.relay_argv(plan.run_id, plan.attempt.restart, "serve")
        if plan.attempt.supervised:  # one caller per try of the supervisor, each within the relay's wait
            return [*serve, str(RELAY_WAIT_S), str(int(plan.attempt.max_restarts) + 1)]
        return serve

    def environment(self, plan: JobPlan, host: RankHost) -> list[tuple[str, str]]:
        """Variables of the launcher process. DISTRUN_RUN_ID tags it (and every child) for 'distrun stop'."""
        return [(RUN_TAG, plan.run_id)]

    def needs(self, plan: JobPlan) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Programs the run needs, label -> candidate paths or names: (on every node, on the head only)."""
        return {}, {}

    def rank_order(self, hosts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
        """The plan's hosts (as plan.json records them: name, slots, address, net_address) in the
        order ranks fill them, each its slots; None where the scheduler decides once the job
        starts (Slurm's own node order)."""
        return None

    # --- while and after it runs -----------------------------------------------------------

    def cancel(self, plan: JobPlan) -> dict[str, Any]:
        """What ends the run in the launcher's own scheduler before its processes are stopped:
        the extra-vars of playbooks/stop.yml's cancel play (``distrun_cancel_role``, the role whose
        entry point ``cancel`` runs on the head, and that role's variables), or {} when stopping the
        processes is enough."""
        return {}

    @abstractmethod
    def rank_log(self, rank: int, host: str, local_rank: int) -> str:
        """Shell glob of a rank's output file on its node, relative to its attempt's folder (rundir.py)."""

    def exit_code(self, rc: int) -> int:
        """distrun's exit code for the launcher's own: 0 or 1 unless the launcher says more."""
        return ExitCode.OK if rc == 0 else ExitCode.FAILED

    def failure_lines(self, rank_logs: Mapping[int, Path]) -> list[str]:
        """Lines from the collected rank logs that name a failing rank the launcher's own output
        does not name; appended to what the run printed before its failed rank is looked for."""
        return []

    def failed_rank(self, text: str) -> int | None:
        """The rank that failed first according to the launcher's output, or None."""
        for pattern in self.failed_rank_patterns:
            m = re.search(pattern, text)
            if m:
                return int(m.group(1))
        return None
