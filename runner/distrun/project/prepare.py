"""The ``--prepare`` step: one command run once on the head, in the workdir, as the training
user, before anything is launched (a partitioner such as JittorGeometric's dist_partition.py).

It runs over the same ssh (or local shell) the runner follows a run with, so its output is
streamed as it comes; its exit code decides whether the run goes on. The run's environment
(env.sh's variables, secrets included) reaches it on stdin, never in an argv.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable

from distrun.inventory.cluster import Node
from distrun.planning.jobplan import JobPlan
from distrun.transport.remote import as_user, shell_argv


def prepare_script(plan: JobPlan) -> str:
    """What the training user's shell on the head runs: the env from stdin, the run's own
    variables (DISTRUN_RUN_ID tags the process for 'distrun stop'), the env's bin first on PATH,
    the run directory made, then the prepare command itself, from the workdir."""
    assert plan.program.workdir and plan.program.prepare
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in plan.program.env)
    run_dir = shlex.quote(plan.run_dir)
    return (
        'set -e; eval "$(cat)"; ' + exports
        + f"export PATH={shlex.quote(plan.launch.env_prefix.rstrip('/') + '/bin')}:\"$PATH\"; "
        + f"mkdir -p {run_dir}; chmod 0750 {run_dir}; cd {shlex.quote(plan.program.workdir)}; "
        + f"exec {shlex.join(plan.program.prepare)} < /dev/null 2>&1"
    )


def prepare_argv(node: Node, plan: JobPlan) -> list[str]:
    return shell_argv(node, as_user(plan.launch.user, prepare_script(plan)))


def run_prepare(node: Node, plan: JobPlan, env_text: str, on_line: Callable[[str], None]) -> int:
    """Run the prepare step on node (the head); each output line to on_line; its exit code."""
    # Its own session: Ctrl-C reaches the runner, which stops the run's processes everywhere.
    proc = subprocess.Popen(prepare_argv(node, plan), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        try:
            proc.stdin.write(env_text)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the shell ended at once: its output says why
        for raw in proc.stdout:
            on_line(raw.rstrip("\n"))
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
