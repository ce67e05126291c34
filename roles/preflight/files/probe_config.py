# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The probe's config, read once from its JSON argument (as tasks/probe.yml renders it) and handed
to the checks; one that is not the probe's is a bad call (CallError, the head's)."""

import json

# typing's names for the parts' annotations only: the probe starts faster without typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # noqa: F401 - the other parts' annotations


def _strings(value: object, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CallError(f"{key} {value!r} is not a list of strings")
    return list(value)


def _mapping(value: object, key: str) -> dict:
    if not isinstance(value, dict):
        raise CallError(f"{key} {value!r} is not a JSON object")
    return dict(value)


class ProbeConfig:
    """What one node's probe is asked to check, as the task renders it (probe.yml names each key)."""

    def __init__(self, cfg: dict) -> None:
        for key in ("host", "user", "env_prefix", "shared_dir"):
            if not isinstance(cfg.get(key), str):
                raise CallError(f"{key} {cfg.get(key)!r} is missing or not a string")
        self.host: str = cfg["host"]
        self.user: str = cfg["user"]  # the training user
        self.prefix: str = cfg["env_prefix"].rstrip("/")  # the env
        self.mpi_prefix: str = str(cfg.get("mpi_prefix") or "")  # "": no distrun fact (or a site's Slurm)
        self.shared_dir: str = cfg["shared_dir"]
        try:
            self.ssh_timeout: int = int(cfg.get("ssh_timeout", 5))
        except (TypeError, ValueError):
            raise CallError(f"ssh_timeout {cfg.get('ssh_timeout')!r} is not a number of seconds") from None
        # The ssh a probe that is the training user itself runs (a connection that is not root).
        self.user_ssh: list[str] = _strings(cfg.get("user_ssh") or [], "user_ssh")
        self.ssh_banner: bool = cfg.get("ssh_mode") == "banner"  # check sshd's banner, not a login
        self.ssh_targets: list[str] = _strings(cfg.get("ssh_targets") or [], "ssh_targets")
        self.names: list[str] = _strings(cfg.get("names") or [], "names")
        self.modules: list[str] = _strings(cfg.get("modules") or [], "modules")
        self.programs: dict[str, list[str]] = {str(k): _strings(v, f"programs[{k}]")
                                               for k, v in _mapping(cfg.get("programs") or {}, "programs").items()}
        # Whether a run may read root's record of the env's versions ('distrun check' never does).
        self.env_records: bool = bool(cfg.get("env_records", True))
        # Where root keeps that record, and where the ssh fingerprint reads the node's files (/):
        # a test points them elsewhere.
        self.env_records_dir: str = str(cfg.get("env_records_dir") or "/var/cache/distrun/preflight")
        self.fingerprint_root: str = str(cfg.get("ssh_fingerprint_root") or "/")
        self.image: dict = _mapping(cfg.get("image") or {}, "image")  # the run's container image, if it has one
        self.mount_fstypes: list[str] = _strings(cfg.get("mount_fstypes") or [], "mount_fstypes")
        self.shared_fs_mounts: bool = bool(cfg.get("shared_fs_mounts"))
        self.shared_probe: bool = bool(cfg.get("shared_probe"))
        ports = cfg.get("ports") or []  # ports and "low-high" ranges (the head's)
        if not isinstance(ports, list) or not all(isinstance(p, (int, str)) for p in ports):
            raise CallError(f"ports {ports!r} is not a list of ports and ranges")
        self.ports: list[int | str] = ports
        self.net: dict = _mapping(cfg.get("net") or {}, "net")  # netprobe.py's NetworkProbe's config
        self.addresses: bool = bool(cfg.get("addresses"))
        self.facts: bool = bool(cfg.get("facts"))  # report the facts 'distrun check' keeps (probe_facts.py)
        self.slurm: bool = bool(cfg.get("slurm"))
        self.slurm_partition: str = str(cfg.get("slurm_partition") or "")
        self.stage: dict = _mapping(cfg.get("stage") or {}, "stage")  # a run's stage step's config, if any

    @classmethod
    def read(cls, text: str) -> ProbeConfig:
        try:
            cfg = json.loads(text)
        except ValueError:
            raise CallError("the probe's config is not JSON") from None
        if not isinstance(cfg, dict):
            raise CallError("the probe's config is not a JSON object")
        return cls(cfg)
