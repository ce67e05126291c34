"""What a run leaves behind it, outside its unit and on the controller: a job that fills shared
memory, SysV IPC and /tmp and then succeeds, and a job whose run directory is a few files at the
end of very deep folder chains, and names no terminal should print. Each attack is tallied in
tests/cluster/hostile.py."""

from __future__ import annotations

import os
import textwrap
import uuid

from .conftest import train_program
from .hostile import TALLY

# Rank 0 of every node: a file in /dev/shm, a SysV shared memory segment, a file in /tmp, all
# left on purpose; then the run ends well.
LEAVE = textwrap.dedent(r'''
    import ctypes, os, socket, sys
    tag = "TAG"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        with open(f"/dev/shm/leak-{tag}", "wb") as f:
            f.write(b"x" * (1 << 20))
        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(int(tag[:7], 16), 1 << 20, 0o1000 | 0o600)  # IPC_CREAT
        with open(f"/tmp/leak-{tag}", "w") as f:
            f.write("left\n")
        sys.stdout.write(f"LEFT {socket.gethostname()} shm={shmid}\n")
''')

# Rank 0 of the head: CHAINS files, each at the end of a chain of DEPTH folders, and two files
# whose names are not text.
DEEP = textwrap.dedent(r'''
    import os
    tag = "TAG"
    if os.environ.get("RANK", "0") == "0":
        top = os.path.join(os.environ["DISTRUN_RUN_DIR"], "deep")
        for c in range(CHAINS):
            path = os.path.join(top, f"c{c}", *["d"] * DEPTH)
            os.makedirs(path, exist_ok=True)
            open(os.path.join(path, "f"), "w").close()
        base = os.fsencode(os.environ["DISTRUN_RUN_DIR"])
        for name in (b"ctl-\x1b[2J\x07-" + tag.encode(), b"bad-\xff\xfe-" + tag.encode()):
            open(os.path.join(base, name), "w").close()
''').replace("CHAINS", "200").replace("DEPTH", "200")


def test_a_run_leaves_nothing_in_shared_memory_ipc_or_tmp(provisioned, distrun_home, tmp_path):
    tag = uuid.uuid4().hex[:8]
    res, _ = train_program(distrun_home, tmp_path / "leave.py", LEAVE.replace("TAG", tag), {})
    try:
        assert res.rc == 0 and res.stdout.count("LEFT ") == 3, res.stdout[-3000:] + res.stderr[-2000:]
        key = f"0x{int(tag[:7], 16):08x}"
        shm = {k: provisioned.exec(k, f"test -e /dev/shm/leak-{tag}", check=False).returncode == 0 for k in (1, 2, 3)}
        ipc = {k: key in provisioned.exec(k, "ipcs -m", check=False).stdout for k in (1, 2, 3)}
        tmp = {k: provisioned.exec(k, f"test -e /tmp/leak-{tag}", check=False).returncode == 0 for k in (1, 2, 3)}
        print(f"\nafter the run: /dev/shm {shm}, SysV segment {key} {ipc}, /tmp {tmp}")
        found = [TALLY.record("a finished run leaves a file in /dev/shm", any(shm.values())),
                 TALLY.record("a finished run leaves a SysV shared memory segment", any(ipc.values())),
                 TALLY.record("a finished run leaves a file in /tmp", any(tmp.values()))]
        assert not any(found), (shm, ipc, tmp)
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"rm -f /dev/shm/leak-{tag} /tmp/leak-{tag}; ipcrm -M 0x{int(tag[:7], 16):08x} "
                                "2>/dev/null; true", check=False)


def _entries(root: bytes) -> tuple[int, int, list[bytes]]:
    """Folders, deepest path (in folders) and names that are not printable text, below root."""
    folders, deepest, odd = 0, 0, []
    for top, dirs, files in os.walk(root):
        folders += len(dirs)
        deepest = max(deepest, top[len(root):].count(b"/"))
        for name in dirs + files:
            try:
                text = name.decode("utf-8")
            except UnicodeDecodeError:
                odd.append(name)
                continue
            if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
                odd.append(name)
    return folders, deepest, odd


def test_collect_brings_no_deep_folder_chains_and_no_names_that_are_not_text(provisioned, distrun_home, tmp_path):
    tag = uuid.uuid4().hex[:8]
    res, run = train_program(distrun_home, tmp_path / "deep.py", DEEP.replace("TAG", tag), {})
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]  # the job's own exit code is kept
    folders, deepest, odd = _entries(os.fsencode(run / "nodes"))
    print(f"\nthe record holds {folders} folders, {deepest} deep; names that are not text: {odd[:4]}")
    print("collect said: " + " | ".join(ln for ln in res.stderr.splitlines() if ln.startswith("collect")))
    found = [TALLY.record("collect makes thousands of folders on the controller for a few hundred files",
                          folders > 2000),
             TALLY.record("collect stores a name with control bytes or bytes that are not UTF-8 on the controller",
                          bool(odd))]
    assert not any(found), (folders, deepest, odd[:4])
