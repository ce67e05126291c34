"""Which variable names a rank may be given (--env, distrun_env, a project's .distrun_env): shell
variable names that distrun does not set itself."""

from __future__ import annotations

import re

from distrun.errors import PlanError

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV_PREFIX = "DISTRUN_"
# Open MPI parameters distrun sets for mpirun and its daemons (on their command line, and as
# OMPI_MCA_ variables): a value from a run's settings would undo them. Why, per parameter.
_AGENT = "distrun starts Open MPI's daemons through its relay, over the cluster's ssh, which accepts distrun's daemons only"
_FILES = "distrun keeps Open MPI to its installation's own parameter file and components"
OPEN_MPI_PARAMS = {
    **dict.fromkeys(("orte_launch_agent", "plm_rsh_agent", "orte_rsh_agent"), _AGENT),
    **dict.fromkeys(("mca_base_param_files", "mca_param_files", "mca_base_component_path", "mca_component_path"), _FILES),
}
# Names distrun sets for the launcher itself, a rank's value would be ignored or undo it: why.
OWNED = {f"OMPI_MCA_{param.upper()}": why for param, why in OPEN_MPI_PARAMS.items()}


def env_name_problem(key: str) -> str | None:
    """Why a name may not be given to a rank, or None: it must be a shell variable name, and not
    one distrun sets itself (DISTRUN_RUN_ID tags a run's processes for 'distrun stop')."""
    if not _ENV_KEY_RE.fullmatch(key):
        return "is not a valid environment variable name"
    if key.upper().startswith(RESERVED_ENV_PREFIX):
        return "is refused: DISTRUN_* variables are set by distrun itself; choose another name"
    if key.upper() in OWNED:
        return f"is refused: {OWNED[key.upper()]}; leave it unset"
    return None


def check_env_key(key: str) -> None:
    """A --env name a rank may receive (env_name_problem)."""
    problem = env_name_problem(key)
    if problem:
        raise PlanError(f"--env {key}=...: {problem.removeprefix('is ').removeprefix('refused: ')}")
