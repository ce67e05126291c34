"""The preflight's fixes on a Slurm cluster the user does not administer (``slurm_site``).

There ``distrun setup`` refuses to run: the env, the folder and Slurm's commands are the user's
or the site's, so every fix the judge would give as "run 'distrun setup'" says instead what the
user can do as themselves. The judge (``judge.verdict`` with ``site=True``) calls this last;
what was found stays as it is, only the words of the fix (and of "never set up") change.
Standard library only: Ansible imports it through the judge.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# What installs each module a run may need into the user's own env.
_PACKAGES = {"module torch": "torch", "module jittor": "jittor", "module pymetis": "pymetis", "module mpi4py": "mpi4py",
             "module numpy": "numpy"}


def _env_fix(prefix: str) -> str:
    return (f"create your env at {prefix} (python3 -m venv {prefix}, or a conda env) on a path the compute nodes "
            "see too, with mpi4py and what the workload needs; or set distrun_env_prefix to the env you have")


def _needs_fix(detail: str, prefix: str) -> str:
    packages = [pkg for label, pkg in _PACKAGES.items() if f"{label} is" in detail]
    fixes = [f"install {' '.join(packages)} into your env: {prefix}/bin/python -m pip install {' '.join(packages)}"] \
        if packages else []
    if any(f"{p} is" in detail for p in ("sbatch", "srun")):
        fixes.append("put the site's Slurm commands on your PATH on the login node (its module, or ask its admins)")
    return "; ".join(fixes) or _env_fix(prefix)


def _slurm_fix(kind: str) -> str:
    if kind == "partition":
        return "set slurm_partition in the inventory to a partition sinfo lists (or leave it unset for the site's default)"
    if kind == "sinfo":
        return "Slurm does not answer from the login node as you: ask the site's admins (slurmctld, munge)"
    return "put the site's Slurm commands on your PATH on the login node (its module, or ask its admins)"


def site_fixes(report: dict[str, dict[str, Any]], probes: Mapping[str, Mapping[str, Any]], *,
               env_prefix: str, shared_dir: str) -> dict[str, dict[str, Any]]:
    """The report with the fixes a user can apply on a cluster they do not administer."""
    fixes = {
        "env": _env_fix(env_prefix),
        "setup": _env_fix(env_prefix),
        "mpi4py": (f"install mpi4py into your env against the site's MPI (load its MPI module, then "
                   f"{env_prefix}/bin/python -m pip install mpi4py)"),
        "versions": "install the same versions into every env the job uses",
        "shared folder": (f"set distrun_shared_dir to a folder you can write that the compute nodes mount too "
                          f"(your home or scratch), not {shared_dir}"),
    }
    out: dict[str, dict[str, Any]] = {}
    for check, items in report.items():
        out[check] = {}
        for host, item in items.items():
            if item.ok:
                out[check][host] = item
            elif check == "needs":
                out[check][host] = dataclasses.replace(item, fix=_needs_fix(item.detail, env_prefix))
            elif check == "slurm":
                kind = str(((probes.get(host) or {}).get("slurm") or {}).get("kind", ""))
                out[check][host] = dataclasses.replace(item, fix=_slurm_fix(kind))
            elif check == "shared folder" and item.detail.endswith("does not exist"):
                out[check][host] = dataclasses.replace(item, fix=(
                    f"create it as you on {host} (mkdir -p {shared_dir}) if the compute nodes mount its filesystem "
                    "too; else set distrun_shared_dir to a folder you can write that they mount (your home or scratch)"))
            elif check == "setup":
                # The probe says "distrun never set up <host>: no env <prefix>"; here nothing ever will.
                out[check][host] = dataclasses.replace(item, detail=item.detail.split(": ", 1)[-1] + f" on {host}",
                                                       fix=fixes["setup"])
            else:
                out[check][host] = dataclasses.replace(item, fix=fixes.get(check, item.fix))
    return out
