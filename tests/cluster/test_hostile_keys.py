"""Keys a run can read reach only that run's hosts, and only for its start: a job given node1 and
node2 looks for every ssh private key it can read (the training user's home, its run directory)
and uses each to copy a file onto node3, which is not its run's; every key it found is kept, and
whatever it can log in with is looked at for how long it stays good. Each attack is tallied in
tests/cluster/hostile.py."""

from __future__ import annotations

import json
import textwrap
import uuid

from .conftest import distrun
from .hostile import TALLY

HOME = "/home/distrun"

STEAL = textwrap.dedent(r'''
    import glob, json, os, socket, subprocess, sys
    tag = sys.argv[1]
    home = os.path.expanduser("~")
    run_dir = os.environ["DISTRUN_RUN_DIR"]
    if os.environ.get("RANK") == "0":
        keys = []
        for path in glob.glob(f"{home}/.ssh/*") + glob.glob(f"{run_dir}/**", recursive=True):
            try:
                with open(path, "rb") as f:
                    head = f.read(64)
            except OSError:
                continue
            # Split, so the run record that keeps this script holds no key block to its own scan.
            if head.startswith(b"-----BEGIN OPENSSH " + b"PRIVATE KEY-----"):
                keys.append(path)
        said = {"keys": keys, "copied": {}, "validity": {}}
        os.makedirs(f"{home}/stolen-{tag}", exist_ok=True)
        with open(f"{home}/stolen-{tag}/marker", "w") as f:
            f.write(tag + "\n")
        for i, key in enumerate(keys):
            ssh = f"ssh -F /etc/ssh/ssh_config -o BatchMode=yes -o IdentitiesOnly=yes -i {key}"
            cert = key + "-cert.pub"
            if os.path.exists(cert):
                ssh += f" -o CertificateFile={cert}"
                said["validity"][key] = subprocess.run(["ssh-keygen", "-L", "-f", cert], capture_output=True,
                                                       text=True).stdout
            else:
                said["validity"][key] = "a plain key: no end"
            p = subprocess.run(["rsync", "-e", ssh, f"{home}/stolen-{tag}/marker", f"node3:{home}/stolen-{tag}-{i}"],
                               capture_output=True, text=True, timeout=60)
            said["copied"][key] = {"rc": p.returncode, "err": p.stderr[-300:]}
        sys.stdout.write("STOLEN " + json.dumps(said) + "\n")
''')


def test_keys_a_job_reads_reach_no_node_outside_its_run(provisioned, tmp_path):
    tag = uuid.uuid4().hex[:8]
    script = tmp_path / "steal.py"
    script.write_text(STEAL)
    try:
        res = distrun("train", "--inventory", "test", "--launcher", "mpirun", "--hosts", "node1,node2", "--script",
                      str(script), "--", tag, timeout=600)
        assert res.rc == 0 and "STOLEN " in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
        said = json.JSONDecoder().raw_decode(res.stdout.split("STOLEN ", 1)[1])[0]
        landed = provisioned.exec(3, f"ls {HOME} | grep -c stolen-{tag}- || true", check=False).stdout.strip()
        print(f"\nkeys the job read: {said['keys']}\nits copies to node3: {said['copied']}\nlanded: {landed}")
        lasting = [k for k, v in said["validity"].items() if "no end" in v or "forever" in v]
        found = [TALLY.record("a key the job reads copies a file onto a node outside its run",
                              landed not in ("", "0")),
                 TALLY.record("a key the job reads logs in with no end to its validity", bool(lasting))]
        assert not any(found), (said, landed)
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"rm -rf {HOME}/stolen-{tag}*", check=False)
