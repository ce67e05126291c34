"""Put a run's files in place on one node, with the training user's rights, in one round trip.

Run by role job's stage step as a raw command (a script needs no Ansible module around it):
``python3 -I -c <distrun_fsuser.py + nodecommon.py + this file> <config JSON>`` (role distrun's
module_utils/distrun_fsuser.py: the switch of a root process's filesystem identity; nodecommon.py,
the node programs' shared head: the run id's rule); on a run's first attempt, by role preflight's
probe instead, after its checks (the same round trip). Run as root, it first takes the training
user's filesystem identity (the config's ``user``) and stays root otherwise: every file it reads or
writes is checked as that user's, and no process of that user's is involved, whose answer a job
could forge. The runner sent the run's files ahead of the play over
the run's ssh connection, into the training user's ``~/.cache/distrun/incoming/<run id>.json``
(a 0600 file: the bundle, base64 of a tar.gz holding run/ and workloads/, and the run's
variables, possibly secrets, which never go on a command line); the config says whether that
upload succeeded. This script unpacks the bundle into the run folder (mode 0750), copies the
reference workloads into the shared folder unless the same digest is there, writes the
variables to ``<run_dir>/env.sh`` (0600), removes the upload, and prints
``{"changed": ..., "staged": RUN_ID, "created": [the run's folders it made]}``.
Standard library only.
"""

import base64
import io
import json
import os
import pwd
import sys
import tarfile

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): the head and the switch of identity
    _HERE = os.path.dirname(os.path.abspath(__file__))
    for _part in (f"{_HERE}/nodecommon.py", f"{_HERE}/../../distrun/module_utils/distrun_fsuser.py"):
        with open(_part, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _part, "exec"))  # the same one namespace as the composed source on a node


class StageError(Exception):
    """What went wrong, in one line for the user."""


def safe_run_id(run_id: str) -> bool:
    """A run id names a folder under the shared folder's runs/: one plain path component, as
    every node program takes a run id (nodecommon.py's plain_name)."""
    return plain_name(run_id)


def fs_uid() -> int:
    """The uid this process acts on files with (the kernel's filesystem uid: the training user's
    after the switch, root's own otherwise)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[4])
    except (OSError, IndexError, ValueError):
        pass
    return os.getuid()


def incoming_path(run_id: str) -> str:
    """Where the runner's upload for run_id waits, in the training user's own home."""
    home = pwd.getpwuid(fs_uid()).pw_dir
    return os.path.join(home, ".cache", "distrun", "incoming", f"{run_id}.json")


def _private_dir(path: str) -> bool:
    """The folder, 0750; True when this call made it."""
    made = not os.path.lexists(path)
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o750)  # other local users may not read a run: its logs, its program, its env file
    return made


def _members(bundle: str) -> list[tuple[str, str, int, bytes | None]]:
    """The bundle's folders and regular files, unpacked here in memory: (top folder, path below
    it, mode, contents; None for a folder). A link, a device or a name that leaves the bundle
    refuses the stage: nothing the bundle holds is written anywhere but below its two folders."""
    out: list[tuple[str, str, int, bytes | None]] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(bundle)), mode="r:gz") as tar:
            for m in tar:
                parts = [x for x in m.name.split("/") if x not in ("", ".")]
                if m.name.startswith("/") or ".." in parts or not parts:
                    raise StageError(f"the run's bundle holds {m.name!r}, a name outside the run")
                if m.isdir():
                    out.append((parts[0], "/".join(parts[1:]), m.mode, None))
                elif m.isfile():
                    fh = tar.extractfile(m)
                    out.append((parts[0], "/".join(parts[1:]), m.mode, fh.read() if fh else b""))
                else:
                    raise StageError(f"the run's bundle holds {m.name!r}, which is not a file or a folder")
    except (tarfile.TarError, EOFError, ValueError, OSError) as exc:
        raise StageError(f"the run's bundle does not unpack on the node: {exc}") from None
    return out


def _put(root: str, rel: str, mode: int, data: bytes | None) -> None:
    """One member below root: a folder made, a file written whole and renamed into place (a link
    in its place is replaced, never followed), with its mode (less the umask)."""
    path = os.path.join(root, rel) if rel else root
    if data is None:
        os.makedirs(path, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        os.fchmod(fh.fileno(), (mode & 0o777 or 0o644) & ~0o022)
    os.replace(tmp, path)


def _write_env(path: str, text: str) -> None:
    """env.sh for the training user only; a link or a file in its place is replaced, never followed."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text if text.endswith("\n") else text + "\n")
    os.replace(tmp, path)


def stage(p: dict, created: list | None = None) -> bool:
    """Unpack p["bundle"] and write p["env"] as the run's files; True when new workloads were
    copied (the node changed). ``created`` gets the run's folders this call made."""
    created = [] if created is None else created
    os.umask(0o022)
    updated = False
    members = _members(p["bundle"])
    if _private_dir(p["run_dir"]):
        created.append(p["run_dir"])
    if p["checkpoint_dir"]:
        if _private_dir(p["checkpoint_dir"]):
            created.append(p["checkpoint_dir"])
    for top, rel, mode, data in members:
        if top == "run" and rel:  # the run dir keeps its own mode
            _put(p["run_dir"], rel, mode, data)
    workloads = os.path.join(p["shared_dir"], "workloads")
    marker = os.path.join(workloads, f".digest-{p['workloads_digest']}")
    if any(top == "workloads" for top, _, _, _ in members) and not os.path.exists(marker):
        os.makedirs(workloads, exist_ok=True)
        for top, rel, mode, data in members:
            if top == "workloads" and rel:
                _put(workloads, rel, mode, data)
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(p["workloads_digest"] + "\n")
        updated = True
    if p["env"]:
        _write_env(os.path.join(p["run_dir"], ENV_FILE), p["env"])
    return updated


def take_upload(run_id: str) -> dict:
    """The runner's upload for run_id, read once (never through a link) and removed."""
    path = incoming_path(run_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StageError(f"the run's files are not in {path} ({exc.strerror}): the upload did not reach this node") from None
    try:
        with os.fdopen(fd, encoding="utf-8") as fh:
            data = json.load(fh)
    finally:
        os.unlink(path)
    if not isinstance(data, dict) or not isinstance(data.get("bundle"), str) or not isinstance(data.get("env", ""), str):
        raise StageError(f"{path} is not an upload of distrun's")
    return data


def staged(cfg: dict) -> dict:
    """Stage the run: {"changed", "staged", "created"}, or StageError."""
    run_id = str(cfg.get("run_id", ""))
    if not safe_run_id(run_id):
        raise StageError(f"distrun_run_id={run_id} is empty or unsafe; runs are staged by 'distrun train'")
    if cfg.get("upload") != "ok":
        raise StageError(f"the run's files did not reach the nodes: {cfg.get('upload') or 'no answer'}")
    data = take_upload(run_id)
    try:
        created: list = []
        updated = stage({**cfg, "bundle": data["bundle"], "env": data.get("env", "")}, created)
    except OSError as exc:
        raise StageError(f"staging into {cfg['run_dir']} failed: {exc}") from None
    # created: what a refused run removes again when it was staged before the judge (preflight's probe).
    return {"changed": updated, "staged": run_id, "created": created}


def main(cfg: dict) -> None:
    if os.geteuid() == 0 and cfg.get("user"):
        try:
            become(str(cfg["user"]))  # noqa: F821 - distrun_fsuser.py, sent in front of this program
        except FsUserError as exc:  # noqa: F821
            raise StageError(f"not staged: {exc}") from None
    print(json.dumps(staged(cfg)))


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except StageError as exc:
        print(exc, file=sys.stderr, flush=True)  # the task's error: the last line of its stderr
        sys.exit(1)
