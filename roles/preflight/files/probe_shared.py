# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The shared folder checks: writable by the training user (asked with that user's rights), the
mount where it must be one, the mount lines that hold it, the head's probe file (judged by
runner/distrun/preflight/sharedfs.py)."""

import os
import pwd


def probe_writable(cfg: ProbeConfig, path: str) -> dict:
    try:
        if user_files(cfg, may_write, path):
            return {"ok": True, "detail": f"{path} is writable by {cfg.user}"}
    except FsUserError as exc:
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
    return {"ok": False, "detail": f"{path} is not writable by {cfg.user} (owner {owner}, mode {st.st_mode & 0o7777:04o})"}


def probe_shared_file(cfg: ProbeConfig) -> dict:
    """The head writes the probe file (nfs, sshfs, external: every other node must see it), under
    a unique name: two checks at once, or a file left by a killed check, never match."""
    path = os.path.join(cfg.shared_dir, f".distrun-preflight-{os.urandom(6).hex()}")
    try:
        user_files(cfg, new_file, path)
    except FsUserError as exc:
        return {"ok": False, "file": path, "detail": f"cannot create {path} as {cfg.user}: {exc}"}
    return {"ok": True, "file": path, "detail": f"wrote {path}"}


def probe_mount(cfg: ProbeConfig, path: str, fstypes: list[str]) -> dict:
    """The shared folder must be the mounted filesystem itself (an empty mount point is writable too).

    Read from /proc/self/mounts, not by stat: a FUSE mount that only its user may enter is not
    stat-able by root.
    """
    try:  # an automount (nfs x-systemd.automount) mounts on access
        user_files(cfg, os.path.isdir, path + "/.")
    except FsUserError:
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


def mounts_above(path: str) -> list[str]:
    """The mount table's lines for the path and its parents (the judge picks the one that holds it):
    an external shared filesystem must be the same one on every node."""
    parts = [p for p in os.path.normpath(path).split("/") if p]
    candidates = {"/"} | {"/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)}
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return [line.strip() for line in fh if len(line.split()) >= 3 and line.split()[1].replace("\\040", " ") in candidates]

