"""distrun preflight probe: everything one node can tell about itself, as one JSON line.

Runs as root with the node's system Python (``python3 -c <distrun_fsuser.py + netprobe.py +
imageprobe.py + userprobe.py + this file> '<config json>'``), so one round trip per host gathers the env, versions,
the shared folder, ssh to the other nodes, name resolution, (on the head, to name the owning
process) the launch ports, and TCP connections between the nodes (netprobe.py). It changes nothing
except the shared-folder probe file, which the role removes again, its own record of the env's
versions, which saves starting the env's Python while nothing they depend on changed, and, given a
run's stage step (role job's files/stage.py as the second argument), the run's files, unpacked
after the checks (stage_run).

Root believes no process of the training user's uid: a job of that user can trace any of them,
or feed them through files it writes, and make them say anything. So what root records or decides
on comes from root's own processes (the env's Python and Open MPI's mpirun are root's files, run
as root and isolated); what the training user may do (write the shared folder, run a program,
unpack the run's files) is done or asked by a forked root process that took only that user's
filesystem identity (userprobe.py: the user's rights, no process of the user's).
ssh to the other nodes logs in as the training user with root's node key, certified by the user
CA (role ssh_mesh), and runs nothing there. Only the container image's checks run the runtime as
the user (its image store is that user's). Standard library only.
"""

import contextlib
import hashlib
import json
import time
import os
import pwd
import re
import socket
import stat
import subprocess
import sys
import threading

CFG = json.loads(sys.argv[1])
USER = CFG["user"]
PREFIX = CFG["env_prefix"].rstrip("/")
TIMEOUT = int(CFG.get("ssh_timeout", 5))
# Where the node's files are read for the ssh fingerprint: / (a test points it at a folder).
ROOT = CFG.get("ssh_fingerprint_root") or "/"
# Where root keeps what the env's Python said, by the env's fingerprint (a test points it elsewhere).
ENV_RECORDS = CFG.get("env_records_dir") or "/var/cache/distrun/preflight"
ENV_RECORD_MAX_AGE_S = 86400

# Run by the env's Python as root: versions by package metadata (importing torch or
# jittor is slow, and jittor compiles at first import), mpi4py by loading libmpi without MPI_Init.
# -I: neither the working directory, PYTHON* variables nor the user's site folder (~/.local, which
# a job can write) reach sys.path; the env's own site-packages still do.
ENV_FLAGS = ["-I", "-c"]
ENV_SCRIPT = r"""
import hashlib, importlib.util, json, os, platform, sys
from importlib import metadata
out = {"python": platform.python_version()}
out["_modules"] = {m: importlib.util.find_spec(m) is not None for m in json.loads(sys.argv[1])}
for name in ("mpi4py", "torch", "jittor"):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = "absent"
dists = sorted({(d.metadata["Name"] or "?").lower().replace("_", "-") + "==" + str(d.version)
                for d in metadata.distributions()})
meta = os.path.join(sys.prefix, "conda-meta")
if os.path.isdir(meta):
    dists += sorted(f for f in os.listdir(meta) if f.endswith(".json"))
out["env lock"] = "sha256:" + hashlib.sha256("\n".join(dists).encode()).hexdigest()[:16]
try:
    import mpi4py
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI
    out["_mpi4py"] = "ok: " + MPI.Get_library_version().strip().splitlines()[0]
except Exception as exc:
    out["_mpi4py"] = "error: " + type(exc).__name__ + ": " + str(exc).strip().splitlines()[-1][:300]
print(json.dumps(out))
"""


def _last_line(text):
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def in_thread(fn, *args, **kwargs):
    """Start fn(*args, **kwargs) in a thread; the function returned waits for its value (or raises
    its error). Threads, not a pool: the probe starts in a fraction of the time without one."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - raised again where the value is asked for
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return wait


FAN_OUT = 16  # checks of other nodes (names, rsync) at once
SSH_FAN_OUT = 4  # ssh logins to other nodes at once: with every node of the mesh logging in to a ring of
                 # the others, each sshd sees about this many pending connections per wave


def fan_out(fn, items, *args, limit=FAN_OUT, **kwargs):
    """fn(item, *args, **kwargs) for each item, ``limit`` at a time and started in the items'
    order, in threads; item -> the function that waits for its value (or raises its error)."""
    todo = list(dict.fromkeys(items))
    boxes = {item: {} for item in todo}
    done = {item: threading.Event() for item in todo}
    lock = threading.Lock()
    pending = iter(todo)

    def worker():
        while True:
            with lock:
                item = next(pending, done)  # ``done`` marks the end: it is never an item
            if item is done:
                return
            try:
                boxes[item]["value"] = fn(item, *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - raised again where the value is asked for
                boxes[item]["error"] = exc
            done[item].set()

    for _ in range(min(limit, len(todo))):
        threading.Thread(target=worker, daemon=True).start()

    def waiter(item):
        def wait():
            done[item].wait()
            if "error" in boxes[item]:
                raise boxes[item]["error"]
            return boxes[item]["value"]
        return wait

    return {item: waiter(item) for item in todo}


def probe_env():
    python = f"{PREFIX}/bin/python"
    if not os.path.exists(python):
        return {"ok": False, "detail": f"{python} is missing"}, {}
    # As root: the env is root's (setup checked that no one else can change it), and a process of
    # the training user would answer whatever a job tracing it made it say.
    proc = run([python, *ENV_FLAGS, ENV_SCRIPT, json.dumps(CFG.get("modules", []))])
    if proc.returncode != 0:
        return {"ok": False, "detail": f"{python} does not start: {_last_line(proc.stderr)}"}, {}
    try:
        return {"ok": True, "detail": python}, json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "detail": f"{python} printed no versions: {_last_line(proc.stdout)}"}, {}


def _stat_line(path):
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path} {exc.errno}"
    return f"{path} {os.path.realpath(path)} {st.st_ino} {st.st_mode} {st.st_uid} {st.st_gid} {st.st_size} " \
           f"{st.st_mtime_ns} {st.st_ctime_ns}"


def env_fingerprint(openmpi):
    """What the env probe's answer depends on, read without starting the env: the env's folders
    and interpreter, every package's metadata (the versions are read from it; pip and conda add
    and remove these entries, an edit changes their times; a chmod or chown their ctime), the
    training user, the modules asked for, Open MPI's version (libmpi is what mpi4py loads) and
    the script that asks."""
    pw = pwd.getpwnam(USER)
    parts = [PREFIX, USER, str(pw.pw_uid), str(pw.pw_gid), pw.pw_dir, str(os.getgrouplist(USER, pw.pw_gid)),
             json.dumps(sorted(CFG.get("modules", []))), str(openmpi), str(ENV_FLAGS), ENV_SCRIPT]
    lib = []
    with contextlib.suppress(OSError):
        lib = sorted(f"{PREFIX}/lib/{n}" for n in os.listdir(f"{PREFIX}/lib") if n.startswith("python"))
    paths = [PREFIX, f"{PREFIX}/bin", f"{PREFIX}/bin/python", f"{PREFIX}/conda-meta", *lib]
    for folder in [f"{d}/site-packages" for d in lib] + [f"{PREFIX}/conda-meta"]:
        paths.append(folder)
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.name.endswith((".dist-info", ".egg-info")):
                    paths += [e.path, f"{e.path}/METADATA", f"{e.path}/PKG-INFO"]
                elif e.name.endswith(".json"):
                    paths.append(e.path)
    parts += [_stat_line(p) for p in paths]
    return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _env_record_path():
    key = hashlib.sha256(f"{PREFIX}\0{USER}".encode()).hexdigest()[:16]
    return os.path.join(ENV_RECORDS, f"env-{key}.json")


def recorded_env(fingerprint):
    """The env probe's last answer, when it was taken for this fingerprint within a day; only
    root's own records count (a job, running as the training user, can write none of them)."""
    if os.geteuid() != 0 or not CFG.get("env_records", True):
        return None
    try:
        fd = os.open(_env_record_path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, encoding="utf-8") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077 or st.st_size > 1 << 20:
            return None
        try:
            data = json.load(fh)
        except ValueError:
            return None
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint \
            or not 0 <= time.time() - float(data.get("time", 0)) < ENV_RECORD_MAX_AGE_S:
        return None
    return data.get("env"), data.get("versions")


def record_env(fingerprint, env, versions):
    """Keep a working env's answer for the next probe: root's, 0600 in a 0700 folder of root's."""
    if os.geteuid() != 0:
        return
    try:
        os.makedirs(ENV_RECORDS, mode=0o700, exist_ok=True)
        st = os.lstat(ENV_RECORDS)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
            return
        path = _env_record_path()
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"fingerprint": fingerprint, "time": time.time(), "env": env, "versions": versions}, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # no record: the next probe starts the env's Python again


def probe_env_once(openmpi_f):
    """probe_env's answer, from root's record while the env's fingerprint is unchanged (and the
    full set, 'distrun check', never reads a record); and how it was got: "recorded" or "ran"."""
    fingerprint = env_fingerprint(openmpi_f())
    found = recorded_env(fingerprint)
    if found is not None and isinstance(found[0], dict) and isinstance(found[1], dict):
        return found[0], dict(found[1]), "recorded"
    env, versions = probe_env()
    if env.get("ok") and str(versions.get("_mpi4py", "")).startswith("ok"):
        record_env(fingerprint, env, versions)
    return env, versions, "ran"


def probe_openmpi():
    if not CFG.get("mpi_prefix"):
        # A site's Slurm: its MPI is the site's, behind srun; nothing of distrun's to compare.
        return "the site's (srun)" if CFG.get("slurm") else "unknown (no distrun fact: run distrun setup)"
    mpirun = f"{CFG['mpi_prefix'].rstrip('/')}/bin/mpirun"
    proc = run([mpirun, "--version"])
    m = re.search(r"\(Open MPI\)\s+(\S+)", proc.stdout)
    if m:
        return m.group(1)
    return "missing" if proc.returncode == 127 else f"unknown ({_last_line(proc.stderr or proc.stdout)})"


# What a target's sshd says when it drops a connection that has not authenticated yet because
# too many are pending (MaxStartups, 10 by default): every node of a large cluster logging in to
# every other at once sees it, and it says nothing about the target.
SSH_BUSY = re.compile(r"Connection reset by|Connection closed by|kex_exchange_identification")
SSH_TRIES = 3


def probe_ssh(target):
    for attempt in range(SSH_TRIES):
        proc = run(login_argv(target), timeout=TIMEOUT + 10)
        if proc.returncode == 0:
            return {"ok": True, "check": "login", "detail": "ssh in batch mode works"}
        if attempt + 1 < SSH_TRIES and proc.returncode == 255 and SSH_BUSY.search(proc.stderr or ""):
            time.sleep(0.3 + 0.7 * int.from_bytes(os.urandom(1), "big") / 255)
            continue
        break
    return {"ok": False, "check": "login", "detail": _last_line(proc.stderr) or f"ssh exited {proc.returncode}"}


def ssh_order(targets, me):
    """The targets in the order this node logs in to them: the sorted ring of nodes, starting after
    this one, so that nodes logging in to every other at once each begin with a different one."""
    ring = sorted(set(targets) | {me})
    start = ring.index(me) + 1
    return [t for t in ring[start:] + ring[:start] if t != me and t in targets]


def probe_banner(target):
    """The cheap check, once a login from here to target was verified and nothing it depends on
    changed: target's sshd answers with its SSH banner where the system's ssh configuration connects
    (``ssh -G`` resolves the host and port from the system's config without connecting). A target
    reached through a proxy, or whose config ssh cannot read, gets the full login instead."""
    conf = {}
    proc = run([*CFG["user_ssh"], "-G", "--", target], timeout=TIMEOUT + 10)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        conf.setdefault(key.lower(), value.strip())
    if (proc.returncode != 0 or "hostname" not in conf or not conf.get("port", "22").isdigit()
            or conf.get("proxycommand", "none") != "none" or conf.get("proxyjump", "none") != "none"):
        return probe_ssh(target)
    host, port = conf["hostname"], int(conf.get("port", "22"))
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
            sock.settimeout(TIMEOUT)
            first = sock.makefile("rb").readline(256)
            if first.startswith(b"SSH-"):
                # A client's identification before closing: sshd logs a closed connection, not a
                # missing identification string (which intrusion filters may count against the head).
                with contextlib.suppress(OSError):
                    sock.sendall(b"SSH-2.0-distrun-preflight\r\n")
    except socket.timeout:
        return {"ok": False, "check": "banner", "detail": f"sshd does not answer on {host}:{port} within {TIMEOUT}s"}
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        return {"ok": False, "check": "banner", "detail": f"sshd does not answer on {host}:{port}: {why}"}
    if not first.startswith(b"SSH-"):
        shown = first.decode("ascii", "replace").strip()[:40] or "nothing"
        return {"ok": False, "check": "banner", "detail": f"{host}:{port} answers {shown!r}, not an SSH banner"}
    return {"ok": True, "check": "banner", "detail": "sshd answers"}


# At most this much of each file counts: a file a job made huge costs the probe nothing.
FINGERPRINT_READ = 1 << 20


def _plain(name, dir_fd=None):
    """What a file is, for the fingerprint: its bytes if it is a regular file (at most
    FINGERPRINT_READ), else a marker. Never through a link, and never blocking on a FIFO: the
    probe runs as root, and the training user's files are a job's to plant."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return b"missing"
    except OSError as exc:  # ELOOP: a link
        return f"unreadable {exc.errno}".encode()
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"not a file {stat.S_IFMT(st.st_mode):o}".encode()
        chunks, left = [], FINGERPRINT_READ
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"file " + f"{st.st_uid} {st.st_mode:o} ".encode() + b"".join(chunks)
    except OSError as exc:
        return f"unreadable {exc.errno}".encode()
    finally:
        os.close(fd)


def _meta(name, dir_fd=None, size=False):
    """Owner and mode (and size and time) of a path itself, never of what a link points at."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "missing"
    line = f"{st.st_uid} {st.st_mode:o}"
    return f"{line} {st.st_size} {st.st_mtime_ns}" if size else line


def _user_ssh(h, home):
    """The training user's side, read from a descriptor of ~/.ssh opened without following a link:
    authorized keys, known hosts, config and public keys by content, private keys by name, size
    and time only (their contents are never read), and the owner and mode of home, ~/.ssh and
    authorized_keys (sshd refuses keys others may write to)."""
    h.update(f"home {_meta(home)}\0".encode())
    try:
        ssh_fd = os.open(os.path.join(home, ".ssh"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        h.update(f"no .ssh {exc.errno}\0".encode())
        return
    try:
        h.update(f".ssh {_meta(os.path.join(home, '.ssh'))}\0".encode())
        names = sorted(os.listdir(ssh_fd))
        for name in ("authorized_keys", "authorized_keys2", "known_hosts", "config"):
            h.update(f"file {name}\0".encode() + _plain(name, ssh_fd) + b"\0")
        for name in names:
            if name.startswith("id_") and name.endswith(".pub"):
                h.update(f"public {name}\0".encode() + _plain(name, ssh_fd) + b"\0")
            elif name.startswith("id_"):
                h.update(f"key {name} {_meta(name, ssh_fd, size=True)}\0".encode())
    finally:
        os.close(ssh_fd)


def ssh_fingerprint():
    """A digest of everything on this node a login as the training user depends on (the user's
    passwd entry, ssh files, the system's ssh configuration, root's keys and principals files of the
    user, the user CA sshd trusts, root's node key's certificate and known_hosts, host keys,
    /etc/hosts, and the boot: a reboot counts as a change). Missing or unreadable files
    count as such. Local reads only, no process started."""
    pw = pwd.getpwnam(USER)
    h = hashlib.sha256(f"user {pw.pw_uid} {pw.pw_gid} {pw.pw_dir} {pw.pw_shell}\0".encode())
    _user_ssh(h, os.path.join(ROOT, pw.pw_dir.lstrip("/")))
    system = ["/etc/ssh/sshd_config", "/etc/ssh/ssh_config", "/etc/ssh/ssh_known_hosts", "/etc/hosts",
              "/proc/sys/kernel/random/boot_id", "/etc/ssh/distrun_user_ca.pub",
              f"{NODE_KEY}-cert.pub", ROOT_KNOWN_HOSTS]  # noqa: F821 - userprobe.py, shipped in front
    system += [p for d in ("/etc/ssh/sshd_config.d", "/etc/ssh/ssh_config.d", "/etc/ssh/distrun_keys",
                           "/etc/ssh/distrun_principals") for p in _listed(d)]
    system += [p for p in _listed("/etc/ssh") if p.rsplit("/", 1)[-1].startswith("ssh_host_") and p.endswith("_key.pub")]
    for path in sorted(set(system)):
        h.update(f"system {path}\0".encode() + _plain(os.path.join(ROOT, path.lstrip("/"))) + b"\0")
    return "sha256:" + h.hexdigest()


def _listed(folder):
    """The paths of a system folder's entries (as seen from /), sorted; none when it is missing."""
    try:
        return sorted(f"{folder}/{n}" for n in os.listdir(os.path.join(ROOT, folder.lstrip("/"))))
    except OSError:
        return []


def probe_writable(path):
    try:
        if user_files(_writable, path):
            return {"ok": True, "detail": f"{path} is writable by {USER}"}
    except FsUserError as exc:  # noqa: F821 - distrun_fsuser.py, shipped in front
        return {"ok": False, "detail": f"{path}: {exc}"}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"ok": False, "detail": f"{path} does not exist"}
    except OSError as exc:
        return {"ok": False, "detail": f"{path}: {exc.strerror}"}
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return {"ok": False, "detail": f"{path} is not writable by {USER} (owner {owner}, mode {st.st_mode & 0o7777:04o})"}


def resolve(name):
    """Every address the name has here, in the resolver's order ("a,b"; "" when none). Not only
    the first: with /etc/host.conf's "multi on", a stray /etc/hosts line adds an address that
    getaddrinfo may sort behind the right one on this node, while another program gets it first."""
    try:
        addresses = socket.gethostbyname_ex(name)[2]
    except OSError:
        return ""
    return ",".join(dict.fromkeys(addresses))


def _in(port, spec):
    if isinstance(spec, int) or str(spec).isdigit():
        return port == int(spec)
    lo, _, hi = str(spec).partition("-")
    return int(lo) <= port <= int(hi)


def probe_ports(specs):
    """Every configured port or range -> who listens there (ss as root shows the process)."""
    try:
        out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=20, check=False).stdout
    except FileNotFoundError:
        return {str(s): {"ok": False, "detail": "ss not found (install iproute2)"} for s in specs}
    listeners = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        port = fields[3].rsplit(":", 1)[-1]
        if not port.isdigit():
            continue
        procs = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        who = ", ".join(f"{n} (pid {p})" for n, p in dict.fromkeys(procs)) or "a process of another user"
        listeners.append((int(port), who))
    result = {}
    for spec in specs:
        single = isinstance(spec, int) or str(spec).isdigit()
        taken = sorted({(f"by {who}" if single else f"{p} by {who}") for p, who in listeners if _in(p, spec)})
        result[str(spec)] = ({"ok": True, "detail": "free"} if not taken
                             else {"ok": False, "detail": "in use " + "; ".join(taken)})
    return result


def probe_shared_file(path):
    """The head writes the probe file (nfs, sshfs, external: every other node must see it)."""
    try:
        user_files(_new_file, path)
    except FsUserError as exc:  # noqa: F821 - distrun_fsuser.py, shipped in front
        return {"ok": False, "file": path, "detail": f"cannot create {path} as {USER}: {exc}"}
    return {"ok": True, "file": path, "detail": f"wrote {path}"}


def _search_path():
    """Where a program named without a folder is looked for: the env, the usual folders and,
    when the probe already runs as the training user, that user's own PATH (a site's modules)."""
    dirs = [f"{PREFIX}/bin", "/usr/local/bin", "/usr/bin", "/bin"]
    if os.geteuid() != 0 or USER == "root":
        dirs += [d for d in os.environ.get("PATH", "").split(os.pathsep) if d.startswith("/")]
    return list(dict.fromkeys(dirs))


def probe_programs(programs):
    """Each program this run needs -> found (the first candidate the training user may run)."""
    out = {}
    for label, candidates in programs.items():
        found = ""
        for c in candidates:
            path = c if "/" in c else next((f"{d}/{c}" for d in _search_path() if os.path.exists(f"{d}/{c}")), "")
            if path and _may_run(path):
                found = path
                break
        where = os.path.dirname(candidates[0]) if "/" in candidates[0] else "PATH"
        out[label] = {"ok": bool(found), "detail": found or f"not in {where}"}
    return out


SLURM_PROGRAMS = ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")


def probe_slurm(partition):
    """A Slurm the user does not administer, seen from its login node (as the probe: the training
    user there): the client commands distrun runs are there, sinfo answers, and the partition (if
    one is set) is up."""
    found = probe_programs({p: [p] for p in SLURM_PROGRAMS})
    missing = [p for p, r in found.items() if not r["ok"]]
    if missing:
        return {"ok": False, "kind": "programs", "detail": f"{', '.join(missing)} not found on PATH for {USER}"}
    sinfo = run([found["sinfo"]["detail"], "--noheader", "--format=%P %a %D %t"], timeout=30)
    if sinfo.returncode != 0:
        return {"ok": False, "kind": "sinfo",
                "detail": f"sinfo failed as {USER}: {_last_line(sinfo.stderr or sinfo.stdout) or f'exit {sinfo.returncode}'}"}
    parts = {}
    for line in sinfo.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4:
            name = fields[0].rstrip("*")
            avail, nodes, states = parts.get(name, (fields[1], 0, []))
            parts[name] = (avail, nodes + int(fields[2]) if fields[2].isdigit() else nodes, states + [fields[3]])
    if partition and partition not in parts:
        return {"ok": False, "kind": "partition",
                "detail": f"partition {partition} is not in sinfo (partitions: {', '.join(sorted(parts)) or 'none'})"}
    shown = [partition] if partition else sorted(parts)
    if partition and parts[partition][0] != "up":
        return {"ok": False, "kind": "partition", "detail": f"partition {partition} is {parts[partition][0]}"}
    return {"ok": True, "detail": "sinfo answers: " + "; ".join(
        f"partition {p} {parts[p][0]}, {parts[p][1]} node(s) {'/'.join(sorted(set(parts[p][2])))}" for p in shown)}


def probe_mount(path, fstypes):
    """The shared folder must be the mounted filesystem itself (an empty mount point is writable too).

    Read from /proc/self/mounts, not by stat: a FUSE mount that only its user may enter is not
    stat-able by root.
    """
    try:  # an automount (nfs x-systemd.automount) mounts on access
        user_files(os.path.isdir, path + "/.")
    except FsUserError:  # noqa: F821 - distrun_fsuser.py, shipped in front
        pass
    want = os.path.normpath(path)
    found = ""
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 3 and fields[1].replace("\\040", " ") == want:
                found = fields[2]  # the last mount on a path is the one in effect
    if found and any(found == t or (t.endswith("*") and found.startswith(t[:-1])) for t in fstypes):
        return {"ok": True, "detail": f"{path} is mounted ({found})"}
    if found:
        return {"ok": False, "detail": f"{path} is a {found} mount, not {' or '.join(fstypes)}"}
    return {"ok": False, "detail": f"{path} is not mounted (expected {' or '.join(fstypes)})"}


def probe_addresses():
    """Each interface -> its IPv4 addresses, as the node has them now (a run plans from cached
    facts and checks them against this); None when ``ip`` cannot tell."""
    try:
        proc = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=20,
                              check=False)
        links = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (FileNotFoundError, subprocess.TimeoutExpired, ValueError):
        return None
    if not isinstance(links, list):
        return None
    return {str(link.get("ifname")): [str(a["local"]) for a in link.get("addr_info") or [] if a.get("local")]
            for link in links if isinstance(link, dict) and link.get("ifname")}


def mounts_above(path):
    """The mount table's lines for the path and its parents (the judge picks the one that holds it):
    an external shared filesystem must be the same one on every node."""
    parts = [p for p in os.path.normpath(path).split("/") if p]
    candidates = {"/"} | {"/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)}
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return [line.strip() for line in fh if len(line.split()) >= 3 and line.split()[1].replace("\\040", " ") in candidates]


def main():
    global STEP
    report = {"host": CFG["host"]}
    net = dict(CFG.get("net") or {})
    if CFG.get("ports"):
        STEP = "ports"
        take_turn()  # noqa: F821 - netprobe.py's: another run's probe here ends first; then, before our listeners, the ports
        report["ports"] = probe_ports(CFG["ports"])
        if not all(v.get("ok") for v in report["ports"].values()):
            net["rendezvous"] = 0  # taken: the ports check says by whom
    stage = None
    if CFG.get("stage"):
        # Beside the other checks, in a thread: it checks for itself what it needs first.
        stage = in_thread(stage_run, CFG["stage"], sys.argv[2] if len(sys.argv) > 2 else "")
    network = None
    if net.get("rendezvous") or net.get("mpi_range"):
        STEP = "network"
        # First, in threads: every node listens while the others call, whatever else it checks.
        network = NetworkProbe(CFG["host"], net)  # noqa: F821 - defined by netprobe.py, shipped in front
    try:
        body(report)
    finally:
        if network is not None:
            step, STEP = STEP, "network"
            report["net"] = network.result()
            STEP = step  # a step that raised in body() is the one the error names
        if stage is not None:
            # Whatever else happened: the runner removes what was staged when it refuses the run.
            STAGED.update(stage())
    report.update(STAGED)
    print(json.dumps(report, sort_keys=True))


def stage_run(config, script):
    """A run's stage step in this round trip (role job's files/stage.py, passed as the second
    argument): with the training user's rights (user_files), and only where the user exists and the shared folder is
    writable by it (and mounted, where it must be), so nothing lands in an empty mount point;
    checked here, beside the same checks in the report. The runner starts nothing before the
    judge passed every node, and removes what was staged when it refuses the run.
    {"staged": run id, "stage_changed": bool, "stage_created": the run's folders it made}, or
    {"stage_error": why}."""
    if not script:
        return {"stage_error": "not staged: the probe was given no stage script"}
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return {"stage_error": f"not staged: no user {USER}"}
    checks = [probe_writable(CFG["shared_dir"])]
    if CFG.get("mount_fstypes"):
        checks.append(probe_mount(CFG["shared_dir"], CFG["mount_fstypes"]))
    failed = [c["detail"] for c in checks if not c.get("ok")]
    if failed:
        return {"stage_error": "not staged: " + "; ".join(failed)}
    try:
        said = user_files(_stage_in_child, script, config)
    except FsUserError as exc:  # noqa: F821 - distrun_fsuser.py, shipped in front
        return {"stage_error": str(exc)}
    if "error" in said:
        return {"stage_error": said["error"]}
    try:
        return {"staged": str(said["staged"]), "stage_changed": bool(said.get("changed")),
                "stage_created": [str(d) for d in said.get("created") or []]}
    except (KeyError, TypeError):
        return {"stage_error": f"the stage step said {str(said)[:300]!r}"}


def body(report):
    global STEP
    try:
        pwd.getpwnam(USER)
    except KeyError:
        # Nothing below means anything without the training user: the node was never set up.
        report["setup"] = {"ok": False, "detail": f"distrun never set up {CFG['host']}: no user {USER}"}
        return
    STEP = "ssh fingerprint"
    report["ssh_fingerprint"] = ssh_fingerprint()
    if not os.path.exists(f"{PREFIX}/bin/python"):
        report["setup"] = {"ok": False, "detail": f"distrun never set up {CFG['host']}: no env {PREFIX}"}
        return
    report["setup"] = {"ok": True, "detail": f"user {USER} and env {PREFIX}"}
    if CFG.get("addresses"):
        STEP = "addresses"
        report["addresses"] = probe_addresses()
    STEP = "env, versions, shared folder, ssh, names"
    ompi_f = in_thread(probe_openmpi)
    env_f = in_thread(probe_env_once, ompi_f)
    writable_f = in_thread(probe_writable, CFG["shared_dir"])
    check_ssh = probe_banner if CFG.get("ssh_mode") == "banner" else probe_ssh
    ssh_f = fan_out(check_ssh, ssh_order(CFG.get("ssh_targets", []), CFG["host"]), limit=SSH_FAN_OUT)
    names_f = fan_out(resolve, CFG.get("names", []))
    env, versions, report["env_probe"] = env_f()
    report["env"] = env
    mpi = versions.pop("_mpi4py", "error: the env's Python did not run")
    report["mpi4py"] = {"ok": mpi.startswith("ok"), "detail": mpi.split(": ", 1)[-1]}
    versions_modules = versions.pop("_modules", {})
    report["versions"] = {"python": versions.get("python", "missing"), "openmpi": ompi_f(),
                          "mpi4py": versions.get("mpi4py", "missing"), "torch": versions.get("torch", "missing"),
                          "jittor": versions.get("jittor", "missing"),
                          "env lock": versions.get("env lock", "missing")}
    report["shared_writable"] = writable_f()
    report["ssh"] = {t: f() for t, f in ssh_f.items()}
    report["names"] = {n: f() for n, f in names_f.items()}
    STEP = "needs"
    modules = versions_modules
    report["needs"] = {f"module {m}": {"ok": bool(modules.get(m)),
                                       "detail": "importable" if modules.get(m) else f"not in {PREFIX}"}
                       for m in CFG.get("modules", [])}
    report["needs"].update(probe_programs(CFG.get("programs", {})))
    if CFG.get("image"):
        STEP = "container image"
        report["image"] = probe_image(CFG["image"])  # noqa: F821 - imageprobe.py, shipped in front
    if CFG.get("mount_fstypes"):
        STEP = "shared folder mount"
        report["shared_mount"] = probe_mount(CFG["shared_dir"], CFG["mount_fstypes"])
    if CFG.get("shared_fs_mounts"):
        STEP = "shared folder filesystem"
        report["shared_fs_mounts"] = mounts_above(CFG["shared_dir"])
    if CFG.get("slurm"):
        STEP = "slurm"
        report["slurm"] = probe_slurm(CFG.get("slurm_partition") or "")
    if CFG.get("shared_probe"):
        STEP = "shared folder probe file"
        # A unique name: two checks at once, or a file left by a killed check, never match.
        path = os.path.join(CFG["shared_dir"], f".distrun-preflight-{os.urandom(6).hex()}")
        report["shared_probe"] = probe_shared_file(path)


STEP = "start"
STAGED = {}  # what the run's stage step said, if it ran
try:
    main()
except Exception:  # noqa: BLE001 - whatever broke, the report names the step; the trace goes to the log
    import traceback

    traceback.print_exc()
    print(json.dumps({"host": CFG["host"], "probe_error": {"step": STEP}, **STAGED}, sort_keys=True))
