"""The Slurm driver: the head's launcher for a Slurm run, and the table of final states.

The driver is a bash script that the job role starts on the head as the training user, like
every other launcher (so Ansible's become, not a second privilege path, decides who submits).
It submits the sbatch script(s), prints the queue state while a job waits, streams rank 0's
output while it runs, and when the job has ended prints one ``DISTRUN_SLURM_RESULT`` line and
exits with the code ``exit_code`` gives its final state. A TERM/INT/HUP (Ctrl-C in the CLI and
``distrun stop`` both end in playbooks/stop.yml, which signals every process of the run)
makes it ``scancel`` its jobs; stop.yml also cancels them by name on the controller in case
the driver is gone (the launcher's cancel, ``Slurm.cancel``: role slurm's entry point).

Final states come from ``scontrol show job`` (no accounting database is needed: the role keeps
finished jobs visible for MinJobAge=600 s), falling back to ``sacct`` where one exists.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from distrun.launchers.slurm.sbatch import HOSTFILE, JOB_FILE, JOBIDS, RANKS, mode, multi_job_file, placed_by_hostfile
from distrun.transport import rundir

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan

# Final Slurm job state -> (distrun's exit code, what it means). The codes follow the shell's
# conventions a user already knows: 124 like timeout(1), 130 like Ctrl-C, 137 like a SIGKILL
# from the OOM killer, 255 like ssh losing its host (what distrun returns for a lost node).
STATE_EXIT: Mapping[str, tuple[int, str]] = {
    "COMPLETED": (0, "every task exited 0"),
    "FAILED": (1, "a task exited non-zero"),
    "TIMEOUT": (124, "the job reached its time limit"),
    "DEADLINE": (124, "the job reached its deadline"),
    "CANCELLED": (130, "the job was cancelled (scancel, 'distrun stop' or Ctrl-C)"),
    "OUT_OF_MEMORY": (137, "a task ran out of memory"),
    "PREEMPTED": (143, "a higher-priority job preempted it"),
    "NODE_FAIL": (255, "a node of the job failed"),
    "BOOT_FAIL": (255, "a node of the job failed to boot"),
}
DRIVER = "slurm-driver.sh"  # at the top of the run directory
UNKNOWN_EXIT = 1  # a state this table does not know, or none could be read
WAITING_STATES = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED")
RUNNING_STATES = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING")

POLL_S = 2
# srun's words for a task that never started (its node's slurmstepd could not enter the working
# directory, open the output, or run the program): the step would wait for it for ever, as would
# the ranks that did start, so the driver cancels the job and says where and why.
LAUNCH_FAILED_RE = r"^srun: error: task [0-9]+ launch failed"


def base_state(state: str) -> str:
    """'CANCELLED by 1000' and 'CANCELLED+' (sacct) are CANCELLED."""
    return (state.strip().split() or [""])[0].rstrip("+").upper()


def exit_code(state: str) -> int:
    return STATE_EXIT.get(base_state(state), (UNKNOWN_EXIT, ""))[0]


ABORT_RE = re.compile(r"MPI_ABORT was invoked on rank \d+|Traceback \(most recent call last\)")


def rank_failure_lines(logs: Mapping[int, Path]) -> list[str]:
    """Header and first error line of every rank log that shows the rank failing on its own.

    Under srun an MPI_Abort ends the whole step, so srun reports every task as killed; the
    aborting rank's own log still says which it was. These lines are added to what the run
    printed, where the usual "first failing rank" rule finds them.
    """
    found: list[str] = []
    for rank in sorted(logs):
        try:
            text = logs[rank].read_text(errors="replace")
        except OSError:
            continue
        m = ABORT_RE.search(text)
        if m:
            header = text.splitlines()[0] if text else ""
            found += [header, text[m.start():].splitlines()[0]]
    return found


def _state_case() -> str:
    arms = "\n".join(f"    {state}) echo {code} ;;" for state, (code, _) in STATE_EXIT.items())
    return f'exit_code_of() {{\n  case "$1" in\n{arms}\n    *) echo {UNKNOWN_EXIT} ;;\n  esac\n}}\n'


def driver_script(plan: JobPlan) -> str:
    """The head's launcher for a Slurm run (run as the training user from the run directory)."""
    multi = mode(plan) == "multi-job"
    count = len(plan.placement.hosts) if multi else 1
    scripts = [multi_job_file(i) for i in range(count)] if multi else [JOB_FILE]
    waiting = "|".join(WAITING_STATES)
    running = "|".join(RUNNING_STATES)
    # Single mode: rank 0 writes ranks/0/stdout on the batch host (the head whenever it runs
    # ranks). Multi-job: torchrun's --tee copies every local rank to the job's own output.
    stream = f'"$a"/{RANKS}/0/stdout' if not multi else ""
    # Multi-job: one job failing ends the others (they would wait for it in the rendezvous).
    cancel_rest = '\n          scancel "${jobs[@]}" 2>/dev/null' if multi else ""
    hostfile = f"export SLURM_HOSTFILE={shlex.quote(plan.run_dir + '/' + HOSTFILE)}\n" if (
        placed_by_hostfile(plan)) else ""
    return f"""#!/bin/bash
# distrun run {plan.run_id}: submit the Slurm job(s), follow them, map the final state to an exit code.
# Generated by distrun; do not edit.
set -uo pipefail
cd {shlex.quote(plan.run_dir)}
# This attempt's own folder: the job ids, Slurm's output and the ranks' logs go there.
a={shlex.quote(rundir.attempt_folder(plan) or ".")}
mkdir -p "$a"
{_state_case()}
jobs=()
tail_pid=""
cancel() {{
  trap - INT TERM HUP
  if [ -n "${{jobs[*]:-}}" ]; then
    scancel "${{jobs[@]}}" 2>/dev/null
    echo "DISTRUN_SLURM cancelled job(s) ${{jobs[*]}}"
  fi
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null
  exit 130
}}
trap cancel INT TERM HUP
field() {{ tr ' ' '\\n' <<< "$1" | sed -n "s/^$2=//p" | head -n 1; }}
record() {{ scontrol show job -o "$1" 2>/dev/null | head -n 1; }}
submit() {{
  local id
  # $1 the script, then sbatch options (which must come before the script on sbatch's line).
  if ! id="$(sbatch --parsable "${{@:2}}" "$1" 2>&1)"; then
    echo "DISTRUN_SLURM_ERROR sbatch ${{*:2}} $1: $id"
    return 1
  fi
  id="${{id%%;*}}"
  jobs+=("$id")
  echo "$id" >> "$a"/{JOBIDS}
  echo "DISTRUN_SLURM submitted $1 as job $id"
}}
# The state of job $1, reported when it changes; sets st (and rec).
last=()
poll() {{
  rec="$(record "$1")"
  st="$(field "$rec" JobState)"
  if [ -z "$st" ]; then
    st="$(sacct --noheader --parsable2 --allocations --format=State --jobs "$1" 2>/dev/null | head -n 1)"
    st="${{st%% *}}"
    st="${{st:-UNKNOWN}}"
  fi
  local now="$st $(field "$rec" Reason) $(field "$rec" NodeList)"
  if [ "${{last[$2]:-}}" != "$now" ]; then
    last[$2]="$now"
    echo "DISTRUN_SLURM job $1 $st reason=$(field "$rec" Reason) nodes=$(field "$rec" NodeList)"
  fi
}}
{hostfile}: > "$a"/{JOBIDS}
submit {scripts[0]} || exit 5
""" + (f"""# Multi-job: the master must run before the workers learn its node (MASTER_ADDR).
while :; do
  poll "${{jobs[0]}}" 0
  case "$st" in
    {waiting}) sleep {POLL_S} ;;
    {running}) break ;;
    *) break ;;
  esac
done
master="$(field "$rec" BatchHost)"
if [ -n "$master" ]; then
  echo "DISTRUN_SLURM master job ${{jobs[0]}} runs on $master: MASTER_ADDR=$master"
  for script in {' '.join(scripts[1:])}; do
    submit "$script" --export="ALL,MASTER_ADDR=$master" || {{ scancel "${{jobs[@]}}"; exit 5; }}
  done
fi
""" if multi else "") + f"""# Follow every job until all have ended; the first one that fails ends the others.
final=COMPLETED
failed_job=""
launch_failed=""
# tail -F waits for the files to appear: a job that ends between two polls is still shown.
tail -q -n +1 -F -s 0.5 {stream + " " if stream else ""}"$a"/slurm-"${{jobs[0]}}".out 2>/dev/null &
tail_pid=$!
while :; do
  active=0
  for i in "${{!jobs[@]}}"; do
    poll "${{jobs[$i]}}" "$i"
    if [ -z "$launch_failed" ] && grep -q -E '{LAUNCH_FAILED_RE}' "$a/slurm-${{jobs[$i]}}.out" 2>/dev/null; then
      launch_failed="${{jobs[$i]}}"
      if [ "$final" = COMPLETED ]; then final=FAILED; failed_job="$launch_failed"; fi
      scancel "${{jobs[@]}}" 2>/dev/null
    fi
    case "$st" in
      {waiting}) active=1 ;;
      {running}) active=1 ;;
      *)
        if [ "$st" != COMPLETED ] && [ "$final" = COMPLETED ]; then
          final="$st"
          failed_job="${{jobs[$i]}}"{cancel_rest}
        fi ;;
    esac
  done
  [ "$active" = 0 ] && break
  sleep {POLL_S}
done
# Let the stream catch up with the last lines before it stops.
if [ -n "$tail_pid" ]; then sleep 1.5; kill "$tail_pid" 2>/dev/null; wait "$tail_pid" 2>/dev/null; fi
trap - INT TERM HUP
rec="$(record "${{failed_job:-${{jobs[0]}}}}")"
echo "DISTRUN_SLURM_RESULT state=$final job=${{failed_job:-${{jobs[0]}}}} exit=$(field "$rec" ExitCode) nodes=$(field "$rec" NodeList) reason=$(field "$rec" Reason)"
if [ -n "$launch_failed" ] && [ "$launch_failed" = "$failed_job" ]; then
  # A task that never started: its node's slurmstepd said why (the first error line it wrote).
  out="$a/slurm-$failed_job.out"
  why="$(grep -m 1 -E '^slurmstepd-[^:]+: error: ' "$out" 2>/dev/null)"
  node="$(sed -n 's/^slurmstepd-\\([^:]*\\):.*/\\1/p' <<< "$why")"
  launch="$(grep -m 1 -E '{LAUNCH_FAILED_RE}' "$out")"
  where="${{node:-$(field "$rec" NodeList)}}"
  echo "DISTRUN_FAILED_HOST $where Slurm could not start a task on $where (srun: ${{launch#srun: error: }}${{why:+; slurmstepd: ${{why#*: error: }}}}); the job was cancelled"
elif [ "$final" != COMPLETED ]; then
  # The task that exited non-zero, rather than those srun killed because of it.
  # Only the failed job's output: in multi-job mode the others were cancelled because of it.
  errors="$(grep -E '^srun: error: [^: ]+: tasks? [0-9,-]+: ' "$a/slurm-$failed_job.out" 2>/dev/null)"
  bad="$(grep -v -E ': (Killed|Terminated)$' <<< "$errors" | grep -m 1 .)"
  if [ -n "$bad" ]; then
    node="$(cut -d: -f3 <<< "$bad" | tr -d ' ')"
    echo "DISTRUN_FAILED_HOST $node Slurm job ${{failed_job}} ended $final on $node:$(cut -d: -f4- <<< "$bad")"
  else
    # srun killed every task (an MPI_Abort ends the step before the rank's own exit is seen):
    # the rank logs, collected afterwards, name the rank (rank_failure_lines in the runner).
    echo "DISTRUN_FAILED_HOST $(field "$rec" NodeList) Slurm job ${{failed_job}} ended $final (exit $(field "$rec" ExitCode), reason $(field "$rec" Reason))"
  fi
fi
exit "$(exit_code_of "${{final%% *}}")"
"""


def driver_files(plan: JobPlan) -> dict[str, str]:
    return {DRIVER: driver_script(plan)}

