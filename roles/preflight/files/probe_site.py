# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The check of a Slurm the user does not administer, on its login node: its client commands, sinfo,
the partition (judged by runner/distrun/preflight/judge_site.py)."""

SLURM_PROGRAMS = ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")


def probe_slurm(cfg: ProbeConfig) -> dict:
    """A Slurm the user does not administer, seen from its login node (as the probe: the training
    user there): the client commands distrun runs are there, sinfo answers, and the partition (if
    one is set) is up."""
    partition, user = cfg.slurm_partition, cfg.user
    found = probe_programs(cfg, {p: [p] for p in SLURM_PROGRAMS})
    missing = [p for p, r in found.items() if not r["ok"]]
    if missing:
        return {"ok": False, "kind": "programs", "detail": f"{', '.join(missing)} not found on PATH for {user}"}
    sinfo = run(cfg, [found["sinfo"]["detail"], "--noheader", "--format=%P %a %D %t"], timeout=30)
    if sinfo.returncode != 0:
        return {"ok": False, "kind": "sinfo",
                "detail": f"sinfo failed as {user}: {last_line(sinfo.stderr or sinfo.stdout) or f'exit {sinfo.returncode}'}"}
    parts: dict[str, tuple[str, int, list[str]]] = {}
    for line in sinfo.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4:
            name = fields[0].rstrip("*")
            avail, nodes, states = parts.get(name, (fields[1], 0, []))
            parts[name] = (avail, nodes + int(fields[2]) if fields[2].isdigit() else nodes, states + [fields[3]])
    if partition and partition not in parts:
        return {"ok": False, "kind": "partition",
                "detail": f"partition {partition} is not in sinfo (partitions: {', '.join(sorted(parts)) or 'none'})"}
    shown = [partition] if partition else sorted(parts)
    if partition and parts[partition][0] != "up":
        return {"ok": False, "kind": "partition", "detail": f"partition {partition} is {parts[partition][0]}"}
    return {"ok": True, "detail": "sinfo answers: " + "; ".join(
        f"partition {p} {parts[p][0]}, {parts[p][1]} node(s) {'/'.join(sorted(set(parts[p][2])))}" for p in shown)}
