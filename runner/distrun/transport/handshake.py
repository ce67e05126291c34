"""One attempt's handshake between the runner and playbooks/run.yml: every name both sides use
(gate files, extra-vars, facts, tags). The states an attempt goes through are run/attempt.py's.

The runner plans the attempt, then the claim on the hosts, the upload of the run's files and
run.yml go at once; DEVELOPING.md ("One attempt, step by step") draws the sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distrun.transport.playbook_events import PlaybookResult

# Files in the run record that run.yml's stage step waits for (the lookup plugin distrun_gate),
# and the extra-vars that name them.
CLAIM_GATE = "claim"  # the claim's answer: held, allowed or refused
CLAIM_GATE_VAR = "distrun_claim_gate"
UPLOAD_GATE_VAR = "distrun_upload_gate"
# Whether the probes stage this attempt in their own round trip (no stage step then).
STAGE_EARLY_VAR = "distrun_stage_early"

# Facts run.yml publishes: the step it is in (in STEPS' order), the judge's verdict, and that
# every node is staged where the stage step has steps after unpacking.
STEP_FACT = "distrun_step"
STEPS = ("preflight", "stage")
PREFLIGHT_FACT = "preflight_verdict"
STAGED_FACT = "distrun_staged"

# Tags of run.yml's tasks the runner skips: never needed by a run (the preflight's full set is
# 'distrun check''s, its GPU health read too; role distrun's argument check, tagged 'always', is
# done by the runner with the same spec when it read the inventory; the judge's own task fails
# each blamed node) ...
RUN_SKIPS = ("preflight_shared", "preflight_gpu_health", "always", "preflight_blame")
# ... and, per attempt: the stage steps where there are none, the gate and unpacking where the
# probes staged the attempt.
STAGE_STEPS_TAG = "job_stage_steps"
GATE_TAG = "run_gate"
UNPACK_TAG = "job_unpack"


def upload_gate(restart: int, attempt: int) -> str:
    """The upload gate of one try (a restart's attempt may be planned twice)."""
    return f"upload-{restart}-{attempt}"


def stage_early(preflight: bool, restart: int, mode: str, steps: bool) -> bool:
    """Whether the preflight's probes stage this attempt in their round trip: a first attempt
    with a preflight and no stage steps. A restart's run dir holds the earlier attempts' logs and
    checkpoints, an external shared filesystem is judged across the nodes before anything is
    written to it, and the steps (partition, pulls, compiling) must not start on a node that did
    not unpack the run: these are staged in the stage step, after the judge and the gate."""
    return bool(preflight) and restart == 0 and mode != "external" and not steps


def failed_step(result: PlaybookResult) -> str:
    """The earliest step of run.yml a host failed in, as the hosts' STEP_FACT said: 'preflight'
    or 'stage' (a host that failed before any step said so: 'preflight')."""
    steps = {h.failed_step or STEPS[0] for h in result.failures()}
    return next((step for step in STEPS if step in steps), STEPS[-1])
