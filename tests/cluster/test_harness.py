"""The podman test cluster behaves like the small real cluster the roles are written for."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import session_cluster_name
from tests.harness import podcluster

Cluster = podcluster.Cluster


def _podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], text=True, capture_output=True, check=False)


def test_three_nodes_come_up_with_inventory(cluster3: Cluster) -> None:
    states = {cname: state for cname, state, _ in podcluster.status(cluster3.name)}
    assert states == {f"{cluster3.name}-node{k}": "running" for k in (1, 2, 3)}

    inv = yaml.safe_load(cluster3.inventory.read_text())["all"]
    assert list(inv["children"]["head"]["hosts"]) == ["node1"]
    assert list(inv["children"]["workers"]["hosts"]) == ["node1", "node2", "node3"]
    for k in (1, 2, 3):
        host = inv["hosts"][f"node{k}"]
        assert host["ansible_host"] == cluster3.ip(k)
        assert host["slots"] == 1
    assert "StrictHostKeyChecking=yes" in inv["vars"]["ansible_ssh_common_args"]
    assert inv["vars"]["ansible_python_interpreter"] == "/usr/bin/python3"


def test_each_node_has_its_own_host_keys(cluster3: Cluster) -> None:
    prints = [cluster3.exec(k, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
              for k in (1, 2, 3)]
    assert len(set(prints)) == 3, prints


def test_ssh_checks_host_keys_and_works(cluster3: Cluster, tmp_path: Path) -> None:
    for k in (1, 2, 3):
        assert cluster3.ssh(k, "hostname").stdout.strip() == f"node{k}"
    # The same connection with an empty known_hosts must be refused: proves the checked
    # known_hosts, not a silently ignored one, is what made the calls above work.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    opts = [o.replace(str(cluster3.known_hosts), str(empty)) for o in cluster3.ssh_options()]
    refused = subprocess.run(["ssh", *opts, f"root@{cluster3.ip(1)}", "true"],
                             text=True, capture_output=True, timeout=30, check=False)
    assert refused.returncode != 0
    assert "Host key verification failed" in refused.stderr


def test_ansible_reaches_every_node_through_the_inventory(cluster3: Cluster) -> None:
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
           "ANSIBLE_HOST_KEY_CHECKING": "True"}
    res = subprocess.run([str(venv_bin / "ansible"), "-i", str(cluster3.inventory), "all",
                          "-m", "ansible.builtin.command", "-a", "hostname"],
                         text=True, capture_output=True, env=env, timeout=180, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    for k in (1, 2, 3):
        assert f"node{k} | CHANGED | rc=0 >>\nnode{k}" in res.stdout


def test_nodes_resolve_and_reach_each_other_by_name(provisioned: Cluster) -> None:
    """Each node's /etc/hosts is its own (podman leaves it alone): the harness writes it as
    Debian's installer does (the node's own hostname on 127.0.1.1), role base adds every node's
    address; both survive a restart of the node."""
    for src in (1, 2, 3):
        hosts = provisioned.exec(src, "cat /etc/hosts").stdout
        assert f"127.0.1.1\tnode{src}\n" in hosts, hosts
        for dst in (1, 2, 3):
            resolved = provisioned.exec(src, f"getent ahostsv4 node{dst}").stdout.split()
            assert provisioned.ip(dst) in resolved, (src, dst, resolved)
            if src != dst:
                assert "127.0.1.1" not in resolved, (src, dst, resolved)
        provisioned.exec(src, f"ping -c1 -W3 node{src % 3 + 1}")


def test_systemd_is_pid1_and_system_is_up(cluster3: Cluster) -> None:
    for k in (1, 2, 3):
        assert cluster3.exec(k, "cat /proc/1/comm").stdout.strip() == "systemd"
        state = cluster3.exec(k, "systemctl is-system-running --wait", check=False, timeout=120)
        failed = cluster3.exec(k, "systemctl --failed --no-legend --plain").stdout
        assert state.stdout.strip() in ("running", "degraded"), failed
        cluster3.exec(k, "systemctl is-active ssh.service ssh-hostkeys.service dbus.service")


def test_sshfs_mount_between_nodes_works(cluster3: Cluster) -> None:
    # The shared_fs role's sshfs mode needs FUSE in the nodes (this kernel has no NFS).
    # Node-to-node trust is the ssh_mesh role's job; here a throwaway key stands in for it.
    cluster3.exec(1, "rm -f /root/.ssh/fuse_test && "
                     "ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/fuse_test")
    pub = cluster3.exec(1, "cat /root/.ssh/fuse_test.pub").stdout
    cluster3.exec(2, "cat >> /root/.ssh/authorized_keys", input=pub)
    cluster3.exec(2, "mkdir -p /srv/fuse-test && echo from-node2 > /srv/fuse-test/f")
    try:
        cluster3.exec(1, "mkdir -p /mnt/fuse-test && sshfs -o IdentityFile=/root/.ssh/fuse_test "
                         "-o UserKnownHostsFile=/root/.ssh/fuse_test_known_hosts "
                         "-o StrictHostKeyChecking=accept-new root@node2:/srv/fuse-test "
                         "/mnt/fuse-test")
        assert cluster3.exec(1, "cat /mnt/fuse-test/f").stdout == "from-node2\n"
        cluster3.exec(1, "echo from-node1 > /mnt/fuse-test/g")
        assert cluster3.exec(2, "cat /srv/fuse-test/g").stdout == "from-node1\n"
    finally:
        cluster3.exec(1, "fusermount3 -u /mnt/fuse-test; rm -f /root/.ssh/fuse_test*",
                      check=False)
        cluster3.exec(2, f"grep -vF {pub.split()[1]!r} /root/.ssh/authorized_keys > /tmp/ak; "
                         "cat /tmp/ak > /root/.ssh/authorized_keys; rm -rf /srv/fuse-test",
                      check=False)


def test_second_image_build_is_a_cache_hit(cluster3: Cluster,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rebuild(*_: object) -> None:
        raise AssertionError("build_image() ran mmdebstrap although the image was cached")

    monkeypatch.setattr(podcluster, "_run_mmdebstrap", no_rebuild)
    result = podcluster.build_image(log=lambda _msg: None)
    assert result.built is False
    assert result.ref == cluster3.image


def test_wheelhouse_is_mounted_read_only(cluster_factory, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "marker-0.1-py3-none-any.whl").write_text("not a real wheel\n")
    c = cluster_factory(1, name="wheels", wheelhouse=wheels)
    assert c.exec(1, "ls /opt/wheelhouse").stdout.split() == ["marker-0.1-py3-none-any.whl"]
    assert c.exec(1, "touch /opt/wheelhouse/x", check=False).returncode != 0


def test_host_wheelhouse_reaches_cluster3(cluster3: Cluster) -> None:
    host = Path("/opt/wheels")
    if not host.is_dir():
        pytest.skip("this host has no /opt/wheels wheelhouse")
    assert cluster3.exec(1, "ls /opt/wheelhouse").stdout.split() == sorted(
        p.name for p in host.iterdir())


def test_stopped_node_comes_back_with_same_host_key_and_hosts_file(cluster_factory) -> None:
    c = cluster_factory(2, name="restart", wheelhouse=None)
    before = c.exec(2, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout
    # What role base writes into /etc/hosts must outlive a restart, as on a machine.
    c.exec(2, f"echo '{c.ip(1)} node1' >> /etc/hosts")
    hosts = c.exec(2, "cat /etc/hosts").stdout
    c.stop_node(2)
    assert c.ssh(2, "true", check=False, timeout=30).returncode != 0
    assert c.ssh(1, "true").returncode == 0  # the other node is unaffected
    c.start_node(2)
    assert c.exec(2, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout == before
    assert c.exec(2, "cat /etc/hosts").stdout == hosts
    assert c.exec(2, "getent hosts node1").stdout.split()[0] == c.ip(1)
    assert c.ssh(2, "hostname").stdout.strip() == "node2"
    c.kill_node(2)
    assert dict((n, s) for n, s, _ in podcluster.status(c.name))[c.node(2).container] != "running"


def test_up_removes_leftovers_and_down_leaves_nothing(cluster_factory, tmp_path: Path) -> None:
    name = f"{session_cluster_name()}-leftover"
    # What a dead earlier session leaves: a network and a container holding node1's name.
    image = podcluster.build_image(log=lambda _m: None).ref
    assert _podman("network", "create", f"{name}-net").returncode == 0
    assert _podman("create", "--name", f"{name}-node1", "--network", f"{name}-net",
                   image).returncode == 0
    c = cluster_factory(1, name="leftover", wheelhouse=None, inventory=tmp_path / "hosts.yml")
    assert c.ssh(1, "hostname").stdout.strip() == "node1"

    podcluster.down(name)
    assert podcluster.status(name) == []
    names = _podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert not [n for n in names if n.startswith(f"{name}-")]
    assert _podman("network", "exists", f"{name}-net").returncode != 0


def test_containers_conf_merge_keeps_other_settings(tmp_path: Path) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\nlog_size_max = 100\ndefault_ulimits = [\n  "nofile=1:1",\n]\n'
                    '\n[network]\ndns_bind_port = 53\n')
    podcluster._apply_containers_conf(
        {("containers", "default_ulimits"): ["nofile=20000:20000"],
         ("engine", "runtime"): "runc"}, conf)
    data = tomllib.loads(conf.read_text())
    assert data == {"containers": {"log_size_max": 100, "default_ulimits": ["nofile=20000:20000"]},
                    "network": {"dns_bind_port": 53}, "engine": {"runtime": "runc"}}
    assert (tmp_path / "containers.conf.distrun-orig").exists()


def test_image_sources_follow_the_host_mirror(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb-src\nURIs: http://src.example/debian\n"
        "Suites: bookworm\nComponents: main\n")
    monkeypatch.delenv("DISTRUN_DEBIAN_MIRROR", raising=False)
    assert podcluster.debian_sources(tmp_path) == [
        "deb http://mirror.example/debian bookworm main",
        "deb http://mirror.example/debian bookworm-updates main"]
    monkeypatch.setenv("DISTRUN_DEBIAN_MIRROR", "http://other.example/debian")
    assert podcluster.debian_sources(tmp_path)[0] == "deb http://other.example/debian bookworm main"
