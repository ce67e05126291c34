"""Distributed forward pass, loss and gradients equal the single-process full-graph computation.

Every program writes, with --check-exact, the logits of all nodes, the global training loss and
the gradient of that loss w.r.t. every (unsharded) parameter for the initial model with dropout
off. They are compared with tests/workloads/reference.py, an independent dense float64 numpy GCN.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import free_port, run_workload
from reference import dense_norm_adj, gcn_reference

TOL = 1e-5
SEED = 7
WIDE_HIDDEN = 1440  # at least Cora's 1433 features: the partitioned trainers aggregate the features first


@pytest.fixture(scope="module")
def cora_reference(cora_raw: Path):
    import loaders
    from graph import init_params

    g = loaders.load_cora(cora_raw, download=False)
    params = init_params(SEED, g.features.shape[1], 16, g.num_classes)
    adj = dense_norm_adj(g.num_nodes, g.src, g.dst)
    return gcn_reference(adj, g.features, g.labels, g.train_mask, params)


@pytest.fixture(scope="module")
def cora_partitions(cora_parts) -> Path:  # noqa: ANN001
    for n in (1, 2, 3):
        root = cora_parts(n).parent
    return root


def assert_matches(check: Path, ref) -> float:  # noqa: ANN001
    with np.load(check, allow_pickle=False) as z:
        got = {k: z[k] for k in z.files}
    errors = {"logits": np.abs(got["logits"] - ref.logits).max(), "loss": abs(float(got["loss"]) - ref.loss)}
    for k, v in ref.grads.items():
        assert got[f"grad_{k}"].shape == v.shape, k
        errors[f"grad_{k}"] = np.abs(got[f"grad_{k}"] - v).max()
    worst = max(errors.values())
    assert worst < TOL, errors
    # Cora's initial logits are small (row-normalised features), so also bound the error
    # relative to each quantity's scale: 1e-5 absolute alone could hide a wrong small term.
    scale = {"logits": np.abs(ref.logits).max(), "loss": abs(ref.loss),
             **{f"grad_{k}": np.abs(v).max() for k, v in ref.grads.items()}}
    relative = {k: errors[k] / scale[k] for k in errors}
    assert max(relative.values()) < 1e-4, relative
    print(f"max abs error {worst:.2e}, max relative error {max(relative.values()):.2e}")
    # Guard against a comparison that passes trivially (e.g. all zeros on both sides).
    assert np.abs(ref.grads["W1"]).max() > 1e-4 and np.abs(ref.logits).max() > 1e-3
    return float(worst)


@pytest.mark.jittor
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_jittor_partitioned_matches_full_graph(ranks, cora_partitions, cora_reference, work_env, tmp_path):
    out = tmp_path / "check.npz"
    args = ["--dataset", "cora", "--seed", str(SEED), "--part-dir", str(cora_partitions / f"cora-{ranks}"),
            "--num-parts", str(ranks), "--check-exact", str(out)]
    r = run_workload("gcn_jittor.py", args, work_env, ranks=ranks if ranks > 1 else None)
    assert r.rc == 0, r.stderr[-3000:]
    assert_matches(out, cora_reference)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_torch_partitioned_matches_full_graph(ranks, cora_partitions, cora_reference, work_env, tmp_path):
    out = tmp_path / "check.npz"
    args = ["--dataset", "cora", "--seed", str(SEED), "--part-dir", str(cora_partitions / f"cora-{ranks}"),
            "--num-parts", str(ranks), "--check-exact", str(out)]
    if ranks == 1:
        r = run_workload("gcn_torch.py", args, work_env)  # no launcher: one process, no process group
    else:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        r = run_workload("gcn_torch.py", args, work_env, ranks=ranks, extra_env=env)
    assert r.rc == 0, r.stderr[-3000:]
    assert_matches(out, cora_reference)


@pytest.fixture(scope="module")
def cora_reference_wide_hidden(cora_raw: Path):
    """The reference with a hidden layer at least as wide as Cora's 1433 features."""
    import loaders
    from graph import init_params

    g = loaders.load_cora(cora_raw, download=False)
    params = init_params(SEED, g.features.shape[1], WIDE_HIDDEN, g.num_classes)
    return gcn_reference(dense_norm_adj(g.num_nodes, g.src, g.dst), g.features, g.labels, g.train_mask, params)


@pytest.mark.parametrize("workload,ranks", [
    pytest.param("gcn_torch.py", 2), pytest.param("gcn_torch.py", 3),
    pytest.param("gcn_jittor.py", 2, marks=pytest.mark.jittor), pytest.param("gcn_jittor.py", 3, marks=pytest.mark.jittor),
])
def test_aggregating_features_first_matches_full_graph(workload, ranks, cora_partitions, cora_reference_wide_hidden,
                                                        work_env, tmp_path):
    """A hidden layer at least as wide as the features makes both partitioned trainers compute
    Â·X before ·W1, with the halo's features exchanged once and no exchange in that layer's
    backward pass."""
    out = tmp_path / "check.npz"
    args = ["--dataset", "cora", "--seed", str(SEED), "--part-dir", str(cora_partitions / f"cora-{ranks}"),
            "--num-parts", str(ranks), "--hidden", str(WIDE_HIDDEN), "--check-exact", str(out)]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())} if workload == "gcn_torch.py" else None
    r = run_workload(workload, args, work_env, ranks=ranks, extra_env=env)
    assert r.rc == 0, r.stderr[-3000:]
    assert_matches(out, cora_reference_wide_hidden)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_halo_rows_carry_the_owners_dropout_masks(backend, cora_partitions, work_env):
    """Training drops input features by masks each owner draws; a rank that aggregates a halo
    node's features must apply the owner's mask to them, bit for bit (Cora: 1433 features, not a
    multiple of 8, so the bit packing's last byte is partial). torch: gcn_torch's exchange;
    numpy: the mpi4py halo gcn_jittor uses."""
    import subprocess

    from conftest import PYTHON, mpirun_prefix

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = mpirun_prefix(3, env) + [PYTHON, str(Path(__file__).with_name("halo_check.py")), backend,
                                   str(cora_partitions / "cora-3")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**work_env, **env}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    checked = int(proc.stdout.split("halo rows checked:")[1].split()[0])
    assert checked > 300, proc.stdout  # Cora in 3 parts: 372 halo rows


def test_torch_partitioned_gdc_matches_full_graph_under_torchrun(cora_raw, cora_gdc, work_env, tmp_path):
    """Parts of the GDC diffusion carry its rows and weights (test_partition, test_gdc check that
    they are the diffusion's); here 2 ranks under torchrun against the dense float64 GCN with the
    same P assembled from the parts."""
    import subprocess
    import sys

    import loaders
    from conftest import WORKLOADS
    from graph import init_params

    g = loaders.load_cora(cora_raw, download=False)
    p_dense = np.zeros((g.num_nodes, g.num_nodes))
    for i in range(2):
        with np.load(cora_gdc / f"part-{i}.npz") as z:
            local_to_global = np.concatenate([z["owned_gid"], z["halo_gid"]])
            rows = np.repeat(z["owned_gid"], np.diff(z["indptr"]))
            p_dense[rows, local_to_global[z["indices"]]] = z["weights"]
    assert np.allclose(p_dense.sum(1), 1.0, atol=1e-5) and (p_dense > 0).sum() > 30 * g.num_nodes
    ref = gcn_reference(p_dense, g.features, g.labels, g.train_mask, init_params(SEED, g.features.shape[1], 16, g.num_classes))
    out = tmp_path / "check.npz"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(WORKLOADS / "gcn_torch.py"), "--dataset", "cora", "--use-gdc", "--part-dir", str(cora_gdc),
           "--seed", str(SEED), "--check-exact", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=work_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_matches(out, ref)


@pytest.mark.jittor
@pytest.mark.parametrize("ranks", [2, 3])
def test_tensor_parallel_matches_full_graph(ranks, cora_raw, cora_reference, work_env, tmp_path):
    out = tmp_path / "check.npz"
    args = ["--dataset", "cora", "--data-dir", str(cora_raw), "--seed", str(SEED), "--check-exact", str(out)]
    r = run_workload("gcn_tp.py", args, work_env, ranks=ranks)
    assert r.rc == 0, r.stderr[-3000:]
    assert_matches(out, cora_reference)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_ddp_under_mpirun_matches_full_graph(ranks, cora_raw, cora_reference, work_env, tmp_path):
    out = tmp_path / "check.npz"
    args = ["--dataset", "cora", "--data-dir", str(cora_raw), "--seed", str(SEED), "--check-exact", str(out)]
    if ranks == 1:
        r = run_workload("gcn_ddp.py", args, work_env)  # no launcher: plain single process
    else:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        r = run_workload("gcn_ddp.py", args, work_env, ranks=ranks, extra_env=env)
    assert r.rc == 0, r.stderr[-3000:]
    assert_matches(out, cora_reference)


def test_ddp_under_torchrun_matches_full_graph(cora_raw, cora_reference, work_env, tmp_path):
    import subprocess
    import sys

    from conftest import WORKLOADS

    out = tmp_path / "check.npz"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(WORKLOADS / "gcn_ddp.py"), "--dataset", "cora", "--data-dir", str(cora_raw), "--seed", str(SEED),
           "--check-exact", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=work_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_matches(out, cora_reference)
