"""Checkpoints that survive a restart: rank 0 saves one every K epochs, a restarted run resumes
from the newest.

The folder is --checkpoint-dir, else $DISTRUN_CHECKPOINT_DIR (distrun gives every run one in
its shared folder, kept across restarts); with neither, nothing is saved. A checkpoint is
written under a temporary name and renamed, so a rank killed mid-write leaves the previous one
whole. Every checkpoint is kept (a GCN's is a few KB), so --resume-from can name any of them.
What a checkpoint holds is the trainer's business: this module names, finds and writes files.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path

from common import UserError, emit

NAME_RE = re.compile(r"^epoch-(\d{6})\.ckpt$")


def add_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="folder rank 0 saves checkpoints into (default $DISTRUN_CHECKPOINT_DIR; neither: none saved)")
    g.add_argument("--checkpoint-every", type=int, default=10, metavar="K", help="save every K epochs (0: never)")
    g.add_argument("--resume-from", type=Path, default=None, metavar="FILE",
                   help="start from this checkpoint (default: the newest in the checkpoint folder, if any)")


def folder(args: argparse.Namespace) -> Path | None:
    if args.checkpoint_dir is not None:
        return Path(args.checkpoint_dir)
    env = os.environ.get("DISTRUN_CHECKPOINT_DIR")
    return Path(env) if env else None


def epoch_of(path: Path) -> int | None:
    m = NAME_RE.fullmatch(path.name)
    return int(m.group(1)) if m else None


def to_resume(args: argparse.Namespace) -> Path | None:
    """The checkpoint to start from: --resume-from, else the newest in the folder, else None."""
    if args.checkpoint_every < 0:
        raise UserError("--checkpoint-every must be 0 (never) or more")
    if args.resume_from is not None:
        if not Path(args.resume_from).is_file():
            raise UserError(f"--resume-from {args.resume_from}: no such checkpoint on this node")
        return Path(args.resume_from)
    where = folder(args)
    if where is None or not where.is_dir():
        return None
    found = sorted((p for p in where.iterdir() if epoch_of(p) is not None and p.is_file()), key=lambda p: epoch_of(p) or 0)
    return found[-1] if found else None


def due(args: argparse.Namespace, epoch: int) -> bool:
    """Whether rank 0 saves after this epoch: every K epochs, not after the last (the result is final)."""
    every = args.checkpoint_every
    return every > 0 and epoch % every == 0 and epoch < args.epochs and folder(args) is not None


def save(args: argparse.Namespace, epoch: int, write: Callable[[Path], None]) -> Path:
    """Write the checkpoint of ``epoch`` through ``write(path)``, atomically; its path."""
    where = folder(args)
    assert where is not None
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"epoch-{epoch:06d}.ckpt"
    tmp = where / f".{path.name}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)
    return path


def announce(epoch: int, path: Path, rank: int) -> None:
    """Say, once, where the run resumed: a line for people and one for parsers."""
    if rank == 0:
        print(f"resumed from epoch {epoch} (checkpoint {path})", flush=True)
        emit("DISTRUN_RESUMED", {"epoch": epoch, "checkpoint": str(path), "restart": os.environ.get("DISTRUN_RESTART")})
