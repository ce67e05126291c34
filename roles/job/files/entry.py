"""distrun's one root entry point on a node where people have accounts of their own (the
inventory's distrun_users): the only program a person runs as root, through one sudo rule (role
people's /etc/sudoers.d/distrun-entry names this file's installed path, and nothing else).

``sudo -n /usr/local/lib/distrun/entry-<digest>.py PROGRAM VERB '<config JSON>'``, any secret on
stdin (handed on). PROGRAM is one of root's node programs setup installed beside this file (the
one recipe, distrun.transport.nodeprog, writes their paths into PROGRAMS below), VERB one of its
verbs; the program's answer is its own. A refused call is one line on stderr and exit 2, naming
what was asked and who called.

The caller is the kernel's and sudo's word, never the request's: ``SUDO_UID``, which sudo sets
itself (and resets the rest of the environment: the caller cannot pass it), when this process
runs as root; root without sudo (the single-account mode's root connection) is root.
  - A caller who is not an admin (root's /etc/distrun/admins, written by setup from
    distrun_admins) acts as themself only: the config's ``user`` must be the caller.
  - A verb about a run (the config's ``run``: stop, scan, follow, state, launch, ...) acts only
    on a run whose units on this node (launch.py's ``distrun:<run>:<attempt>:<host>.service``)
    all run as the config's user: systemd's answer, which no process of a person's can change.
  - An admin acts on everyone's runs; their act on another person's is written to the journal
    (``logger -t distrun``).
  - ``proc`` (node.py's view of another /proc, for tests) is root's alone.
Root itself (no SUDO_UID) acts for the config's user, as the node programs do when sent.
Sent behind the node programs' head (nodecommon.py: NAME, UNIT), as each of them is; installed
with its #! line first (nodeprog.ENTRY_SHEBANG). Standard library only; Python 3.9 or newer.
"""

import json
import os
import pwd
import stat
import subprocess
import sys

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): nodecommon.py from beside it
    _HEAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nodecommon.py")
    with open(_HEAD, encoding="utf-8") as _head:
        exec(compile(_head.read(), _HEAD, "exec"))  # the same one namespace as the composed source on a node

PROGRAMS: dict = {}  # the recipe writes the installed programs' paths here (nodeprog.text)
# Each program's verbs a caller may ask for.
VERBS = {"node": ("scan", "stop", "claim"), "launch": ("launch",), "attempt": ("follow", "state"),
         "sign": ("sign",), "files": ("put", "remove"), "pack": ("pack",)}
ADMINS = "/etc/distrun/admins"  # one name a line, root's (role people writes it)
PYTHON = "/usr/bin/python3"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class Refused(Exception):
    """A call refused, in one line."""


def caller() -> str:
    """Who called: sudo's SUDO_UID (root's process, sudo started it), else root itself."""
    if os.geteuid() != 0:
        raise Refused("not root: run it through its sudo rule (sudo -n <this file> ...)")
    sudo = os.environ.get("SUDO_UID")
    if sudo is None:
        return "root"
    try:
        return pwd.getpwuid(int(sudo)).pw_name
    except (ValueError, KeyError):
        raise Refused(f"sudo's caller uid {sudo[:20]!r} is no account here") from None


def admins(path: str = ADMINS) -> set:
    """The admins root's file names; none where it is missing or anyone but root could write it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return set()
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != 0 or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            return set()
        return {w for w in (line.strip() for line in f.read(1 << 16).splitlines()) if NAME.fullmatch(w)}


def _account(name: str) -> str:
    """A unit's User= (a number or a name) as an account name."""
    try:
        return pwd.getpwuid(int(name)).pw_name if name.isdigit() else name
    except KeyError:
        return name


def run_owners(run: str) -> set:
    """The accounts the run's units on this node run as (systemd's answer), none without systemd."""
    if not os.path.isdir("/run/systemd/system"):
        return set()
    listed = subprocess.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--type=service",
                             f"distrun:{run}:*"], capture_output=True, text=True, timeout=30, check=False, env=ENV)
    units = [w[0] for w in (ln.split() for ln in listed.stdout.splitlines()) if w and UNIT.fullmatch(w[0])]
    units = [u for u in units if UNIT.fullmatch(u).group(1) == run]
    if not units:
        return set()
    shown = subprocess.run(["systemctl", "show", "--property=Id,LoadState,User", "--", *units],
                           capture_output=True, text=True, timeout=30, check=False, env=ENV)
    owners, answered = set(), set()
    for block in shown.stdout.split("\n\n"):
        props = dict(ln.split("=", 1) for ln in block.splitlines() if "=" in ln)
        if props.get("Id") in units:
            answered.add(props["Id"])
            if props.get("LoadState") != "not-found":  # ended since it was listed: nobody's now
                # A unit without User= runs as root: no person's run, nobody's to act on but root's.
                owners.add(_account(props.get("User", "")) if props.get("User") else "root")
    # A unit systemd listed but did not describe: whose it is is unknown, so it is no one's to act on.
    return owners | ({"an account systemd did not name"} if answered != set(units) else set())


def allowed(program: str, verb: str, cfg: dict, who: str) -> str:
    """The config's user, when who may ask program's verb with cfg; Refused otherwise."""
    asked = f"{program} {verb} as {cfg.get('user')!r}" + (f" (run {cfg['run']})" if "run" in cfg else "")
    user = cfg.get("user")
    if not isinstance(user, str) or not NAME.fullmatch(user):
        raise Refused(f"{asked}: the config names no user")
    if who == "root":
        return user
    is_admin = who in admins()
    if user != who and not is_admin:
        raise Refused(f"{asked} refused: {who} called, who is not an admin and acts as {who} only")
    try:
        if pwd.getpwnam(user).pw_uid == 0:
            raise Refused(f"{asked} refused: {who} called; no person acts as root")
    except KeyError:
        raise Refused(f"{asked}: no account {user!r} here") from None
    if cfg.get("proc", "/proc") != "/proc":
        raise Refused(f"{asked} refused: {who} called; another /proc is root's to name")
    run = cfg.get("run")
    if run is not None:
        if not isinstance(run, str) or not NAME.fullmatch(run):
            raise Refused(f"{asked}: run {run!r} is not a run id")
        others = sorted(run_owners(run) - {user})
        if others:
            raise Refused(f"{asked} refused: {who} called; run {run} here is {', '.join(others)}'s")
    return user


def main(argv: list) -> int:
    try:
        if len(argv) != 3:
            raise Refused("usage: entry PROGRAM VERB '<config JSON>'")
        program, verb, text = argv
        if verb not in VERBS.get(program, ()):
            raise Refused(f"{program[:40]!r} {verb[:40]!r} is not one of: "
                          + "; ".join(f"{p} {'|'.join(v)}" for p, v in VERBS.items()))
        try:
            cfg = json.loads(text)
        except ValueError:
            cfg = None
        if not isinstance(cfg, dict):
            raise Refused(f"{program} {verb}: the config is not a JSON object")
        who = caller()
        user = allowed(program, verb, cfg, who)
        path = PROGRAMS.get(program, "")
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise Refused(f"{program} {verb}: {path or program} is not root's installed program: run distrun setup")
    except Refused as exc:
        print(f"distrun entry: {exc}", file=sys.stderr, flush=True)
        return 2
    if who not in ("root", user):
        subprocess.run(["logger", "-t", "distrun", "--", f"admin {who} ran {program} {verb} as {user}"
                        + (f" on run {cfg['run']}" if "run" in cfg else "")], timeout=10, check=False, env=ENV)
    os.execve(PYTHON, [PYTHON, "-I", path, verb, json.dumps(cfg)], ENV)
    return 0  # not reached: execve replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
