"""The run summary's hints, matched against what Open MPI 4.1 really prints (captured from mpirun)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distrun.diagnosis import diagnose

DATA = Path(__file__).parent / "data" / "openmpi"


@pytest.mark.parametrize(("capture", "hint"), [
    # mpirun -n 1 /nonexistent: a rank's program that a node cannot see (an unmounted shared folder)
    ("cannot-execute.txt", "vm cannot run /nonexistent: is the shared folder mounted there? 'distrun check' names it; "
                           "fix: run 'distrun setup --tags shared_fs'"),
    # a remote shell without Open MPI on its PATH
    ("orted-not-found.txt", "remote nodes cannot find Open MPI: run 'distrun setup' so every node has the env, "
                            "and keep mpirun's --prefix"),
    # a hostfile name the head cannot resolve
    ("host-does-not-resolve.txt", "the head cannot resolve nosuchhost-zz: correct /etc/hosts or DNS "
                                  "(role base manages /etc/hosts: 'distrun setup --tags base')"),
    # two ranks with no transport between them
    ("ranks-cannot-reach.txt", "two ranks cannot reach each other over MPI: a firewall or a wrong interface between "
                               "nodes; run 'distrun check'"),
])
def test_each_real_open_mpi_failure_gets_its_own_hint(capture, hint):
    assert diagnose((DATA / capture).read_text()) == [hint]


def test_a_daemon_that_did_not_start_for_another_reason_gets_the_general_hint():
    text = (DATA / "host-does-not-resolve.txt").read_text().replace("ssh: Could not resolve hostname nosuchhost-zz", "")
    assert diagnose(text) == ["Open MPI could not start its daemon on a node (ssh, the env or /tmp there): run 'distrun check'"]


def test_a_clean_log_gets_no_hint():
    assert diagnose("epoch 1/3 loss 0.5\nDISTRUN_RESULT {}\n") == []
