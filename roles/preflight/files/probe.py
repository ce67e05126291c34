# ruff: noqa: F821 - the preflight probe's driver: names of the parts composed in front of it (nodeprog.RECIPES)
"""distrun preflight probe: everything one node can tell about itself, as one JSON line.

``python3 -I -S -c <source> '<config JSON>' ['<stage program>']``, as root with the node's system
Python; the source is the one recipe's (runner/distrun/transport/nodeprog.py): role job's head
(nodecommon.py), role distrun's distrun_fsuser.py, the probe's parts (its config, how root asks
about the training user: userprobe.py, one part per check) and this driver last, which reads the
config once, runs the checks and prints the report, its keys sorted (the role's judge reads it):
``{"host": ..., "probe_error": {"step": ...}}`` where a check broke, the trace on stderr. A bad
call is one line on stderr and exit 2. It changes nothing but the shared folder's probe file
(the role removes it), root's record of the env's versions and, given a run's stage step (role
job's files/stage.py, the second argument), the run's files, unpacked after the checks. Root
believes no process of the training user's uid (userprobe.py says how). Standard library only.
"""

import os
import pwd
import sys


class Probe:
    """One node's probe as it goes: its report, the step at work (the one an error names) and
    what the run's stage step said, if it ran."""

    def __init__(self, cfg: ProbeConfig, stage_script: str) -> None:
        self.cfg = cfg
        self.stage_script = stage_script
        self.report: dict = {"host": cfg.host}
        self.step = "start"
        self.staged: dict = {}

    def run(self) -> dict:
        cfg, report = self.cfg, self.report
        net = dict(cfg.net)
        if cfg.ports:
            self.step = "ports"
            take_turn()  # netprobe.py's: another run's probe here ends first; then, before our listeners, the ports
            report["ports"] = probe_ports(cfg.ports)
            if not all(v.get("ok") for v in report["ports"].values()):
                net["rendezvous"] = 0  # taken: the ports check says by whom
        # Beside the other checks, in a thread: it checks for itself what it needs first.
        stage = in_thread(stage_run, cfg, self.stage_script) if cfg.stage else None
        network = None
        if net.get("rendezvous") or net.get("mpi_range"):
            self.step = "network"
            # First, in threads: every node listens while the others call, whatever else it checks.
            network = NetworkProbe(cfg.host, net)
        try:
            self.checks()
        finally:
            if network is not None:
                step, self.step = self.step, "network"
                report["net"] = network.result()
                self.step = step  # a step that raised in checks() is the one the error names
            if stage is not None:
                # Whatever else happened: the runner removes what was staged when it refuses the run.
                self.staged.update(stage())
        report.update(self.staged)
        return report

    def checks(self) -> None:
        cfg, report = self.cfg, self.report
        if cfg.facts:
            self.step = "facts"
            report["facts"] = probe_facts()
            # The node's own record of its Open MPI, where the controller's cache had none yet.
            cfg.mpi_prefix = cfg.mpi_prefix or str(report["facts"]["local"].get("mpi_prefix") or "")
        try:
            pwd.getpwnam(cfg.user)
        except KeyError:
            # Nothing below means anything without the training user: the node was never set up.
            report["setup"] = {"ok": False, "detail": f"distrun never set up {cfg.host}: no user {cfg.user}"}
            return
        self.step = "ssh fingerprint"
        report["ssh_fingerprint"] = ssh_fingerprint(cfg)
        if not os.path.exists(f"{cfg.prefix}/bin/python"):
            report["setup"] = {"ok": False, "detail": f"distrun never set up {cfg.host}: no env {cfg.prefix}"}
            return
        report["setup"] = {"ok": True, "detail": f"user {cfg.user} and env {cfg.prefix}"}
        if cfg.addresses:
            self.step = "addresses"
            report["addresses"] = probe_addresses()
        self.step = "env, versions, shared folder, ssh, names"
        ompi_f = in_thread(probe_openmpi, cfg)
        env_f = in_thread(probe_env_once, cfg, ompi_f)
        writable_f = in_thread(probe_writable, cfg, cfg.shared_dir)
        check_ssh = probe_banner if cfg.ssh_banner else probe_ssh
        ssh_f = fan_out(check_ssh, ssh_order(cfg.ssh_targets, cfg.host), cfg, limit=SSH_FAN_OUT)
        names_f = fan_out(resolve, cfg.names)
        found = versions_report(cfg, env_f(), ompi_f())
        report["shared_writable"] = writable_f()
        report["ssh"] = {t: f() for t, f in ssh_f.items()}
        report["names"] = {n: f() for n, f in names_f.items()}
        self.step = "needs"
        report.update(found)
        report["needs"].update(probe_programs(cfg, cfg.programs))
        if cfg.image:
            self.step = "container image"
            report["image"] = probe_image(cfg, cfg.image)
        if cfg.mount_fstypes:
            self.step = "shared folder mount"
            report["shared_mount"] = probe_mount(cfg, cfg.shared_dir, cfg.mount_fstypes)
        if cfg.shared_fs_mounts:
            self.step = "shared folder filesystem"
            report["shared_fs_mounts"] = mounts_above(cfg.shared_dir)
        if cfg.slurm:
            self.step = "slurm"
            report["slurm"] = probe_slurm(cfg)
        if cfg.shared_probe:
            self.step = "shared folder probe file"
            report["shared_probe"] = probe_shared_file(cfg)


def main(argv: list[str]) -> int:
    """The probe's one call: its config, and the stage program where a run stages in this round trip."""
    try:
        if len(argv) not in (1, 2):
            raise CallError(f"usage: probe.py '<config JSON>' ['<stage program>'] (got {len(argv)} arguments)")
        cfg = ProbeConfig.read(argv[0])
    except CallError as exc:
        print(f"probe.py: {exc}", file=sys.stderr, flush=True)
        return 2
    probe = Probe(cfg, argv[1] if len(argv) > 1 else "")
    try:
        report = probe.run()
    except Exception:  # noqa: BLE001 - whatever broke, the report names the step; the trace goes to the log
        import traceback  # here only: the probe starts faster without it

        traceback.print_exc()
        report = {"host": cfg.host, "probe_error": {"step": probe.step}, **probe.staged}
    answer(report)
    return 0


sys.exit(main(sys.argv[1:]))
