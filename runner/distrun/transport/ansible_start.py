"""ansible-playbook as distrun starts it: Ansible's own program (the ``ansible-playbook`` console
entry point, ``ansible.cli.playbook:main``), run as it is, through Ansible's public interfaces only.

With ``--distrun-args-from SOCKET`` as its first two arguments it imports Ansible first and only
then takes the rest of its command line from the runner over that Unix socket, so a run's
ansible-playbook can import Ansible (about a third of a second) while the runner still plans the
run (distrun.transport.early_playbook.EarlyPlaybook). Nothing of Ansible is replaced or patched.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# ``--distrun-args-from SOCKET`` (the first two arguments): the program starts, imports Ansible, and
# only then takes the rest of its arguments from the runner, over that Unix socket (in the run's
# private folder), so the runner can start it while it still plans the run (distrun.transport.early_playbook
# .EarlyPlaybook). A socket that closes without a well-formed answer runs nothing.
ARGS_FROM = "--distrun-args-from"
# Its exit status when the runner gave no arguments (it stopped, or ran another playbook first).
NO_ARGUMENTS = 90


def unix_address(path: str) -> tuple[str, int]:
    """An address for the Unix socket at ``path`` that fits in the 108 bytes a socket address
    holds, however long the folder's path: the folder, opened, named through /proc/self/fd. The
    caller closes the descriptor (the second value) once the socket is bound or connected."""
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def late_arguments(where: str) -> list[str] | None:
    """The arguments the runner sends over the Unix socket ``where``: a JSON object whose "args"
    is a list of strings, then the end of the stream. None when the connection fails or closes
    with anything else (the runner stopped, or gave up on this process)."""
    import json
    import socket

    chunks: list[bytes] = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            address, fd = unix_address(where)
            try:
                conn.connect(address)
            finally:
                os.close(fd)
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        said = json.loads(b"".join(chunks))
    except (OSError, ValueError):
        return None
    args = said.get("args") if isinstance(said, dict) else None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return None
    return args


def main() -> Any:
    where = None
    if len(sys.argv) > 2 and sys.argv[1] == ARGS_FROM:
        where = sys.argv[2]
        del sys.argv[1:3]
    from ansible.cli.playbook import main as playbook  # the console entry point: imports Ansible

    if where is not None:
        late = late_arguments(where)
        if late is None:
            sys.stderr.write("distrun-ansible-playbook: distrun gave this playbook no arguments; nothing was run\n")
            return NO_ARGUMENTS
        sys.argv.extend(late)
    sys.argv[0] = os.path.join(os.path.dirname(sys.argv[0]), "ansible-playbook")
    return playbook()


if __name__ == "__main__":
    sys.exit(main())
