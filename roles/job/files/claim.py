"""node.py's claim verb, composed before it (transport/nodeprog.RECIPES): a run takes a host, or
some of its GPUs, for as long as its controller holds the claim and its processes live there.
Standard library only; Python 3.9 or newer. It calls node.py's scan and _read (the same one
namespace once composed).

The rules (claim's docstring): a run without GPUs takes the whole host, one run at a time, as
before GPUs were claimed; runs with GPUs share a host while their GPUs are disjoint, and each
holder is named, with its owner, to the run it refuses.
"""

import errno
import fcntl
import json
import os
import pwd
import select
import sys
import time

CLAIMS = os.path.join(RECORDS, "claims")  # root's claims: a root process holds its lock there
LOCK_WAIT_S = 3.0  # how long a claim waits for the host's lock (another claim deciding) or its holder's name


def _locked_by_another(path: str) -> bool:
    """Whether another process holds path's lock (a GPU claim's controller is starting or following)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False  # no such lock: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _gpu_records(path: str) -> dict:
    """The host's GPU claims as the last claim wrote them: run -> {"gpu_ids": [...], "owner": name}."""
    try:
        got = json.loads((_read(path, 1 << 20) or b"{}").decode(errors="replace"))
    except ValueError:
        return {}
    out = {}
    for run, rec in (got.items() if isinstance(got, dict) else ()):
        gpus = rec.get("gpu_ids") if isinstance(rec, dict) else None
        if NAME.fullmatch(str(run)) and isinstance(gpus, list) and all(isinstance(g, int) for g in gpus):
            out[run] = {"gpu_ids": sorted(set(gpus)), "owner": str(rec.get("owner") or "")[:80]}
    return out


def _write_records(path: str, records: dict, dropped: "set[str]" = frozenset()) -> None:
    """Replace the host's GPU claims (written aside, then renamed: a reader sees the old or the new);
    the locks of the ``dropped`` runs' claims go with their records (nobody holds them)."""
    for run in dropped:
        try:
            os.unlink(path[:-len(".gpus")] + f"@{run}.lock")
        except OSError:
            pass
    aside = path + ".new"
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps(records, sort_keys=True).encode())
    finally:
        os.close(fd)
    os.rename(aside, path)


def _gpu_list(value: object, what: str) -> "list[int] | None":
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1024
                                              for g in value):
        raise CallError(f"claim: {what} {value!r} is not a list of GPU indices")
    return sorted(set(value))


def _owner(cfg: dict) -> str:
    """Whose claim it is: the caller sudo names (the root entry point's caller: sudo sets SUDO_UID,
    and resets what the caller could), else the account the config names (root's connection acts
    for the training user), else this process's own; never a name the config says is the owner."""
    try:
        return pwd.getpwuid(int(os.environ["SUDO_UID"])).pw_name
    except (KeyError, ValueError, OverflowError):
        return str(cfg.get("user") or pwd.getpwuid(os.getuid()).pw_name)


def claim(cfg: dict) -> dict:
    """Take the host, or the GPUs ``gpus`` of it, for a run, or say who has them; then hold the
    claim while the controller's lines come.

    A claim without GPUs ("gpu_ids" absent or empty) takes the whole host, as one run at a time: it
    holds the host's lock for its life and is refused while any other run holds the lock, holds
    GPUs here, or has processes here. A GPU claim holds the host's lock only while it decides: it
    is refused by a whole-host holder, by processes of a run that holds no GPU claim here (that
    run has the whole host), and by a live holder of any of the same GPUs; else it records its
    GPUs in busy-<host>.gpus, holds busy-<host>@<run>.lock for its life and lets the host's lock
    go. A GPU record lives while its lock is held (the controller is starting or following) or
    while its run has processes here (a detached run); a dead one is dropped by the next claim.
    ``"ask": true`` takes nothing and answers which of the host's ``total`` GPUs are free."""
    host, run, hold = cfg["host"], cfg["run"], float(cfg.get("hold_s", 20))
    if not NAME.fullmatch(str(host)):
        raise CallError(f"host {host!r} is not a plain name")
    wanted = _gpu_list(cfg.get("gpu_ids"), "gpu_ids") or None
    total = cfg.get("total")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or not 0 <= total <= 1024):
        raise CallError(f"claim: total {total!r} is not a number of GPUs")
    folder = CLAIMS if os.geteuid() == 0 else os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".cache", "distrun")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if os.geteuid() == 0 and (os.lstat(folder).st_uid != 0 or os.lstat(folder).st_mode & 0o022):
            raise OSError(errno.EPERM, "not a folder only root writes")
        lock = os.open(os.path.join(folder, f"busy-{host}.lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return {"verb": "claim", "claimed": False, "error": f"cannot write the claims' folder: {exc.strerror}"}
    named = os.path.join(folder, f"busy-{host}.run")
    recorded = os.path.join(folder, f"busy-{host}.gpus")
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:  # a whole-host holder names its run once its scan found no other; a GPU claim decides and goes
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            holder = (_read(named, 80) or b"").decode(errors="replace").strip()
            if NAME.fullmatch(holder) or time.monotonic() >= deadline:
                return {"verb": "claim", "claimed": False, "held": True,
                        "runs": [holder if NAME.fullmatch(holder) else ""]}
            time.sleep(0.05)
    try:  # emptied first: a whole-host holder that was killed left its run's name
        fd = os.open(named, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        others = sorted(r for r in scan({"proc": cfg.get("proc"), "user": cfg.get("user")})["runs"] if r != run)
        records, live = _gpu_records(recorded), {}
        for r, rec in records.items():
            if r == run:
                continue
            held_now = _locked_by_another(os.path.join(folder, f"busy-{host}@{r}.lock"))
            if held_now or r in others:
                live[r] = {**rec, "held": held_now}
        whole = [r for r in others if r not in live]  # processes of a run without a GPU claim: the whole host is its
        taken = sorted({g for rec in live.values() for g in rec["gpu_ids"]})
        free = [g for g in range(total) if g not in taken] if total is not None and not whole else None
        owners = {r: rec["owner"] for r, rec in live.items() if rec["owner"]}
        if cfg.get("ask"):
            return {"verb": "claim", "claimed": False, "asked": True, "free": free or [], "runs": whole, "owners": owners}
        if wanted is None:
            if whole or live:
                if set(records) != set(live):
                    _write_records(recorded, {r: records[r] for r in live}, set(records) - set(live) - {run})
                return {"verb": "claim", "claimed": False, "held": not whole and all(rec["held"] for rec in live.values()),
                        "runs": sorted({*whole, *live}), "owners": owners}
            os.write(fd, f"{run}\n".encode())
            if records:
                _write_records(recorded, {}, set(records) - {run})
        else:
            clash = {r: sorted(set(wanted) & set(rec["gpu_ids"])) for r, rec in live.items()}
            clash = {r: g for r, g in clash.items() if g}
            if whole or clash:
                if set(records) != set(live):
                    _write_records(recorded, {r: records[r] for r in live}, set(records) - set(live) - {run})
                return {"verb": "claim", "claimed": False, "runs": whole or sorted(clash),
                        "held": not whole and all(live[r]["held"] for r in clash),
                        "gpu_ids": sorted({g for held in clash.values() for g in held}) if not whole else [],
                        "free": free, "owners": {r: o for r, o in owners.items() if r in clash}}
            mine = os.open(os.path.join(folder, f"busy-{host}@{run}.lock"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            fcntl.flock(mine, fcntl.LOCK_EX)  # only this run's claim takes it, under the host's lock
            owner = _owner(cfg)
            _write_records(recorded, {**{r: records[r] for r in live}, run: {"gpu_ids": wanted, "owner": owner}},
                           set(records) - set(live) - {run})
            fcntl.flock(lock, fcntl.LOCK_UN)  # the next claim may decide now: this run's GPUs are recorded
    except OSError as exc:
        return {"verb": "claim", "claimed": False, "error": f"cannot write {named}: {exc.strerror}"}
    answer({"verb": "claim", "claimed": True, "runs": [], "gpu_ids": wanted or []})
    while select.select([sys.stdin], [], [], hold)[0] and sys.stdin.readline():
        pass  # held while heartbeats come; a closed stdin (the controller gone) or silence ends it
    if wanted is None:
        os.ftruncate(fd, 0)  # let go: no run's name is left for the next holder's wait
    sys.exit(0)
