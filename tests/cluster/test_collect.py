"""A run's end brings its logs and small files home; the bigger files its job wrote stay on the
nodes, listed in the record, until 'distrun fetch' brings them, as the training user and never
through a link the job planted."""

from __future__ import annotations

import hashlib
import json
import textwrap

from .conftest import distrun
from .test_train import _latest_run

# Every rank writes a small result and a 3 MiB "model"; rank 0 also plants a link to a root-only file.
SCRIPT = textwrap.dedent("""
    import json, os
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    os.makedirs("out", exist_ok=True)
    json.dump({"rank": rank}, open(f"out/result-{rank}.json", "w"))
    with open(f"out/model-{rank}.bin", "wb") as f:
        f.write(bytes(range(256)) * (3 * 4096 + rank))
    if rank == 0:
        os.symlink("/etc/shadow", "out/shadow")
    print("wrote", rank, flush=True)
""")


def test_big_outputs_stay_on_the_nodes_listed_until_fetched(provisioned, distrun_home, tmp_path):
    script = tmp_path / "outputs.py"
    script.write_text(SCRIPT)
    result = distrun("train", "--inventory", "test", "--script", str(script), timeout=600)
    assert result.rc == 0, result.stdout[-3000:] + result.stderr[-2000:]
    run = _latest_run(distrun_home)
    said = " ".join(result.stdout.split())
    assert "left on the nodes: 3 bigger file(s), 9.0 MiB" in said and f"distrun fetch {run.name} PATH" in said, said[-2000:]
    nodes = run / "nodes"
    # Logs and small files came home from every node (sync mode: each holds its own); models did not.
    for k in (1, 2, 3):
        assert json.loads((nodes / f"node{k}" / "out" / f"result-{k - 1}.json").read_text()) == {"rank": k - 1}
        assert not (nodes / f"node{k}" / "out" / f"model-{k - 1}.bin").exists()
    listing = json.loads((run / "left-on-nodes.json").read_text())
    assert listing["run_dir"] == f"/srv/distrun/runs/{run.name}"
    for k in (1, 2, 3):
        size = 256 * (3 * 4096 + k - 1)
        assert listing["hosts"][f"node{k}"]["files"] == [{"path": f"out/model-{k - 1}.bin", "size": size}]

    # Fetch brings one model from the node that holds it, byte for byte; the planted link never.
    got = distrun("fetch", "last", "out/model-2.bin")
    assert got.rc == 0, got.stdout + got.stderr
    assert got.stdout.startswith("node3: 1 file(s), 3.0 MiB into "), got.stdout
    fetched = (nodes / "node3" / "out" / "model-2.bin").read_bytes()
    on_node = provisioned.exec(3, f"sha256sum /srv/distrun/runs/{run.name}/out/model-2.bin").stdout.split()[0]
    assert hashlib.sha256(fetched).hexdigest() == on_node
    got = distrun("fetch", "last", "out", "--host", "node1")
    assert got.rc == 0, got.stdout + got.stderr
    assert (nodes / "node1" / "out" / "model-0.bin").stat().st_size == 256 * 3 * 4096
    assert not (nodes / "node1" / "out" / "shadow").exists()
    # A path no node holds: one line naming it and where the listing is.
    missing = distrun("fetch", "last", "out/nothing.bin")
    assert missing.rc == 2 and "out/nothing.bin: no such file in /srv/distrun/runs/" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
