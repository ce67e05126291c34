# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""A run's stage step in the probe's round trip: role job's files/stage.py, the probe's second
argument, run with the training user's rights after the probe's checks of that user and folder."""

import pwd


def stage_run(cfg: ProbeConfig, script: str) -> dict:
    """The stage step (``script``, with its config ``cfg.stage``), with the training user's rights
    (user_files), and only where the user exists and the shared folder is writable by it (and
    mounted, where it must be), so nothing lands in an empty mount point; checked here, beside the
    same checks in the report. The runner starts nothing before the judge passed every node, and
    removes what was staged when it refuses the run.
    {"staged": run id, "stage_changed": bool, "stage_created": the run's folders it made}, or
    {"stage_error": why}."""
    if not script:
        return {"stage_error": "not staged: the probe was given no stage script"}
    try:
        pwd.getpwnam(cfg.user)
    except KeyError:
        return {"stage_error": f"not staged: no user {cfg.user}"}
    checks = [probe_writable(cfg, cfg.shared_dir)]
    if cfg.mount_fstypes:
        checks.append(probe_mount(cfg, cfg.shared_dir, cfg.mount_fstypes))
    failed = [c["detail"] for c in checks if not c.get("ok")]
    if failed:
        return {"stage_error": "not staged: " + "; ".join(failed)}
    try:
        said = user_files(cfg, stage_in_child, script, cfg.stage)
    except FsUserError as exc:
        return {"stage_error": str(exc)}
    if "error" in said:
        return {"stage_error": said["error"]}
    try:
        return {"staged": str(said["staged"]), "stage_changed": bool(said.get("changed")),
                "stage_created": [str(d) for d in said.get("created") or []]}
    except (KeyError, TypeError):
        return {"stage_error": f"the stage step said {str(said)[:300]!r}"}
