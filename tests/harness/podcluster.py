#!/usr/bin/env python3
"""N-node podman test cluster: the hosts every cluster test and playbook run talks to.

Each node is a rootful podman container with systemd as PID 1, its own SSH host keys and
root's authorized_keys set to a per-cluster admin key, on a dedicated podman bridge network
where nodes resolve each other as ``node1..nodeN``. ``up()`` writes an Ansible inventory that
reaches the nodes over real SSH with host-key checking on.

Library use::

    from tests.harness import podcluster
    with podcluster.up(3, wheelhouse=Path("/opt/wheels")) as cluster:
        cluster.exec(1, "systemctl is-system-running")

CLI use (from the repo root, with the venv's python)::

    .venv/bin/python tests/harness/podcluster.py image
    .venv/bin/python tests/harness/podcluster.py up -n 3      # writes inventory/test/hosts.yml
    .venv/bin/python tests/harness/podcluster.py status
    .venv/bin/python tests/harness/podcluster.py down
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache"
DEFAULT_INVENTORY = REPO_ROOT / "inventory" / "test" / "hosts.yml"
DEFAULT_NAME = "distrun-test"
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
IMAGE_REPO = "localhost/distrun-node"
LABEL = "distrun.cluster"
INSTALL_HINT = "apt-get install podman runc mmdebstrap (or run tests/harness/install-host-deps)"

# Bump when the build procedure changes in a way the other recipe inputs do not capture.
RECIPE_VERSION = "2"
# CAs the host trusts beyond Debian's bundle (a TLS-intercepting proxy on the way to PyPI, a
# site CA). Nodes must trust them too, as a site's own base image would; their bytes are part
# of the recipe digest.
HOST_EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
SUITE = "bookworm"
PACKAGES: tuple[str, ...] = (
    "openssh-server", "openssh-client", "python3", "sudo", "iproute2", "rsync",
    "systemd", "systemd-sysv", "dbus", "ca-certificates", "procps", "less",
    # sshfs is the shared-folder fallback where the kernel has no NFS (see testbed.md).
    "fuse3", "sshfs",
    # Ansible's apt module installs python3-apt itself when missing; baking it in saves
    # that step in every role test.
    "python3-apt",
    # Tests and verify playbooks check node-to-node reachability by name with ping.
    "iputils-ping",
)

# Runs on the host with $1 = the rootfs (mmdebstrap --customize-hook). Its text is part of
# the image digest, so editing it rebuilds the image.
CUSTOMIZE_SCRIPT = r"""#!/bin/sh
set -eu
root="$1"
# Host keys baked into the image would be shared by every container (and by every cluster
# built from this image): remove them and let each container make its own at first boot.
rm -f "$root"/etc/ssh/ssh_host_*
cat > "$root/etc/systemd/system/ssh-hostkeys.service" <<'EOF'
[Unit]
Description=Generate this container's own SSH host keys
Before=ssh.service
[Service]
Type=oneshot
# -A only creates the key types that are missing, so a restarted container keeps its keys.
ExecStart=/usr/bin/ssh-keygen -A
RemainAfterExit=yes
[Install]
WantedBy=ssh.service
EOF
mkdir -p "$root/etc/systemd/system/ssh.service.wants"
ln -sf ../ssh-hostkeys.service "$root/etc/systemd/system/ssh.service.wants/ssh-hostkeys.service"
# An empty machine-id makes systemd create a distinct one per container at boot.
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
# The host's extra CAs ($2 holds copies of them), so pip and apt on the nodes trust what the host trusts.
if [ -n "${2:-}" ] && ls "$2"/*.crt >/dev/null 2>&1; then
    mkdir -p "$root/usr/local/share/ca-certificates/host"
    cp "$2"/*.crt "$root/usr/local/share/ca-certificates/host/"
    chroot "$root" update-ca-certificates >/dev/null
fi
# dpkg as in Debian's own slim container images: no fsync per file, no manuals, docs or
# translations. Every role test installs packages on fresh nodes; on 2 cores this is most of it.
cat > "$root/etc/dpkg/dpkg.cfg.d/01-distrun-test-node" <<'EOF'
force-unsafe-io
path-exclude=/usr/share/man/*
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
EOF
# Units that only make sense on real hardware or a console; in a container they fail and
# leave systemd "degraded", hiding failures of the units under test.
for unit in getty@tty1.service console-getty.service systemd-remount-fs.service \
            sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
"""

# Errors podman prints when the host needs containers.conf settings (see
# ../shared/docs/testbed.md beside the repository). Each maps to the settings that fix it.
_RLIMIT_ERRORS = re.compile(r"setrlimit RLIMIT_NOFILE|error setting rlimit|RLIMIT_NPROC")
_CGROUP_ERRORS = re.compile(
    r"cgroups in hybrid mode|systemd cgroup flag passed|sd-bus call|Failed to connect to bus")

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class HarnessError(RuntimeError):
    """A failure the user can fix; the message is one line naming what failed and the fix."""


# --------------------------------------------------------------------------- processes

def _run(cmd: Sequence[str], *, check: bool = True, input: str | None = None,
         timeout: float | None = 300, what: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(cmd), input=input, text=True, capture_output=True,
                              timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise HarnessError(f"{cmd[0]} is not installed: {INSTALL_HINT}") from exc
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what or shlex.join(cmd)} timed out after {timeout:.0f}s") from exc
    if check and proc.returncode != 0:
        raise HarnessError(f"{what or shlex.join(cmd)} failed (rc {proc.returncode}): "
                           f"{_last_line(proc.stderr or proc.stdout)}")
    return proc


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def _podman(*args: str, check: bool = True, input: str | None = None,
            timeout: float | None = 300) -> subprocess.CompletedProcess[str]:
    return _run(["podman", *args], check=check, input=input, timeout=timeout,
                what=f"podman {args[0]}")


# --------------------------------------------------------------------------- ensure_podman

def _set_toml_key(text: str, table: str, key: str, literal: str) -> str:
    """Set ``key = literal`` in ``[table]`` of a TOML text, keeping every other line.

    Only single-level tables are handled, which is all containers.conf uses for these keys.
    """
    lines = text.splitlines()
    header = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-]+)\s*\]\s*(#.*)?$")
    start: int | None = None
    end = len(lines)
    for i, line in enumerate(lines):
        m = header.match(line)
        is_header = bool(m) or line.lstrip().startswith("[[")
        if start is not None and is_header:
            end = i
            break
        if m and m.group(1) == table:
            start = i
    new_line = f"{key} = {literal}"
    if start is None:
        tail = ["", f"[{table}]", new_line] if lines else [f"[{table}]", new_line]
        return "\n".join(lines + tail) + "\n"
    key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for i in range(start + 1, end):
        if key_re.match(lines[i]):
            # A multi-line array value continues until its brackets balance.
            j = i
            depth = _bracket_depth(lines[i].split("=", 1)[1])
            while depth > 0 and j + 1 < end:
                j += 1
                depth += _bracket_depth(lines[j])
            return "\n".join(lines[:i] + [new_line] + lines[j + 1:]) + "\n"
    return "\n".join(lines[:start + 1] + [new_line] + lines[start + 1:]) + "\n"


def _bracket_depth(fragment: str) -> int:
    unquoted = re.sub(r'"[^"]*"|\'[^\']*\'|#.*$', "", fragment)
    return unquoted.count("[") - unquoted.count("]")


def _rlimit_settings() -> dict[tuple[str, str], Any]:
    # Podman asks for nofile 1048576; without CAP_SYS_RESOURCE a container cannot go above
    # the host's hard limit, so ask for exactly that.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    return {("containers", "default_ulimits"): [f"nofile={nofile}:{nofile}",
                                                f"nproc={nproc}:{nproc}"]}


_CGROUP_SETTINGS: dict[tuple[str, str], Any] = {
    ("engine", "runtime"): "runc",
    ("engine", "cgroup_manager"): "cgroupfs",
    ("engine", "events_logger"): "file",
}


def _apply_containers_conf(settings: dict[tuple[str, str], Any], conf: Path) -> None:
    text = conf.read_text() if conf.exists() else ""
    backup = conf.with_name(conf.name + ".distrun-orig")
    if conf.exists() and not backup.exists():
        shutil.copy2(conf, backup)
    for (table, key), value in settings.items():
        text = _set_toml_key(text, table, key, json.dumps(value))
    parsed = tomllib.loads(text)  # refuse to write a file podman could not read
    for (table, key), value in settings.items():
        if parsed.get(table, {}).get(key) != value:
            raise HarnessError(f"could not set [{table}] {key} in {conf}: edit it by hand")
    conf.parent.mkdir(parents=True, exist_ok=True)
    tmp = conf.with_name(conf.name + ".distrun-tmp")
    tmp.write_text(text)
    tmp.replace(conf)


def _probe_rootfs() -> Path:
    """A rootfs holding only /bin/true and its libraries: lets us test `podman run` before
    any image exists (there is no registry to pull one from)."""
    root = CACHE_DIR / "podman-probe"
    true = Path(shutil.which("true") or "/bin/true").resolve()
    if (root / "bin" / "true").exists():
        return root
    (root / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(true, root / "bin" / "true")
    ldd = _run(["ldd", str(true)], check=False).stdout
    for lib in re.findall(r"(/\S+)", ldd):
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)
    return root


def ensure_podman(log: Log = _stderr, conf: Path = CONTAINERS_CONF) -> None:
    """Make sure rootful podman can run a container here, applying the known host settings
    (testbed.md) only when podman fails with the errors they fix."""
    if shutil.which("podman") is None:
        raise HarnessError(f"podman is not installed: {INSTALL_HINT}")
    applied: set[str] = set()
    busy_tries = 2  # a host busy with another cluster's setup can be slow or briefly refuse
    for _ in range(3 + busy_tries):
        try:
            proc = _podman("run", "--rm", "--network", "none", "--rootfs", str(_probe_rootfs()),
                           "/bin/true", check=False, timeout=300)
        except HarnessError:
            if busy_tries == 0:
                raise
            busy_tries -= 1
            continue
        if proc.returncode == 0:
            return
        err = proc.stderr + proc.stdout
        if _RLIMIT_ERRORS.search(err) and "rlimit" not in applied:
            settings = _rlimit_settings()
            applied.add("rlimit")
            why = "podman could not raise RLIMIT_NOFILE above this host's hard limit"
        elif _CGROUP_ERRORS.search(err) and "cgroup" not in applied:
            settings = _CGROUP_SETTINGS
            applied.add("cgroup")
            why = "this host's cgroup setup (hybrid v1/v2) needs runc with cgroupfs"
        elif busy_tries > 0:
            busy_tries -= 1
            log(f"podcluster: podman could not run its probe container ({_last_line(err)}); trying again")
            time.sleep(10)
            continue
        else:
            raise HarnessError(f"podman cannot run a container: {_last_line(err)} "
                               f"(see ../shared/docs/testbed.md, beside the repository, for known host settings)")
        _apply_containers_conf(settings, conf)
        shown = ", ".join(f"[{t}] {k} = {json.dumps(v)}" for (t, k), v in settings.items())
        log(f"podcluster: wrote {shown} to {conf} because {why}")
    raise HarnessError(f"podman still cannot run a container after editing {conf}")


# --------------------------------------------------------------------------- image

@dataclass(frozen=True)
class ImageResult:
    ref: str          # localhost/distrun-node:<digest12>
    digest: str       # sha256 of the recipe
    built: bool       # False when the digest tag already existed (cache hit)
    seconds: float


def _parse_deb822(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
        elif line[0].isspace() and last:
            current[last] += " " + line.strip()
        elif ":" in line:
            last, value = (s.strip() for s in line.split(":", 1))
            current[last] = value
    if current:
        stanzas.append(current)
    return stanzas


def debian_sources(etc_apt: Path = Path("/etc/apt")) -> list[str]:
    """One-line apt sources for the image, taken from the host's mirror configuration.

    DISTRUN_DEBIAN_MIRROR=<url> overrides them with <url> bookworm + bookworm-updates.
    """
    override = os.environ.get("DISTRUN_DEBIAN_MIRROR")
    if override:
        return [f"deb {override} {SUITE} main", f"deb {override} {SUITE}-updates main"]
    lines: list[str] = []
    files = sorted((etc_apt / "sources.list.d").glob("*.sources"))
    for f in files:
        for st in _parse_deb822(f.read_text()):
            if "deb" not in st.get("Types", "").split() or st.get("Enabled", "yes") == "no":
                continue
            for uri in st.get("URIs", "").split():
                for suite in st.get("Suites", "").split():
                    if suite.split("-")[0] == SUITE:
                        lines.append(f"deb {uri} {suite} main")
    one_line = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list"))]
    for f in one_line:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            parts = re.sub(r"\[[^\]]*\]", "", line).split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2].split("-")[0] == SUITE:
                lines.append(f"deb {parts[1]} {parts[2]} main")
    if not any(f" {SUITE} " in ln for ln in lines):
        raise HarnessError(f"no Debian {SUITE} mirror found in {etc_apt}/sources.list(.d): "
                           f"set DISTRUN_DEBIAN_MIRROR=http://<mirror>/debian")
    return list(dict.fromkeys(lines))


def host_extra_cas(ca_dir: Path = HOST_EXTRA_CA_DIR) -> dict[str, bytes]:
    """File name -> bytes of every extra CA certificate the host trusts."""
    if not ca_dir.is_dir():
        return {}
    return {f"{i:02d}-{p.name}": p.read_bytes() for i, p in enumerate(sorted(ca_dir.rglob("*.crt")))}


def recipe_digest(sources: Sequence[str], cas: dict[str, bytes] | None = None) -> str:
    ca_digests = {name: hashlib.sha256(data).hexdigest() for name, data in (cas or {}).items()}
    recipe = json.dumps({"version": RECIPE_VERSION, "suite": SUITE, "sources": list(sources),
                         "packages": list(PACKAGES), "customize": CUSTOMIZE_SCRIPT,
                         "cas": ca_digests},
                        sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()


def image_exists(ref: str) -> bool:
    return _podman("image", "exists", ref, check=False).returncode == 0


def _run_mmdebstrap(sources: Sequence[str], tarball: Path, hook: Path, ca_dir: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise HarnessError(f"mmdebstrap is not installed: {INSTALL_HINT}")
    cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar",
           f"--include={','.join(PACKAGES)}",
           # Keep the package lists so roles can apt-get install from a fresh node at once.
           "--skip=cleanup/apt/lists",
           f"--customize-hook=sh {shlex.quote(str(hook))} \"$1\" {shlex.quote(str(ca_dir))}",
           SUITE, str(tarball), *sources]
    _run(cmd, timeout=1800, what="mmdebstrap (building the node rootfs)")


def build_image(force: bool = False, log: Log = _stderr) -> ImageResult:
    """Build (or find cached) the node image ``localhost/distrun-node:<digest12>``."""
    t0 = time.monotonic()
    if shutil.which("podman") is None:
        raise HarnessError(f"podman is not installed: {INSTALL_HINT}")
    sources = debian_sources()
    cas = host_extra_cas()
    digest = recipe_digest(sources, cas)
    ref = f"{IMAGE_REPO}:{digest[:12]}"
    images = CACHE_DIR / "images"
    images.mkdir(parents=True, exist_ok=True)
    # Two test sessions may build at once; the lock makes the second one reuse the first's.
    with open(images / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and image_exists(ref):
            _podman("tag", ref, f"{IMAGE_REPO}:latest")
            dt = time.monotonic() - t0
            log(f"podcluster: image {ref} is cached ({dt:.1f}s)")
            return ImageResult(ref, digest, False, dt)
        with tempfile.TemporaryDirectory(dir=images) as tmp:
            hook = Path(tmp) / "customize.sh"
            hook.write_text(CUSTOMIZE_SCRIPT)
            ca_dir = Path(tmp) / "cas"
            ca_dir.mkdir()
            for name, data in cas.items():
                (ca_dir / name).write_bytes(data)
            tarball = Path(tmp) / "rootfs.tar"
            log(f"podcluster: building {ref} with mmdebstrap from {sources[0].split()[1]}")
            _run_mmdebstrap(sources, tarball, hook, ca_dir)
            t1 = time.monotonic()
            _podman("import", "--change", 'CMD ["/sbin/init"]',
                    "--change", "STOPSIGNAL SIGRTMIN+3",
                    "--change", f"LABEL distrun.recipe={digest}",
                    str(tarball), ref, timeout=600)
            _podman("tag", ref, f"{IMAGE_REPO}:latest")
        dt = time.monotonic() - t0
        log(f"podcluster: built {ref} in {dt:.1f}s (mmdebstrap {t1 - t0:.1f}s, "
            f"import {dt - (t1 - t0):.1f}s)")
        return ImageResult(ref, digest, True, dt)


# --------------------------------------------------------------------------- cluster

@dataclass
class Node:
    index: int
    name: str        # nodeK: hostname, DNS alias on the cluster network, inventory name
    container: str   # <cluster>-nodeK
    ip: str          # on the cluster network: the inventory's ansible_host (management)
    fast_ip: str = ""  # on the second network: internal, no gateway (a fast network beside it)


@dataclass
class Cluster:
    name: str
    network: str
    image: str
    state_dir: Path
    inventory: Path
    nodes: list[Node] = field(default_factory=list)
    # The second network every node has (<cluster>-fast: internal, no gateway), as real nodes
    # have a management network and a fast one; its CIDR is what distrun_network names.
    fast_network: str = ""
    fast_cidr: str = ""

    # -- paths the inventory points at
    @property
    def key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    def ssh_options(self) -> list[str]:
        return ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-i", str(self.key)]

    # -- nodes
    def node(self, k: int) -> Node:
        if not 1 <= k <= len(self.nodes):
            raise HarnessError(f"cluster {self.name} has nodes 1..{len(self.nodes)}, not {k}")
        return self.nodes[k - 1]

    def ip(self, k: int) -> str:
        return self.node(k).ip

    def exec(self, k: int, cmd: str | Sequence[str], check: bool = True,
             input: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in node k through podman (a shell string runs under ``sh -c``)."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        flags = ["-i"] if input is not None else []
        return _run(["podman", "exec", *flags, self.node(k).container, *argv], check=check,
                    input=input, timeout=timeout, what=f"{shlex.join(argv)} on node{k}")

    def netns(self, k: int, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a host program (iptables) in node k's network namespace: a firewall rule on that
        node, set from outside (the nodes have neither the tool nor the capability, as a job on
        a real node would not)."""
        pid = _podman("inspect", "-f", "{{.State.Pid}}", self.node(k).container).stdout.strip()
        return _run(["nsenter", "-t", pid, "-n", *argv], check=check, what=f"{shlex.join(argv)} in node{k}'s network")

    def ssh(self, k: int, cmd: str, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on node k over SSH with the cluster's checked known_hosts."""
        return _run(["ssh", *self.ssh_options(), f"root@{self.ip(k)}", cmd], check=check,
                    timeout=timeout, what=f"ssh root@node{k} {cmd!r}")

    def stop_node(self, k: int, timeout: int = 10) -> None:
        _podman("stop", "-t", str(timeout), self.node(k).container, timeout=timeout + 60)

    def kill_node(self, k: int) -> None:
        _podman("kill", "-s", "KILL", self.node(k).container)

    def start_node(self, k: int, wait_s: float = 90) -> None:
        """Start a stopped node again and wait for its sshd; rewrites the inventory if
        the node came back with another address."""
        node = self.node(k)
        _podman("start", node.container)
        node.ip = _container_ip(node.container, self.network)
        _wait_for_ssh(self, node, wait_s)
        self._write_files()

    def down(self) -> None:
        down(self.name)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- files
    def _write_files(self) -> None:
        self.inventory.parent.mkdir(parents=True, exist_ok=True)
        self.inventory.write_text(render_inventory(self))
        (self.state_dir / "state.json").write_text(json.dumps(
            {**asdict(self), "state_dir": str(self.state_dir),
             "inventory": str(self.inventory)}, indent=2) + "\n")


def state_dir_for(name: str) -> Path:
    return CACHE_DIR / "testcluster" / name


def render_inventory(cluster: Cluster) -> str:
    """The inventory YAML: head = node1, workers = all nodes (the head also runs ranks)."""
    import yaml  # the venv has it (ansible needs it); only the inventory writer needs it

    ssh_args = (f"-o UserKnownHostsFile={cluster.known_hosts} -o StrictHostKeyChecking=yes "
                f"-o ControlMaster=auto -o ControlPersist=60s")
    doc = {"all": {
        "vars": {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(cluster.key),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": ssh_args,
            # Wins over a host_key_checking=False in some ansible.cfg, whose
            # "-o StrictHostKeyChecking=no" would come before ours and take effect.
            "ansible_host_key_checking": True,
        },
        "hosts": {n.name: {"ansible_host": n.ip, "slots": 1} for n in cluster.nodes},
        "children": {
            "head": {"hosts": {cluster.nodes[0].name: None}},
            "workers": {"hosts": {n.name: None for n in cluster.nodes}},
        },
    }}
    header = (f"# Generated by tests/harness/podcluster.py for cluster {cluster.name!r}; "
              f"do not edit (git-ignored).\n# Tear down: .venv/bin/python "
              f"tests/harness/podcluster.py down --name {cluster.name}\n")
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)


def _container_ip(container: str, network: str) -> str:
    fmt = f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}'
    ip = _podman("inspect", "--format", fmt, container).stdout.strip()
    if not ip:
        raise HarnessError(f"container {container} has no address on network {network}")
    return ip


def _wait_for_ssh(cluster: Cluster, node: Node, wait_s: float) -> None:
    """Wait until node's sshd accepts the admin key with host-key checking on.

    The trusted host key comes from inside the container (podman exec), not from the
    network; ssh-keyscan must then return the same key, which catches a wrong address.
    """
    deadline = time.monotonic() + wait_s
    last = "no answer yet"
    host_key = ""
    while time.monotonic() < deadline:
        if not host_key:
            got = cluster.exec(node.index, "cat /etc/ssh/ssh_host_ed25519_key.pub", check=False)
            host_key = " ".join(got.stdout.split()[:2]) if got.returncode == 0 else ""
            if not host_key:
                last = "ssh-hostkeys.service has not created host keys"
                time.sleep(0.5)
                continue
        scan = _run(["ssh-keyscan", "-T", "3", "-t", "ed25519", node.ip], check=False,
                    timeout=30)
        scanned = " ".join(scan.stdout.split()[1:3])
        if not scanned:
            last = f"sshd on {node.ip} not answering ssh-keyscan"
            time.sleep(0.5)
            continue
        if scanned != host_key:
            raise HarnessError(f"{node.ip} presents host key {scanned[:40]}... but {node.container}"
                               f" holds {host_key[:40]}...: another host has that address")
        _update_known_hosts(cluster.known_hosts, node, host_key)
        probe = cluster.ssh(node.index, "true", check=False, timeout=30)
        if probe.returncode == 0:
            return
        last = f"ssh root@{node.ip}: {_last_line(probe.stderr)}"
        time.sleep(0.5)
    raise HarnessError(f"{node.container} ({node.ip}) not reachable by ssh after {wait_s:.0f}s:"
                       f" {last} (check `podman logs {node.container}`)")


def _update_known_hosts(path: Path, node: Node, host_key: str) -> None:
    keep = [ln for ln in (path.read_text().splitlines() if path.exists() else [])
            if ln.split(" ", 1)[0] not in (f"{node.ip},{node.name}", node.ip)]
    path.write_text("\n".join(keep + [f"{node.ip},{node.name} {host_key}"]) + "\n")


def _remove_leftovers(name: str) -> None:
    """Remove what a previous run of cluster `name` left in podman's records: its processes
    are dead when a session ends, but names and networks stay and would block a new run."""
    ids = _podman("ps", "-a", "-q", "--filter", f"label={LABEL}={name}").stdout.split()
    if ids:
        _podman("rm", "-f", "-t", "0", *ids, timeout=300)
    named = [ln for ln in _podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
             if re.fullmatch(rf"{re.escape(name)}-node\d+", ln)]
    if named:
        _podman("rm", "-f", "-t", "0", *named, timeout=300)
    for network in (f"{name}-net", f"{name}-fast"):
        if _podman("network", "exists", network, check=False).returncode == 0:
            _podman("network", "rm", "-f", network)


def _node_mac(ip: ipaddress.IPv4Address) -> str:
    """A locally administered MAC derived from the node's address."""
    return "0a:58:" + ":".join(f"{b:02x}" for b in ip.packed)


def _network_subnet(network: str) -> ipaddress.IPv4Network:
    out = _podman("network", "inspect", network, "--format", "{{range .Subnets}}{{.Subnet}} {{end}}").stdout
    for item in out.split():
        net = ipaddress.ip_network(item, strict=False)
        if isinstance(net, ipaddress.IPv4Network):
            return net
    raise HarnessError(f"podman network {network} has no IPv4 subnet ({out.strip() or 'none'})")


def node_pip_cache() -> Path:
    """The host folder the nodes' pip cache lives in (DISTRUN_TEST_CACHE, else ~/.cache/distrun)."""
    root = Path(os.environ.get("DISTRUN_TEST_CACHE", Path.home() / ".cache" / "distrun"))
    path = root / "node-pip"
    path.mkdir(parents=True, exist_ok=True)
    return path


def up(n: int, name: str = DEFAULT_NAME, wheelhouse: Path | str | None = None,
       inventory: Path | str | None = None, image: str | None = None,
       wait_s: float = 120, log: Log = _stderr,
       volumes: Sequence[tuple[Path | str, str, str]] = (),
       node_images: Sequence[str] = ()) -> Cluster:
    """Start an n-node cluster (removing leftovers of the same name first) and write its
    inventory; on any failure everything started is removed again.

    ``volumes``: more host paths bound into every node, as (host path, node path, "ro"|"rw").
    ``node_images``: one image per node instead of the node image (a snapshot(), below)."""
    if n < 1:
        raise HarnessError(f"a cluster needs at least 1 node, not {n}")
    if node_images and len(node_images) != n:
        raise HarnessError(f"{len(node_images)} node images for {n} nodes")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name):
        raise HarnessError(f"cluster name {name!r}: use lowercase letters, digits, '-', '_', '.'")
    t0 = time.monotonic()
    ensure_podman(log)
    ref = image or build_image(log=log).ref
    wheel_dir = Path(wheelhouse).resolve() if wheelhouse else None
    if wheel_dir is not None and not wheel_dir.is_dir():
        raise HarnessError(f"wheelhouse {wheel_dir} is not a directory")
    binds: list[str] = []
    for host_path, node_path, mode in volumes:
        if mode not in ("ro", "rw"):
            raise HarnessError(f"volume {host_path}: mode {mode!r} is neither 'ro' nor 'rw'")
        if not Path(host_path).exists():
            raise HarnessError(f"volume {host_path}: no such file or directory on this host")
        if "," in f"{host_path}{node_path}" or ":" in f"{host_path}{node_path}":
            raise HarnessError(f"volume {host_path}:{node_path}: podman -v cannot bind a path with ':' or ','")
        binds += ["-v", f"{Path(host_path).resolve()}:{node_path}:{mode}"]
    state = state_dir_for(name)
    cluster = Cluster(name=name, network=f"{name}-net", image=ref, state_dir=state,
                      inventory=Path(inventory or DEFAULT_INVENTORY).resolve(), fast_network=f"{name}-fast")
    _remove_leftovers(name)
    try:
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True, mode=0o700)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"podcluster-{name}",
              "-f", str(cluster.key)])
        pubkey = cluster.key.with_suffix(".pub").read_text()
        _podman("network", "create", "--label", f"{LABEL}={name}", cluster.network)
        subnet = _network_subnet(cluster.network)
        _podman("network", "create", "--internal", "--label", f"{LABEL}={name}", cluster.fast_network)
        fast = _network_subnet(cluster.fast_network)
        cluster.fast_cidr = str(fast)
        for k in range(1, n + 1):
            node = Node(index=k, name=f"node{k}", container=f"{name}-node{k}", ip="",
                        fast_ip=str(fast.network_address + 10 + k))
            args = ["run", "-d", "--name", node.container, "--hostname", node.name,
                    # A fixed address per node on each network: a node stopped and started again
                    # (failure tests) comes back where every other node's /etc/hosts expects it,
                    # and with its old MAC, or the others' ARP caches point at a dead veth.
                    "--network", f"{cluster.network}:ip={subnet.network_address + 10 + k},"
                                 f"mac={_node_mac(subnet.network_address + 10 + k)}",
                    "--network", f"{cluster.fast_network}:ip={node.fast_ip},mac={_node_mac(fast.network_address + 10 + k)}",
                    "--network-alias", node.name,
                    "--label", f"{LABEL}={name}", "--systemd=always",
                    # sshfs (the shared-folder mode this kernel supports) needs FUSE.
                    "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
                    # Debian's ping carries file capability cap_net_raw; without it in the
                    # bounding set exec fails with EPERM, unlike on a real host.
                    "--cap-add", "NET_RAW",
                    # A machine's root may look into any process (CAP_SYS_PTRACE): newuidmap, which
                    # rootless podman runs from a run's unit, opens /proc/<pid> of a process that
                    # the unit's /proc (ProtectProc=invisible) shows only to root with it.
                    "--cap-add", "SYS_PTRACE",
                    # Rootless podman in a node (the --image tests) mounts a fresh /proc for a
                    # container with its own pid namespace; the kernel refuses that while the
                    # node's /proc has podman's masks over parts of it, as a machine's has not.
                    "--security-opt", "unmask=/proc/*",
                    # /etc/hosts is the node's own file, as on a machine: podman would write a
                    # fresh one at every start, dropping what role base manages there, so a
                    # restarted node could no longer resolve the others.
                    "--no-hosts"]
            if wheel_dir is not None:
                args += ["-v", f"{wheel_dir}:/opt/wheelhouse:ro"]
            # One pip cache for every node of every cluster: a wheel is downloaded (or built
            # from its sdist) once per machine, not once per node. pip runs as root on the nodes.
            args += ["-v", f"{node_pip_cache()}:/root/.cache/pip"]
            args += binds
            # The whole suite runs the cluster tests beside molecule's containers; each container
            # is its own CPU cgroup of equal weight unless told otherwise, and scripts/test gives
            # the cluster's nodes, its longest path, a larger share (DISTRUN_TEST_CPU_SHARES).
            shares = os.environ.get("DISTRUN_TEST_CPU_SHARES", "")
            if shares.isdigit() and int(shares) > 0:
                args += ["--cpu-shares", shares]
            _podman(*args, node_images[k - 1] if node_images else ref)
            node.ip = _container_ip(node.container, cluster.network)
            cluster.nodes.append(node)
        for node in cluster.nodes:
            # As Debian's and Ubuntu's installers write it: the machine's own hostname on
            # 127.0.1.1, not on its address (podman's own file would say the address, and a
            # program that finds itself by its hostname would work here and fail on a real node).
            cluster.exec(node.index, "printf '127.0.0.1\\tlocalhost\\n127.0.1.1\\t%s\\n\\n"
                         "::1\\tlocalhost ip6-localhost ip6-loopback\\n' " + shlex.quote(node.name) + " > /etc/hosts")
            cluster.exec(node.index, "install -d -m 0700 /root/.ssh && "
                         "cat > /root/.ssh/authorized_keys && "
                         "chmod 0600 /root/.ssh/authorized_keys", input=pubkey)
        cluster.known_hosts.write_text("")
        for node in cluster.nodes:
            _wait_for_ssh(cluster, node, wait_s)
        cluster._write_files()
    except BaseException:
        # KeyboardInterrupt included: a half-built cluster is never left behind.
        with contextlib.suppress(Exception):
            down(name)
        raise
    log(f"podcluster: {n}-node cluster {name!r} up in {time.monotonic() - t0:.1f}s; "
        f"inventory {cluster.inventory}")
    return cluster


def down(name: str = DEFAULT_NAME) -> None:
    """Remove cluster `name`'s containers and network (whether or not they still run)."""
    _remove_leftovers(name)


def load(name: str = DEFAULT_NAME) -> Cluster:
    """The cluster `name` as the last up() in any process recorded it."""
    path = state_dir_for(name) / "state.json"
    if not path.exists():
        raise HarnessError(f"no cluster {name!r} recorded in {path}: run `podcluster.py up`")
    data = json.loads(path.read_text())
    nodes = [Node(**nd) for nd in data.pop("nodes")]
    return Cluster(**{**data, "state_dir": Path(data["state_dir"]),
                      "inventory": Path(data["inventory"])}, nodes=nodes)


def stop_node(k: int, name: str = DEFAULT_NAME) -> None:
    load(name).stop_node(k)


def kill_node(k: int, name: str = DEFAULT_NAME) -> None:
    load(name).kill_node(k)


def start_node(k: int, name: str = DEFAULT_NAME) -> None:
    load(name).start_node(k)


def exec(k: int, cmd: str | Sequence[str], name: str = DEFAULT_NAME,  # noqa: A001
         check: bool = True) -> subprocess.CompletedProcess[str]:
    return load(name).exec(k, cmd, check=check)


def ip(k: int, name: str = DEFAULT_NAME) -> str:
    return load(name).ip(k)


# --------------------------------------------------------------------------- snapshots

# A provisioned cluster kept as one image per node, keyed by everything its first `distrun
# setup` depends on: the node image, the roles and playbooks, the test inventory, the runner,
# the harness. Any change there is another key, so a snapshot is only ever the result of the
# same converge; it is also rebuilt after SNAPSHOT_MAX_AGE_S (the packages pip and apt pick
# within the roles' pins move on).
SNAPSHOT_REPO = "localhost/distrun-provisioned"
SNAPSHOT_MAX_AGE_S = 7 * 24 * 3600
SNAPSHOT_GRACE_S = 3600  # another snapshot younger than this is kept: a session may be starting from it
SNAPSHOT_INPUTS = ("roles", "playbooks", "setup.yml", "ansible.cfg", "inventory/test", "runner",
                   "pyproject.toml", "tests/harness/podcluster.py", "tests/conftest.py",
                   "tests/cluster/conftest.py")


def snapshot_key(base_image: str, n: int) -> str:
    """The digest of the snapshot inputs' files as they are now (git's files there: tracked, or
    new and not ignored; the inventory the harness writes is ignored)."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                           *SNAPSHOT_INPUTS], cwd=REPO_ROOT, capture_output=True, check=False)
    if proc.returncode == 0 and proc.stdout:
        files = sorted(REPO_ROOT / f for f in proc.stdout.decode().split("\0") if f)
    else:  # not a git checkout: every file but what the harness writes there itself
        files = sorted(f for top in SNAPSHOT_INPUTS for f in
                       ((REPO_ROOT / top).rglob("*") if (REPO_ROOT / top).is_dir() else [REPO_ROOT / top])
                       if f.is_file() and "__pycache__" not in f.parts and f != DEFAULT_INVENTORY)
    h = hashlib.sha256(f"{base_image}\n{n}\n".encode())
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def snapshot_images(key: str, n: int) -> list[str]:
    """The snapshot's image per node, or [] when it is missing (or too old to use)."""
    refs = [f"{SNAPSHOT_REPO}:{key}-node{k}" for k in range(1, n + 1)]
    for ref in refs:
        out = _podman("image", "inspect", ref, "--format", "{{.Created.Unix}}", check=False)
        if out.returncode != 0 or not out.stdout.strip().isdigit() \
                or time.time() - int(out.stdout.strip()) > SNAPSHOT_MAX_AGE_S:
            return []
    return refs


def _older_than(ref: str, seconds: float) -> bool:
    """Whether image ``ref`` was made more than ``seconds`` ago (or podman cannot say when)."""
    made = _podman("image", "inspect", ref, "--format", "{{.Created.Unix}}", check=False).stdout.strip()
    return not made.isdigit() or time.time() - int(made) > seconds


def snapshot(cluster: Cluster, key: str, log: Log = _stderr) -> None:
    """Commit every node of a freshly provisioned cluster as the snapshot ``key`` (all nodes at
    once), and remove every other snapshot older than SNAPSHOT_GRACE_S (about 2 GB per node): a
    younger one may be what another session on this machine is starting its nodes from."""
    t0 = time.monotonic()
    procs = [(node, subprocess.Popen(["podman", "commit", "-q", node.container, f"{SNAPSHOT_REPO}:{key}-node{node.index}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
             for node in cluster.nodes]
    ended = [(node, p.communicate(timeout=900)[1], p.returncode) for node, p in procs]
    failed = [f"{node.container}: {_last_line(err)}" for node, err, rc in ended if rc != 0]
    if failed:
        for node in cluster.nodes:
            _podman("rmi", f"{SNAPSHOT_REPO}:{key}-node{node.index}", check=False)
        raise HarnessError("podman commit of the provisioned nodes failed: " + "; ".join(failed))
    listed = _podman("images", "--format", "{{.Repository}}:{{.Tag}}", SNAPSHOT_REPO, check=False).stdout.split()
    stale = [ref for ref in listed if not ref.split(":")[-1].startswith(f"{key}-") and _older_than(ref, SNAPSHOT_GRACE_S)]
    if stale:
        _podman("rmi", *stale, check=False)
    log(f"podcluster: snapshot {key} of {len(cluster.nodes)} provisioned nodes in {time.monotonic() - t0:.1f}s")


def status(name: str = DEFAULT_NAME) -> list[tuple[str, str, str]]:
    """(container, state, ip) for each container podman knows for cluster `name`."""
    # JSON because the text {{.State}} of podman 4.3 is "Up 3 seconds ago", not "running".
    out = _podman("ps", "-a", "--filter", f"label={LABEL}={name}", "--format", "json").stdout
    rows = []
    for entry in sorted(json.loads(out or "[]"), key=lambda e: e["Names"][0]):
        cname, state = entry["Names"][0], entry["State"]
        addr = _container_ip(cname, f"{name}-net") if state == "running" else ""
        rows.append((cname, state, addr))
    return rows


@contextlib.contextmanager
def cluster(n: int, **kwargs: Any) -> Iterator[Cluster]:
    """``with cluster(3) as c:`` — up() then always down()."""
    c = up(n, **kwargs)
    try:
        yield c
    finally:
        c.down()


# --------------------------------------------------------------------------- CLI

def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="podcluster.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    img = sub.add_parser("image", help="build the node image (cached by recipe digest)")
    img.add_argument("--force", action="store_true", help="rebuild even if cached")
    u = sub.add_parser("up", help="start a cluster and write its inventory")
    u.add_argument("-n", "--nodes", type=int, default=3)
    u.add_argument("--name", default=DEFAULT_NAME)
    u.add_argument("--wheelhouse", default="/opt/wheels" if Path("/opt/wheels").is_dir() else None,
                   help="host folder bound read-only at /opt/wheelhouse (default /opt/wheels)")
    u.add_argument("--no-wheelhouse", action="store_true")
    u.add_argument("--inventory", default=str(DEFAULT_INVENTORY.relative_to(REPO_ROOT)))
    u.add_argument("--hold", action="store_true",
                   help="stay in the foreground and tear down on Ctrl-C / SIGTERM")
    d = sub.add_parser("down", help="remove a cluster's containers and network")
    d.add_argument("--name", default=DEFAULT_NAME)
    s = sub.add_parser("status", help="list a cluster's containers")
    s.add_argument("--name", default=DEFAULT_NAME)
    args = p.parse_args(argv)

    # SIGTERM ends like Ctrl-C so the same cleanup paths run.
    signal.signal(signal.SIGTERM, _interrupt)
    # A shell starts background jobs with SIGINT ignored; Ctrl-C must still tear down.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if args.cmd == "image":
            ensure_podman()
            r = build_image(force=args.force)
            print(r.ref)
        elif args.cmd == "up":
            wheel = None if args.no_wheelhouse else args.wheelhouse
            inv = Path(args.inventory)
            c = up(args.nodes, name=args.name, wheelhouse=wheel,
                   inventory=inv if inv.is_absolute() else REPO_ROOT / inv)
            for node in c.nodes:
                print(f"{node.name}\t{node.ip}\t{node.container}")
            print(f"inventory: {c.inventory}")
            if args.hold:
                print("holding; Ctrl-C tears the cluster down", file=sys.stderr)
                try:
                    while True:
                        time.sleep(3600)
                finally:
                    down(args.name)
                    print(f"cluster {args.name} removed", file=sys.stderr)
        elif args.cmd == "down":
            down(args.name)
            print(f"cluster {args.name} removed")
        elif args.cmd == "status":
            rows = status(args.name)
            if not rows:
                print(f"cluster {args.name}: no containers")
            for row in rows:
                print("\t".join(row))
    except HarnessError as exc:
        print(f"podcluster: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("podcluster: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(_main())
