"""The people of a cluster: one Unix account per person, as the inventory lists them.

``distrun_users: [{name: alice, ssh_keys: ["ssh-ed25519 AAAA... alice@laptop"], uid: 2001}]`` and
``distrun_admins: [alice]`` (group variables). Without ``distrun_users`` the cluster has one
training account (``distrun_user``) that every run shares, as before: ``read`` answers None.

Checked when the inventory is read, every problem its own line naming the variable, the entry
and the fix: names as useradd takes them and no account distrun or the system keeps for itself,
each name and uid once, uids in the range of ordinary accounts, every key one ``<type> <base64>``
line whose payload names the same type, admins among the people, and fixed uids where the shared
folder is a filesystem the nodes do not own alone (``nfs``, ``external``: a file's owner is its
number there, the same on every node).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrun.errors import InventoryError

USERS_VAR = "distrun_users"
ADMINS_VAR = "distrun_admins"

# useradd's rule (NAME_REGEX on Debian), kept to 32 characters: the name is a path component, a
# unit's name part, an ssh principal and a sudoers group member, and never an option.
_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# Ordinary accounts: above the system range, below nobody (65534) and the range systemd gives
# dynamic users (61184-65519).
UID_MIN, UID_MAX = 1000, 60000
# Names distrun or every Debian system keeps for itself.
RESERVED = frozenset({"root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
                      "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody", "_apt", "sshd",
                      "messagebus", "systemd-network", "systemd-resolve", "systemd-timesync", "munge",
                      "slurm", "distrun-users", "distrun-admins"})
# The key types sshd takes for a user's key (ssh-keygen -t, security keys included).
KEY_TYPES = frozenset({"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                       "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com",
                       "sk-ecdsa-sha2-nistp256@openssh.com"})
# The shared folder modes whose files carry the same uid on every node (a person's files there
# are theirs on every node only when their uid is fixed).
FIXED_UID_MODES = ("nfs", "external")


@dataclass(frozen=True)
class Person:
    name: str
    uid: int | None  # None: whatever useradd gives on each node (sync mode only)
    ssh_keys: tuple[str, ...]
    admin: bool


@dataclass(frozen=True)
class People:
    """Everyone who may run on the cluster, in the inventory's order."""

    persons: tuple[Person, ...]

    def get(self, name: str) -> Person | None:
        return next((p for p in self.persons if p.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.persons)

    @property
    def admins(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.persons if p.admin)


def key_problem(text: str) -> str | None:
    """Why ``text`` is not exactly one public key line ``<type> <base64> [comment]`` (no options
    in front, no second line, a payload that decodes and names the same type), or None."""
    if not isinstance(text, str) or "\n" in text.strip() or "\r" in text or "\0" in text:
        return "is not one line"
    words = text.strip().split(None, 2)
    if len(words) < 2:
        return "is not '<type> <base64> [comment]'"
    kind, blob = words[0], words[1]
    if kind not in KEY_TYPES:
        return f"has type {kind[:40]!r}, not one of {', '.join(sorted(KEY_TYPES))} (options before the key are not taken)"
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return "has a key part that is not base64"
    # The payload starts with its own type as an ssh string: 4 bytes of length, then the name.
    if len(raw) < 4 or raw[4:4 + int.from_bytes(raw[:4], "big")] != kind.encode():
        return f"has a key part that is not an {kind} key"
    return None


def _line(var: str, where: str, what: str) -> str:
    return f"{var}{where}: {what}"


def _person(index: int, entry: object, problems: list[str]) -> Person | None:
    where = f"[{index}]"
    if not isinstance(entry, Mapping):
        problems.append(_line(USERS_VAR, where, "is not a mapping; write {name: alice, ssh_keys: ['ssh-ed25519 ...'], uid: 2001}"))
        return None
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(_line(USERS_VAR, where, f"name {name!r} is not an account name; use lowercase letters, digits, "
                                                 "_ and - (starting with a letter or _), at most 32"))
        return None
    where = f"[{index}] ({name})"
    unknown = sorted(set(map(str, entry)) - {"name", "ssh_keys", "uid"})
    if unknown:
        problems.append(_line(USERS_VAR, where, f"has {', '.join(unknown)}; a person takes name, ssh_keys and uid only"))
    if name in RESERVED:
        problems.append(_line(USERS_VAR, where, "is a name the system or distrun keeps for itself; choose another"))
    uid: int | None = None
    raw_uid = entry.get("uid")
    if raw_uid is not None:
        if isinstance(raw_uid, bool) or not (isinstance(raw_uid, int) or (isinstance(raw_uid, str) and raw_uid.isdigit())):
            problems.append(_line(USERS_VAR, where, f"uid {raw_uid!r} is not a number"))
        elif not UID_MIN <= int(raw_uid) <= UID_MAX:
            problems.append(_line(USERS_VAR, where, f"uid {raw_uid} is outside {UID_MIN}-{UID_MAX}, the ordinary accounts' range"))
        else:
            uid = int(raw_uid)
    keys = entry.get("ssh_keys", [])
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list) or not keys:
        problems.append(_line(USERS_VAR, where, "has no ssh_keys; give the public key(s) this person logs in with"))
        keys = []
    good: list[str] = []
    for k, key in enumerate(keys):
        why = key_problem(key) if isinstance(key, str) else "is not text"
        if why:
            problems.append(_line(USERS_VAR, f"{where} ssh_keys[{k}]", f"{why}; paste one line of the person's .pub file"))
        else:
            good.append(" ".join(key.strip().split()))
    return Person(name=name, uid=uid, ssh_keys=tuple(good), admin=False)


def problems_and_people(group_vars: Mapping[str, Any], shared_fs_mode: str,
                        training_user: str) -> tuple[list[str], People | None]:
    """Every problem with the inventory's people (one line each) and the people it lists (None
    when it lists none: the single training account)."""
    raw = group_vars.get(USERS_VAR)
    admins_raw = group_vars.get(ADMINS_VAR)
    if raw is None or raw == []:
        if admins_raw:
            return [f"{ADMINS_VAR} is set but {USERS_VAR} is not; list the people in {USERS_VAR} first"], None
        return [], None
    if isinstance(raw, str) and "{{" in raw:
        return [], None  # a template only Ansible renders: setup's role checks it
    problems: list[str] = []
    if not isinstance(raw, list):
        return [f"{USERS_VAR} is not a list; write a list of {{name, ssh_keys, uid}} entries"], None
    persons = [p for p in (_person(i, e, problems) for i, e in enumerate(raw)) if p is not None]
    seen: dict[str, int] = {}
    uids: dict[int, str] = {}
    for p in persons:
        if p.name in seen:
            problems.append(_line(USERS_VAR, "", f"names {p.name} twice; one entry per person"))
        seen[p.name] = 1
        if p.name == training_user:
            problems.append(_line(USERS_VAR, f" ({p.name})", "is the training account (distrun_user); give the person "
                                                              "their own name"))
        if p.uid is not None:
            if p.uid in uids:
                problems.append(_line(USERS_VAR, "", f"gives uid {p.uid} to both {uids[p.uid]} and {p.name}; one uid per person"))
            uids.setdefault(p.uid, p.name)
        elif shared_fs_mode in FIXED_UID_MODES:
            problems.append(_line(USERS_VAR, f" ({p.name})", f"has no uid; distrun_shared_fs_mode {shared_fs_mode} keeps "
                                                              "owners by number, so give every person a fixed uid"))
    admins: list[str] = []
    if admins_raw is not None:
        if not isinstance(admins_raw, list) or not all(isinstance(a, str) for a in admins_raw):
            problems.append(f"{ADMINS_VAR} is not a list of names; write [alice, bob]")
        else:
            for a in admins_raw:
                if a not in seen:
                    problems.append(f"{ADMINS_VAR}: {a!r} is not in {USERS_VAR}; add them there, or remove them here")
            admins = list(admins_raw)
    if shared_fs_mode == "sshfs":
        problems.append(f"{USERS_VAR} with distrun_shared_fs_mode sshfs: one FUSE mount per node belongs to one "
                        "account and cannot keep people's files apart; use nfs, external or sync")
    people = People(tuple(Person(p.name, p.uid, p.ssh_keys, p.name in admins) for p in persons))
    return problems, people


def read(path: Path, group_vars: Mapping[str, Any], shared_fs_mode: str, training_user: str) -> People | None:
    """The inventory's people, or None (one training account); an InventoryError listing every
    problem, one line each, when the list is wrong."""
    problems, people = problems_and_people(group_vars, shared_fs_mode, training_user)
    if problems:
        raise InventoryError("\n".join(f"inventory {path}: {line}" for line in problems))
    return people
