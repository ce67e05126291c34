"""The process's edges, which every verb meets before and after its own work: its standard
streams (closed at start, a reader that went away, a full disk, an encoding that cannot hold
Unicode), the folder it was started in, the UTF-8 locale Ansible's children need, an OSError
there told as one line naming the file and the fix (exit 7), and the exit itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from typing import NoReturn

from distrun.errors import ExitCode
from distrun.ui import console as ui


def exit_now(code: str | int | None) -> NoReturn:
    """End the process with a SystemExit's code, without tearing the interpreter down: tens of
    milliseconds of freeing modules that whoever waits for distrun (a script, a benchmark, the
    shell) would wait for too. Exit handlers run and output is flushed first; while a thread that
    is not a daemon still runs, Python's own exit does it all (it waits for such threads and ends
    idle thread pools)."""
    import atexit
    import threading

    if any(t is not threading.current_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("text"): the text on stderr, status 1, as Python does
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers Python's exit would run
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away, or a closed stream: nothing more can be told
    os._exit(status)


def fail(message: str, code: int) -> NoReturn:
    try:
        ui.fatal(message)
    except (OSError, ValueError):
        silence(2)  # stderr is gone or full: the exit code is all that can still be told
    sys.exit(code)


def silence(fd: int) -> None:
    """Point a standard stream that cannot be written at /dev/null, so that nothing written or
    flushed later (at exit too) fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != fd:  # a closed descriptor is the first free one: /dev/null may have taken it
        os.dup2(devnull, fd)
        os.close(devnull)
    name = "stdout" if fd == 1 else "stderr"
    setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 - the process's own stream


def closed_streams() -> list[str]:
    """Python leaves sys.stdout or sys.stderr None when the shell closed it (>&-, 2>&-). Each
    gets /dev/null at once, so that no file distrun opens later takes its descriptor."""
    closed = [name for name in ("stdout", "stderr") if getattr(sys, name) is None]
    for name in closed:
        silence(1 if name == "stdout" else 2)
    return closed


def os_error_line(exc: OSError) -> str:
    """An OSError at the program's edge (a file or folder it writes or reads, its own output) as
    one line: what, why, and the fix (for a file of the state folder: DISTRUN_HOME)."""
    output = exc.errno in (errno.EPIPE, errno.EBADF) or _stdout_cannot_take_more()
    where = exc.filename if exc.filename is not None else ("standard output" if output else "a file distrun writes")
    fixes = {
        errno.ENOSPC: "the disk is full: free some space or write somewhere else",
        errno.EDQUOT: "your disk quota is used up: free some space or write somewhere else",
        errno.EACCES: "you may not write or read there: choose a folder you own or fix its permissions",
        errno.EPERM: "you may not write or read there: choose a folder you own or fix its permissions",
        errno.EROFS: "that file system is read-only: choose a writable folder",
        errno.ENAMETOOLONG: "a name is too long for the file system: choose a shorter name",
        errno.ENOENT: "a folder on that path does not exist: create it first or give another path",
        errno.ENOTDIR: "a part of that path is a file, not a folder: give another path",
        errno.EBADF: "the output is closed: give distrun a file, a pipe or /dev/null for it",
        errno.EIO: "an I/O error: check the disk or the terminal",
    }
    fix = fixes.get(exc.errno or 0, "check that path and its permissions")
    if exc.filename is not None and _in_state_folder(str(exc.filename)):
        fix = fix.replace(" or write somewhere else", "").replace("choose a writable folder", "make it writable") + (
            " (it is in distrun's state folder: or point DISTRUN_HOME at another folder)")
    return f"{where}: {exc.strerror or exc}; {fix}"


def _stdout_cannot_take_more() -> bool:
    """Whether standard output is what a write without a file name failed on: a device that
    is not a terminal (/dev/full), or a file on a full disk."""
    try:
        st = os.fstat(1)
        if stat.S_ISCHR(st.st_mode) and not os.isatty(1):
            return True
        return stat.S_ISREG(st.st_mode) and os.fstatvfs(1).f_bavail == 0
    except OSError:
        return False


def _in_state_folder(path: str) -> bool:
    own = os.environ.get("DISTRUN_HOME") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "distrun")
    return os.path.isabs(own) and os.path.abspath(path).startswith(os.path.abspath(own) + os.sep)


def plain_encoding() -> None:
    """A stream whose encoding cannot hold all of Unicode (PYTHONIOENCODING=ascii, a Latin-1
    terminal) shows what it cannot as escapes (\\u2713), never a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        encoding = str(getattr(stream, "encoding", "") or "").lower().replace("-", "").replace("_", "")
        if reconfigure is not None and encoding not in ("utf8", "utf16", "utf32"):
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def working_folder() -> None:
    """The folder distrun was started in must still exist: relative paths, the project's
    inventories and Ansible's own start read it."""
    try:
        os.getcwd()
    except FileNotFoundError:
        fail(f"the current folder {os.environ.get('PWD', '')!r} was removed while this shell was in it; cd to a "
              "folder that exists (cd ~) and run distrun again", ExitCode.LOCAL_IO)
    except OSError as exc:
        fail(f"the current folder cannot be read ({exc.strerror}); cd to a folder you may read and run distrun again",
              ExitCode.LOCAL_IO)


def utf8_locale() -> None:
    """Ansible refuses to start under a locale that is not UTF-8 (LC_ALL=C from cron, CI or a
    container): distrun's children (ansible-inventory, ansible-playbook) get C.UTF-8 instead,
    the rest of the environment as it was."""
    import locale

    try:
        locale.setlocale(locale.LC_CTYPE, "")
        codeset = locale.nl_langinfo(locale.CODESET)
    except (locale.Error, ValueError, AttributeError):
        codeset = ""
    if codeset.lower().replace("-", "") == "utf8":
        return
    for name in ("C.UTF-8", "C.utf8", "en_US.UTF-8"):
        try:
            locale.setlocale(locale.LC_CTYPE, name)
        except locale.Error:
            continue
        os.environ["LC_ALL"] = name
        return


def output_lost() -> None:
    """Exit 7 where a console's stream failed while the verb went on (ui's consoles went quiet
    then, so a run's record still ended as the run did): quietly where the reader went away
    (distrun train ... | head), as other tools do; with one line on stderr for a full disk."""
    for c in (ui.console, ui.err_console):
        lost = c.lost
        if lost is None:
            continue
        if lost.errno != errno.EPIPE and not c.stderr:
            fail(f"standard output: {lost.strerror or lost}; "
                  f"{os_error_line(lost).split('; ', 1)[1]}", ExitCode.LOCAL_IO)
        sys.exit(ExitCode.LOCAL_IO)
