"""A job reaches for a way to start work that lives outside its run's units on the nodes: the
cluster's ssh key, a key of its own, the login shell's startup file, the systemd user manager.
One real job ('distrun train --script' under mpirun, rank 0 on node1 and rank 1 on node2) tries
them all; each attack is tallied in tests/cluster/hostile.py. After the run, nothing it started
is alive on any node, and what distrun itself sends over the key (the preflight's login check,
mpirun's daemons, the sync mode's rsync, which the suite's other runs use) still works. The same
job reads the resource limits its ranks got on each node: the inventory's distrun_unit_limits.
A second job writes the training user's ~/.ssh/config and ~/.openmpi/mca-params.conf on every
node: the next check's logins and a later run's ssh (mpirun's daemons, the sync mode's copies),
Open MPI's daemons and ranks never run what they say."""

from __future__ import annotations

import json
import textwrap
import uuid

from .conftest import distrun
from .hostile import TALLY

HOME = "/home/distrun"

JOB = textwrap.dedent(r"""
    import json, os, resource, socket, subprocess, sys
    from mpi4py import MPI

    tag = sys.argv[1]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    home = os.path.expanduser("~")
    said = {"nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))}  # the inventory's distrun_unit_limits

    def sh(cmd):
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
        return {"rc": p.returncode, "out": p.stdout[-400:], "err": p.stderr[-400:]}

    def away(name):  # a process that outlives whoever started it, by a name the test looks for
        return f"nohup setsid bash -c 'exec -a {name}-{tag} sleep 600' </dev/null >/dev/null 2>&1 &"

    pub = None
    if rank == 0:  # a key pair of the job's own
        key = f"/tmp/jobkey-{tag}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "job@away", "-f", key], check=True)
        pub = open(key + ".pub").read()
    pub = comm.bcast(pub, root=0)
    if rank == 1:  # node2: the key authorized, a startup file for the login shell, a user unit
        os.makedirs(f"{home}/.ssh", exist_ok=True)
        with open(f"{home}/.ssh/authorized_keys", "a") as f:
            f.write(pub)
        rc = f"{home}/.bashrc"  # first, before the usual "not interactive: return"
        kept = open(rc).read() if os.path.exists(rc) else ""
        with open(rc, "w") as f:
            f.write(f"touch {home}/bashrc-ran-{tag}\n{kept}")
        said["systemd-run"] = sh(f"XDG_RUNTIME_DIR=/run/user/{os.getuid()} systemd-run --user --collect -- "
                                 f"bash -c 'exec -a escapee-unit-{tag} sleep 600'")
    comm.Barrier()
    # The run's own certificate (the only key a job can read): its hosts, minutes, the relay only.
    cert = f"-o IdentitiesOnly=yes -i {os.environ['DISTRUN_RUN_DIR']}/attempts/0/mesh-key"
    if rank == 0:  # from node1 to node2
        said["mesh"] = sh(f"ssh -o BatchMode=yes {cert} node2 \"{away('escapee-mesh')}\"")
        said["own-key"] = sh(f"ssh -o BatchMode=yes -o IdentitiesOnly=yes -i /tmp/jobkey-{tag} node2 \"{away('escapee-key')}\"")
        said["login-check"] = sh(f"ssh -o BatchMode=yes {cert} node2 true")
    comm.Barrier()
    # one write: the text layer is unbuffered (PYTHONUNBUFFERED), where print() writes its end apart
    sys.stdout.write("ESCAPES " + json.dumps({socket.gethostname().split(".")[0]: said}) + "\n")
    sys.stdout.flush()
""")


def _said(res) -> dict:
    """Every rank's report, also where mpirun ran two ranks' lines together."""
    found: dict = {}
    for chunk in (res.stdout + res.stderr).split("ESCAPES ")[1:]:
        found.update(json.JSONDecoder().raw_decode(chunk)[0])
    return found


def _alive(cluster, name: str) -> dict[int, int]:
    """Processes by that name on each node ('[e]scapee-...': the shell asking is no match)."""
    pattern = f"[{name[0]}]{name[1:]}"
    return {k: len(cluster.exec(k, f"pgrep -f -- '{pattern}' || true", check=False).stdout.split()) for k in (1, 2, 3)}


def test_a_job_starts_nothing_outside_its_run_through_ssh_or_the_user_manager(provisioned, tmp_path):
    tag = uuid.uuid4().hex[:8]
    script = tmp_path / "escape.py"
    script.write_text(JOB)
    try:
        res = distrun("train", "--inventory", "test", "--launcher", "mpirun", "--script", str(script), "--", tag,
                      timeout=600)
        assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
        said = _said(res)
        assert set(said) == {"node1", "node2", "node3"}, res.stdout[-3000:]
        node1, node2 = said["node1"], said["node2"]
        # Not an attack: the inventory's limits reach the ranks in every node's unit (the head's
        # launcher, the relays of nodes 2 and 3), where a login would have had PAM's.
        assert {n: s["nofile"] for n, s in said.items()} == dict.fromkeys(said, [16384, 16384])

        # The cluster key: distrun's own login check passes, a command of the job's is refused.
        assert node1["login-check"]["rc"] == 0, node1
        mesh = _alive(provisioned, f"escapee-mesh-{tag}")
        assert not TALLY.record("the run's certificate starts a process outside the run on another node",
                                any(mesh.values()) or node1["mesh"]["rc"] == 0), (mesh, node1["mesh"])
        assert "refused" in node1["mesh"]["err"] and "distrun launcher" in node1["mesh"]["err"], node1["mesh"]

        # A key the job wrote into ~/.ssh/authorized_keys logs in nowhere: sshd reads root's file.
        own = _alive(provisioned, f"escapee-key-{tag}")
        assert not TALLY.record("a key the job added to authorized_keys logs in",
                                any(own.values()) or node1["own-key"]["rc"] == 0), (own, node1["own-key"])
        assert "Permission denied" in node1["own-key"]["err"], node1["own-key"]

        # The login shell never ran the ~/.bashrc the job wrote before the key's forced command.
        ran = provisioned.exec(2, f"test -e {HOME}/bashrc-ran-{tag}", check=False).returncode == 0
        assert not TALLY.record("the login shell runs a startup file the job wrote", ran)

        # No systemd user manager to start a unit outside the run's.
        unit = _alive(provisioned, f"escapee-unit-{tag}")
        assert not TALLY.record("systemd-run --user starts a unit outside the run",
                                any(unit.values()) or node2["systemd-run"]["rc"] == 0), (unit, node2["systemd-run"])
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"pkill -f -- '[e]scapee-[a-z]*-{tag}' ; "
                                f"rm -f {HOME}/bashrc-ran-{tag} /tmp/jobkey-{tag} /tmp/jobkey-{tag}.pub; "
                                f"sed -i '/{tag}/d' {HOME}/.bashrc; sed -i '/job@away/d' {HOME}/.ssh/authorized_keys; "
                                f"runuser -u distrun -- env XDG_RUNTIME_DIR=/run/user/$(id -u distrun) "
                                f"systemctl --user stop 'run-*' 2>/dev/null; true", check=False)


# A job writes configuration into the training user's home on every node, for whatever of the
# account's later work reads it: an ssh client configuration whose LocalCommand leaves a mark and
# a process behind whenever that user's ssh connects, an Open MPI parameter file whose fork agent
# (a program Open MPI's daemons start every rank through) leaves a mark and runs the rank, and a
# unit of the user's systemd manager, started whenever that manager starts (the node's boot).
# distrun's later steps: the next check's logins between the nodes (outside every unit), the
# sync mode's copies, a later run's mpirun, its daemons and ranks (inside that run, where a
# command could read the run's secrets). They read the system's configuration only.
HOME_CONFIG_JOB = textwrap.dedent(r"""
    import os, socket, sys
    tag = sys.argv[1]
    home = os.path.expanduser("~")
    os.makedirs(f"{home}/.ssh", exist_ok=True)
    with open(f"{home}/.ssh/config", "w") as f:
        f.write("Host *\n    PermitLocalCommand yes\n"
                f"    LocalCommand touch {home}/sshcfg-ran-{tag}; nohup setsid bash -c 'exec -a escapee-sshcfg-{tag} "
                "sleep 600' </dev/null >/dev/null 2>&1 &\n")
    agent = f"{home}/forkagent-{tag}.sh"  # in the home: each run's /tmp is its own
    with open(agent, "w") as f:
        f.write(f"#!/bin/sh\ntouch {home}/forkagent-ran-{tag}\nexec \"$@\"\n")
    os.chmod(agent, 0o755)
    os.makedirs(f"{home}/.openmpi", exist_ok=True)
    with open(f"{home}/.openmpi/mca-params.conf", "w") as f:
        f.write(f"orte_fork_agent = {agent}\n")
    units = f"{home}/.config/systemd/user"
    os.makedirs(f"{units}/default.target.wants", exist_ok=True)
    with open(f"{units}/escapee-{tag}.service", "w") as f:
        f.write(f"[Service]\nExecStart=/bin/bash -c 'exec -a escapee-usrunit-{tag} sleep 600'\n"
                "[Install]\nWantedBy=default.target\n")
    os.symlink(f"../escapee-{tag}.service", f"{units}/default.target.wants/escapee-{tag}.service")
    sys.stdout.write(f"PLANTED {socket.gethostname()}\n")
""")

PLAIN_JOB = textwrap.dedent(r"""
    import socket, sys
    from mpi4py import MPI
    total = MPI.COMM_WORLD.allreduce(1)
    sys.stdout.write(f"PLAIN {socket.gethostname()} world={total}\n")
""")


def test_configuration_a_job_wrote_into_the_home_runs_nothing_in_later_checks_or_runs(provisioned, tmp_path):
    tag = uuid.uuid4().hex[:8]
    plant, plain = tmp_path / "plant.py", tmp_path / "plain.py"
    plant.write_text(HOME_CONFIG_JOB)
    plain.write_text(PLAIN_JOB)

    def marked(name: str) -> dict[int, bool]:
        return {k: provisioned.exec(k, f"test -e {HOME}/{name}-ran-{tag}", check=False).returncode == 0 for k in (1, 2, 3)}

    try:
        res = distrun("train", "--inventory", "test", "--launcher", "mpirun", "--script", str(plant), "--", tag,
                      timeout=600)
        assert res.rc == 0 and res.stdout.count("PLANTED ") == 3, res.stdout[-3000:] + res.stderr[-2000:]
        for k in (1, 2, 3):  # the job's files, as it left them on every node
            assert f"sshcfg-ran-{tag}" in provisioned.exec(k, f"cat {HOME}/.ssh/config").stdout
            assert f"forkagent-{tag}" in provisioned.exec(k, f"cat {HOME}/.openmpi/mca-params.conf").stdout

        # The next check: every node logs in to every other as the training user, outside any unit.
        checked = distrun("check", "--inventory", "test", timeout=600)
        assert checked.rc == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
        marks, alive = marked("sshcfg"), _alive(provisioned, f"escapee-sshcfg-{tag}")
        assert not TALLY.record("an ssh config the job wrote runs its command in the next check, outside every unit",
                                any(marks.values()) or any(alive.values())), (marks, alive)

        # A later run: mpirun's ssh to the other nodes, its daemons and ranks, the stage step's copies.
        later = distrun("train", "--inventory", "test", "--launcher", "mpirun", "--script", str(plain), timeout=600)
        assert later.rc == 0 and later.stdout.count("world=3") == 3, later.stdout[-3000:] + later.stderr[-2000:]
        marks = marked("sshcfg")
        assert not TALLY.record("an ssh config the job wrote runs its command inside a later run",
                                any(marks.values())), marks
        agent = marked("forkagent")
        assert not TALLY.record("an Open MPI parameter file the job wrote starts a later run's ranks through its program",
                                any(agent.values())), agent

        # The node boots again, or a login of the user's begins: the user's systemd manager is masked
        # and never starts, so neither does the unit.
        started = {k: provisioned.exec(k, "systemctl start user@$(id -u distrun).service && sleep 1", check=False).returncode
                   for k in (1, 2, 3)}
        units = _alive(provisioned, f"escapee-usrunit-{tag}")
        assert all(rc != 0 for rc in started.values()), started
        assert not TALLY.record("a unit the job wrote into ~/.config/systemd/user starts outside every run at the next boot",
                                any(units.values())), units
    finally:
        for k in (1, 2, 3):
            units = f"{HOME}/.config/systemd/user"
            provisioned.exec(k, f"pkill -f -- '[e]scapee-[a-z]*-{tag}'; rm -rf {HOME}/sshcfg-ran-{tag} {HOME}/forkagent-{tag}.sh "
                                f"{HOME}/forkagent-ran-{tag} {HOME}/.ssh/config {HOME}/.openmpi {units}/escapee-{tag}.service "
                                f"{units}/default.target.wants/escapee-{tag}.service; true", check=False)
