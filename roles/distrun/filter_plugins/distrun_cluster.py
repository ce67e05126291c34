"""Filters that apply distrun's cluster rules in the roles, from the runner's own code.

The rules live in the ``distrun`` Python package (``distrun.inventory.rules``, ``distrun.preflight.judge``,
``distrun.preflight.report``); this file only adapts Ansible's hostvars to them. Ansible normally runs
from the environment distrun is installed in; otherwise the package is found next to these roles
(a checkout's ``runner/``, or the ``site-packages`` that holds an installed ``distrun/_project``).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from distrun.inventory import rules
    from distrun.preflight import sshmesh
except ImportError:  # ansible-playbook from another Python: use the package beside the roles
    _here = Path(__file__).resolve()
    for _candidate in (_here.parents[3] / "runner", _here.parents[5]):
        if (_candidate / "distrun" / "inventory" / "rules.py").is_file():
            sys.path.insert(0, str(_candidate))
            break
    from distrun.inventory import rules
    from distrun.preflight import sshmesh
# The judge and the shared-folder rules are imported by the filters that use them: each task's
# worker process loads this file, and the probe's workers need neither.

from ansible.errors import AnsibleFilterError


def _get(hostvars: object, key: str) -> object:
    getter = getattr(hostvars, "get", None)
    return getter(key) if getter is not None else None


def node_address(hostvars: object, fallback: str = "") -> str:
    facts = _get(hostvars, "ansible_facts")
    return rules.node_address(_get(hostvars, "ansible_host"), {"ansible_facts": facts or {}}, str(fallback))


def network_address(hostvars: object, network: object = "", fallback: str = "") -> str:
    """A node's address on the network its ranks talk over (distrun_network; '' when it has none there)."""
    try:
        cidr = rules.cluster_network(network)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None
    facts = _get(hostvars, "ansible_facts")
    return rules.network_address(_get(hostvars, "ansible_host"), {"ansible_facts": facts or {}}, cidr, str(fallback))


def gpus(hostvars: object) -> int:
    try:
        return rules.gpus({"ansible_facts": _get(hostvars, "ansible_facts") or {}}, {"gpus": _get(hostvars, "gpus")})
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def slots(hostvars: object) -> int:
    try:
        return rules.slots(_get(hostvars, "slots"), gpus(hostvars))[0]
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def gpu_count(devices: object, smi_lines: object = ()) -> int:
    return rules.gpu_count(int(str(devices or 0)), [str(x) for x in (smi_lines or [])])


def hostfile(nodes: object, hostvars: object) -> str:
    return rules.hostfile((str(n), slots(hostvars[n])) for n in nodes)  # type: ignore[index]


def preflight_report(probes: object, **options: object) -> dict:
    """The preflight's verdict (check -> node -> ok, detail, fix) from every node's probe."""
    from distrun.preflight import judge, report as judge_report

    return judge_report.as_dicts(judge.verdict(probes, **options))  # type: ignore[arg-type]


def preflight_problems(verdict: object, host: str) -> list[str]:
    """What the verdict finds wrong on one host, one line per check, with the fix."""
    from distrun.preflight import report as judge_report

    return judge_report.problems(judge_report.from_dicts(verdict), str(host))  # type: ignore[arg-type]


def preflight_blamed(verdict: object) -> list[str]:
    """The nodes a verdict finds anything wrong on."""
    from distrun.preflight import report as judge_report

    return judge_report.blamed(judge_report.from_dicts(verdict))  # type: ignore[arg-type]


def ssh_mode(baseline: dict | None, head: str, targets: list | None) -> str:
    """How the head checks ssh to its targets: 'banner' once logins to all were proved, else 'login'."""
    return sshmesh.mode({str(k): str(v) for k, v in (baseline or {}).items()}, str(head), [str(t) for t in targets or []])


def ssh_mesh(probes: object, **options: object) -> dict:
    """What the runner keeps or re-verifies of the head's ssh checks (published beside the verdict)."""
    return sshmesh.summary(probes, **options)  # type: ignore[arg-type]


def shared_fs_external(findings: object, **options: object) -> dict:
    """external mode at setup: host -> what is wrong with the shared filesystem there, with the fix."""
    from distrun.preflight import sharedfs

    return sharedfs.external_setup(findings, **options)  # type: ignore[arg-type]


def slurm_node_name(name: object) -> str:
    return rules.slurm_node_name(str(name))


_REQUIREMENT_FLAGS = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable")


def local_sources(specs: object, variable: str, paths: bool = False) -> list[dict]:
    """{name, path} of each entry of a package, channel or URL list that names a file on the node
    ('/x', '~user/x', './x', 'file:///x', 'pkg @ file:///x', '-r /x'): what setup's root would
    read from the node's own disk. Names and remote URLs are left out; with `paths`, every entry
    that is not a URL is a path (a wheelhouse: 'wheels' is a relative path, not a name)."""
    from urllib.parse import unquote, urlsplit

    found = []
    for spec in specs if isinstance(specs, (list, tuple)) else [specs]:
        text = str(spec or "").strip()
        if not text:
            continue
        flag, _, rest = text.replace("=", " ", 1).partition(" ") if text.startswith("-") else ("", "", "")
        if flag in _REQUIREMENT_FLAGS:
            text = rest.strip()
        if " @ " in text:
            text = text.split(" @ ", 1)[1].strip()
        if text.startswith("file:"):
            found.append({"name": variable, "path": unquote(urlsplit(text).path) or text})
        elif text.startswith(("/", "~", "./", "../")) or text in (".", "..") or (paths and "://" not in text):
            found.append({"name": variable, "path": text})
    return found


def user_ssh(options: object = ()) -> list[str]:
    """The ssh command distrun runs as the training user on the nodes, with options added, as an argv."""
    from distrun.transport import remote

    if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
        raise AnsibleFilterError(f"distrun_user_ssh: options must be a list of strings, not {options!r}")
    return [*remote.USER_SSH, *options]


def public_key_problem(text: object) -> str:
    """Why text is not exactly one public key line (``<type> <base64> [comment]``), or ""."""
    from distrun.inventory.people import key_problem

    return key_problem(text) or "" if isinstance(text, str) else "is not text"


def node_program(name: str) -> str:
    """Where setup installs a node program (role job's install step) and the runner names it."""
    from distrun.transport import nodeprog

    try:
        return nodeprog.installed(str(name))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def people_problems(users: object, admins: object, shared_fs_mode: object, training_user: object) -> list[str]:
    """What is wrong with the inventory's people (distrun_users, distrun_admins), one line each:
    the runner's own rules (distrun.inventory.people)."""
    from distrun.inventory import people

    found, _ = people.problems_and_people({"distrun_users": users, "distrun_admins": admins or None},
                                          str(shared_fs_mode), str(training_user))
    return found


def node_source(name: str) -> str:
    """A node program's source as the runner composes it (transport/nodeprog.py's one recipe): the
    text a raw task sends, or setup installs."""
    from distrun.transport import nodeprog

    try:
        return nodeprog.text(str(name))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict:
        return {
            "distrun_node_address": node_address,
            "distrun_network_address": network_address,
            "distrun_is_ip": rules.is_ip,
            "distrun_gpus": gpus,
            "distrun_gpu_count": gpu_count,
            "distrun_slots": slots,
            "distrun_mpi_prefix": rules.mpi_prefix,
            "distrun_conda_pins": rules.conda_pins,
            "distrun_rank_order": rules.rank_order,
            "distrun_hostfile": hostfile,
            "distrun_preflight_report": preflight_report,
            "distrun_preflight_problems": preflight_problems,
            "distrun_preflight_blamed": preflight_blamed,
            "distrun_shared_fs_external": shared_fs_external,
            "distrun_ssh_mode": ssh_mode,
            "distrun_ssh_mesh": ssh_mesh,
            "distrun_slurm_node_name": slurm_node_name,
            "distrun_local_sources": local_sources,
            "distrun_free_subid": rules.free_subid,
            "distrun_node_program": node_program,
            "distrun_node_source": node_source,
            "distrun_user_ssh": user_ssh,
            "distrun_people_problems": people_problems,
            "distrun_public_key_problem": public_key_problem,
        }
