"""The distrun program's exit (cli.run, cli.edges.exit_now): it skips tearing the interpreter down,
and still gives the exit code, the whole output, its exit handlers and its threads' work, as
Python's own exit would. Run as separate processes, the way a shell or a script sees them; each
has a time limit, so an exit that waited forever fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DISTRUN = str(Path(sys.executable).parent / "distrun")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_the_program_gives_its_exit_code_and_whole_output_through_a_pipe(tmp_path):
    ok = subprocess.run([DISTRUN, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0
    assert "Exit codes" in ok.stdout  # the last section of the help: nothing cut off

    bad = subprocess.run([DISTRUN, "runs", "--bogus"], capture_output=True, text=True, timeout=60, check=False,
                         env={"PATH": "/usr/bin:/bin", "DISTRUN_HOME": str(tmp_path)})
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "distrun: error: runs: no such option --bogus ('distrun runs --help' lists them)"]


def test_exit_handlers_run_and_output_is_flushed_first():
    done = _python(
        "import atexit, sys\n"
        "from distrun.cli.edges import exit_now\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        "sys.stdout.write('unflushed line\\n')\n"
        "exit_now(3)\n")
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["unflushed line", "exit handler ran"]


def test_a_thread_still_running_and_an_idle_thread_pool_get_pythons_own_exit():
    done = _python(
        "import atexit, threading, time\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from distrun.cli.edges import exit_now\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        "pool = ThreadPoolExecutor(1)\n"
        "pool.submit(print, 'pool task')\n"  # its worker then waits for more: never shut down here
        "time.sleep(0.1)\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread finished'))).start()\n"
        "exit_now(3)\n")
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["pool task", "thread finished", "exit handler ran"]


def test_a_text_exit_is_told_on_stderr_with_status_1_and_none_is_0():
    text = _python("from distrun.cli.edges import exit_now; exit_now('cannot go on')")
    assert (text.returncode, text.stderr.strip()) == (1, "cannot go on")
    assert _python("from distrun.cli.edges import exit_now; exit_now(None)").returncode == 0
