# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The env and versions check: the env's Python, as root, says its versions, the modules the run
needs and mpi4py's MPI library; root's mpirun, Open MPI's version. Root keeps the env's answer under
a fingerprint of what it depends on, and a run reads it back while that holds, for a day at most
(judged by runner/distrun/preflight/judge.py)."""

import contextlib
import hashlib
import json
import os
import pwd
import re
import stat
import time
from collections.abc import Callable

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


def probe_env(cfg: ProbeConfig) -> tuple[dict, dict]:
    """The env's check ({ok, detail}) and what its Python said (versions, and "_modules" and
    "_mpi4py" for the needs and mpi4py checks)."""
    python = f"{cfg.prefix}/bin/python"
    if not os.path.exists(python):
        return {"ok": False, "detail": f"{python} is missing"}, {}
    # As root: the env is root's (setup checked that no one else can change it), and a process of
    # the training user would answer whatever a job tracing it made it say.
    proc = run(cfg, [python, *ENV_FLAGS, ENV_SCRIPT, json.dumps(cfg.modules)])
    if proc.returncode != 0:
        return {"ok": False, "detail": f"{python} does not start: {last_line(proc.stderr)}"}, {}
    try:
        return {"ok": True, "detail": python}, json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "detail": f"{python} printed no versions: {last_line(proc.stdout)}"}, {}


def _stat_line(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path} {exc.errno}"
    return f"{path} {os.path.realpath(path)} {st.st_ino} {st.st_mode} {st.st_uid} {st.st_gid} {st.st_size} " \
           f"{st.st_mtime_ns} {st.st_ctime_ns}"


def env_fingerprint(cfg: ProbeConfig, openmpi: str) -> str:
    """What the env probe's answer depends on, read without starting the env: the env's folders
    and interpreter, every package's metadata (the versions are read from it; pip and conda add
    and remove these entries, an edit changes their times; a chmod or chown their ctime), the
    training user, the modules asked for, Open MPI's version (libmpi is what mpi4py loads) and
    the script that asks."""
    prefix, user = cfg.prefix, cfg.user
    pw = pwd.getpwnam(user)
    parts = [prefix, user, str(pw.pw_uid), str(pw.pw_gid), pw.pw_dir, str(os.getgrouplist(user, pw.pw_gid)),
             json.dumps(sorted(cfg.modules)), str(openmpi), str(ENV_FLAGS), ENV_SCRIPT]
    lib: list[str] = []
    with contextlib.suppress(OSError):
        lib = sorted(f"{prefix}/lib/{n}" for n in os.listdir(f"{prefix}/lib") if n.startswith("python"))
    paths = [prefix, f"{prefix}/bin", f"{prefix}/bin/python", f"{prefix}/conda-meta", *lib]
    for folder in [f"{d}/site-packages" for d in lib] + [f"{prefix}/conda-meta"]:
        paths.append(folder)
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.name.endswith((".dist-info", ".egg-info")):
                    paths += [e.path, f"{e.path}/METADATA", f"{e.path}/PKG-INFO"]
                elif e.name.endswith(".json"):
                    paths.append(e.path)
    parts += [_stat_line(p) for p in paths]
    return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _env_record_path(cfg: ProbeConfig) -> str:
    key = hashlib.sha256(f"{cfg.prefix}\0{cfg.user}".encode()).hexdigest()[:16]
    return os.path.join(cfg.env_records_dir, f"env-{key}.json")


def recorded_env(cfg: ProbeConfig, fingerprint: str) -> tuple[object, object] | None:
    """The env probe's last answer, when it was taken for this fingerprint within a day; only
    root's own records count (a job, running as the training user, can write none of them)."""
    if os.geteuid() != 0 or not cfg.env_records:
        return None
    try:
        fd = os.open(_env_record_path(cfg), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
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


def record_env(cfg: ProbeConfig, fingerprint: str, env: dict, versions: dict) -> None:
    """Keep a working env's answer for the next probe: root's, 0600 in a 0700 folder of root's."""
    if os.geteuid() != 0:
        return
    try:
        os.makedirs(cfg.env_records_dir, mode=0o700, exist_ok=True)
        st = os.lstat(cfg.env_records_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
            return
        path = _env_record_path(cfg)
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"fingerprint": fingerprint, "time": time.time(), "env": env, "versions": versions}, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # no record: the next probe starts the env's Python again


def probe_env_once(cfg: ProbeConfig, openmpi: Callable[[], str]) -> tuple[dict, dict, str]:
    """probe_env's answer, from root's record while the env's fingerprint is unchanged (and the
    full set, 'distrun check', never reads a record); and how it was got: "recorded" or "ran".
    ``openmpi`` waits for probe_openmpi's answer (in a thread beside this one)."""
    fingerprint = env_fingerprint(cfg, openmpi())
    found = recorded_env(cfg, fingerprint)
    if found is not None and isinstance(found[0], dict) and isinstance(found[1], dict):
        return found[0], dict(found[1]), "recorded"
    env, versions = probe_env(cfg)
    if env.get("ok") and str(versions.get("_mpi4py", "")).startswith("ok"):
        record_env(cfg, fingerprint, env, versions)
    return env, versions, "ran"


def probe_openmpi(cfg: ProbeConfig) -> str:
    """Open MPI's version, as root's own mpirun says it."""
    if not cfg.mpi_prefix:
        # A site's Slurm: its MPI is the site's, behind srun; nothing of distrun's to compare.
        return "the site's (srun)" if cfg.slurm else "unknown (no distrun fact: run distrun setup)"
    mpirun = f"{cfg.mpi_prefix.rstrip('/')}/bin/mpirun"
    proc = run(cfg, [mpirun, "--version"])
    m = re.search(r"\(Open MPI\)\s+(\S+)", proc.stdout)
    if m:
        return m.group(1)
    return "missing" if proc.returncode == 127 else f"unknown ({last_line(proc.stderr or proc.stdout)})"


def versions_report(cfg: ProbeConfig, env_versions: tuple[dict, dict, str], openmpi: str) -> dict:
    """The report's env, env_probe, mpi4py, versions and needs' modules, from what the env said."""
    env, versions, how = env_versions
    mpi = versions.pop("_mpi4py", "error: the env's Python did not run")
    modules = versions.pop("_modules", {})
    return {
        "env_probe": how, "env": env,
        "mpi4py": {"ok": mpi.startswith("ok"), "detail": mpi.split(": ", 1)[-1]},
        "versions": {"python": versions.get("python", "missing"), "openmpi": openmpi,
                     "mpi4py": versions.get("mpi4py", "missing"), "torch": versions.get("torch", "missing"),
                     "jittor": versions.get("jittor", "missing"), "env lock": versions.get("env lock", "missing")},
        "needs": {f"module {m}": {"ok": bool(modules.get(m)), "detail": "importable" if modules.get(m) else f"not in {cfg.prefix}"}
                  for m in cfg.modules},
    }
