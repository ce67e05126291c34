"""Read what a node's NVIDIA GPUs say about their health, for 'distrun check' to judge.

Prints one JSON object and judges nothing (distrun.preflight.gpuhealth does, on the controller):
the GPU devices present (/dev/nvidia<N>), nvidia-smi's answer to one --query-gpu (index, bus id,
name, driver, persistence mode, ECC mode and uncorrected error counts) and one
--query-remapped-rows, each as exit code, stdout and stderr (capped), and the kernel log's NVRM
Xid lines of this boot with the clock they are read against. On a node without nvidia-smi and
without GPU devices it reads nothing else and says so. Standard library only; runs as root
(the kernel log may be closed to others) with a time limit on every command.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

QUERY_GPU = ("index,pci.bus_id,name,driver_version,persistence_mode,ecc.mode.current,"
             "ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total")
QUERY_REMAP = "gpu_bus_id,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"
XID = re.compile(r"NVRM: Xid \(")
CAP = 64 * 1024  # bytes kept of each command's output
MAX_XID_LINES = 200  # the newest ones
TIMEOUT_S = 20


def run(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, errors="replace")
    except (OSError, subprocess.SubprocessError) as exc:
        return {"rc": -1, "out": "", "err": f"{argv[0]}: {exc}"[:CAP]}
    return {"rc": p.returncode, "out": p.stdout[:CAP], "err": p.stderr[-CAP:]}


def kernel_xids():
    """The Xid lines of this boot: the journal's kernel messages (ISO times), else dmesg's."""
    tried = []
    for argv in (["journalctl", "-k", "-b", "-o", "short-iso", "--no-pager", "-q"],
                 ["dmesg", "--time-format", "iso"], ["dmesg"]):
        if not shutil.which(argv[0]):
            tried.append(f"{argv[0]}: not installed")
            continue
        got = run(argv)
        lines = got["out"].splitlines()
        if got["rc"] == 0 and lines:
            return {"source": " ".join(argv), "lines": [ln for ln in lines if XID.search(ln)][-MAX_XID_LINES:],
                    "error": ""}
        tried.append(f"{' '.join(argv)}: {(got['err'].strip().splitlines() or ['no output'])[-1][:200]}")
    return {"source": "", "lines": [], "error": "; ".join(tried)}


def read():
    devices = sorted(d for d in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia[0-9]+", d))
    smi = shutil.which("nvidia-smi") or next((p for p in ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")
                                              if os.access(p, os.X_OK)), "")
    out = {"devices": len(devices), "smi": smi, "now": time.time(), "boot": boot_time()}
    if not smi and not devices:
        return out
    if smi:
        out["query"] = run([smi, f"--query-gpu={QUERY_GPU}", "--format=csv"])
        out["remap"] = run([smi, f"--query-remapped-rows={QUERY_REMAP}", "--format=csv"])
    out["kernel"] = kernel_xids()
    return out


def boot_time():
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


if __name__ == "__main__":
    sys.stdout.write(json.dumps(read()) + "\n")
