"""Files of a user, as that user: root switches only its filesystem identity.

The primitive every root step uses to touch a path a user can write (the user's home, the shared
folder, a run's folder). The process stays uid 0: no process of the user's uid can trace it,
signal it or feed it an answer; but from the switch on, the kernel checks every path component
and every file it opens or creates as that user (``setfsuid``/``setfsgid`` and the user's
groups), the capabilities that would override those checks leave its effective set, and what it
creates belongs to the user. A link a job planted reaches only what the user could reach anyway.

Linux keeps the filesystem identity per thread, and a process that took the user's identity can
no longer read root's own files (an Ansible module's payload among them): ``as_user_fs`` runs the
work in a forked child of one thread, which takes the identity, and hands its JSON answer back
over a pipe between the two root processes. Whatever the caller learns is the kernel's answer to
its own calls, never a user process's output. Standard library only, Python 3.9 or newer, and no
``from __future__``: the node programs that need it (the preflight's probe, role job's stage,
follow and collect steps) are sent with this text in front of their own.
"""

import ctypes
import json
import os
import pwd

_NO_CHANGE = 0xFFFFFFFF  # setfsuid/setfsgid with an invalid id only answer the current one


class FsUserError(Exception):
    """The switch could not be made (one line: why, and the fix)."""


_LIBC: list = []  # the C library's handle, found once (before any fork: a child only uses it)


def _libc():
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library this interpreter already has
        for name in ("setfsuid", "setfsgid"):
            getattr(libc, name).argtypes = [ctypes.c_uint]
            getattr(libc, name).restype = ctypes.c_int
        _LIBC.append(libc)
    return _LIBC[0]


def become(user):
    """Switch this process's filesystem identity (and groups) to user's; its passwd entry.

    As root: the switch, then a check that it took. Already running as that user (a connection
    that cannot be root): nothing to switch. Anyone else: FsUserError."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise FsUserError(f"there is no user {user} here: run distrun setup") from None
    if os.geteuid() != 0:
        if os.geteuid() == pw.pw_uid:
            return pw
        raise FsUserError(f"running as uid {os.geteuid()}, neither root nor {user}")
    libc = _libc()
    os.setgroups(os.getgrouplist(user, pw.pw_gid))
    libc.setfsgid(pw.pw_gid)
    libc.setfsuid(pw.pw_uid)
    if libc.setfsuid(_NO_CHANGE) != pw.pw_uid or libc.setfsgid(_NO_CHANGE) != pw.pw_gid:
        raise FsUserError(f"could not take the filesystem identity of {user} (uid {pw.pw_uid})")
    return pw


def identity():
    """This process's filesystem uid and gid as the kernel has them."""
    libc = _libc()
    return libc.setfsuid(_NO_CHANGE), libc.setfsgid(_NO_CHANGE)


def as_user_fs(user, work, *args):
    """work(*args) in a forked child that took user's filesystem identity (``become``): its value
    (JSON data), or FsUserError with the line that says why it failed (an OSError's included)."""
    _libc()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one thread, root with the user's filesystem identity
        os.close(read_end)
        try:
            become(user)
            said = {"value": work(*args)}
        except FsUserError as exc:
            said = {"error": str(exc)}
        except OSError as exc:
            said = {"error": f"{exc.strerror or exc}{': ' + exc.filename if exc.filename else ''}"}
        except BaseException as exc:  # noqa: BLE001 - the parent says what broke, the child only ends
            said = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(write_end, json.dumps(said).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    try:
        said = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        said = {}
    if "value" not in said:
        raise FsUserError(said.get("error") or f"the step as {user} ended without an answer")
    return said["value"]
