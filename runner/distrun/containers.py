"""Ranks inside a container image: which image and runtime a run uses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import PlanError

RUNTIMES = ("podman", "docker")
DEFAULT_RUNTIME = "podman"

# An OCI image reference: [registry[:port]/]path[:tag][@digest] (the distribution spec's grammar,
# lower-case path components); never an option, never shell text.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)"
_IMAGE = re.compile(rf"{_REGISTRY}?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                    r"(?:@sha256:[a-f0-9]{64})?")

@dataclass(frozen=True)
class Container:
    image: str
    runtime: str = DEFAULT_RUNTIME


def check_image(ref: str, where: str) -> str:
    """The image reference, or one line naming ``where`` (the flag or variable) and the fix."""
    if not _IMAGE.fullmatch(ref):
        raise PlanError(f"{where} {ref!r} is not an image reference; write it as [registry[:port]/]name[:tag]"
                        "[@sha256:digest] in lower case, e.g. docker.io/library/python:3.11 or localhost/train:1")
    return ref


def check_runtime(name: str, where: str) -> str:
    if name not in RUNTIMES:
        raise PlanError(f"{where} {name!r}: choose one of {', '.join(RUNTIMES)}")
    return name


def choose(source: object, group_vars: dict[str, Any] | Any, image: str | None,
           runtime: str | None) -> Container | None:
    """The run's container: the flags win over the inventory's ``distrun_image`` and
    ``distrun_container_runtime``; None where neither names an image."""
    inv = f"inventory {source}:"
    inv_runtime = str(group_vars.get("distrun_container_runtime") or "")
    if inv_runtime:
        check_runtime(inv_runtime, f"{inv} distrun_container_runtime")
    chosen_runtime = runtime or inv_runtime or DEFAULT_RUNTIME
    if runtime:
        check_runtime(runtime, "--container-runtime")
    if image:
        return Container(check_image(image, "--image"), chosen_runtime)
    inv_image = str(group_vars.get("distrun_image") or "")
    if inv_image:
        return Container(check_image(inv_image, f"{inv} distrun_image"), chosen_runtime)
    if runtime:
        raise PlanError("--container-runtime needs an image: add --image REF (or distrun_image in the inventory)")
    return None
