"""Exit codes: one table (errors.ExitCode and each launcher's own, composed by launchers.exit_codes)
that every code the program can return is in, shown by 'distrun --help' and, the same table,
docs/guide/cli.md; and the program's edges (its own output closed or full, a folder it may not
write, a name too long) told in one line with a code from that table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from distrun.errors import ExitCode
from distrun.launchers import LAUNCHERS, exit_codes
from distrun.launchers.slurm import STATE_EXIT

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "runner" / "distrun"
DISTRUN = str(Path(sys.executable).parent / "distrun")

# Where a code is given in the source: an exit, a refusal's code, a code a run is finished with,
# a named constant for one, and the train loop's returns (run_job's value is the exit code; an
# attempt's launch returns the code the run ends with).
PATTERNS = (
    re.compile(r"exit_code=(\d+)"),
    re.compile(r"sys\.exit\((\d+)\)"),
    re.compile(r"exit_now\((\d+)\)"),
    re.compile(r"_fail\([^\n]*?, (\d+)\)"),
    re.compile(r"\.finish\((\d+)"),
    re.compile(r"^[A-Z_]*(?:EXIT|LOST)[A-Z_]* = (\d+)", re.M),
)
RETURNING = ("train.py", "launching.py", "attach.py", "logs.py", "ending.py")


def codes_in_source() -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        patterns = [*PATTERNS, re.compile(r"^\s+return (\d+)$", re.M)] if path.name in RETURNING else PATTERNS
        for pattern in patterns:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.setdefault(int(match.group(1)), []).append(f"{path.relative_to(REPO)}:{line}")
    for code, _ in STATE_EXIT.values():
        found.setdefault(code, []).append("launchers/slurm/driver.py STATE_EXIT")
    # A code named by its member (ExitCode.CONTACT_LOST) is given too: "the table holds no code
    # nothing gives" counts it.
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py":
            continue
        for match in re.finditer(r"\bExitCode\.([A-Z_]+)\b", path.read_text()):
            found.setdefault(int(ExitCode[match.group(1)]), []).append(f"{path.relative_to(REPO)} ExitCode.{match.group(1)}")
    return found


def help_text() -> str:
    done = subprocess.run([DISTRUN, "--help"], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_exit_code_in_the_source_is_in_the_table_the_help_and_the_guide():
    found = codes_in_source()
    assert 6 in found and 2 in found and 130 in found, "the grep no longer finds the codes it must"
    table = {code for code, _ in exit_codes()}
    unknown = {code: where for code, where in found.items() if code not in table}
    assert not unknown, f"exit codes neither in errors.ExitCode nor a launcher's exit_codes: {unknown}"
    text = help_text()
    section = text[text.index("Exit codes"):]
    guide = (REPO / "docs" / "guide" / "cli.md").read_text()
    for code in sorted(found):
        assert re.search(rf"^\s+{code}\s+\S", section, re.M), f"exit code {code} is not in 'distrun --help'"
        assert f"| {code} |" in guide, f"exit code {code} is not in docs/guide/cli.md"
    # and the table holds no code nothing gives
    assert table - set(found) <= {int(ExitCode.OK), int(ExitCode.LOCAL_IO), int(ExitCode.TERMINATED)}


def test_the_guides_exit_code_table_is_the_composed_one_and_a_launchers_codes_are_its_own():
    guide = (REPO / "docs" / "guide" / "cli.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", guide[guide.index("## Exit codes"):], re.M)
    assert [(int(c), m) for c, m in rows] == list(exit_codes())
    # A launcher's own codes are distrun's neither in meaning nor in name: errors.ExitCode names no launcher.
    errors_text = (PACKAGE / "errors.py").read_text().lower()
    assert not [name for name in LAUNCHERS if name in errors_text]
    slurm = LAUNCHERS["slurm"]
    assert {code for code, _ in STATE_EXIT.values()} - {0, 1} == set(slurm.exit_codes)


def _distrun(args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """distrun through a shell, so that the shell's own redirections (>&-, >/dev/full) apply."""
    return subprocess.run(["bash", "-c", f"{DISTRUN} {args}"], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DISTRUN_HOME": str(tmp_path / "state"),
                               **env})


def _one_clean_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    return lines[0]


def test_a_closed_stdout_is_told_on_stderr_with_the_io_code(tmp_path):
    done = _distrun("runs >&-", tmp_path)
    assert done.returncode == ExitCode.LOCAL_IO
    assert "standard output closed" in _one_clean_line(done) and "/dev/null" in done.stderr


def test_a_closed_stderr_is_told_on_stdout(tmp_path):
    done = _distrun("runs 2>&-", tmp_path)
    assert done.returncode == ExitCode.LOCAL_IO and "standard error closed" in done.stdout


def test_a_full_stdout_is_one_line_not_a_traceback(tmp_path):
    for args in ("runs >/dev/full", "--help >/dev/full", "runs --json >/dev/full"):
        done = _distrun(args, tmp_path)
        assert done.returncode == ExitCode.LOCAL_IO, args
        assert "No space left" in _one_clean_line(done) and "free some space" in done.stderr


def test_both_streams_full_still_exit_with_the_code_and_nothing_else(tmp_path):
    done = _distrun("runs >/dev/full 2>/dev/full", tmp_path)
    assert done.returncode == ExitCode.LOCAL_IO


def test_a_reader_that_goes_away_ends_it_quietly(tmp_path):
    done = _distrun("--help | true; exit ${PIPESTATUS[0]}", tmp_path)
    assert done.returncode == ExitCode.LOCAL_IO and done.stderr == ""


def test_an_unwritable_folder_and_a_name_too_long_are_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root writes anywhere: a file in the way gives the same edge
        ro = tmp_path / "file"
        ro.write_text("")
    done = _distrun(f"init prod --head a --workers a --dir {ro}/sub", tmp_path)
    assert done.returncode in (ExitCode.LOCAL_IO, ExitCode.USAGE)
    assert str(ro) in _one_clean_line(done)
    long = _distrun(f"init {'n' * 300} --head a --workers a --dir {tmp_path}", tmp_path)
    assert long.returncode in (ExitCode.LOCAL_IO, ExitCode.USAGE)
    assert "too long" in _one_clean_line(long)


def _cli(args: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner

    from distrun.cli.main import main

    result = CliRunner().invoke(main, args, prog_name="distrun")
    assert "Traceback" not in result.output + result.stderr
    return result.exit_code, result.stderr.strip()


def test_logs_of_a_setup_run_names_what_it_is_and_where_its_log_is(private_state, tmp_path):
    from distrun.store.runs import new_run

    run = new_run("setup", tmp_path / "hosts.ini")
    run.finish(0, "changed=0")
    code, err = _cli(["logs", run.id])
    assert code == ExitCode.USAGE and len(err.splitlines()) == 1
    assert f"run {run.id} is a 'setup' run" in err and "ansible.log" in err and "does not exist yet" not in err


def test_stop_of_a_run_whose_inventory_is_gone_fails_and_says_so(private_state, tmp_path):
    from distrun.store.runs import new_run

    gone = tmp_path / "gone" / "hosts.ini"
    run = new_run("train", gone)  # still running, as far as its record knows
    code, err = _cli(["stop", run.id])
    assert code == ExitCode.FAILED and len(err.splitlines()) == 1
    assert f"its inventory {gone} is gone" in err and "put the inventory back" in err
    assert "stopped 0 process" not in err
