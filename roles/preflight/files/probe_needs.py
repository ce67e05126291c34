# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The needs check's programs (its modules are the env's answer): each found where the training user
may run it (judged by runner/distrun/preflight/judge.py)."""

import os


def _search_path(cfg: ProbeConfig) -> list[str]:
    """Where a program named without a folder is looked for: the env, the usual folders and,
    when the probe already runs as the training user, that user's own PATH (a site's modules)."""
    dirs = [f"{cfg.prefix}/bin", "/usr/local/bin", "/usr/bin", "/bin"]
    if os.geteuid() != 0 or cfg.user == "root":
        dirs += [d for d in os.environ.get("PATH", "").split(os.pathsep) if d.startswith("/")]
    return list(dict.fromkeys(dirs))


def probe_programs(cfg: ProbeConfig, programs: dict[str, list[str]]) -> dict[str, dict]:
    """Each program this run needs -> found (the first candidate the training user may run)."""
    out = {}
    for label, candidates in programs.items():
        found = ""
        for c in candidates:
            path = c if "/" in c else next((f"{d}/{c}" for d in _search_path(cfg) if os.path.exists(f"{d}/{c}")), "")
            if path and may_run(cfg, path):
                found = path
                break
        where = os.path.dirname(candidates[0]) if "/" in candidates[0] else "PATH"
        out[label] = {"ok": bool(found), "detail": found or f"not in {where}"}
    return out
