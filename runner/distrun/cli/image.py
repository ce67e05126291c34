"""'distrun push-image': an image into the training user's store on every node (registered by cli/main.py)."""

from __future__ import annotations

import json
import sys

import click

from distrun.cli import params as P
from distrun.cli.parse import Command
from distrun.errors import ExitCode, UserError
from distrun.ui.console import console


def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


@click.command("push-image", cls=Command)
@click.argument("ref", metavar="IMAGE")
@P.inventory_option
@click.option("--from", "from_node", default=None, metavar="NODE",
              help="Take the image from this node's training user (default: this machine's own podman or docker).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result as JSON: ref, runtime, id, source, archive, saved, moved_bytes, nodes (docs/guide/cli.md).")
def push_image(ref: str, inventory: P.Inventory, from_node: str | None, as_json: bool) -> None:
    """Put IMAGE into the training user's image store on every node, with one id everywhere.

    A node that already holds the image's id gets nothing; the others get one archive, saved
    once into distrun's state folder under the id (a second push saves nothing) and loaded on
    all of them at once. Then 'distrun train --image IMAGE' finds it on every node, and refuses a
    node that holds another id under the name (a job can tag an image of its own).
    Example: distrun push-image localhost/train:1 --inventory prod
    """
    from distrun.inventory.cluster import load_cluster
    from distrun.project.image_push import push

    result = push(load_cluster(inventory.path), ref, from_node)
    if as_json:
        from distrun.ui.data import SCHEMA

        click.echo(json.dumps({
            "schema": SCHEMA, "ref": result.ref, "runtime": result.runtime, "id": f"sha256:{result.image_id}", "source": result.source,
            "archive": result.archive or None, "saved": result.saved, "moved_bytes": result.moved,
            "nodes": [{"host": n.host, "before": f"sha256:{n.before}" if n.before else None,
                       "after": f"sha256:{n.after}" if n.after else None, "moved_bytes": n.moved,
                       "seconds": n.seconds, "error": n.error or None} for n in result.nodes]}, indent=2))
    else:
        short = result.image_id[:12]
        for n in result.nodes:
            if n.error:
                line = f"{n.host}: FAILED: {n.error}"
            elif n.moved:
                line = f"{n.host}: loaded {short} ({_size(n.moved)} in {n.seconds:.1f} s)"
            else:
                line = f"{n.host}: has {short}, nothing moved"
            console.print(line, markup=False, soft_wrap=True)
        how = ("saved from " + result.source + " into " + result.archive) if result.saved else \
            (f"archive {result.archive} reused" if result.archive else "no archive needed")
        console.print(f"{result.ref} {short}: {_size(result.moved)} moved to "
                      f"{sum(1 for n in result.nodes if n.moved)} of {len(result.nodes)} node(s); {how}",
                      markup=False, soft_wrap=True)
    if result.failed:
        raise UserError(f"image {ref} did not reach {', '.join(n.host for n in result.failed)}: "
                        "see the lines above, then run 'distrun push-image' again", exit_code=ExitCode.FAILED)
    sys.exit(ExitCode.OK)
