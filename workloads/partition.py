#!/usr/bin/env python3
"""Partition a graph with Metis into one portable .npz file per part plus manifest.json.

    python partition.py --dataset reddit --num-parts 2 [--data-dir DIR] [--out DIR]

Each ``part-<i>.npz`` holds plain numpy arrays (read with allow_pickle=False):
  owned_gid       global ids of the nodes this part owns (sorted)
  halo_gid        global ids of neighbours owned elsewhere, sorted by (owner, id)
  halo_owner      the part owning each halo node
  indptr, indices local CSR of the symmetrised graph: rows = owned nodes, columns = local ids
                  (0..n_owned-1 owned, then n_owned.. halo), no self loops
  degree          global neighbour count of every local node (owned then halo)
  send_idx        local ids of owned nodes to send, grouped by destination part
  send_counts     how many of send_idx go to each part
  recv_counts     how many halo rows arrive from each part (= halo_owner histogram)
  features, labels, train_mask, val_mask, test_mask   for the owned nodes
  part_id, num_parts, num_nodes, num_train   scalars
The rows part p sends to part q are exactly q's halo rows owned by p, in the same order, so
one MPI Alltoallv fills the halo.

Re-running with the same inputs reuses the existing partition; other inputs rebuild it. Writes
go to a temporary folder renamed into place at the end, so a killed run leaves nothing a later
run would trust.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import datasets
from datasets import DatasetError, Graph, SyntheticSpec

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class PartitionResult:
    membership: np.ndarray
    edge_cut: int  # undirected edges whose ends lie in different parts
    parts: list[dict[str, np.ndarray]] = field(default_factory=list)


def metis_membership(graph: Graph, num_parts: int) -> np.ndarray:
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    import pymetis

    # symmetrise() leaves the edges sorted by source: that already is Metis' CSR adjacency.
    xadj = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(graph.src, minlength=graph.num_nodes), out=xadj[1:])
    _, membership = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, graph.dst))
    membership = np.asarray(membership, dtype=np.int64)
    if np.bincount(membership, minlength=num_parts).min() == 0:
        raise DatasetError(f"Metis left a part empty: the graph is too small for {num_parts} parts")
    return membership


def build_parts(graph: Graph, membership: np.ndarray, num_parts: int) -> PartitionResult:
    n = graph.num_nodes
    src, dst = graph.src, graph.dst
    degree = np.bincount(src, minlength=n).astype(np.int64)
    owner_src = membership[src]
    owner_dst = membership[dst]
    edge_cut = int(np.count_nonzero(owner_src != owner_dst) // 2)
    num_train = int(graph.train_mask.sum())

    # Edges sorted by (owner of source, source): one slice per part, rows already in order.
    order = np.argsort(owner_src, kind="stable")
    bounds = np.searchsorted(owner_src[order], np.arange(num_parts + 1))
    owned = [np.flatnonzero(membership == p) for p in range(num_parts)]
    halos: list[np.ndarray] = []
    edge_slices: list[tuple[np.ndarray, np.ndarray]] = []
    for p in range(num_parts):
        sel = order[bounds[p] : bounds[p + 1]]
        e_src, e_dst = src[sel], dst[sel]
        remote = np.unique(e_dst[owner_dst[sel] != p])
        halo = remote[np.lexsort((remote, membership[remote]))]
        halos.append(halo)
        edge_slices.append((e_src, e_dst))

    g2l = np.full(n, -1, dtype=np.int64)
    result = PartitionResult(membership, edge_cut)
    for p in range(num_parts):
        own, halo = owned[p], halos[p]
        g2l[own] = np.arange(own.size)
        g2l[halo] = own.size + np.arange(halo.size)
        e_src, e_dst = edge_slices[p]
        indptr = np.zeros(own.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(g2l[e_src], minlength=own.size), out=indptr[1:])
        indices = g2l[e_dst]
        # What p sends to q = q's halo nodes owned by p, in q's order.
        sends = [halos[q][membership[halos[q]] == p] for q in range(num_parts)]
        send_counts = np.array([s.size for s in sends], dtype=np.int64)
        send_idx = g2l[np.concatenate(sends)] if send_counts.sum() else np.zeros(0, np.int64)
        halo_owner = membership[halo]
        result.parts.append(
            {
                "owned_gid": own,
                "halo_gid": halo,
                "halo_owner": halo_owner,
                "indptr": indptr,
                "indices": indices,
                "degree": degree[np.concatenate([own, halo])],
                "send_idx": send_idx,
                "send_counts": send_counts,
                "recv_counts": np.bincount(halo_owner, minlength=num_parts).astype(np.int64),
                "features": graph.features[own],
                "labels": graph.labels[own],
                "train_mask": graph.train_mask[own],
                "val_mask": graph.val_mask[own],
                "test_mask": graph.test_mask[own],
                "part_id": np.int64(p),
                "num_parts": np.int64(num_parts),
                "num_nodes": np.int64(n),
                "num_train": np.int64(num_train),
            }
        )
        g2l[own] = -1
        g2l[halo] = -1
    return result


def input_key(graph: Graph, num_parts: int) -> str:
    return hashlib.sha256(json.dumps([FORMAT_VERSION, graph.name, graph.digest, num_parts]).encode()).hexdigest()


def tool_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        out["pymetis"] = md.version("pymetis")
    except md.PackageNotFoundError:
        out["pymetis"] = "absent"
    return out


def read_manifest(out: Path) -> dict | None:
    try:
        return json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def existing_is_valid(out: Path, key: str) -> bool:
    man = read_manifest(out)
    if not man or man.get("input_key") != key:
        return False
    files = man.get("files", {})
    if len(files) != man.get("num_parts"):
        return False
    return all((out / name).is_file() and datasets.sha256_file(out / name) == digest for name, digest in files.items())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(out: Path) -> None:
    """Temp folders of killed runs are never read; remove them once their writer is gone."""
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if not (pid.isdigit() and _pid_alive(int(pid))):
            shutil.rmtree(stale, ignore_errors=True)


def write_partition(out: Path, graph: Graph, num_parts: int, params: dict) -> dict:
    """Build and write the partition; returns the manifest. Safe against being killed midway."""
    key = input_key(graph, num_parts)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        t0 = time.perf_counter()
        membership = metis_membership(graph, num_parts)
        t_metis = time.perf_counter() - t0
        res = build_parts(graph, membership, num_parts)
        files: dict[str, str] = {}
        for p, arrays in enumerate(res.parts):
            name = f"part-{p}.npz"
            np.savez(tmp / name, **arrays)
            files[name] = datasets.sha256_file(tmp / name)
        sizes = [int(a["owned_gid"].size) for a in res.parts]
        manifest = {
            "format_version": FORMAT_VERSION,
            "input_key": key,
            "dataset": graph.name,
            "dataset_digest": graph.digest,
            "num_nodes": graph.num_nodes,
            "num_edges": graph.num_edges,
            "num_features": int(graph.features.shape[1]),
            "num_classes": graph.num_classes,
            "num_train": int(graph.train_mask.sum()),
            "num_parts": num_parts,
            "part_sizes": sizes,
            "halo_sizes": [int(a["halo_gid"].size) for a in res.parts],
            "edge_cut": res.edge_cut,
            "balance": max(sizes) / (graph.num_nodes / num_parts),
            "metis_seconds": round(t_metis, 3),
            "total_seconds": round(time.perf_counter() - t0, 3),
            "tools": tool_versions(),
            "params": params,
            "files": files,
        }
        # The manifest is written last: its presence marks a complete partition.
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_part(part_dir: Path, part_id: int) -> tuple[dict, dict[str, np.ndarray]]:
    """Read one part for a trainer; DatasetError when the folder is not a complete partition."""
    man = read_manifest(part_dir)
    if man is None:
        raise DatasetError(
            f"{part_dir / MANIFEST}: missing or unreadable; run partition.py with the same "
            f"--dataset and --num-parts first (or pass --part-dir)"
        )
    if man.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{part_dir}: partition format {man.get('format_version')} is not {FORMAT_VERSION}; partition again")
    path = part_dir / f"part-{part_id}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable ({exc}); partition again") from None
    return man, arrays


def default_out(dataset: str, num_parts: int) -> Path:
    return Path("partitions") / f"{dataset}-{num_parts}"


def add_dataset_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dataset", choices=datasets.DATASETS, default="cora")
    ap.add_argument("--data-dir", type=Path, default=None, help="folder with the dataset's files")
    g = ap.add_argument_group("synthetic dataset")
    d = SyntheticSpec()
    g.add_argument("--syn-nodes", type=int, default=d.num_nodes)
    g.add_argument("--syn-edges", type=int, default=d.num_edges, help="directed edge entries (Reddit: 114M)")
    g.add_argument("--syn-features", type=int, default=d.num_features)
    g.add_argument("--syn-classes", type=int, default=d.num_classes)
    g.add_argument("--syn-homophily", type=float, default=d.homophily)
    g.add_argument("--syn-seed", type=int, default=d.seed)


def synthetic_spec(args: argparse.Namespace) -> SyntheticSpec:
    return SyntheticSpec(args.syn_nodes, args.syn_edges, args.syn_features, args.syn_classes, args.syn_homophily, args.syn_seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dataset_args(ap)
    ap.add_argument("--num-parts", "--num_parts", dest="num_parts", type=int, required=True)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default partitions/<dataset>-<n>)")
    ap.add_argument("--use-gdc", "--use_gdc", dest="use_gdc", action="store_true", help="not implemented yet")
    args = ap.parse_args(argv)
    try:
        if args.use_gdc:
            raise DatasetError("--use-gdc (graph diffusion convolution) is not implemented yet; run without it")
        if args.num_parts < 1:
            raise DatasetError("--num-parts must be at least 1")
        out = args.out or default_out(args.dataset, args.num_parts)
        if out.exists() and not (out / MANIFEST).exists() and any(out.iterdir()):
            raise DatasetError(f"{out}: exists and is not a partition written by this tool; choose another --out")
        graph = datasets.load(args.dataset, args.data_dir, synthetic_spec(args))
        if args.num_parts > graph.num_nodes:
            raise DatasetError(f"--num-parts {args.num_parts} exceeds the {graph.num_nodes} nodes of {graph.name}")
        key = input_key(graph, args.num_parts)
        if existing_is_valid(out, key):
            remove_stale_temps(out)
            print(f"reusing existing partition in {out} (same dataset digest and --num-parts)", flush=True)
            return 0
        params = {"dataset": args.dataset, "num_parts": args.num_parts}
        if args.dataset == "synthetic":
            params["synthetic"] = synthetic_spec(args).__dict__
        verb = "replacing" if (out / MANIFEST).exists() else "writing"
        print(f"{verb} partition {out}: {graph.name}, {graph.num_nodes} nodes, {graph.num_edges} edges, {args.num_parts} parts", flush=True)
        man = write_partition(out, graph, args.num_parts, params)
        print(
            f"wrote {out}: edge cut {man['edge_cut']}, balance {man['balance']:.3f}, "
            f"{man['total_seconds']:.2f} s",
            flush=True,
        )
        return 0
    except DatasetError as exc:
        print(f"partition.py: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
