"""A job reaches for a way to start work that lives outside its run's units on the nodes: the
cluster's ssh key, a key of its own, the login shell's startup file, the systemd user manager.
One real job ('distrun train --script' under mpirun, rank 0 on node1 and rank 1 on node2) tries
them all; each attack is tallied in tests/cluster/hostile.py. After the run, nothing it started
is alive on any node, and what distrun itself sends over the key (the preflight's login check,
mpirun's daemons, the sync mode's rsync, which the suite's other runs use) still works. The same
job reads the resource limits its ranks got on each node: the inventory's distrun_unit_limits."""

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
            f.write(f"touch /tmp/bashrc-ran-{tag}\n{kept}")
        said["systemd-run"] = sh(f"XDG_RUNTIME_DIR=/run/user/{os.getuid()} systemd-run --user --collect -- "
                                 f"bash -c 'exec -a escapee-unit-{tag} sleep 600'")
    comm.Barrier()
    if rank == 0:  # from node1 to node2
        said["mesh"] = sh(f"ssh -o BatchMode=yes node2 \"{away('escapee-mesh')}\"")
        said["own-key"] = sh(f"ssh -o BatchMode=yes -o IdentitiesOnly=yes -i /tmp/jobkey-{tag} node2 \"{away('escapee-key')}\"")
        said["login-check"] = sh("ssh -o BatchMode=yes node2 true")
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
        assert not TALLY.record("the cluster key starts a process outside the run on another node",
                                any(mesh.values()) or node1["mesh"]["rc"] == 0), (mesh, node1["mesh"])
        assert "refused" in node1["mesh"]["err"] and "distrun launcher" in node1["mesh"]["err"], node1["mesh"]

        # A key the job wrote into ~/.ssh/authorized_keys logs in nowhere: sshd reads root's file.
        own = _alive(provisioned, f"escapee-key-{tag}")
        assert not TALLY.record("a key the job added to authorized_keys logs in",
                                any(own.values()) or node1["own-key"]["rc"] == 0), (own, node1["own-key"])
        assert "Permission denied" in node1["own-key"]["err"], node1["own-key"]

        # The login shell never ran the ~/.bashrc the job wrote before the key's forced command.
        ran = provisioned.exec(2, f"test -e /tmp/bashrc-ran-{tag}", check=False).returncode == 0
        assert not TALLY.record("the login shell runs a startup file the job wrote", ran)

        # No systemd user manager to start a unit outside the run's.
        unit = _alive(provisioned, f"escapee-unit-{tag}")
        assert not TALLY.record("systemd-run --user starts a unit outside the run",
                                any(unit.values()) or node2["systemd-run"]["rc"] == 0), (unit, node2["systemd-run"])
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"pkill -f -- '[e]scapee-[a-z]*-{tag}' ; "
                                f"rm -f /tmp/bashrc-ran-{tag} /tmp/jobkey-{tag} /tmp/jobkey-{tag}.pub; "
                                f"sed -i '/{tag}/d' {HOME}/.bashrc; sed -i '/job@away/d' {HOME}/.ssh/authorized_keys; "
                                f"runuser -u distrun -- env XDG_RUNTIME_DIR=/run/user/$(id -u distrun) "
                                f"systemctl --user stop 'run-*' 2>/dev/null; true", check=False)
