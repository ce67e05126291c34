"""What a run needs on its nodes, judged once: the same line for 'distrun check' and 'distrun train'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from distrun.inventory.cluster import cluster_from_json
from distrun.planning.needs import preflight_needs
from distrun.preflight.judge import verdict
from distrun.preflight.report import build_report, refusal
from distrun.transport import nodeprog

from .plans import plan_for
from .probe_text import probe_text
from .test_check import NODES, SETUP
from .test_check import probe as full_probe

PROBE = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files" / "probe.py"
OK_STATES = {h: {"state": "ok", "error": ""} for h in NODES}


def failed(*bad: str) -> dict:
    """Ansible's host states: the hosts whose assertion failed."""
    return {h: {"state": "failed" if h in bad else "ok", "error": "assertion failed" if h in bad else ""} for h in NODES}


def probe(host: str, **over) -> dict:
    """What the fast preflight of 'distrun train' probes (no probe file in the shared folder)."""
    p = full_probe(host, **over)
    p.pop("shared_probe", None)
    p.pop("synced", None)
    return p


def judge(probes: dict, hosts: dict, mode: str = "sync") -> str:
    judged = verdict(probes, head="node1", shared_mode=mode, shared_dir="/srv/distrun", setup=SETUP,
                     log_dir="/runs/R1/ansible")
    return refusal(build_report(nodes=NODES, hosts=hosts, judged=judged))


def cluster():
    hosts = {h: {"ansible_host": f"10.0.0.{i}", "slots": 1} for i, h in enumerate(NODES, 1)}
    inv = {"_meta": {"hostvars": hosts}, "all": {"children": ["head", "workers"]},
           "head": {"hosts": ["node1"]}, "workers": {"hosts": NODES}}
    return cluster_from_json(Path("/inv/hosts.yml"), inv, None)


def test_torchrun_needs_torchrun_in_the_env_and_ddp_needs_torch():
    needs = preflight_needs(plan_for(cluster(), run_id="r", launcher="torchrun", workload="ddp"))
    assert needs["preflight_programs"] == {"torchrun": ["/opt/distrun/venv/bin/torchrun"]}
    assert needs["preflight_modules"] == ["torch"]


def test_mpirun_needs_mpirun_on_the_head_and_its_daemon_everywhere_and_gcn_needs_jittor_and_metis():
    needs = preflight_needs(plan_for(cluster(), run_id="r", launcher="mpirun", workload="gcn"))
    assert list(needs["preflight_head_programs"]) == ["mpirun"]
    # Its daemons on the other nodes start through the relay setup installs there.
    assert needs["preflight_programs"] == {"orted": ["/usr/bin/orted", "/usr/bin/prted"],
                                           "distrun relay": [nodeprog.installed("relay")]}
    assert needs["preflight_modules"] == ["jittor", "pymetis"]


def test_a_node_set_up_by_another_distrun_is_told_to_run_setup_for_the_relay():
    missing = {"distrun relay": {"ok": False, "detail": "not in /usr/local/lib/distrun"}}
    probes = {h: probe(h) for h in NODES}
    probes["node2"] = probe("node2", needs=missing)
    line = judge(probes, failed("node2"))
    assert line == f"needs: distrun relay is not in /usr/local/lib/distrun on node2: run '{SETUP}'"


def test_a_missing_program_on_every_node_is_one_line_naming_them_all_with_the_fix():
    missing = {"torchrun": {"ok": False, "detail": "not in /opt/distrun/venv/bin"}}
    line = judge({h: probe(h, needs=missing) for h in NODES}, failed(*NODES))
    assert line == ("needs: torchrun is not in /opt/distrun/venv/bin on node1, node2, node3: add torch to the env's "
                    f"packages (mpi_env_packages) and run '{SETUP}'")


def test_a_node_never_set_up_is_named_with_distrun_setup_and_nothing_else():
    probes = {h: probe(h) for h in NODES}
    probes["node2"] = {"host": "node2", "setup": {"ok": False, "detail": "distrun never set up node2: no user distrun"}}
    # The others cannot ssh to it as the training user either: that is the same cause, not news.
    for h in ("node1", "node3"):
        probes[h]["ssh"]["node2"] = {"ok": False, "detail": "distrun@node2: Permission denied (publickey,password)."}
    line = judge(probes, failed("node2"))
    assert line == f"setup: distrun never set up node2: no user distrun on node2: run '{SETUP}'"


def test_a_probe_that_broke_names_the_node_the_step_and_the_log_without_python_text():
    probes = {h: probe(h) for h in NODES}
    probes["node3"] = {"host": "node3", "probe_error": {"step": "needs"}}
    line = judge(probes, failed("node3"))
    assert line == "preflight: the probe failed at step 'needs' on node3: its full log is in /runs/R1/ansible"


def test_an_unmounted_shared_folder_is_refused_before_writability():
    probes = {h: probe(h) for h in NODES}
    probes["node3"]["shared_mount"] = {"ok": False, "detail": "/srv/distrun is not mounted (expected fuse.sshfs)"}
    line = judge(probes, failed("node3"), mode="sshfs")
    assert line == (f"shared folder: /srv/distrun is not mounted (expected fuse.sshfs) on node3: run '{SETUP} --tags shared_fs'")


def test_a_node_resolving_the_head_wrongly_is_refused_with_checks_words():
    probes = {h: probe(h, names={"node1": "10.0.0.1"}) for h in NODES}
    probes["node3"]["names"] = {"node1": "10.9.9.9"}
    line = judge(probes, failed("node3"))
    assert line.startswith("names: node3 resolves node1 to 10.9.9.9 but node1,node2 to 10.0.0.1 on node3: ")
    assert "correct /etc/hosts or DNS on node3" in line


def test_a_stray_extra_address_for_the_head_is_refused_even_behind_the_right_one():
    # The probe reports every address a name has (/etc/host.conf "multi on" keeps them all); the
    # right address may be sorted first on that node while another program takes the stray one.
    probes = {h: probe(h, names={"node1": "10.0.0.1"}) for h in NODES}
    probes["node3"]["names"] = {"node1": "10.9.9.9,10.0.0.1"}
    line = judge(probes, failed("node3"))
    assert line.startswith("names: node3 resolves node1 to 10.9.9.9,10.0.0.1 but node1,node2 to 10.0.0.1 on node3: ")


def run_probe(user: str, prefix: str) -> dict:
    cfg = {"host": "here", "user": user, "env_prefix": prefix, "mpi_prefix": "/usr", "shared_dir": "/tmp"}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps(cfg)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_probe_says_a_host_was_never_set_up_instead_of_a_traceback():
    found = run_probe("no-such-user-distrun", "/opt/distrun/venv")
    assert found["setup"] == {"ok": False, "detail": "distrun never set up here: no user no-such-user-distrun"}


def test_the_probe_says_a_host_without_the_env_was_never_set_up(tmp_path):
    found = run_probe("root", str(tmp_path / "venv"))
    assert found["setup"]["detail"] == f"distrun never set up here: no env {tmp_path / 'venv'}"


def test_the_probe_reports_a_program_missing_from_the_env_and_a_present_module(tmp_path):
    cfg = {"host": "here", "user": "root", "env_prefix": sys.prefix, "mpi_prefix": "/usr", "shared_dir": str(tmp_path),
           "modules": ["json", "no_such_module_x"], "programs": {"torchrun": [f"{tmp_path}/bin/torchrun"]},
           "mount_fstypes": ["fuse.sshfs"]}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps(cfg)], capture_output=True, text=True,
                         timeout=120)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["needs"]["module json"]["ok"]
    assert found["needs"]["module no_such_module_x"] == {"ok": False, "detail": f"not in {sys.prefix}"}
    assert found["needs"]["torchrun"] == {"ok": False, "detail": f"not in {tmp_path}/bin"}
    assert found["shared_mount"] == {"ok": False, "detail": f"{tmp_path} is not mounted (expected fuse.sshfs)"}
