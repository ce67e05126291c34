"""distrun's file server for the sshfs mode: the SFTP (version 3) requests of the other nodes' mounts,
served on the head by a root process with the training user's filesystem identity.

The nodes' sshfs mounts are root's (their unit runs sshfs as root, with root's node key), and
log in to the head as the account ``distrun-fs``, whose only key runs ``sudo -n`` of this file
(role shared_fs: the keys file, the sudoers rule). Run as root, it first takes the training user's
filesystem identity (role distrun's distrun_fsuser.py, sent in front of this file when setup
installs it): every path a mount asks for is checked as that user's, what it makes is that user's,
and no process of that user's serves the folder (sshd's sftp-server would be one: a job could stop
it, and every mount would hang with it, or trace it and make it start what it likes outside every
run). Run as anyone else, it serves as itself (the tests).

``python3 -I fileserver.py serve USER FOLDER``: requests on stdin, answers on stdout, until stdin
ends. Paths are taken as sshfs sends them (absolute; a relative one is below FOLDER). Standard
library only; Python 3.9 or newer. The extensions sshfs uses: posix-rename, statvfs, hardlink, fsync.
"""

import os
import stat
import struct
import sys

INIT, VERSION, OPEN, CLOSE, READ, WRITE, LSTAT, FSTAT, SETSTAT, FSETSTAT = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
OPENDIR, READDIR, REMOVE, MKDIR, RMDIR, REALPATH, STAT, RENAME, READLINK, SYMLINK = 11, 12, 13, 14, 15, 16, 17, 18, 19, 20
STATUS, HANDLE, DATA, NAME, ATTRS, EXTENDED, EXTENDED_REPLY = 101, 102, 103, 104, 105, 200, 201
OK, EOF, NO_SUCH_FILE, PERMISSION_DENIED, FAILURE, BAD_MESSAGE, UNSUPPORTED = 0, 1, 2, 3, 4, 5, 8
A_SIZE, A_UIDGID, A_PERMISSIONS, A_ACMODTIME, A_EXTENDED = 1, 2, 4, 8, 0x80000000
F_READ, F_WRITE, F_APPEND, F_CREAT, F_TRUNC, F_EXCL = 1, 2, 4, 8, 0x10, 0x20
PACKET_MAX = 1 << 20  # sshfs sends at most 64 KiB of data in one request
READ_MAX = 256 << 10
EXTENSIONS = (("posix-rename@openssh.com", "1"), ("statvfs@openssh.com", "2"), ("fstatvfs@openssh.com", "2"),
              ("hardlink@openssh.com", "1"), ("fsync@openssh.com", "1"))


class Reader:
    """One request's fields, in order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def u32(self) -> int:
        (v,) = struct.unpack_from(">I", self.data, self.at)
        self.at += 4
        return v

    def u64(self) -> int:
        (v,) = struct.unpack_from(">Q", self.data, self.at)
        self.at += 8
        return v

    def bytes(self) -> bytes:
        n = self.u32()
        if self.at + n > len(self.data):
            raise ValueError("a string past the request's end")
        v = self.data[self.at:self.at + n]
        self.at += n
        return v

    def attrs(self) -> dict:
        flags, out = self.u32(), {}
        if flags & A_SIZE:
            out["size"] = self.u64()
        if flags & A_UIDGID:
            out["uid"], out["gid"] = self.u32(), self.u32()
        if flags & A_PERMISSIONS:
            out["mode"] = self.u32()
        if flags & A_ACMODTIME:
            out["times"] = (self.u32(), self.u32())
        if flags & A_EXTENDED:
            for _ in range(self.u32()):
                self.bytes(), self.bytes()
        return out


def s(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def attrs(st: os.stat_result) -> bytes:
    return struct.pack(">IQIIIII", A_SIZE | A_UIDGID | A_PERMISSIONS | A_ACMODTIME, st.st_size, st.st_uid, st.st_gid,
                       st.st_mode, int(st.st_atime) & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF)


def longname(name: bytes, st: os.stat_result) -> bytes:
    return b"%s %3d %8d %8d %10d %s" % (stat.filemode(st.st_mode).encode(), st.st_nlink, st.st_uid, st.st_gid,
                                         st.st_size, name)


def code_of(exc: OSError) -> int:
    import errno

    return {errno.ENOENT: NO_SUCH_FILE, errno.ENOTDIR: NO_SUCH_FILE, errno.EACCES: PERMISSION_DENIED,
            errno.EPERM: PERMISSION_DENIED}.get(exc.errno or 0, FAILURE)


class Server:
    def __init__(self, root: bytes, out) -> None:
        self.root, self.out = root, out
        self.handles: dict = {}
        self.next = 0

    def path(self, raw: bytes) -> bytes:
        return os.path.normpath(raw if raw.startswith(b"/") else os.path.join(self.root, raw))

    def send(self, kind: int, body: bytes) -> None:
        self.out.write(struct.pack(">IB", len(body) + 1, kind) + body)

    def status(self, rid: int, code: int, msg: str = "") -> None:
        self.send(STATUS, struct.pack(">II", rid, code) + s(msg.encode()) + s(b"en"))

    def handle(self, rid: int, value) -> None:
        self.next += 1
        key = b"%d" % self.next
        self.handles[key] = value
        self.send(HANDLE, struct.pack(">I", rid) + s(key))

    def names(self, rid: int, items: list) -> None:
        body = b"".join(s(n) + s(longname(n, st)) + attrs(st) for n, st in items)
        self.send(NAME, struct.pack(">II", rid, len(items)) + body)

    def fd_of(self, key: bytes) -> int:
        kind, value = self.handles[key]
        if kind != "file":
            raise OSError(9, "not a file handle")
        return value

    def setstat(self, target, a: dict) -> None:
        """Apply attrs to a path (bytes) or a descriptor (int)."""
        if "size" in a:
            os.truncate(target, a["size"])
        if "mode" in a:
            os.chmod(target, a["mode"] & 0o7777)
        if "uid" in a:
            os.chown(target, a["uid"], a["gid"])
        if "times" in a:
            os.utime(target, a["times"])

    def request(self, kind: int, r: Reader) -> None:  # noqa: C901 - one branch per request kind
        rid = r.u32()
        try:
            if kind == OPEN:
                name, flags, a = self.path(r.bytes()), r.u32(), r.attrs()
                mode = os.O_RDWR if flags & F_READ and flags & F_WRITE else os.O_WRONLY if flags & F_WRITE else os.O_RDONLY
                mode |= (os.O_APPEND if flags & F_APPEND else 0) | (os.O_CREAT if flags & F_CREAT else 0)
                mode |= (os.O_TRUNC if flags & F_TRUNC else 0) | (os.O_EXCL if flags & F_EXCL else 0)
                self.handle(rid, ("file", os.open(name, mode | os.O_CLOEXEC, a.get("mode", 0o666) & 0o7777)))
            elif kind == CLOSE:
                what, value = self.handles.pop(r.bytes())
                if what == "file":
                    os.close(value)
                self.status(rid, OK)
            elif kind == READ:
                fd, offset, n = self.fd_of(r.bytes()), r.u64(), min(r.u32(), READ_MAX)
                data = os.pread(fd, n, offset)
                if data:
                    self.send(DATA, struct.pack(">I", rid) + s(data))
                else:
                    self.status(rid, EOF)
            elif kind == WRITE:
                fd, offset, data = self.fd_of(r.bytes()), r.u64(), r.bytes()
                while data:
                    done = os.pwrite(fd, data, offset)
                    data, offset = data[done:], offset + done
                self.status(rid, OK)
            elif kind in (LSTAT, STAT):
                name = self.path(r.bytes())
                self.send(ATTRS, struct.pack(">I", rid) + attrs(os.lstat(name) if kind == LSTAT else os.stat(name)))
            elif kind == FSTAT:
                self.send(ATTRS, struct.pack(">I", rid) + attrs(os.fstat(self.fd_of(r.bytes()))))
            elif kind == SETSTAT:
                name = self.path(r.bytes())
                self.setstat(name, r.attrs())
                self.status(rid, OK)
            elif kind == FSETSTAT:
                fd = self.fd_of(r.bytes())
                self.setstat(fd, r.attrs())
                self.status(rid, OK)
            elif kind == OPENDIR:
                name = self.path(r.bytes())
                entries = [(e, os.lstat(os.path.join(name, e))) for e in [b".", b".."] + sorted(os.listdir(name))]
                self.handle(rid, ("dir", entries))
            elif kind == READDIR:
                what, entries = self.handles[r.bytes()]
                if what != "dir":
                    raise OSError(20, "not a folder handle")
                batch, entries[:] = entries[:100], entries[100:]
                self.names(rid, batch) if batch else self.status(rid, EOF)
            elif kind == REMOVE:
                os.unlink(self.path(r.bytes()))
                self.status(rid, OK)
            elif kind == MKDIR:
                name, a = self.path(r.bytes()), r.attrs()
                os.mkdir(name, a.get("mode", 0o777) & 0o7777)
                self.status(rid, OK)
            elif kind == RMDIR:
                os.rmdir(self.path(r.bytes()))
                self.status(rid, OK)
            elif kind == REALPATH:
                name = self.path(r.bytes() or b".")
                self.send(NAME, struct.pack(">II", rid, 1) + s(name) + s(name) + struct.pack(">I", 0))
            elif kind == RENAME:
                old, new = self.path(r.bytes()), self.path(r.bytes())
                if os.path.lexists(new):
                    raise OSError(17, "the target exists")
                os.rename(old, new)
                self.status(rid, OK)
            elif kind == READLINK:
                target = os.readlink(self.path(r.bytes()))
                self.send(NAME, struct.pack(">II", rid, 1) + s(target) + s(target) + struct.pack(">I", 0))
            elif kind == SYMLINK:  # OpenSSH's order, which sshfs sends: the link's target, then the link
                target, link = r.bytes(), self.path(r.bytes())
                os.symlink(target, link)
                self.status(rid, OK)
            elif kind == EXTENDED:
                self.extended(rid, r.bytes(), r)
            else:
                self.status(rid, UNSUPPORTED, f"request {kind} is not served")
        except OSError as exc:
            self.status(rid, code_of(exc), exc.strerror or str(exc))
        except (KeyError, ValueError, struct.error):
            self.status(rid, BAD_MESSAGE, "a bad request")

    def extended(self, rid: int, name: bytes, r: Reader) -> None:
        if name == b"posix-rename@openssh.com":
            os.rename(self.path(r.bytes()), self.path(r.bytes()))
            self.status(rid, OK)
        elif name == b"hardlink@openssh.com":
            os.link(self.path(r.bytes()), self.path(r.bytes()))
            self.status(rid, OK)
        elif name == b"fsync@openssh.com":
            os.fsync(self.fd_of(r.bytes()))
            self.status(rid, OK)
        elif name in (b"statvfs@openssh.com", b"fstatvfs@openssh.com"):
            raw = r.bytes()
            v = os.fstatvfs(self.fd_of(raw)) if name.startswith(b"f") else os.statvfs(self.path(raw))
            self.send(EXTENDED_REPLY, struct.pack(">I11Q", rid, v.f_bsize, v.f_frsize, v.f_blocks, v.f_bfree, v.f_bavail,
                                                  v.f_files, v.f_ffree, v.f_favail, 0, v.f_flag, v.f_namemax))
        else:
            self.status(rid, UNSUPPORTED, f"extension {name.decode(errors='replace')} is not served")


def read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return b""
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(root: bytes, fd_in: int = 0, out=None) -> int:
    out = out or open(1, "wb", buffering=0, closefd=False)
    server = Server(root, out)
    while True:
        head = read_exact(fd_in, 5)
        if not head:
            return 0
        length, kind = struct.unpack(">IB", head)
        if not 1 <= length <= PACKET_MAX:
            return 1
        body = read_exact(fd_in, length - 1)
        if len(body) != length - 1:
            return 0
        if kind == INIT:
            server.send(VERSION, struct.pack(">I", 3) + b"".join(s(k.encode()) + s(v.encode()) for k, v in EXTENSIONS))
        else:
            server.request(kind, Reader(body))


def main(argv: list) -> int:
    if len(argv) != 3 or argv[0] != "serve" or not argv[2].startswith("/"):
        print("fileserver.py: usage: fileserver.py serve USER /FOLDER", file=sys.stderr)
        return 2
    if os.geteuid() == 0:
        try:
            become(argv[1])  # noqa: F821 - distrun_fsuser.py, installed in front of this file
        except FsUserError as exc:  # noqa: F821
            print(f"fileserver.py: {exc}", file=sys.stderr)
            return 1
    os.chdir(argv[2])
    return serve(os.fsencode(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
