#!/usr/bin/python
"""Ansible module of role distrun: write one small file, given as text, atomically.

For files the training user owns in folders its jobs can write (the hostfile in the shared
folder, the keys in ~/.ssh). Run it as that user (``become_user``): the module arrives on the
module's stdin (pipelining), so no file passes through a temporary folder handed from root to
that user, which root would later remove (``copy`` and ``template`` do hand one over where
``setfacl`` is missing, and a job could swap it for a link). Written as that user, the file
cannot land anywhere that user could not write anyway. A link at the destination is replaced,
never followed: the text goes to a new file in the same folder (``O_EXCL``), renamed over it.
"""

from __future__ import annotations

import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: distrun_write_file
short_description: Write a file's text atomically, replacing (never following) a link there
description:
  - Writes content to dest through a new file in dest's folder renamed over dest, with the
    given mode, owned by the user the module runs as. Reports a change only when the text or the
    mode differ, or dest was not a plain file.
options:
  dest: {description: The file to write., type: path, required: true}
  content: {description: Its text., type: str, required: true}
  mode: {description: Its mode (octal string)., type: str, required: true}
author: distrun
"""


def current(dest: str) -> tuple[bytes, int] | None:
    """dest's bytes and permission bits when it is a plain file; None otherwise (a link included)."""
    try:
        fd = os.open(dest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > 16 << 20:
            return None
        return fh.read(), stat.S_IMODE(st.st_mode)


def write(dest: str, data: bytes, mode: int) -> None:
    folder = os.path.dirname(dest) or "."
    fd, tmp = tempfile.mkstemp(prefix=".distrun-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, dest)  # replaces a link at dest itself, never writes where it points
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={"dest": {"type": "path", "required": True},
                       "content": {"type": "str", "required": True, "no_log": False},
                       "mode": {"type": "str", "required": True}},
        supports_check_mode=True,
    )
    p = module.params
    data = p["content"].encode()
    mode = int(p["mode"], 8)
    if current(p["dest"]) == (data, mode):
        module.exit_json(changed=False, dest=p["dest"])
    if not module.check_mode:
        try:
            write(p["dest"], data, mode)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {p['dest']}: {exc.strerror}; check its folder's owner and mode, "
                                 "then run distrun setup again")
    module.exit_json(changed=True, dest=p["dest"])


if __name__ == "__main__":
    main()
