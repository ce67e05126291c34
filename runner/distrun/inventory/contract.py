"""The inventory contract's defaults, as the roles state them (see DEVELOPING.md).

They are written once, in role ``distrun``'s ``defaults/main.yml`` (every other role depends on
it), with their choices in its ``meta/argument_specs.yml``. This module loads those files, so the
runner's plans and dry runs never disagree with what the playbooks do.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from distrun import paths
from distrun.errors import UserError
from distrun.inventory import rules, slurm_site

HEAD_GROUP = "head"
WORKER_GROUP = "workers"
DEFAULT_MASTER_PORT = 29500


def _load(relative: str) -> dict[str, Any]:
    import yaml  # here: most runs read the contract from the inventory's kept answer, never from YAML

    path = paths.project_dir() / relative
    try:
        # libyaml's loader where PyYAML has it: the same data, a tenth of the time of every run's start.
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot read distrun's defaults ({exc}); reinstall distrun") from None
    return data if isinstance(data, dict) else {}


@functools.cache
def defaults() -> dict[str, Any]:
    """Role distrun's defaults/main.yml: distrun_user, distrun_shared_dir, ..."""
    return _load("roles/distrun/defaults/main.yml")


@functools.cache
def _options() -> dict[str, Any]:
    specs = _load("roles/distrun/meta/argument_specs.yml")
    return specs["argument_specs"]["main"]["options"]


def default(name: str) -> str:
    """The default of a plain contract variable (distrun_user, distrun_shared_dir, ...)."""
    return str(defaults()[name])


def choices(name: str) -> tuple[str, ...]:
    """The values a contract variable may take (distrun_mpi_provider, distrun_shared_fs_mode)."""
    return tuple(_options()[name]["choices"])


def env_prefix_default(provider: str) -> str:
    """Where a provider puts the env unless distrun_env_prefix says otherwise."""
    return str(defaults()["distrun_env_prefixes"][provider])


@functools.cache
def distro_mpi_prefix(os_family: str) -> str:
    """Where the distro's Open MPI lives (mpirun's --prefix for the venv provider), as role
    mpi_env states it per OS family (vars/Debian.yml, vars/RedHat.yml); Debian's for others."""
    path = Path("roles/mpi_env/vars") / f"{os_family}.yml"
    if not (paths.project_dir() / path).is_file():
        path = Path("roles/mpi_env/vars/Debian.yml")
    return str(_load(str(path))["_mpi_env_distro_mpi_prefix"])


@functools.cache
def _mpi_env_defaults() -> dict[str, Any]:
    return _load("roles/mpi_env/defaults/main.yml")


def _given(values: dict[str, Any], name: str, fallback: Any) -> Any:
    """A host's value of a variable, else ``fallback``; a template only Ansible renders counts as unset."""
    value = values.get(name)
    return fallback if value is None or "{{" in str(value) else value


def conda_pins_problems(hostvars: Any) -> list[str]:
    """Conda pins role mpi_env would refuse on a conda host (rules.conda_pins, the role's own
    check), said before any play runs: one line per problem, naming the hosts that have it."""
    defaults = _mpi_env_defaults()
    found: dict[str, list[str]] = {}
    for host, values in sorted((hostvars or {}).items()):
        if not isinstance(values, dict) or slurm_site.existing(values):
            continue  # no setup there: the env is the user's own
        provider = _given(values, "mpi_env_provider", _given(values, "distrun_mpi_provider", default("distrun_mpi_provider")))
        if provider != "conda":
            continue
        pins = [values.get(name, defaults[name]) for name in ("mpi_env_conda_python_version", "mpi_env_conda_openmpi_version")]
        if any("{{" in str(pin) for pin in pins):
            continue  # only Ansible knows what a template gives
        problem = rules.conda_pins(*pins)
        if problem:
            found.setdefault(problem, []).append(host)
    return [f"{_hosts(hosts)}: {problem}" for problem, hosts in found.items()]


def _hosts(names: list[str]) -> str:
    """'host a', 'hosts a, b, c', 'hosts a, b, c and 9 more': one line however large the cluster."""
    if len(names) == 1:
        return f"host {names[0]}"
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"hosts {', '.join(names[:3])}{more}"


def problems(hostvars: Any) -> list[str]:
    """What breaks the contract in each host's variables (``ansible-inventory --list``'s
    ``_meta.hostvars``), checked against role distrun's argument spec by Ansible's own validator:
    one line per host and variable. A value Ansible still has to template ("{{ ... }}") is left
    to Ansible; a variable not set takes the role's default. Then the conda pins role mpi_env
    would refuse (conda_pins_problems)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # slow to import: only on a cache miss

    options = _options()
    out: list[str] = []
    for host, values in sorted((hostvars or {}).items()):
        if not isinstance(values, dict):
            continue
        given = {k: v for k, v in values.items() if k in options and "{{" not in str(v)}
        if not given:
            continue
        spec = {k: options[k] for k in given}
        for message in ArgumentSpecValidator(spec).validate(given).error_messages:
            out.append(f"host {host}: {message}")
    return out + conda_pins_problems(hostvars)
