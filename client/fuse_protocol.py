"""The FUSE kernel protocol as bytes in and bytes out: no I/O, no clock.

Theory of operation
-------------------
The kernel and a FUSE file system talk over ``/dev/fuse`` in fixed C structs
(``linux/fuse.h``, protocol 7.x, native byte order). Each ``read(2)`` of the
device returns exactly one request: a ``fuse_in_header`` (length, opcode, a
``unique`` id, the node the request is about, the caller's ids) and the
opcode's own struct, then names or data. Each ``write(2)`` is exactly one reply:
a ``fuse_out_header`` (length, ``-errno`` or 0, the request's ``unique``) and
the reply's struct. This module turns a request buffer into a typed request
(:func:`parse_request`) and builds the bytes of each reply, so the session
(:mod:`fscache.client.fuse_session`) only reads, dispatches and writes.

Rules of the protocol that live here:

* FORGET and BATCH_FORGET get no reply; every other request gets exactly one,
  an error reply being the header alone. INTERRUPT names the interrupted
  request's ``unique``; answering it with ENOSYS tells the kernel never to send
  another.
* INIT negotiates the protocol: the kernel's major must be ours (7); the minor
  we answer is the smaller of the two, and only the flags both sides name are
  on. The reply's ``max_write`` (with ``FUSE_MAX_PAGES``: ``max_pages``) bounds
  a WRITE's data; the session's read buffer must hold that plus the headers.
* Names arrive NUL-terminated; RENAME carries two, LOOKUP one.
* READDIRPLUS entries are a ``fuse_entry_out`` and a ``fuse_dirent`` with the
  name, padded to 8 bytes; each entry with a non-zero node counts as a lookup
  the kernel will forget. An entry that does not fit the kernel's size is left
  for the next call, which starts at the previous entry's ``off``.
* Notifications (INVAL_INODE, INVAL_ENTRY) are written like replies with
  ``unique`` 0 and the notification code where the error goes; INVAL_ENTRY's
  name is followed by a NUL that its ``namelen`` does not count.
* Times are seconds and nanoseconds; a timeout of ``t`` seconds is sent as
  ``(int(t), nanoseconds)``, never negative.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Iterable

__all__ = [
    "FOPEN_KEEP_CACHE",
    "FOPEN_NOFLUSH",
    "ROOT_INODE",
    "Attributes",
    "Entry",
    "FuseError",
    "Opcode",
    "Opened",
    "Request",
    "parse_request",
]

KERNEL_MAJOR = 7
KERNEL_MINOR = 38  # the structs below are those of protocol 7.38
ROOT_INODE = 1

# open_flags of fuse_open_out
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NOFLUSH = 1 << 5

# INIT flags (fuse_init_in.flags / fuse_init_out.flags)
FUSE_ASYNC_READ = 1 << 0
FUSE_ATOMIC_O_TRUNC = 1 << 3
FUSE_BIG_WRITES = 1 << 5
FUSE_AUTO_INVAL_DATA = 1 << 12
FUSE_DO_READDIRPLUS = 1 << 13
FUSE_ASYNC_DIO = 1 << 15
FUSE_PARALLEL_DIROPS = 1 << 18
FUSE_MAX_PAGES = 1 << 22

# fuse_setattr_in.valid
FATTR_MODE = 1 << 0
FATTR_SIZE = 1 << 3
FATTR_FH = 1 << 6

FUSE_GETATTR_FH = 1 << 0
FUSE_FSYNC_FDATASYNC = 1 << 0

NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3


class Opcode(enum.IntEnum):
    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47


class FuseError(Exception):
    """Answer the request with ``errno`` (a positive error number)."""

    def __init__(self, errno: int) -> None:
        super().__init__(errno)
        self.errno = errno


# ---------------------------------------------------------------- the structs
_IN_HEADER = struct.Struct("=IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad
_OUT_HEADER = struct.Struct("=IiQ")  # len error unique
IN_HEADER_SIZE = _IN_HEADER.size  # 40
OUT_HEADER_SIZE = _OUT_HEADER.size  # 16
_U64 = struct.Struct("=Q")
_INIT_IN = struct.Struct("=IIII")  # major minor max_readahead flags
# major minor max_readahead flags max_background congestion_threshold max_write
# time_gran max_pages map_alignment flags2 unused[7]
_INIT_OUT = struct.Struct("=IIIIHHIIHHI28x")
_GETATTR_IN = struct.Struct("=IIQ")  # getattr_flags dummy fh
_SETATTR_IN = struct.Struct("=IIQQQQQQIIIIIIII")
_OPEN_IN = struct.Struct("=II")  # flags open_flags
_CREATE_IN = struct.Struct("=IIII")  # flags mode umask open_flags
_MKDIR_IN = struct.Struct("=II")  # mode umask
_RENAME2_IN = struct.Struct("=QII")  # newdir flags padding
_READ_IN = struct.Struct("=QQII")  # fh offset size read_flags (lock_owner flags pad follow)
_WRITE_IN = struct.Struct("=QQIIQII")  # fh offset size write_flags lock_owner flags padding
_RELEASE_IN = struct.Struct("=QII")  # fh flags release_flags (lock_owner follows)
_FSYNC_IN = struct.Struct("=QI")  # fh fsync_flags (padding follows)
_FORGET_ONE = struct.Struct("=QQ")  # nodeid nlookup
_BATCH_FORGET_IN = struct.Struct("=II")  # count dummy
# ino size blocks atime mtime ctime atimensec mtimensec ctimensec
# mode nlink uid gid rdev blksize flags
_ATTR = struct.Struct("=QQQQQQIIIIIIIIII")
_ENTRY_HEAD = struct.Struct("=QQQQII")  # nodeid generation entry_valid attr_valid (nsecs)
_ATTR_HEAD = struct.Struct("=QII")  # attr_valid attr_valid_nsec dummy
_OPEN_OUT = struct.Struct("=QII")  # fh open_flags padding
_WRITE_OUT = struct.Struct("=II")  # size padding
# blocks bfree bavail files ffree bsize namelen frsize (padding, spare)
_STATFS_OUT = struct.Struct("=QQQQQIIII24x")
_DIRENT = struct.Struct("=QQII")  # ino off namelen type
_INVAL_INODE_OUT = struct.Struct("=Qqq")  # ino off len
_INVAL_ENTRY_OUT = struct.Struct("=QII")  # parent namelen flags
ENTRY_OUT_SIZE = _ENTRY_HEAD.size + _ATTR.size  # 128


# ---------------------------------------------------------------- requests
@dataclasses.dataclass(frozen=True, slots=True)
class Init:
    unique: int
    major: int
    minor: int
    max_readahead: int
    flags: int


@dataclasses.dataclass(frozen=True, slots=True)
class Lookup:
    unique: int
    parent: int
    name: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Forget:
    """FORGET and BATCH_FORGET: ``(inode, nlookup)`` pairs; no reply."""

    unique: int
    items: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Getattr:
    unique: int
    inode: int
    fh: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Setattr:
    unique: int
    inode: int
    fh: int | None
    size: int | None  # the only change that is not ignored
    mode: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Open:
    unique: int
    inode: int
    flags: int


@dataclasses.dataclass(frozen=True, slots=True)
class Create:
    unique: int
    parent: int
    name: bytes
    mode: int
    flags: int


@dataclasses.dataclass(frozen=True, slots=True)
class Read:
    unique: int
    inode: int
    fh: int
    offset: int
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class Write:
    unique: int
    inode: int
    fh: int
    offset: int
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Flush:
    unique: int
    inode: int
    fh: int


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """RELEASE and RELEASEDIR (``directory`` says which)."""

    unique: int
    inode: int
    fh: int
    directory: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Fsync:
    """FSYNC and FSYNCDIR (``directory`` says which)."""

    unique: int
    inode: int
    fh: int
    datasync: bool
    directory: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Opendir:
    unique: int
    inode: int


@dataclasses.dataclass(frozen=True, slots=True)
class Readdir:
    """READDIRPLUS (plain READDIR is never negotiated away: answered ENOSYS)."""

    unique: int
    inode: int
    fh: int
    offset: int
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class Mkdir:
    unique: int
    parent: int
    name: bytes
    mode: int


@dataclasses.dataclass(frozen=True, slots=True)
class Unlink:
    """UNLINK and RMDIR (``directory`` says which)."""

    unique: int
    parent: int
    name: bytes
    directory: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Rename:
    """RENAME and RENAME2."""

    unique: int
    parent: int
    name: bytes
    new_parent: int
    new_name: bytes
    flags: int


@dataclasses.dataclass(frozen=True, slots=True)
class Statfs:
    unique: int
    inode: int


@dataclasses.dataclass(frozen=True, slots=True)
class Interrupt:
    unique: int
    interrupted: int


@dataclasses.dataclass(frozen=True, slots=True)
class Destroy:
    unique: int


@dataclasses.dataclass(frozen=True, slots=True)
class Unsupported:
    """Any other opcode: answered ENOSYS (or EPERM: see ``Session.serve``)."""

    unique: int
    opcode: int


Request = (
    Init
    | Lookup
    | Forget
    | Getattr
    | Setattr
    | Open
    | Create
    | Read
    | Write
    | Flush
    | Release
    | Fsync
    | Opendir
    | Readdir
    | Mkdir
    | Unlink
    | Rename
    | Statfs
    | Interrupt
    | Destroy
    | Unsupported
)


class ProtocolError(Exception):
    """The kernel sent bytes that are not a request of the protocol."""


def _name(buf: bytes | bytearray | memoryview, start: int, end: int) -> bytes:
    """The NUL-terminated name at ``buf[start:end]``."""
    raw = bytes(buf[start:end])
    nul = raw.find(0)
    return raw if nul < 0 else raw[:nul]


def _two_names(buf: bytes | bytearray | memoryview, start: int, end: int) -> tuple[bytes, bytes]:
    raw = bytes(buf[start:end])
    first, _, rest = raw.partition(b"\0")
    second, _, _ = rest.partition(b"\0")
    return first, second


def parse_request(buf: bytes | bytearray | memoryview, length: int) -> Request:
    """The request in ``buf[:length]`` (one ``read(2)`` of ``/dev/fuse``). Names and
    data are copied out, so ``buf`` may be reused at once."""
    if length < IN_HEADER_SIZE:
        raise ProtocolError(f"a request of {length} bytes is shorter than its header")
    size, opcode, unique, inode, _uid, _gid, _pid, extlen, _ = _IN_HEADER.unpack_from(buf)
    if size != length:
        raise ProtocolError(f"a request says it has {size} bytes but {length} were read")
    at = IN_HEADER_SIZE
    end = length - extlen * 8  # extensions (security contexts) are never asked for
    try:
        return _PARSERS[opcode](buf, at, end, unique, inode)
    except KeyError:
        return Unsupported(unique, opcode)
    except struct.error as exc:
        raise ProtocolError(f"opcode {opcode}: {exc}") from None


def _init(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    major, minor, max_readahead, flags = _INIT_IN.unpack_from(buf, at)
    return Init(unique, major, minor, max_readahead, flags)


def _lookup(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    return Lookup(unique, inode, _name(buf, at, end))


def _forget(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    (nlookup,) = _U64.unpack_from(buf, at)
    return Forget(unique, ((inode, nlookup),))


def _batch_forget(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    count, _ = _BATCH_FORGET_IN.unpack_from(buf, at)
    at += _BATCH_FORGET_IN.size
    items = tuple(_FORGET_ONE.unpack_from(buf, at + i * _FORGET_ONE.size) for i in range(count))
    return Forget(unique, items)


def _getattr(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    flags, _, fh = _GETATTR_IN.unpack_from(buf, at)
    return Getattr(unique, inode, fh if flags & FUSE_GETATTR_FH else None)


def _setattr(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    fields = _SETATTR_IN.unpack_from(buf, at)
    valid, fh, size, mode = fields[0], fields[2], fields[3], fields[11]
    return Setattr(
        unique,
        inode,
        fh if valid & FATTR_FH else None,
        size if valid & FATTR_SIZE else None,
        mode if valid & FATTR_MODE else None,
    )


def _open(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    flags, _ = _OPEN_IN.unpack_from(buf, at)
    return Open(unique, inode, flags)


def _opendir(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    return Opendir(unique, inode)


def _create(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    flags, mode, _umask, _ = _CREATE_IN.unpack_from(buf, at)
    return Create(unique, inode, _name(buf, at + _CREATE_IN.size, end), mode, flags)


def _read(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    fh, offset, size, _ = _READ_IN.unpack_from(buf, at)
    return Read(unique, inode, fh, offset, size)


def _readdir(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    fh, offset, size, _ = _READ_IN.unpack_from(buf, at)
    return Readdir(unique, inode, fh, offset, size)


def _write(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    fh, offset, size, *_ = _WRITE_IN.unpack_from(buf, at)
    start = at + _WRITE_IN.size
    if start + size > end:
        raise ProtocolError(f"a write of {size} bytes carries {end - start}")
    return Write(unique, inode, fh, offset, bytes(buf[start : start + size]))


def _flush(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    (fh,) = _U64.unpack_from(buf, at)
    return Flush(unique, inode, fh)


def _release(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    (fh,) = _U64.unpack_from(buf, at)
    return Release(unique, inode, fh, directory=False)


def _releasedir(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    (fh,) = _U64.unpack_from(buf, at)
    return Release(unique, inode, fh, directory=True)


def _fsync(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    fh, flags = _FSYNC_IN.unpack_from(buf, at)
    return Fsync(unique, inode, fh, bool(flags & FUSE_FSYNC_FDATASYNC), directory=False)


def _fsyncdir(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    fh, flags = _FSYNC_IN.unpack_from(buf, at)
    return Fsync(unique, inode, fh, bool(flags & FUSE_FSYNC_FDATASYNC), directory=True)


def _mkdir(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    mode, _umask = _MKDIR_IN.unpack_from(buf, at)
    return Mkdir(unique, inode, _name(buf, at + _MKDIR_IN.size, end), mode)


def _unlink(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    return Unlink(unique, inode, _name(buf, at, end), directory=False)


def _rmdir(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    return Unlink(unique, inode, _name(buf, at, end), directory=True)


def _rename(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    (new_parent,) = _U64.unpack_from(buf, at)
    name, new_name = _two_names(buf, at + _U64.size, end)
    return Rename(unique, inode, name, new_parent, new_name, 0)


def _rename2(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    new_parent, flags, _ = _RENAME2_IN.unpack_from(buf, at)
    name, new_name = _two_names(buf, at + _RENAME2_IN.size, end)
    return Rename(unique, inode, name, new_parent, new_name, flags)


def _statfs(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    return Statfs(unique, inode)


def _interrupt(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    (interrupted,) = _U64.unpack_from(buf, at)
    return Interrupt(unique, interrupted)


def _destroy(buf: _Buf, at: int, end: int, unique: int, inode: int) -> Request:
    return Destroy(unique)


_Buf = bytes | bytearray | memoryview
_PARSERS = {
    Opcode.INIT: _init,
    Opcode.LOOKUP: _lookup,
    Opcode.FORGET: _forget,
    Opcode.BATCH_FORGET: _batch_forget,
    Opcode.GETATTR: _getattr,
    Opcode.SETATTR: _setattr,
    Opcode.OPEN: _open,
    Opcode.OPENDIR: _opendir,
    Opcode.CREATE: _create,
    Opcode.READ: _read,
    Opcode.READDIRPLUS: _readdir,
    Opcode.WRITE: _write,
    Opcode.FLUSH: _flush,
    Opcode.RELEASE: _release,
    Opcode.RELEASEDIR: _releasedir,
    Opcode.FSYNC: _fsync,
    Opcode.FSYNCDIR: _fsyncdir,
    Opcode.MKDIR: _mkdir,
    Opcode.UNLINK: _unlink,
    Opcode.RMDIR: _rmdir,
    Opcode.RENAME: _rename,
    Opcode.RENAME2: _rename2,
    Opcode.STATFS: _statfs,
    Opcode.INTERRUPT: _interrupt,
    Opcode.DESTROY: _destroy,
}


# ---------------------------------------------------------------- what replies carry
@dataclasses.dataclass(frozen=True, slots=True)
class Attributes:
    """A node's attributes as the kernel caches them (``fuse_attr``)."""

    inode: int
    mode: int
    size: int
    mtime_ns: int
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    blksize: int = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """Attributes and how long the kernel may keep them (and the name, for a lookup)."""

    attributes: Attributes
    timeout: float  # seconds, for the attributes (and the name, unless name_timeout)
    name_timeout: float | None = None  # seconds, for the name alone


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    """An open's answer: the handle and ``FOPEN_*`` flags."""

    fh: int
    flags: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class DirEntry:
    """One READDIRPLUS entry; ``offset`` is where the listing goes on after it."""

    name: bytes
    entry: Entry
    offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Negotiated:
    """What INIT settled: the reply, and the sizes the session must honour."""

    reply: bytes
    minor: int
    flags: int
    max_write: int


# ---------------------------------------------------------------- replies
def _split(seconds: float) -> tuple[int, int]:
    if seconds <= 0:
        return 0, 0
    whole = int(seconds)
    return whole, min(int((seconds - whole) * 1e9), 999_999_999)


def _pack_attr(attr: Attributes) -> bytes:
    sec, nsec = divmod(attr.mtime_ns, 1_000_000_000)
    return _ATTR.pack(
        attr.inode,
        attr.size,
        -(-attr.size // 512),
        sec,
        sec,
        sec,
        nsec,
        nsec,
        nsec,
        attr.mode,
        attr.nlink,
        attr.uid,
        attr.gid,
        0,
        attr.blksize,
        0,
    )


def _entry_out(entry: Entry) -> bytes:
    sec, nsec = _split(entry.timeout)
    name = entry.timeout if entry.name_timeout is None else entry.name_timeout
    name_sec, name_nsec = _split(name)
    attr = entry.attributes
    return _ENTRY_HEAD.pack(attr.inode, 0, name_sec, sec, name_nsec, nsec) + _pack_attr(attr)


def _reply(unique: int, payload: bytes) -> bytes:
    return _OUT_HEADER.pack(OUT_HEADER_SIZE + len(payload), 0, unique) + payload


def reply_error(unique: int, errno: int) -> bytes:
    return _OUT_HEADER.pack(OUT_HEADER_SIZE, -errno, unique)


def reply_empty(unique: int) -> bytes:
    return _OUT_HEADER.pack(OUT_HEADER_SIZE, 0, unique)


def reply_entry(unique: int, entry: Entry) -> bytes:
    """LOOKUP, MKDIR: a node and its attributes (one more lookup to forget)."""
    return _reply(unique, _entry_out(entry))


def reply_attr(unique: int, entry: Entry) -> bytes:
    """GETATTR, SETATTR."""
    sec, nsec = _split(entry.timeout)
    return _reply(unique, _ATTR_HEAD.pack(sec, nsec, 0) + _pack_attr(entry.attributes))


def reply_open(unique: int, opened: Opened) -> bytes:
    """OPEN, OPENDIR."""
    return _reply(unique, _OPEN_OUT.pack(opened.fh, opened.flags, 0))


def reply_create(unique: int, entry: Entry, opened: Opened) -> bytes:
    return _reply(unique, _entry_out(entry) + _OPEN_OUT.pack(opened.fh, opened.flags, 0))


def reply_data_header(unique: int, size: int) -> bytes:
    """READ: the header of a reply whose ``size`` bytes of data follow it."""
    return _OUT_HEADER.pack(OUT_HEADER_SIZE + size, 0, unique)


def reply_write(unique: int, size: int) -> bytes:
    return _reply(unique, _WRITE_OUT.pack(size, 0))


@dataclasses.dataclass(frozen=True, slots=True)
class Capacity:
    """A file system's size and room, as STATFS tells it: blocks of ``block_size``
    bytes in all, free, and available to a process without privileges; files
    (inodes) in all and free."""

    blocks: int = 0
    free_blocks: int = 0
    available_blocks: int = 0
    files: int = 0
    free_files: int = 0


def reply_statfs(unique: int, capacity: Capacity, *, block_size: int, name_max: int) -> bytes:
    c = capacity
    return _reply(
        unique,
        _STATFS_OUT.pack(
            c.blocks, c.free_blocks, c.available_blocks, c.files, c.free_files,
            block_size, name_max, block_size, 0,
        ),
    )  # fmt: skip


def pack_direntplus(entries: Iterable[DirEntry], size: int) -> tuple[bytes, list[DirEntry]]:
    """READDIRPLUS: as many of ``entries`` as fit in ``size`` bytes, and those."""
    out = bytearray()
    sent = []
    for item in entries:
        namelen = len(item.name)
        record = ENTRY_OUT_SIZE + _DIRENT.size + namelen
        padded = (record + 7) & ~7
        if len(out) + padded > size:
            break
        attr = item.entry.attributes
        out += _entry_out(item.entry)
        out += _DIRENT.pack(attr.inode, item.offset, namelen, (attr.mode >> 12) & 0o17)
        out += item.name
        out += bytes(padded - record)
        sent.append(item)
    return bytes(out), sent


def notify_inval_inode(inode: int, *, attributes_only: bool) -> bytes:
    """Drop the kernel's cached attributes of ``inode`` and, unless
    ``attributes_only``, all of its pages."""
    payload = _INVAL_INODE_OUT.pack(inode, -1 if attributes_only else 0, 0)
    return _OUT_HEADER.pack(OUT_HEADER_SIZE + len(payload), NOTIFY_INVAL_INODE, 0) + payload


def notify_inval_entry(parent: int, name: bytes) -> bytes:
    """Drop the kernel's cached name ``name`` in directory ``parent``."""
    payload = _INVAL_ENTRY_OUT.pack(parent, len(name), 0) + name + b"\0"
    return _OUT_HEADER.pack(OUT_HEADER_SIZE + len(payload), NOTIFY_INVAL_ENTRY, 0) + payload


def negotiate(request: Init, *, want: int, max_write: int) -> Negotiated:
    """INIT's answer: the flags of ``want`` the kernel offers, ``max_write`` bytes a
    WRITE (in pages, when the kernel takes ``FUSE_MAX_PAGES``)."""
    if request.major != KERNEL_MAJOR:
        raise ProtocolError(f"the kernel speaks FUSE {request.major}.x; this speaks 7.x")
    minor = min(request.minor, KERNEL_MINOR)
    flags = request.flags & want
    max_pages = 0
    if not flags & FUSE_MAX_PAGES:
        max_write = min(max_write, 128 * 1024)  # the kernel's limit without max_pages
    else:
        max_pages = -(-max_write // 4096)
    payload = _INIT_OUT.pack(
        KERNEL_MAJOR,
        minor,
        request.max_readahead,
        flags,
        0,  # max_background: the kernel's default
        0,  # congestion_threshold: the kernel's default
        max_write,
        1,  # time_gran: nanoseconds
        max_pages,
        0,
        0,
    )
    return Negotiated(_reply(request.unique, payload), minor, flags, max_write)
