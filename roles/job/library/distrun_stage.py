#!/usr/bin/python
"""Ansible module of role job: put a run's files in place on one node, in one round trip.

Runs as the training user. The bundle is the archive the runner packed (the rendered files, the
launch scripts, the user's program and the reference workloads, base64 of a tar.gz); the run's
variables (``env``, possibly secrets) go to ``<run_dir>/env.sh``, mode 0600, and are a no_log
argument: Ansible masks them in every result and log.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: distrun_stage
short_description: Unpack a distrun run's bundle and write its env file
description:
  - Creates the run folder (mode 0750) and the checkpoint folder, unpacks the run's files into
    the run folder, copies the reference workloads into the shared folder unless the same digest
    is there, and writes the run's variables to env.sh (mode 0600).
options:
  run_id: {description: The run's id (letters, digits, '.', '_', '-'; not dots alone)., type: str, required: true}
  bundle: {description: Base64 of the run's tar.gz (run/ and workloads/)., type: str, required: true}
  env: {description: Text of env.sh; empty for none., type: str, default: ''}
  run_dir: {description: The run's folder., type: path, required: true}
  checkpoint_dir: {description: The run's checkpoint folder; empty for none., type: str, default: ''}
  shared_dir: {description: The shared folder (workloads go to its workloads/)., type: path, required: true}
  workloads_digest: {description: Digest of the bundled workloads., type: str, default: ''}
author: distrun
"""


def _private_dir(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o750)  # other local users may not read a run: its logs, its program, its env file


def _copy_tree(src: str, dest: str) -> None:
    subprocess.run(["cp", "-R", f"{src}/.", f"{dest}/"], check=True, capture_output=True, text=True)


def _write_env(path: str, text: str) -> None:
    """env.sh for the training user only; a link or a file in its place is replaced, never followed."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text if text.endswith("\n") else text + "\n")
    os.replace(tmp, path)


def safe_run_id(run_id: str) -> bool:
    """A run id names a folder under the shared folder's runs/: one plain path component."""
    return bool(re.fullmatch(r"[A-Za-z0-9._-]+", run_id)) and set(run_id) != {"."}


def stage(p: dict) -> bool:
    """Everything the module does; True when new workloads were copied (the node changed)."""
    os.umask(0o022)
    updated = False
    with tempfile.TemporaryDirectory(prefix="distrun-stage-") as tmp:
        data = base64.b64decode(p["bundle"])
        subprocess.run(["tar", "-xzf", "-", "-C", tmp, "--no-same-owner"], input=data, check=True, capture_output=True)
        _private_dir(p["run_dir"])
        if p["checkpoint_dir"]:
            _private_dir(p["checkpoint_dir"])
        if os.path.isdir(f"{tmp}/run"):
            _copy_tree(f"{tmp}/run", p["run_dir"])
        workloads = os.path.join(p["shared_dir"], "workloads")
        marker = os.path.join(workloads, f".digest-{p['workloads_digest']}")
        if os.path.isdir(f"{tmp}/workloads") and not os.path.exists(marker):
            os.makedirs(workloads, exist_ok=True)
            _copy_tree(f"{tmp}/workloads", workloads)
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write(p["workloads_digest"] + "\n")
            updated = True
    if p["env"]:
        _write_env(os.path.join(p["run_dir"], "env.sh"), p["env"])
    return updated


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            # no_log: the bundle only to keep ~100 kB per host out of every event; env for its secrets.
            "run_id": {"type": "str", "required": True},
            "bundle": {"type": "str", "required": True, "no_log": True},
            "env": {"type": "str", "default": "", "no_log": True},
            "run_dir": {"type": "path", "required": True},
            "checkpoint_dir": {"type": "str", "default": ""},
            "shared_dir": {"type": "path", "required": True},
            "workloads_digest": {"type": "str", "default": ""},
        },
        supports_check_mode=False,
    )
    if not safe_run_id(module.params["run_id"]):
        module.fail_json(msg=f"distrun_run_id={module.params['run_id']} is empty or unsafe; runs are staged by 'distrun train'")
    try:
        updated = stage(module.params)
    except subprocess.CalledProcessError as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        module.fail_json(msg=f"{' '.join(exc.cmd[:2])} failed on the node: {err.strip()[-500:] or f'exit {exc.returncode}'}")
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"staging into {module.params['run_dir']} failed: {exc}")
    module.exit_json(changed=updated, workloads_updated=updated)


if __name__ == "__main__":
    main()
