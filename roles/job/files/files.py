"""distrun's node program for the run's files the runner itself writes or removes in the training
user's folders: the upload a run's stage step unpacks, what a refused run staged, a finished run's
env.sh.

``python3 -I -c <nodecommon.py + distrun_fsuser.py + this file> VERB '<config JSON>'``. Run as
root (where the connection can be root), it first takes the training user's filesystem identity
(``user``): every path is checked with that user's rights, a link a job planted reaches nothing the
user could not, and no process of that user's, which a job could trace, read the run's secrets
from or make answer anything, ever holds them. Otherwise it runs as that user. Standard library
only; Python 3.9 or newer.

  put     {"user": U, "run": R}  stdin (the run's bundle and variables, JSON) kept as
          ~U/.cache/distrun/incoming/R.json, 0600 in a 0700 folder: {"put": bytes}
  remove  {"user": U, "run": R, "paths": [absolute paths]}  the run's upload (if any) and each
          path, a file or a folder with what it holds: {"removed": n, "kept": [paths it could not]}
"""

import json
import os
import pwd
import shutil
import stat
import sys

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): the head and the switch of identity
    _HERE = os.path.dirname(os.path.abspath(__file__))
    for _part in (f"{_HERE}/nodecommon.py", f"{_HERE}/../../distrun/module_utils/distrun_fsuser.py"):
        with open(_part, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _part, "exec"))  # the same one namespace as the composed source on a node

UPLOAD_MAX = 4 << 30  # an upload is the run's bundle: far below this


def incoming(user: str) -> str:
    return os.path.join(pwd.getpwnam(user).pw_dir, ".cache", "distrun", "incoming")


def _folders(path: str) -> None:
    """path's folders below the home, made 0700 where missing; a link there is refused."""
    home = os.path.dirname(os.path.dirname(os.path.dirname(path)))
    for folder in (os.path.join(home, ".cache"), os.path.dirname(path), path):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise OSError(f"{folder} is not a folder (a link?)") from None


def put(cfg: dict) -> dict:
    folder = incoming(cfg["user"])
    _folders(folder)
    name, tmp = f"{cfg['run']}.json", f".{cfg['run']}.tmp-{os.getpid()}"
    fd = os.open(os.path.join(folder, tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    size = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            while True:
                chunk = sys.stdin.buffer.read(1 << 20)
                if not chunk:
                    break
                size += len(chunk)
                if size > UPLOAD_MAX:
                    raise OSError("the upload is larger than 4 GiB")
                fh.write(chunk)
        os.replace(os.path.join(folder, tmp), os.path.join(folder, name))
    except BaseException:
        try:
            os.unlink(os.path.join(folder, tmp))
        except OSError:
            pass
        raise
    return {"verb": "put", "put": size}


def remove(cfg: dict) -> dict:
    paths = [os.path.join(incoming(cfg["user"]), f"{cfg['run']}.json"), *cfg.get("paths", [])]
    removed, kept = 0, []
    for path in paths:
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed += 1
        except FileNotFoundError:
            continue
        except OSError:
            kept.append(path)
    return {"verb": "remove", "removed": removed, "kept": kept}


def _check(verb: str, cfg: dict) -> None:
    for key in ("user", "run"):
        if not plain_name(cfg.get(key)):
            raise CallError(f"{verb}: {key} {cfg.get(key)!r} is empty or not a plain name")
    paths = cfg.get("paths", [])
    if not (isinstance(paths, list) and all(isinstance(p, str) and os.path.isabs(p) and "\0" not in p for p in paths)):
        raise CallError(f"{verb}: paths {paths!r} is not a list of absolute paths")


def as_the_user(verb):
    """The verb, with the training user's filesystem identity where this program is root."""
    def run(cfg: dict) -> dict:
        if os.geteuid() == 0:
            try:
                become(cfg["user"])  # noqa: F821 - distrun_fsuser.py, sent in front of this program
            except FsUserError as exc:  # noqa: F821
                return {"verb": verb.__name__, "error": str(exc)}
        try:
            return verb(cfg)
        except OSError as exc:
            return {"verb": verb.__name__, "error": f"{exc.strerror or exc}{': ' + exc.filename if exc.filename else ''}"}
    return run


VERBS = {"put": as_the_user(put), "remove": as_the_user(remove)}


def main(argv: list) -> int:
    return serve("files.py", VERBS, argv, _check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
