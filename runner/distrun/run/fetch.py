"""'distrun fetch RUN PATH...': bring files a run left on its nodes into its record.

A run brings home its logs, exit codes and small files when it ends; bigger files its job wrote
into the run directory (outputs, models) stay on the nodes, listed in the record's LEFT_FILE.
This brings the named paths (files, folders or globs, relative to the run directory) from the
nodes that hold them into the record's ``nodes/<host>/`` beside the rest, through the same
guarded stream as collect: as the training user, plain files only, never through a link.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from distrun import paths
from distrun.errors import UserError
from distrun.inventory.cluster import load_cluster
from distrun.run.collect import PullError, collect_hosts, pull_run
from distrun.run.collect_rules import LEFT_FILE, path_selection
from distrun.run.ending import collect_limits
from distrun.run.liveness import recorded_plan
from distrun.store.runs import Run, load_run


@dataclass
class Fetched:
    run_id: str
    dest: Path
    brought: dict[str, tuple[int, int]] = field(default_factory=dict)  # host -> (files, bytes)
    errors: dict[str, PullError] = field(default_factory=dict)  # host -> why not


def check_path(path: str) -> str:
    """A path inside the run directory: relative, without '..', one line."""
    text = path.strip()
    clean = (text[2:] if text.startswith("./") else text).rstrip("/")
    if (not clean or clean.startswith("/") or ".." in PurePosixPath(clean).parts
            or any(c in clean for c in "\n\r\0")):
        raise UserError(f"{path!r}: give a path inside the run directory, relative to it "
                        "(as the record's left-on-nodes.json lists them: out/model.pt, out, 'out/*.pt'), without '..'")
    return clean


def holders(run: Run, patterns: list[str]) -> list[str]:
    """The hosts whose listing in the record holds a file the patterns name (itself, or under it;
    '*' crosses folders, as in the node's find)."""
    try:
        listing = json.loads((run.dir / LEFT_FILE).read_text()).get("hosts", {})
    except (OSError, ValueError, AttributeError):
        return []
    found = []
    for host, entry in listing.items():
        files = [str(f.get("path", "")) for f in entry.get("files", []) if isinstance(f, dict)]
        if any(fnmatchcase(f, p) or fnmatchcase(f, f"{p}/*") for f in files for p in patterns):
            found.append(str(host))
    return found


def fetch(run_ref: str, raw_paths: tuple[str, ...], host: str | None = None) -> Fetched:
    """Bring the paths from the run's nodes (``host`` only, when given) into its record."""
    wanted = list(dict.fromkeys(check_path(p) for p in raw_paths))
    run = load_run(run_ref, verb="train")
    plan = recorded_plan(run)
    inventory = Path(run.meta.inventory)
    cluster = load_cluster(inventory, paths.fact_cache_dir(inventory))
    names = {n.name for n in cluster.nodes}
    candidates = [h for h in collect_hosts(cluster, list(plan.placement.reached_hosts)) if h in names]
    if not candidates:
        raise UserError(f"run {run.id}: none of its hosts is in {inventory} any more; "
                        "fetch it with the inventory it ran with")
    if host is not None and host not in candidates:
        raise UserError(f"--host {host}: run {run.id} keeps its files on {', '.join(candidates)}")
    hosts = [host] if host else ([h for h in holders(run, wanted) if h in candidates] or candidates)
    dest = run.dir / "nodes"
    dest.mkdir(exist_ok=True, mode=0o700)
    pulled = pull_run(cluster, plan.run_dir, hosts, dest, path_selection(wanted), **collect_limits())
    out = Fetched(run.id, dest, errors=pulled.errors)
    out.brought = {h: c for h, c in pulled.brought.items() if c[0]}
    if not out.brought and not out.errors:
        listed = run.dir / LEFT_FILE
        where = f"; the files the run left are listed in {listed}" if listed.is_file() else ""
        raise UserError(f"{', '.join(wanted)}: no such file in {plan.run_dir} on "
                        f"{', '.join(hosts)}{where}")
    return out
