# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The names and addresses checks: every address each node's name has here, and this node's
interfaces with their IPv4 addresses now (judged by runner/distrun/preflight/judge.py)."""

import json
import socket
import subprocess


def resolve(name: str) -> str:
    """Every address the name has here, in the resolver's order ("a,b"; "" when none). Not only
    the first: with /etc/host.conf's "multi on", a stray /etc/hosts line adds an address that
    getaddrinfo may sort behind the right one on this node, while another program gets it first."""
    try:
        addresses = socket.gethostbyname_ex(name)[2]
    except OSError:
        return ""
    return ",".join(dict.fromkeys(addresses))


def probe_addresses() -> dict[str, list[str]] | None:
    """Each interface -> its IPv4 addresses, as the node has them now; None when ``ip`` cannot tell."""
    try:
        proc = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=20,
                              check=False)
        links = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (FileNotFoundError, subprocess.TimeoutExpired, ValueError):
        return None
    if not isinstance(links, list):
        return None
    return {str(link.get("ifname")): [str(a["local"]) for a in link.get("addr_info") or [] if a.get("local")]
            for link in links if isinstance(link, dict) and link.get("ifname")}
