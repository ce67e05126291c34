"""Where distrun's Ansible content lives: the repo checkout, or inside the installed wheel."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from distrun.errors import UserError

_PACKAGE_DIR = Path(__file__).resolve().parent


def project_dir() -> Path:
    """The directory holding setup.yml, playbooks/, roles/ and workloads/.

    A wheel carries them in ``distrun/_project``; an editable install or a checkout has them at
    the repository root, two levels above this package. DISTRUN_PROJECT_DIR overrides both, so a
    site can run its own fork of the playbooks with the installed CLI.
    """
    override = os.environ.get("DISTRUN_PROJECT_DIR")
    candidates = [Path(override)] if override else []
    candidates += [_PACKAGE_DIR / "_project", _PACKAGE_DIR.parent.parent]
    for candidate in candidates:
        if (candidate / "setup.yml").is_file() and (candidate / "roles").is_dir():
            return candidate
    where = ", ".join(str(c) for c in candidates)
    raise UserError(
        f"distrun's playbooks were not found (looked in {where}); reinstall distrun or set "
        "DISTRUN_PROJECT_DIR to a checkout"
    )


def state_dir() -> Path:
    """Per-user state: run directories and the fact cache. Kept private (0700)."""
    fix = "point DISTRUN_HOME at a folder you own (default ~/.local/state/distrun)"
    own = os.environ.get("DISTRUN_HOME")
    if own is not None and own.strip() and not os.path.isabs(own):
        raise UserError(f"DISTRUN_HOME={own!r} is a relative path: its state would move with the current folder; "
                        f"give an absolute path (e.g. DISTRUN_HOME=$HOME/.local/state/distrun)")
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and not os.path.isabs(xdg):
        xdg = None  # the XDG spec: a relative path is invalid and ignored
    if not own and not xdg:
        home = os.environ.get("HOME")
        if home is not None and not os.path.isabs(home):
            what = "empty" if not home.strip() else f"{home!r}, a relative path"
            raise UserError(f"HOME is {what}: distrun would keep its state outside your home folder; set HOME to "
                            f"your home folder, or {fix}")
    base = own or os.path.join(xdg or os.path.expanduser("~/.local/state"), "distrun")
    path = Path(base)
    where = "DISTRUN_HOME" if own else "distrun's state folder"
    _private_dir(path, f"{where} {path}", fix)
    return path


def write_text(path: Path, text: str) -> None:
    """``path`` written with ``text``; an OSError names the file (one raised by a write on a full
    disk would name none, and the error line could not say where)."""
    try:
        path.write_text(text)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def _private_dir(path: Path, what: str, fix: str) -> None:
    """Create a 0700 folder, or say in one line why it cannot be one."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.chmod(0o700)
    except FileExistsError:
        raise UserError(f"{what} is a file, not a folder; {fix}") from None
    except NotADirectoryError:
        raise UserError(f"{what}: a part of that path is a file, not a folder; {fix}") from None
    except OSError as exc:
        raise UserError(f"{what}: {exc.strerror}; {fix}") from None


def ssh_control_dir() -> Path:
    """Where Ansible keeps its ssh master connections' sockets (ansible.cfg names each one by
    ssh's %C), so that distrun's own ssh sessions to a node ride on the master a playbook left
    open instead of opening a connection of their own. ANSIBLE_SSH_CONTROL_PATH_DIR or
    $ANSIBLE_HOME/cp, as Ansible reads them; the runner passes the result to Ansible too."""
    override = os.environ.get("ANSIBLE_SSH_CONTROL_PATH_DIR")
    if override:
        return Path(os.path.expanduser(override))
    return Path(os.path.expanduser(os.environ.get("ANSIBLE_HOME") or "~/.ansible")) / "cp"


def runs_dir() -> Path:
    path = state_dir() / "runs"
    _private_dir(path, f"the runs folder {path}", "remove or rename what is there")
    return path


def fact_cache_dir(inventory: Path) -> Path:
    """Facts Ansible gathered for one inventory's hosts.

    One folder per inventory: two inventories may name different machines alike ('node1' in a
    test and in a production inventory), and a plan must never use another cluster's facts.
    """
    path = state_dir() / "facts" / _inventory_key(inventory)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.parent.chmod(0o700)
    return path


def _inventory_key(inventory: Path) -> str:
    resolved = Path(inventory).resolve()
    return f"{resolved.name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:10]}"


def pushed_images_file(inventory: Path) -> Path:
    """What 'distrun push-image' put on one inventory's nodes (image ref -> id), in a private folder."""
    folder = state_dir() / "pushed-images"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    return folder / f"{_inventory_key(inventory)}.json"


def drained_file(inventory: Path) -> Path:
    """The nodes kept out of one inventory's runs (store/drained.py), in a private folder."""
    folder = state_dir() / "drained"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    return folder / f"{_inventory_key(inventory)}.json"


def inventory_search_dirs() -> list[Path]:
    """Named inventories are looked up in ./inventory first, then in the project's."""
    dirs = [Path.cwd() / "inventory"]
    try:
        dirs.append(project_dir() / "inventory")
    except UserError:
        pass
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


def resolve_inventory(name_or_path: str) -> Path:
    """``--inventory`` takes a name under inventory/ or a path to a file or directory."""
    if not name_or_path.strip():
        raise UserError("--inventory is empty: give a name under inventory/ (e.g. local) or a path")
    as_path = Path(name_or_path).expanduser()
    if as_path.exists():
        return as_path.resolve()
    if "/" not in name_or_path:
        for d in inventory_search_dirs():
            candidate = d / name_or_path
            if candidate.exists():
                return candidate.resolve()
    known = sorted({p.name for d in inventory_search_dirs() for p in d.iterdir() if not p.name.startswith(".")})
    listing = ", ".join(known) if known else "none found"
    raise UserError(
        f"--inventory {name_or_path!r}: no such inventory (known: {listing}); "
        "pass a name under inventory/ or a path to an inventory file or directory"
    )
