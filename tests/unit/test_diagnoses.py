"""The run summary's hints, matched against what Open MPI 4.1 and torchrun really print (captures: data/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distrun.run.diagnosis import diagnose

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
    # ssh as a user whose key the node does not accept
    ("ssh-permission-denied.txt", "the training user cannot ssh between nodes: run 'distrun setup --tags ssh_mesh'"),
    # ssh with strict checking and a known_hosts that lacks the node
    ("host-key-unknown.txt", "a node's host key is not in known_hosts (a node was rebuilt?): "
                             "run 'distrun setup --tags ssh_mesh'"),
    # more ranks than the hostfile's slots
    ("not-enough-slots.txt", "more ranks than slots: lower --np or raise 'slots' in the inventory"),
    # a rank's script imports a package the env lacks
    ("module-not-found.txt", "a Python package is missing in the env on a node: add it to mpi_env_packages and "
                             "run 'distrun setup'"),
    # a trainer told to expect another number of ranks than mpirun started
    ("part-count-differs.txt", "the partition's part count differs from the number of ranks: 'distrun train' "
                               "partitions for each --np; by hand, partition again with --num-parts equal to the rank "
                               "count ('distrun partition --np N')"),
    # a node's relay refused to take the daemon: its listener was not in the run's unit
    ("relay-refused.txt", "mpirun's daemon could not join the run's unit on a node (its relay did not start "
                          "there, or another process of the training account holds its name): that node's "
                          "launcher-<node>.log in the attempt's folder says which; run 'distrun check'"),
    # the node's sshd ran the cluster key's forced command, which refused a daemon started another way
    ("mesh-key-refused.txt", "node2 refused what mpirun sent over the cluster's ssh key, which runs distrun's own "
                             "transfers and daemons only: drop the --launcher-args or Open MPI setting that changes "
                             "how mpirun starts its daemons; after installing another distrun, run 'distrun setup'"),
    # the remote shell failed without a word of its own
    ("daemon-did-not-start.txt", "Open MPI could not start its daemon on a node (ssh, the env or /tmp there): "
                                 "run 'distrun check'"),
])
def test_each_real_open_mpi_failure_gets_its_own_hint(capture, hint):
    assert diagnose((DATA / capture).read_text()) == [hint]


@pytest.mark.parametrize(("capture", "hint"), [
    # two nodes expected, only one joined before the join timeout
    ("rendezvous-timeout.txt", "not every node joined the torchrun rendezvous: check 'distrun check' "
                               "(ports, firewall, interface)"),
    # a rendezvous endpoint nobody answers on
    ("rendezvous-connection-failed.txt", "nodes cannot reach the rendezvous on the head: check the port and the "
                                         "network interface ('distrun check')"),
])
def test_each_real_torchrun_failure_gets_its_own_hint(capture, hint):
    assert diagnose((DATA.parent / "torchrun" / capture).read_text()) == [hint]


def test_a_slurm_task_that_cannot_start_in_an_sshfs_folder_names_the_node_and_allow_other():
    text = (DATA.parent / "slurm" / "task-launch-failed.txt").read_text()
    assert diagnose(text) == [
        "Slurm cannot start tasks in the shared folder on node2 (an sshfs mount without allow_other refuses "
        "slurmstepd): set shared_fs_sshfs_allow_other: true (the default) and run 'distrun setup --tags shared_fs'"]


def test_a_daemon_that_did_not_start_for_another_reason_gets_the_general_hint():
    text = (DATA / "host-does-not-resolve.txt").read_text().replace("ssh: Could not resolve hostname nosuchhost-zz", "")
    assert diagnose(text) == ["Open MPI could not start its daemon on a node (ssh, the env or /tmp there): run 'distrun check'"]


def test_a_clean_log_gets_no_hint():
    assert diagnose("epoch 1/3 loss 0.5\nDISTRUN_RESULT {}\n") == []
