"""What the cluster key may run on a node: the parsing behind the relay's ``mesh`` verb, which is
sshd's forced command for that key (role ssh_mesh writes it into root's keys file for the training
user). Composed between the programs' head (nodecommon.py) and relay.py into the installed relay
(transport/nodeprog.text); standard library only, Python 3.9 or newer.

What a job could do with that key, start anything on any node outside every unit, is narrowed to
what distrun's own steps send over it: ``true`` (the preflight's login check), sftp (an sshfs
mount), ``rsync --server`` (the sync mode's copies; never its daemon mode, whose configuration may
run commands, nor options sent over the connection) and a daemon's ``join`` in the form Open MPI
writes it (``NAME=VALUE ; export NAME ;`` for PATH and the library paths only, then the relay's
join), which the relay performs in its own process: the daemon starts in the unit, and nothing the
caller set reaches the relay's interpreter. Anything else, a shell included, is refused in one
line, exit 1. The login shell reads none of the user's startup files first (sshd sets SHLVL for
this user: role ssh_mesh).
"""

import os
import re
import shlex

# What the cluster key may run, and nothing else (the docstring says why).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server")
LAUNCH_VARS = ("PATH", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH")  # what Open MPI's --prefix sets
# (--protect-args would send more options over the connection, where they are not seen here.)
RSYNC_REFUSED = ("--daemon", "--config", "--rsh", "--rsync-path", "-e", "--dparam", "--early-input",
                 "--protect-args", "--secluded-args")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-)?\}|([A-Za-z_][A-Za-z0-9_]*))")
_PYTHON = re.compile(r"(?:/[A-Za-z0-9._/-]*/)?python3(?:\.[0-9]+)?")
_RELAY = re.compile(r"relay-[0-9a-f]{12}\.py")


def _expand(value: str, env: dict) -> str:
    """$NAME and ${NAME:-} in an assignment Open MPI wrote, from env (nothing else is shell)."""
    if "`" in value or "$(" in value:
        raise CallError("a command substitution")
    return _REF.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def _statements(tokens: list) -> "list[list]":
    out: list = [[]]
    for t in tokens:
        if t == ";":
            out.append([])
        else:
            out[-1].append(t)
    return [s for s in out if s]


def mesh_plan(command: "str | None", env: dict, programs_dir: str) -> tuple:
    """What sshd's forced command does with the cluster key's request ``command``
    (SSH_ORIGINAL_COMMAND; None for a login shell): ("exit", code), ("exec", argv, env) or
    ("join", run, attempt, argv, env); a CallError names what is refused. ``env``: the session's."""
    if command is None or not command.strip():
        raise CallError("a login shell")
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as e:
        raise CallError(f"a command that does not parse ({e})") from None
    if tokens == ["true"]:
        return ("exit", 0)
    system = {**env, "PATH": SYSTEM_PATH}
    if os.path.basename(tokens[0]) in ("sftp-server", "internal-sftp") and len(tokens) <= 4:
        for server in SFTP_SERVERS:
            if os.access(server, os.X_OK):
                return ("exec", [server], system)
        raise CallError("sftp: no sftp-server on this node")
    if tokens[0] == "rsync" and tokens[1:2] == ["--server"]:
        bad = [t for t in tokens[2:] if t == ";" or any(t == r or t.startswith(r + "=") for r in RSYNC_REFUSED)
               or (t[:1] == "-" and t[1:2] != "-" and "s" in t[1:].split("e", 1)[0])]  # -s in a bundle, before -e's string
        if bad:
            raise CallError(f"rsync {bad[0]}")
        for folder in SYSTEM_PATH.split(":"):
            if os.access(os.path.join(folder, "rsync"), os.X_OK):
                return ("exec", [os.path.join(folder, "rsync"), *tokens[1:]], system)
        raise CallError("rsync: no rsync on this node")
    # Open MPI's daemon start through the relay: assignments, then python3 -I RELAY join RUN ATTEMPT CMD...
    where = next((i for i, t in enumerate(tokens) if _PYTHON.fullmatch(t)), None)
    if where is None or tokens[where + 1:where + 2] != ["-I"] or len(tokens) < where + 7:
        raise CallError("not one of distrun's own commands")
    relay, verb, run, attempt, argv = tokens[where + 2], tokens[where + 3], tokens[where + 4], tokens[where + 5], tokens[where + 6:]
    if (os.path.dirname(relay) != programs_dir.rstrip("/") or not _RELAY.fullmatch(os.path.basename(relay))
            or verb != "join"):
        raise CallError("a Python program other than distrun's relay")
    if not plain_name(run) or not ATTEMPT.fullmatch(attempt):
        raise CallError("a relay join without a run id and attempt")
    if ";" in argv:
        raise CallError("a second command after the relay's")
    out = dict(env)
    for st in _statements(tokens[:where]):
        m = _ASSIGN.fullmatch(st[0]) if len(st) == 1 else None
        if m and m.group(1) in LAUNCH_VARS:
            out[m.group(1)] = _expand(m.group(2), out)
        elif len(st) == 2 and st[0] == "export" and st[1] in LAUNCH_VARS:
            continue
        else:
            raise CallError(f"{' '.join(st)[:60]!r} before the relay (only {', '.join(LAUNCH_VARS)} may be set)")
    return ("join", run, attempt, argv, out)
