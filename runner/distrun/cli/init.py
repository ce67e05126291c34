"""'distrun init': a new inventory folder from a head and workers (registered by cli/main.py)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from distrun.cli.parse import Command
from distrun.ui.console import console


@click.command(cls=Command)
@click.argument("name")
@click.option("--head", required=True, metavar="HOST", help="The head node: NAME or NAME=ADDRESS.")
@click.option("--workers", required=True, metavar="HOST,HOST",
              help="The hosts that run ranks (the head may be one): NAME or NAME=ADDRESS each, comma-separated.")
@click.option("--user", "admin_user", default=None, metavar="ADMIN",
              help="The account Ansible logs in with (ansible_user); it needs sudo. Default: your ssh default.")
@click.option("--dir", "base_dir", default="inventory", metavar="DIR",
              show_default=True, help="Where the inventory folder is made.")
def init(name: str, head: str, workers: str, admin_user: str | None, base_dir: str) -> None:
    """Write a new inventory, BASE_DIR/NAME/ (hosts.yml and commented group_vars/all.yml).

    Example: distrun init prod --head w1=10.0.0.11 --workers w1,w2=10.0.0.12 --user admin
    """
    from distrun.inventory.scaffold import write_inventory

    if not base_dir.strip():
        raise click.UsageError("--dir is empty: give the folder to make the inventory in (default: inventory)")
    if len(name.encode()) > 200:
        raise click.UsageError(f"the name {name[:20]}... is {len(name.encode())} bytes, too long for a folder name; "
                               "give a short one like prod")
    written = write_inventory(Path(os.path.expanduser(base_dir)), name, head, workers, admin_user)
    for f in written.files:
        console.print(f"wrote {f}", markup=False)
    console.print(f"head {written.head}, workers {', '.join(written.workers)}; read {written.files[-1]} and change "
                  "what your cluster needs (provider, shared folder, packages)", markup=False)
    console.print("next:", markup=False)
    for line in written.next_commands:
        console.print(f"  {line}", markup=False)
