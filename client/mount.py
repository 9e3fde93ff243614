"""FUSE mount: the fscache tree as a local directory (``fscache mount HOST:PORT DIR``).

Theory of operation
-------------------
The FUSE session (:mod:`fscache.client.fuse_session`, our own speaker of the
kernel protocol) answers kernel requests on the trio loop of the async client:
a ``read(2)`` of a file under a live lease is a dict lookup in the client's
cache, and a write waits for approvals like any other.

The kernel caches a file exactly as long as the client's lease lets the client
cache it, so a cached ``open``/``read``/``close`` is answered from the kernel's
page cache with one short call into this process that the caller waits for
(open) and one it does not (release): a read-only open is answered with
``FOPEN_NOFLUSH``, since it has nothing to write back, so its ``close`` sends no
flush. Any other open's ``close`` waits for the flush, which uploads what was
written (close-to-open consistency).

- Attributes are returned with a timeout of the file lease's remaining time
  (:meth:`Client.lease_remaining`: the local expiry, which already has the skew
  taken off), 0 without a lease and for a file with unflushed writes. A
  directory's are kept for the lease on its own listing (see "Directory
  attributes"), 0 while the client holds none. A name (the entry of a lookup or
  of READDIRPLUS) is kept for the longer of that and what is left of the lease on
  its directory's listing: another client's change of the directory's names waits
  for our approval, which drops them from the kernel first, and our own changes
  the kernel makes itself.
- Pages: files are opened without ``direct_io`` (so ``mmap`` works), with
  ``keep_cache`` only when the client holds a lease on the very version the
  kernel's pages hold (``_paged``); otherwise the kernel drops its pages at open.
- Lease expiry: the session asks for ``FUSE_AUTO_INVAL_DATA``, so a read through the page
  cache after the attribute timeout makes the kernel ask for the attributes again
  and drop its pages if the version (mtime) or size changed. For a file whose
  pages the kernel holds, that ``getattr`` revalidates with a one-byte read (a
  not-modified round trip that renews the lease) rather than a bare stat.
- Approval requests: the client calls :meth:`FscacheOperations.before_approval`
  after dropping its entry and awaits it before it sends the approval. For a
  file it invalidates the kernel's pages, attributes and name entry; for a
  directory key (a path ending in ``/``: the directory's name set) it drops the
  kernel's entries for every name it knows in that directory and the directory's
  own attributes. It returns when the kernel has done so.

Why the kernel never serves a page after the approval has gone out. A page
enters the page cache locked and is filled by a READ answered here, always by the
client (a ranged read, cached under the lease), whose entry is gone before the
hook runs: from then on a READ waits at the server, which applies the write
first, and gets the new data. A READ answered with old data before that moment
either completed before the invalidation starts, or still holds its page locked,
and the invalidation waits for that lock; either way the invalidation removes
the page, and the approval is sent only after it returns. Cached attributes and
the name entry go with the same call. Without a lease there is no approval: the
kernel's timeouts end no later than the lease (its deadline is the reply's
arrival plus the remaining time), well inside the ``2 * skew`` by which the
server outlasts the client's expiry.

The price of that order: a READ or lookup of the file that arrives during the
invalidation waits at the server for a write that waits for this approval, while
the invalidation waits for that READ's page; the write then goes ahead when the
lease runs out at the server, which ends the wait. The hook runs beside the
connection's reader, which goes on applying replies meanwhile: a lookup whose
reply has already come in ends, and lets the invalidation (which waits for the
directory lock that lookup holds) go on. Were the reader to wait for the hook,
that reply would never be read, and the mount would hang for good.

Names and directories
---------------------
Directories live on the server: ``mkdir``, ``rmdir``, ``unlink`` and ``rename``
are the client's calls, seen by every client at once, with POSIX errnos
(ENOENT, EEXIST, ENOTDIR, EISDIR, ENOTEMPTY). Listings (``readdir``) and the
lookup of a name come from :meth:`Client.scandir`, cached under the directory's
lease: a directory is looked up in its parent's cached listing, a file's
attributes come from its own lease (else a ``stat``). A directory whose listing
is not cached (every create, unlink or rename in it drops ours, and a directory
written often is leased for no time at all) is listed again only once as many
of its names have been looked up one by one, with a ``stat`` each, as its last
listing had (:meth:`FscacheOperations._lists`): so each create, whose negative
lookup comes first, costs one round trip, not a listing of the whole directory,
and the listings a lookup makes cost at most one ``stat`` per lookup in all. A
name so found is kept by the kernel only for its file's lease (none for a
directory), and a name not found not at all, so another client's create is seen
at the next lookup. ``rename`` passes no flags
on: the server's rename has none, and a check before it could not make them
atomic, so ``RENAME_EXCHANGE`` gets EINVAL, and so does ``RENAME_NOREPLACE``
where the kernel has not already answered EEXIST (it looks the target up first,
and refuses an existing one itself). Open files below a renamed name
are written back first and follow the rename. A write-back, wherever it happens,
makes the kernel drop only the file's attributes (their mtime is the old
version's): the kernel may be holding the directory (a rename) or the file (a
truncate, a write) for the request being answered, and dropping a name waits for
the directory's lock. The pages it keeps are the ones just written.

Directory attributes. A directory's attributes are its kind and its version (the
mtime); a getattr of a directory whose listing the client holds under a lease is
answered from that listing, and the kernel keeps it for the rest of that lease, so
a second ``find`` or ``du`` of a tree asks the server nothing about its
directories. A getattr of a directory the kernel has open for reading and whose
listing the client lacks (``find`` opens a directory, then ``fstat``s it, then
reads it) lists it first, as the readdir that follows would, rather than ask for a
stat and then the listing. The lease covers what a directory's mtime means in POSIX, its
names: a change of them by another client waits for our approval, which drops
the directory's attributes from the kernel with its names, and the kernel drops
them itself after our own create, unlink, rename, mkdir or rmdir in it. The store
moves a directory's mtime on a write of a file in it too (the write's temp file
comes and goes); that the mount shows at the end of the lease, as a local file
system shows no change of a directory's mtime when a file in it is rewritten.

A name the server would refuse gets EINVAL: one that begins with ``.fscache``
(in any case: reserved for the server's own state and temp files), one that is
not UTF-8, or one with a backslash or a control character. EINVAL says nothing
more, so the mount logs which rule the name broke, as a warning at most once per
rule every ``REFUSAL_LOG_INTERVAL`` seconds (a program may try a name over and
over).

A name that goes while its file is open here (``unlink``, or a rename over it)
leaves the open descriptors working, as POSIX says: before the name goes the
mount copies what they see into a local spool (for a big file, a copy of all of
it), which serves reads, writes and ``fstat`` (no link left) until the last close
and is then dropped. The rest of the world sees the name gone at once, and no
close brings it back.

Files of any size, with bounded memory
--------------------------------------
Reads are ranged (:meth:`Client.read` with ``offset`` and ``length``): the
kernel's 128 KiB requests are answered from 1 MiB chunks the client caches under
the file's lease, never the whole file. Writes take one of two paths:

- *Whole new contents* (a file made by ``create`` or opened with ``O_TRUNC``, or
  truncated to 0 while open): the writes go to a private, unlinked spool file on
  local disk (any offset), and on ``close`` (flush) or ``fsync`` the spool is
  streamed to the server as one upload. The upload is atomic: other clients see
  the old contents or the new, never a mix, and see the new from the moment the
  close returns (close-to-open consistency). Memory stays at one part in flight.
  The file stays on the spool until the release of its last writing handle, so a
  descriptor closed while a duplicate writes on (a shell's ``> file``, ``dd``:
  open, ``dup2``, close) uploads what is there so far, and the writes after it go
  up whole at the next close, never as ranged writes. Only a handle that may
  write publishes: a read-only ``open``/``close`` meanwhile, on this mount, sends
  nothing (it reads the writer's bytes: the kernel's pages are one for all).
- *In place* (an existing file opened without ``O_TRUNC``, e.g. sqlite's pages):
  the written ranges are kept in memory and sent as ranged writes
  (``write(path, data, offset=N)``) on ``close``, ``fsync`` or when they pass
  ``DIRTY_BOUND``. Each ranged write (one chunk of a range) is atomic and durable
  when its reply comes; the file as a whole is not
  updated atomically, just as with a local file system, so a program that needs
  a consistent file syncs it (sqlite does, with its journal).

The mount sets its client's cache bound (``MOUNT_CACHE_BYTES`` unless told): the cache
holds the leases the kernel's timeouts and pages rest on, so it is never off; and
the kernel's page cache holds what the mount serves again, so the client's copy
need only span the reads in flight and their neighbours, and a big copy out of the mount stays well
under 100 MiB resident. A path the client evicts goes through
:meth:`FscacheOperations.before_approval` before its lease is given back, so the
kernel never keeps a copy the client no longer holds a lease for.

Until a flush the writer's own reads and ``stat`` see its writes (the spool, or
the server's bytes with the dirty ranges laid over); other clients see the file
as the server has it. A truncate of a file with no spool flushes its ranges and
is the client's ``truncate``. A write-back that fails fails the call that asked
for it (``close``, ``fsync``: EIO; ENOSPC for the server's full disk) and keeps
what it could not send, for a later one to try again; what is still unsent at the
release of the last writing handle is dropped (and logged), and with it the
kernel's pages and attributes of the file, which hold those bytes: from then on
the file reads as the server has it.

Not supported, on purpose
-------------------------
- Modes, owners and times are not stored: files are 0644, directories 0755, owned
  by the mounting user; mtime is the version (an mtime in ns). ``chmod``, ``chown``
  and ``utime`` succeed and change nothing. No links, symlinks or special files
  (making one is EPERM, as on a file system without them, such as vfat:
  ``NOT_PERMITTED``), no xattrs.
- A writable shared ``mmap`` is written back like ``write(2)``: the kernel sends
  the dirty pages on ``msync`` and on close, as ranged writes on the flush that
  follows.
- An ``mmap`` of a file the client holds no lease on (write-shared: written often
  elsewhere, so the server leases it for no time) is not kept current: no approval
  comes when another client writes it, and a mapped page is read by the program
  without a request to us, so the mapping keeps the bytes it has until the kernel
  next asks us about the file: a ``read``, ``stat``/``fstat`` or ``open`` of it on
  this mount (the version it gets is new, so the kernel drops the pages:
  ``FUSE_AUTO_INVAL_DATA``; an open without ``keep_cache`` drops them too).
  Direct I/O would not change it: the kernel maps page-cache pages for ``mmap``
  even then (and refuses a shared mapping unless ``FUSE_DIRECT_IO_ALLOW_MMAP``),
  and nothing else tells us when the program reads. A leased file's mapping is
  current at once. A program that maps a shared file ``fstat``s it before it
  reads the mapping, as on NFS, where a mapping is revalidated only there too.
- FUSE's no-open mode (ENOSYS from ``open``, so cached opens never reach us)
  is not used: the open is where the kernel is told to keep or drop its pages
  (``keep_cache`` only on a leased version), and without it the kernel keeps them.
- Concurrent writers through different mounts: the last upload wins; ranged
  writes interleave range by range. ``O_APPEND`` is atomic within one mount only:
  appends through two mounts at once can land on the same offset and overwrite
  each other (as on NFS). A new file is visible, empty, from ``create`` until its
  first close.
- Locks (``fcntl``, ``flock``) are the kernel's, local to one mount: programs that
  coordinate through them must all run on one mount, or coordinate with fscache's
  own locks. sqlite is one: while a process has a database open for writing, a
  process on another mount must not open it even to read (it may checkpoint a WAL
  or roll back a hot journal under the writer).
- A file open here for writing that another client deletes or renames away (or a
  directory above it): the server does not say where it went, so writes not yet
  sent when the name went cannot follow it, and are not written under the old name
  (which would make it, and its directories, again). The write-back that finds the
  name gone drops them and logs a warning naming the file, and it and every later
  write-back of the file fail with ENOENT (``close``, ``fsync``): the program
  hears it, even one that ignored the first failed close. What was written back
  before (at an earlier ``close`` or ``fsync``) went with the rename. A name
  created through a directory another client removed
  fails with ENOENT (checked before the create: the server would make the
  directory again). Stopping the mount writes back what open files hold unsent
  (at most ``UNMOUNT_WRITE_BACK`` seconds) before it unmounts.
- INTERRUPT is not implemented: a call blocked on the server waits for it (at
  most a lease term plus skew for a write held by a silent holder, and up to
  ``OUTAGE_WAIT`` more while the server cannot be reached). Inode numbers
  are stable while the kernel remembers a name, not after it forgets it.
- A file open here that another client rewrites or replaces is read as the
  server has it from then on (its pages went before the approval): a sequence of
  ``read`` calls that spans the change can return part of each version, as on
  NFS. One kernel READ, a library ``read``, and an ``open`` after the change each
  see one version whole; the rename or unlink of an open file *here* keeps its
  old contents (above).
- ``statfs`` (``df``) shows the file system that holds the server's root, from the
  server's ``stats`` (asked at most once a second; while the server is away, the
  figures it last told).
- While the server is unreachable, what needs it waits, up to ``OUTAGE_WAIT`` (below).

While the server is away
------------------------
A server restart, or a network outage, should cost a program a pause, not its
data: every request the mount sends (but ``statfs``'s, answered with the figures
last told) goes through :meth:`FscacheOperations._server` or ``_server_once``,
which, while the client has no connection (it says Unavailable after waiting a
second for one), tries again until the server answers or ``OUTAGE_WAIT`` seconds
(``mount(outage_wait=...)``) have passed since the first failure; then the call
fails with EIO. So a ``close`` keeps its spool and uploads it whole once the server
is back (never a partial file; the empty file its ``create`` made is all the
server has until then), and a create, ``mkdir`` or lookup waits as a write held in
the server's restart window does. What the mount answers from what it holds under
a lease (cached reads, attributes, names) needs no server and does not wait. A
request that may go twice is sent again even if the connection broke after it went
out (reads, uploads, ranged writes, truncates, a create without ``O_EXCL``, whose
second try finds the first one's file); one that must not (``mkdir``, ``rmdir``,
``unlink``, ``rename``, an exclusive create: a second try after a first that was
applied fails) waits for a live connection first and is sent once: lost with the
connection, it fails with EIO, as it may or may not have been applied. The log
says when the server cannot be reached and when it can again. A process waiting
there cannot be interrupted (INTERRUPT is not implemented), but can be killed; the
mount goes on trying what it was sending (a close's upload) all the same.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import logging
import math
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import BinaryIO, NoReturn, ParamSpec, TypeVar

import trio

from fscache.cache import DirEntry as Listed
from fscache.client.client import Client, StatResult
from fscache.client.fuse_protocol import (
    FOPEN_KEEP_CACHE,
    FOPEN_NOFLUSH,
    ROOT_INODE,
    Attributes,
    Capacity,
    DirEntry,
    Entry,
    FuseError,
    Opcode,
    Opened,
)
from fscache.client.fuse_session import Session, mounted
from fscache.errors import (
    BadPath,
    Conflict,
    Exists,
    FscacheError,
    IsADirectory,
    NoSpace,
    NotADirectory,
    NotEmpty,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from fscache.names import dir_key, parent
from fscache.paths import MAX_PATH_BYTES, MAX_SEGMENT_BYTES, normalize
from fscache.settings import OUTAGE_WAIT

__all__ = ["FscacheOperations", "check_mountpoint", "mount"]

log = logging.getLogger("fscache.mount")

T = TypeVar("T")
P = ParamSpec("P")

# The first class an error is an instance of decides; any other error is EIO.
_ERRNO: tuple[tuple[type[FscacheError], int], ...] = (
    (NotFound, errno.ENOENT),
    (BadPath, errno.EINVAL),
    (IsADirectory, errno.EISDIR),
    (NotADirectory, errno.ENOTDIR),
    (NotEmpty, errno.ENOTEMPTY),
    (Exists, errno.EEXIST),
    (TooLarge, errno.EFBIG),
    (Unauthorized, errno.EACCES),
    (NoSpace, errno.ENOSPC),  # the server's disk or quota: the writer's to hear as such
)
MIXED = -1  # in ``_paged``: the kernel may hold pages of more than one version
BLOCK_SIZE = 4096
MOUNT_CACHE_BYTES = 16 << 20  # the client's cache under a mount (the kernel has the pages)
DIRTY_BOUND = 8 << 20  # bytes written in place that are sent before the close
CAPACITY_TTL = 1.0  # s: statfs answers with the server's disk figures at most this old
# s: how long a request waits for a server it cannot reach (a restart, a network
# outage) before it fails with EIO, counted from its first failed attempt
RETRY_PAUSE = 0.2  # s: between attempts (each also waits up to a second for a connection)
UNMOUNT_WRITE_BACK = 30.0  # s: how long the way out waits for open files' unsent writes
_GONE = "{}: deleted or renamed away by another client while open here; writes to it were lost"
REFUSAL_LOG_INTERVAL = 10.0  # s: at most one warning per rule a refused name broke
# Making a symlink, a hard link or a special file (mknod, mkfifo): EPERM, as a file
# system without them answers (vfat), the same for each; not ENOSYS, which reached
# programs as "Function not implemented" (but for LINK, which the kernel makes EPERM).
NOT_PERMITTED = (Opcode.SYMLINK, Opcode.LINK, Opcode.MKNOD)
DOT, DOT_DOT = b".", b".."  # the names every listing begins with
DOTS = 2


@contextlib.contextmanager
def _errno_replies() -> Iterator[None]:
    """Turn whatever a handler raises into the one exception the session answers with."""
    try:
        yield
    except FuseError:
        raise
    except FscacheError as exc:
        code = next((code for kind, code in _ERRNO if isinstance(exc, kind)), errno.EIO)
        raise FuseError(code) from None
    except Exception:
        log.exception("unexpected error in a FUSE request")
        raise FuseError(errno.EIO) from None


class _DirtyRanges:
    """Bytes written in place and not yet sent: disjoint ranges, by start offset."""

    def __init__(self) -> None:
        self._ranges: dict[int, bytearray] = {}
        self.nbytes = 0

    def __bool__(self) -> bool:
        return bool(self._ranges)

    @property
    def end(self) -> int:
        return max((start + len(data) for start, data in self._ranges.items()), default=0)

    def items(self) -> list[tuple[int, bytes]]:
        return [(start, bytes(self._ranges[start])) for start in sorted(self._ranges)]

    def clear(self) -> None:
        self._ranges.clear()
        self.nbytes = 0

    def write(self, offset: int, buf: bytes) -> None:
        end = offset + len(buf)
        touching = [s for s, d in self._ranges.items() if s <= end and offset <= s + len(d)]
        if len(touching) == 1 and touching[0] <= offset:  # the common case: in or after one
            data = self._ranges[touching[0]]
            before = len(data)
            data[offset - touching[0] : end - touching[0]] = buf
            self.nbytes += len(data) - before
            return
        start = min([offset, *touching])
        stop = max([end, *(s + len(self._ranges[s]) for s in touching)])
        merged = bytearray(stop - start)
        for s in touching:
            data = self._ranges.pop(s)
            self.nbytes -= len(data)
            merged[s - start : s - start + len(data)] = data
        merged[offset - start : end - start] = buf
        self._ranges[start] = merged
        self.nbytes += len(merged)

    def overlay(self, offset: int, data: bytes, length: int) -> bytes:
        """``data`` (the server's bytes from ``offset``) with the dirty ranges over it."""
        out = bytearray(data)
        stop = offset + length
        for start, dirty in self._ranges.items():
            lo, hi = max(start, offset), min(start + len(dirty), stop)
            if lo < hi:
                if hi - offset > len(out):
                    out.extend(bytes(hi - offset - len(out)))
                out[lo - offset : hi - offset] = dirty[lo - start : hi - start]
        return bytes(out)


@dataclasses.dataclass(eq=False)
class _OpenFile:
    """One inode's open state, shared by every handle on it."""

    path: str
    handles: int = 0
    writers: int = 0  # the handles among them that may write (see _Handle.writes)
    spool: BinaryIO | None = None  # the whole new contents, uploaded on flush
    ranges: _DirtyRanges = dataclasses.field(default_factory=_DirtyRanges)
    changes: int = 0  # bumped by every write or truncate
    on_server: int = -1  # ``changes`` when the server last had the spool's contents
    modified_ns: int = 0
    unlinked: bool = False
    # Its name went on the server while it was open here (another client deleted or
    # renamed it, or a directory above it) and writes to it were lost: every write-back
    # fails from then on (see FscacheOperations._lose).
    gone: bool = False
    flushing: trio.Lock = dataclasses.field(default_factory=trio.Lock)
    failed: int = -1  # ``changes`` when a write-back last failed (its caller was told)
    failure: str = ""  # why

    @property
    def dirty(self) -> bool:
        """Whether reads and attributes come from here (a spool, or unsent ranges)
        rather than from the client and its leases."""
        return self.spool is not None or bool(self.ranges)

    @property
    def unsent(self) -> bool:
        """Whether the server lacks some of what was written: a spool changed since
        its last upload, or ranges not yet sent."""
        return (self.spool is not None and self.changes != self.on_server) or bool(self.ranges)

    def start_spool(self) -> None:
        """From now on the local spool holds the whole contents (empty so far)."""
        if self.spool is not None:
            self.spool.truncate(0)
        else:
            self.spool = tempfile.TemporaryFile()  # noqa: SIM115  (closed by the flush)
        self.ranges.clear()
        _changed(self)

    def drop_spool(self) -> None:
        if self.spool is not None:
            self.spool.close()
            self.spool = None


@dataclasses.dataclass(eq=False)
class _Handle:
    append: bool  # O_APPEND: each write goes at the end
    # Opened for writing, or with O_TRUNC (which is a write): its close publishes what
    # was written (close-to-open), and the last such handle's release ends the spool.
    # A read-only handle's close publishes nothing, whoever else has the file open.
    writes: bool


class FscacheOperations:
    """The FUSE request handlers (:class:`fscache.client.fuse_session.Operations`),
    over one async :class:`~fscache.client.client.Client` and the kernel's
    :class:`~fscache.client.fuse_session.Session`."""

    block_size = BLOCK_SIZE
    name_max = MAX_SEGMENT_BYTES

    def __init__(
        self, client: Client, session: Session, *, outage_wait: float = OUTAGE_WAIT
    ) -> None:
        self._client = client
        self._outage_wait = outage_wait
        self._outage_since: float | None = None  # when requests began to wait for the server
        self._session = session
        root = ROOT_INODE
        self._path_of: dict[int, str] = {root: ""}
        self._inode_of: dict[str, int] = {"": root}
        self._lookups: dict[int, int] = {root: 1}
        self._next_inode = root + 1
        self._open: dict[int, _OpenFile] = {}  # by inode
        self._handles: dict[int, _Handle] = {}
        self._listings: dict[int, tuple[str, list[tuple[str, StatResult]]]] = {}
        # By directory: the names its last listing had, and the lookups in it answered
        # with a stat since (see _lists); kept while the kernel knows the directory.
        self._listed: dict[str, tuple[int, int]] = {}
        self._next_handle = 1
        self._paged: dict[int, int] = {}  # inode: the version of the pages the kernel may hold
        self._invalidations = 0  # approval requests seen: a read spanning one is MIXED
        client.before_approval.append(self.before_approval)
        self._capacity = Capacity()  # the server's disk, as last told
        self._refusals: dict[str, tuple[float, int]] = {}  # rule: last warned, refused since
        self._capacity_until = -math.inf  # when to ask again
        self._uid = os.getuid()
        self._gid = os.getgid()

    # ------------------------------------------------------------ the server
    async def _server(
        self,
        call: Callable[P, Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``call(*args, **kwargs)``, a request to the server that may be sent twice
        (a read, an upload, a ranged write, a truncate: see "While the server is
        away" in the theory note). While the server cannot be reached it is sent
        again, for up to ``outage_wait`` seconds from the first failure; then the
        last Unavailable is raised (EIO)."""
        since: float | None = None
        while True:
            try:
                result = await call(*args, **kwargs)
            except Unavailable:
                since = self._waiting(since)
                await trio.sleep(RETRY_PAUSE)
                continue
            self._reached()
            return result

    async def _server_once(
        self,
        call: Callable[P, Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """As :meth:`_server`, for a change that must not be sent twice: a second
        mkdir, unlink, rename or exclusive create after a first that was applied but
        whose reply was lost would fail. It goes out only over a live connection,
        waited for as long as :meth:`_server` waits, and is not sent again: lost with
        the connection, it fails (EIO), as it may have been applied."""
        await self._connected()
        result = await call(*args, **kwargs)
        self._reached()
        return result

    def _reached(self) -> None:
        if self._outage_since is not None:
            log.warning("%s can be reached again", self._client.address)
            self._outage_since = None

    async def _connected(self) -> None:
        """Return once the client has a live connection (asking it for one); raise
        Unavailable once ``outage_wait`` seconds have passed without."""
        since: float | None = None
        while not self._client.connected:
            since = self._waiting(since)
            with contextlib.suppress(Unavailable):  # (waits a second for a connection)
                await self._client.server_stats()
            if not self._client.connected:
                await trio.sleep(RETRY_PAUSE)

    def _waiting(self, since: float | None) -> float:
        """A request found the server unreachable: when it began to wait (now, if it
        had not), or Unavailable if that was ``outage_wait`` seconds ago."""
        now = trio.current_time()
        if since is None:
            since = now
            if self._outage_since is None:
                self._outage_since = now
                log.warning(
                    "%s cannot be reached: requests wait up to %g s for it",
                    self._client.address,
                    self._outage_wait,
                )
        elif now - since >= self._outage_wait:
            raise Unavailable(
                f"{self._client.address} could not be reached for {self._outage_wait:g} s"
            )
        return since

    # ------------------------------------------------------------ inodes and paths
    def _path(self, inode: int) -> str:
        path = self._path_of.get(inode)
        if path is None:
            raise FuseError(errno.ESTALE)
        return path

    def _child(self, parent_inode: int, name: bytes) -> str:
        if len(name) > MAX_SEGMENT_BYTES:
            raise FuseError(errno.ENAMETOOLONG)
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            self._refused("utf-8", name, "fscache names are UTF-8")
            raise FuseError(errno.EINVAL) from None
        parent_path = self._path(parent_inode)
        path = f"{parent_path}/{text}" if parent_path else text
        if len(path.encode("utf-8")) > MAX_PATH_BYTES:
            raise FuseError(errno.ENAMETOOLONG)
        try:
            return normalize(path)
        except BadPath as exc:  # EINVAL alone does not say which rule the name broke
            self._refused(str(exc).partition(":")[0], text, exc)
            raise FuseError(errno.EINVAL) from None

    def _refused(self, rule: str, name: str | bytes, why: object) -> None:
        """Say why a name was refused: EINVAL alone does not. A WARNING (the mount
        logs no less by default) at most once per ``rule`` (the rule's words, without
        the name) every REFUSAL_LOG_INTERVAL seconds, since a program may look the
        same name up over and over; the rest at DEBUG, counted in the next one."""
        now = time.monotonic()
        last, since = self._refusals.get(rule, (-math.inf, 0))
        if now - last < REFUSAL_LOG_INTERVAL:
            self._refusals[rule] = (last, since + 1)
            log.debug("refused the name %r: %s", name, why)
            return
        self._refusals[rule] = (now, 0)
        more = f" ({since} more refused so since the last warning)" if since else ""
        log.warning("refused the name %r: %s%s", name, why, more)

    def _inode(self, path: str) -> int:
        inode = self._inode_of.get(path)
        if inode is None:
            inode = self._next_inode
            self._next_inode += 1
            self._inode_of[path] = inode
            self._path_of[inode] = path
            self._lookups[inode] = 0
        return inode

    def _remember(self, path: str) -> int:
        """The inode of ``path``, with one more lookup the kernel will ``forget``."""
        inode = self._inode(path)
        self._lookups[inode] += 1
        return inode

    def _moved(self, src: str, dst: str) -> None:
        """After a rename: ``src`` and everything below it is now at ``dst``."""
        replaced = self._inode_of.pop(dst, None)
        if replaced is not None and replaced in self._open:
            self._open[replaced].unlinked = True  # its old contents are gone
        below = src + "/"
        for path in [p for p in self._inode_of if p == src or p.startswith(below)]:
            inode = self._inode_of.pop(path)
            moved = dst + path[len(src) :]
            self._inode_of[moved] = inode
            self._path_of[inode] = moved
            self._paged.pop(inode, None)
            self._listed.pop(path, None)  # (listed again under its new name)
            if inode in self._open:
                self._open[inode].path = moved

    # ------------------------------------------------------------ attributes
    def _local(self, path: str) -> StatResult | None:
        """``path`` as this mount knows it without asking: a spool, or a lease."""
        inode = self._inode_of.get(path)
        open_file = self._open.get(inode) if inode is not None else None
        if open_file is not None and open_file.spool is not None:
            size = os.fstat(open_file.spool.fileno()).st_size
            return StatResult(path, open_file.modified_ns, size, False)
        leased = self._client.leased(path)  # the lease keeps size and version current too
        if leased is None and open_file is None:
            return self._listed_directory(path)
        if leased is not None and open_file is not None and open_file.ranges:
            return StatResult(
                path, open_file.modified_ns, max(leased.size, open_file.ranges.end), False
            )
        return leased

    def _listed_directory(self, path: str) -> StatResult | None:
        """``path`` as a directory whose listing the client holds under a lease: its
        version (mtime) as of that listing (see "Directory attributes")."""
        key = dir_key(path)
        listing = self._client.cache.get_listing(key)
        if listing is None or self._client.lease_remaining(key) <= 0:
            return None
        return StatResult(path, listing.version, 0, True)

    async def _stat(self, path: str) -> StatResult:
        """What ``path`` looks like from this mount: unflushed writes, a leased cache
        entry, or the server."""
        known = self._local(path)
        if known is not None:
            return known
        inode = self._inode_of.get(path)
        if inode is not None and inode in self._paged:  # the kernel asks whether its
            await self._server(self._client.read, path, offset=0, length=1)  # pages current?
            known = self._local(path)
            if known is not None:
                return known
        st = await self._server(self._client.stat, path)
        open_file = self._open.get(inode) if inode is not None else None
        if open_file is not None and open_file.ranges:
            return StatResult(
                path, open_file.modified_ns, max(st.size, open_file.ranges.end), False
            )
        return st

    def _attributes(self, inode: int, st: StatResult) -> Entry:
        attributes = Attributes(
            inode=inode,
            mode=(stat.S_IFDIR | 0o755) if st.is_dir else (stat.S_IFREG | 0o644),
            size=st.size,
            mtime_ns=st.version,
            nlink=2 if st.is_dir else 1,
            uid=self._uid,
            gid=self._gid,
            blksize=BLOCK_SIZE,
        )
        return Entry(attributes, self._kernel_term(inode, st))

    def _kernel_term(self, inode: int, st: StatResult) -> float:
        """How long the kernel may keep ``st``: what is left of the lease on exactly
        this version (a directory's: on its listing); 0 for unflushed writes or no
        lease."""
        if st.is_dir:
            listed = self._listed_directory(st.path)
            if listed is None or listed.version != st.version:
                return 0.0
            return self._client.lease_remaining(dir_key(st.path))
        if inode in self._open and self._open[inode].dirty:
            return 0.0
        leased = self._client.leased(st.path)
        if leased is None or leased.version != st.version:
            return 0.0
        return self._client.lease_remaining(st.path)

    async def _entry(self, path: str) -> StatResult:
        """``path`` looked up in its directory's leased listing: a directory from
        there, a file from its own lease or the server. Or, if the listing is not
        cached and is not worth listing again (:meth:`_lists`), the one name from
        the server."""
        known = self._local(path)
        if known is not None:
            return known
        directory = parent(path)
        if not self._lists(directory):
            size, looked_up = self._listed[directory]
            self._listed[directory] = (size, looked_up + 1)
            return await self._stat(path)
        entries = await self._scandir(directory)
        name = path.rpartition("/")[2]
        at = bisect.bisect_left(entries, name, key=lambda entry: entry.name)
        if at == len(entries) or entries[at].name != name:
            raise NotFound(path)
        if entries[at].is_dir:
            return StatResult(path, entries[at].version, 0, True)
        return await self._stat(path)

    def _lists(self, directory: str) -> bool:
        """Whether a lookup in ``directory`` goes through its listing: while the
        client has one cached (leased: no request; expired: a revalidation, which
        costs no entries if the directory is unchanged), the first time, and then
        once as many lookups have been answered by a ``stat`` as the last listing
        had names. A listing costs the server about one ``stat`` per name, so the
        lookups in a directory that keeps changing cost about two stats each
        at most, however big it is, while a directory nobody changes is listed as
        before, and the kernel keeps its names for the listing's lease."""
        if self._client.cache.get_listing(dir_key(directory)) is not None:
            return True
        listed = self._listed.get(directory)
        return listed is None or listed[1] >= listed[0]

    async def _scandir(self, directory: str) -> list[Listed]:
        """The client's (leased) listing of ``directory``, and its size noted."""
        entries = await self._server(self._client.scandir, directory)
        self._listed[directory] = (len(entries), 0)
        return entries

    async def lookup(self, parent_inode: int, name: bytes) -> Entry:
        with _errno_replies():
            if name in (DOT, DOT_DOT):
                path = self._path(parent_inode)
                if name == DOT_DOT:
                    path = parent(path)
                st = await self._server(self._client.stat, path)
                return self._attributes(self._remember(st.path), st)
            path = self._child(parent_inode, name)
            st = await self._entry(path)
            return self._named(self._remember(st.path), st, self._names_term(parent(path)))

    def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            if inode == ROOT_INODE:
                continue
            left = self._lookups.get(inode, 0) - count
            if left > 0:
                self._lookups[inode] = left
                continue
            self._lookups.pop(inode, None)  # (the kernel holds a lookup on every open file)
            self._paged.pop(inode, None)
            path = self._path_of.pop(inode, None)
            if path is not None and self._inode_of.get(path) == inode:
                del self._inode_of[path]
                self._listed.pop(path, None)

    async def getattr(self, inode: int) -> Entry:
        with _errno_replies():
            return await self._current_attributes(inode)

    async def _current_attributes(self, inode: int) -> Entry:
        open_file = self._open.get(inode)
        if open_file is not None and open_file.unlinked and open_file.spool is not None:
            # Open, its name gone: the spool, with no link left.
            size = os.fstat(open_file.spool.fileno()).st_size
            st = StatResult(open_file.path, open_file.modified_ns, size, False)
            return Entry(dataclasses.replace(self._attributes(inode, st).attributes, nlink=0), 0.0)
        path = self._path(inode)
        if any(path == of for of, _ in self._listings.values()) and self._local(path) is None:
            # A directory open for reading (``find``: open, fstat, getdents): list it
            # now, as its readdir will, and its leased listing answers this (and keeps
            # it in the kernel), instead of a stat first.
            with contextlib.suppress(FscacheError):  # (the stat below says why)
                await self._scandir(path)
        return self._attributes(inode, await self._stat(path))

    async def setattr(self, inode: int, size: int | None) -> Entry:
        with _errno_replies():
            path = self._path(inode)
            if size is not None:  # modes, owners and times are not stored
                open_file = self._open.get(inode)
                if open_file is not None and (open_file.spool is not None or size == 0):
                    if open_file.spool is None:
                        open_file.start_spool()
                    else:
                        open_file.spool.truncate(size)
                        _changed(open_file)
                else:
                    if open_file is not None:
                        await self._write_back(open_file)  # its ranges go first
                    await self._server(self._client.truncate, path, size)
            return await self._current_attributes(inode)

    # ------------------------------------------------------------ directories
    async def opendir(self, inode: int) -> Opened:
        with _errno_replies():
            path = self._path(inode)
            fh = self._new_handle()
            self._listings[fh] = (path, [])
            return Opened(fh)

    async def readdir(self, inode: int, fh: int, offset: int) -> Iterable[DirEntry]:
        """The listing from ``offset`` on (the session takes as many as fit)."""
        with _errno_replies():
            path, entries = self._listings[fh]
            if offset == 0:  # (re)start: list afresh
                entries = await self._list(path)
                self._listings[fh] = (path, entries)
            return self._entries(path, inode, entries, offset, self._names_term(path))

    def _entries(
        self,
        path: str,
        inode: int,
        entries: list[tuple[str, StatResult]],
        offset: int,
        names_term: float,
    ) -> Iterator[DirEntry]:
        """``.`` and ``..`` first, as every directory lists them, then the listing; an
        entry's ``offset`` is its place in that whole sequence, counted from 1."""
        up = self._inode_of.get(parent(path), ROOT_INODE) if path else ROOT_INODE
        for index, (dot, dot_inode) in enumerate(((DOT, inode), (DOT_DOT, up))):
            if index >= offset:  # (the kernel takes no lookup of these: see listed)
                attributes = _directory_attributes(dot_inode, self._uid, self._gid)
                yield DirEntry(dot, Entry(attributes, 0.0), index + 1)
        for index in range(max(offset - DOTS, 0), len(entries)):
            name, st = entries[index]
            entry = self._named(self._inode(st.path), st, names_term)
            yield DirEntry(name.encode("utf-8"), entry, DOTS + index + 1)

    def _names_term(self, directory: str) -> float:
        """How long the kernel may keep the names it has in ``directory``: what is left
        of the lease on its listing. Another client's change of its names waits for
        our approval, which drops them from the kernel first (:meth:`before_approval`);
        our own changes the kernel makes itself. So a ``rm -rf`` of a listed directory
        looks up no name again after each unlink (which drops our cached listing)."""
        return self._client.lease_remaining(dir_key(directory))

    def _named(self, inode: int, st: StatResult, names_term: float) -> Entry:
        """The entry of a name: its attributes for their own term, the name itself for
        the longer of that and the listing's."""
        entry = self._attributes(inode, st)
        return dataclasses.replace(entry, name_timeout=max(entry.timeout, names_term))

    def listed(self, entries: Sequence[DirEntry]) -> None:
        for item in entries:  # each is a lookup the kernel will forget, but the dots:
            if item.name not in (DOT, DOT_DOT):  # the kernel makes no entry of them
                self._lookups[item.entry.attributes.inode] += 1

    async def _list(self, path: str) -> list[tuple[str, StatResult]]:
        """The leased listing of ``path``: each file as this mount knows it, else as
        listed (with no kernel timeout: a listing says nothing of a file's contents)."""
        prefix = f"{path}/" if path else ""
        listed = []
        for entry in await self._scandir(path):
            child = prefix + entry.name
            known = self._local(child)
            if known is None:
                known = StatResult(child, entry.version, entry.size, entry.is_dir)
            listed.append((entry.name, known))
        return listed

    async def releasedir(self, inode: int, fh: int) -> None:
        self._listings.pop(fh, None)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int) -> Entry:
        with _errno_replies():
            path = self._child(parent_inode, name)
            await self._server_once(self._client.mkdir, path)
            st = await self._server(self._client.stat, path)
            return self._attributes(self._remember(path), st)

    async def rmdir(self, parent_inode: int, name: bytes) -> None:
        with _errno_replies():
            path = self._child(parent_inode, name)
            await self._server_once(self._client.rmdir, path)
            self._inode_of.pop(path, None)
            self._listed.pop(path, None)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
    ) -> None:
        with _errno_replies():
            if flags:  # NOREPLACE, EXCHANGE: not atomic through a check, so not at all
                raise FuseError(errno.EINVAL)
            src = self._child(parent_inode_old, name_old)
            dst = self._child(parent_inode_new, name_new)
            below = src + "/"
            for open_file in list(self._open.values()):  # the data goes before the name
                if open_file.gone:  # (its name is another file's, if any)
                    continue
                if open_file.path == src or open_file.path.startswith(below):
                    await self._write_back(open_file)
            if dst != src:
                await self._keep_open_contents(dst)  # a file it replaces, if open here
            await self._server_once(self._client.rename, src, dst)
            self._moved(src, dst)

    async def statfs(self) -> Capacity:
        """The server's disk, for ``df``: the figures of its ``stats``, asked at most
        once per CAPACITY_TTL; while it is unreachable, the last ones it told (zeros
        before the first)."""
        now = trio.current_time()
        if now >= self._capacity_until:
            try:
                stats = await self._client.server_stats()
            except FscacheError:
                return self._capacity
            self._capacity = _capacity(stats, self.block_size)
            self._capacity_until = now + CAPACITY_TTL
        return self._capacity

    # ------------------------------------------------------------ files
    def _new_handle(self) -> int:
        fh = self._next_handle
        self._next_handle += 1
        return fh

    async def open(self, inode: int, flags: int) -> Opened:
        with _errno_replies():
            return self._opened(inode, flags, spool=bool(flags & os.O_TRUNC))

    def _opened(self, inode: int, flags: int, *, spool: bool) -> Opened:
        open_file = self._open.get(inode)
        if open_file is None:
            open_file = self._open[inode] = _OpenFile(self._path(inode))
        open_file.handles += 1
        writes = flags & os.O_ACCMODE != os.O_RDONLY or spool
        if writes:
            open_file.writers += 1
        if spool:
            open_file.start_spool()
        fh = self._new_handle()
        self._handles[fh] = _Handle(append=bool(flags & os.O_APPEND), writes=writes)
        leased = self._client.leased(open_file.path)
        keep = leased is not None and self._paged.get(inode) == leased.version
        if not keep:
            self._paged.pop(inode, None)  # the kernel drops its pages now
        open_flags = FOPEN_KEEP_CACHE if keep else 0
        if not writes:
            open_flags |= FOPEN_NOFLUSH  # nothing to write back: its close need not wait
        return Opened(fh, open_flags)

    async def create(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        flags: int,
    ) -> tuple[Opened, Entry]:
        with _errno_replies():
            path = self._child(parent_inode, name)
            await self._parent_is_a_directory(path)
            made = True
            # 0: only if absent. Sent again after a lost reply, a Conflict may be our own
            # first try's: so an exclusive create goes once.
            send = self._server_once if flags & os.O_EXCL else self._server
            try:
                await send(self._client.write, path, b"", if_version=0)
            except Conflict:
                if flags & os.O_EXCL:
                    raise FuseError(errno.EEXIST) from None
                made = False
            inode = self._remember(path)
            info = self._opened(inode, flags, spool=made or bool(flags & os.O_TRUNC))
            if made:  # the server has the empty file: a close with no write sends nothing
                open_file = self._open[inode]
                open_file.on_server = open_file.changes
            return info, self._attributes(inode, await self._stat(path))

    async def _parent_is_a_directory(self, path: str) -> None:
        """A write makes missing parents on the server; a name made here must not: a
        directory another client removed or renamed (a shell's stale working
        directory) would come back. Looked up as the kernel's lookups are
        (:meth:`_entry`: from the leased listing above it, which our own creates in
        the directory leave alone), so mostly without a round trip."""
        above = parent(path)
        if above and not (await self._entry(above)).is_dir:
            raise FuseError(errno.ENOTDIR)

    async def read(self, inode: int, fh: int, off: int, size: int) -> bytes:
        with _errno_replies():
            open_file = self._open[inode]
            if open_file.spool is not None:
                self._paged[inode] = MIXED  # pages the server does not have yet
                return os.pread(open_file.spool.fileno(), size, off)
            seen = self._invalidations
            data = await self._server(self._client.read, open_file.path, offset=off, length=size)
            if open_file.ranges:
                self._paged[inode] = MIXED
                return open_file.ranges.overlay(off, data, size)
            leased = self._client.leased(open_file.path)
            version = MIXED
            if leased is not None and seen == self._invalidations:
                version = leased.version  # the entry ``data`` came from
            held = self._paged.get(inode, version)
            self._paged[inode] = version if held == version else MIXED
            return data

    async def write(self, inode: int, fh: int, off: int, buf: bytes) -> int:
        with _errno_replies():
            handle = self._handles[fh]
            open_file = self._open[inode]
            if open_file.spool is not None:
                fd = open_file.spool.fileno()
                if handle.append:
                    off = os.fstat(fd).st_size
                os.pwrite(fd, buf, off)
            elif handle.append:
                # The end of the file: the server's size or the end of what is not yet
                # sent, asked with no write-back under way (one could send and clear
                # ranges the server's answer did not count yet).
                async with open_file.flushing:
                    size = (await self._stat(open_file.path)).size
                    open_file.ranges.write(max(size, open_file.ranges.end), bytes(buf))
            else:
                open_file.ranges.write(off, bytes(buf))
            _changed(open_file)
            if open_file.ranges.nbytes > DIRTY_BOUND:
                await self._write_back(open_file)
            return len(buf)

    async def flush(self, inode: int, fh: int) -> None:
        """The ``close`` of a descriptor (each one, duplicates too): a writing handle's
        publishes what was written (close-to-open); a read-only one's sends nothing,
        though another handle may have written (it is answered ``FOPEN_NOFLUSH``, so
        this comes only for a handle opened with ``O_TRUNC``)."""
        with _errno_replies():
            handle = self._handles.get(fh)
            if handle is not None and handle.writes:
                await self._write_back(self._open[inode])

    async def fsync(self, inode: int, fh: int, datasync: bool) -> None:
        """``fsync`` sends what the file holds unsent, through whichever descriptor."""
        with _errno_replies():
            await self._write_back(self._open[inode])

    async def release(self, inode: int, fh: int) -> None:
        """The last reference to an open handle is gone. Only the last writing handle
        out sends what is still unsent (its close has sent it unless that failed, or a
        writable ``mmap`` wrote after it) and ends the spool: a new or truncated file
        stays whole on the spool, and goes up as one upload, until then, however its
        descriptors were duplicated and closed (a shell's ``> file``, ``dd``). A
        read-only handle's release sends nothing: the file may be half written."""
        handle = self._handles.pop(fh)
        open_file = self._open[inode]
        open_file.handles -= 1  # the release that makes it 0 ends the file's open state
        if handle.writes:
            open_file.writers -= 1
        if open_file.writers > 0:
            return
        try:
            if open_file.gone:
                pass  # the log said so when it was found gone (_lose)
            elif open_file.unsent and open_file.failed == open_file.changes:
                # The write-back failed and the close (or fsync) said so; nothing was
                # written since. A second try here would tell no one, and would serve
                # the unsent bytes to this mount's readers while it waits.
                log.warning(
                    "%s was not written: %s; its unsent writes are dropped",
                    open_file.path,
                    open_file.failure,
                )
            elif handle.writes or open_file.handles == 0:
                await self._write_back(open_file)
        except FscacheError as exc:  # the kernel has no one to tell: say it here
            log.warning("%s was not written on its last close: %s", open_file.path, exc)
        except Exception:
            log.exception("writing %s back on its last close failed", open_file.path)
        finally:
            # After any write-back still under way (another release's, a rename's, an
            # fsync's); else at once, before the requests behind this one are read: an
            # open that follows the failed close must not find the unsent bytes.
            if open_file.flushing.locked():
                async with open_file.flushing:
                    await self._end_writing(inode, open_file)
            else:
                await self._end_writing(inode, open_file)

    async def _end_writing(self, inode: int, open_file: _OpenFile) -> None:
        """No handle may write any more (if that still holds: an open may have come
        meanwhile): reads go back to the client (and its leases); the last handle out
        ends the file's open state. What is still unsent could not be sent (the log
        said so) and is dropped, and so are the kernel's pages and attributes, which
        hold it: else the kernel would serve bytes the server never stored until its
        attributes time out. An unlinked file keeps its spool until the last close:
        it is the contents. Changes the state before it waits for anything."""
        if open_file.writers > 0 or self._open.get(inode) is not open_file:
            return
        lost = (open_file.unsent or open_file.gone) and not open_file.unlinked
        if not open_file.unlinked or open_file.handles == 0:
            open_file.drop_spool()
            open_file.ranges.clear()
        if open_file.handles == 0:
            del self._open[inode]
        if lost:
            await self._invalidate_pages(inode)

    async def unlink(self, parent_inode: int, name: bytes) -> None:
        with _errno_replies():
            path = self._child(parent_inode, name)
            open_file = await self._keep_open_contents(path)
            await self._server_once(self._client.delete, path)
            self._inode_of.pop(path, None)
            if open_file is not None:  # no close may bring it back
                open_file.unlinked = True

    async def _keep_open_contents(self, path: str) -> _OpenFile | None:
        """Before the name ``path`` goes (unlink, or a rename over it): if it is open
        here, copy what its descriptors see (the server's bytes with unflushed ranges
        laid over) into a spool, which serves them from then until the last close, as
        POSIX keeps an unlinked file for its open descriptors. The file it returns is
        marked unlinked by the caller once the name is gone."""
        inode = self._inode_of.get(path)
        open_file = self._open.get(inode) if inode is not None else None
        if open_file is None or open_file.unlinked or open_file.spool is not None:
            return open_file
        spool = tempfile.TemporaryFile()  # noqa: SIM115  (closed by the last release)
        try:
            await self._server(_read_whole, self._client, path, spool)
            spool.flush()  # from here on it is read and written by descriptor
            for start, data in open_file.ranges.items():
                os.pwrite(spool.fileno(), data, start)
        except BaseException:
            spool.close()
            raise
        open_file.spool = spool
        open_file.ranges.clear()
        return open_file

    # ------------------------------------------------------------ the kernel's copy
    async def before_approval(self, path: str) -> None:
        """The client got an approval request for ``path`` and dropped its entry: clear
        the kernel's copy before the approval goes out (see the theory note)."""
        self._invalidations += 1
        if path.endswith("/"):  # a directory's name set
            await self._invalidate_names(path[:-1])
            return
        inode = self._inode_of.get(path)
        if inode is not None:  # else the kernel has forgotten it: no pages, no entry
            await self._invalidate(path, inode)

    async def _invalidate(self, path: str, inode: int) -> None:
        """Make the kernel forget ``path``'s pages, attributes and name. In a worker
        thread: the kernel may wait for requests only this trio loop can answer."""
        parent_inode = self._inode_of.get(parent(path))
        name = path.rpartition("/")[2].encode("utf-8")
        self._paged.pop(inode, None)

        def forget() -> None:
            with contextlib.suppress(OSError):  # ENOENT: the kernel has forgotten it
                self._session.invalidate_inode(inode)
            if parent_inode is not None:
                with contextlib.suppress(OSError):
                    self._session.invalidate_entry(parent_inode, name)

        await trio.to_thread.run_sync(forget)
        self._paged.pop(inode, None)  # (pages read meanwhile were read during it)

    async def _invalidate_names(self, directory: str) -> None:
        """Make the kernel forget every name it has in ``directory``, and its attributes."""
        inode = self._inode_of.get(directory)
        if inode is None:
            return
        names = [
            path.rpartition("/")[2].encode("utf-8")
            for path in self._inode_of
            if path and path != directory and parent(path) == directory
        ]

        def forget() -> None:
            for name in names:
                with contextlib.suppress(OSError):
                    self._session.invalidate_entry(inode, name)
            with contextlib.suppress(OSError):
                self._session.invalidate_inode(inode, attributes_only=True)

        await trio.to_thread.run_sync(forget)

    async def write_back_all(self) -> None:
        """On the way out (SIGTERM, Ctrl-C, cancellation, before the unmount): send what
        files still open hold unsent, as their closes would have, within
        ``UNMOUNT_WRITE_BACK`` seconds; name in the log what could not be sent. The
        session answers no request after this, so the spools go too."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + UNMOUNT_WRITE_BACK
            for open_file in list(self._open.values()):
                if open_file.gone:  # (the log has said so)
                    continue
                try:
                    await self._write_back(open_file)
                except FscacheError as exc:
                    log.warning("%s was not written before the unmount: %s", open_file.path, exc)
        for open_file in self._open.values():
            if open_file.unsent and not open_file.unlinked:
                log.warning("%s: its unsent writes are lost with the unmount", open_file.path)
            open_file.drop_spool()  # no request is answered after this

    async def _write_back(self, open_file: _OpenFile) -> None:
        """Send what was written: the spool as one upload, or the dirty ranges. A
        failure is raised, and remembered (see :meth:`release`)."""
        if open_file.gone:
            raise NotFound(_GONE.format(open_file.path))
        if not open_file.unsent:  # nothing new (an empty file made here: `touch`)
            return
        async with open_file.flushing:
            if open_file.gone:
                raise NotFound(_GONE.format(open_file.path))
            if open_file.unlinked:  # the spool is its contents until the last close
                return
            if not open_file.unsent:
                return
            changes = open_file.changes
            try:
                await self._send(open_file, changes)
            except Exception as exc:
                open_file.failed, open_file.failure = changes, str(exc)
                raise
            inode = self._inode_of.get(open_file.path)
            if inode is not None:  # its cached mtime is the old version's
                await self._invalidate_attributes(inode)

    async def _send(self, open_file: _OpenFile, changes: int) -> None:
        """Send what was written up to write number ``changes``; NotFound if the file
        is gone (see :meth:`_lose`)."""
        try:
            await self._server(self._client.stat, open_file.path)  # leased, mostly
        except NotFound:
            # Deleted or renamed away by another client since it was opened here (the
            # server does not say where to): its unsent bytes cannot follow it, and
            # writing them under the old name would make the name (and its
            # directories) again. The caller hears it (see _lose).
            if open_file.spool is not None:
                open_file.unlinked = True  # its spool serves reads until the last close
            self._lose(open_file)
        if open_file.spool is not None:
            # The spool stays, the file's whole contents, until the last writing
            # handle's release: writes after this flush (through a duplicate
            # descriptor) go into it, and up whole again at the next flush.
            await self._server(_upload, self._client, open_file.path, open_file.spool)
            open_file.on_server = changes  # (written meanwhile: still unsent)
        else:
            for start, data in open_file.ranges.items():
                await self._server(self._client.write, open_file.path, data, offset=start)
            if open_file.changes == changes:
                open_file.ranges.clear()

    def _lose(self, open_file: _OpenFile) -> NoReturn:
        """``open_file``'s name went elsewhere while writes to it were unsent: drop
        them, say so in the log (once), and raise NotFound, so the ``close`` (or
        ``fsync``, or the write past DIRTY_BOUND) that asked for the write-back fails
        with ENOENT. It is :attr:`_OpenFile.gone` from then on: every later write-back
        of it fails the same way, so the last ``close`` fails too, even where a
        program ignored the first failure (a shell ignores its ``>&N``'s close).
        The descriptors go on working until the last close (a spool still serves
        their reads)."""
        open_file.gone = True
        open_file.ranges.clear()
        open_file.on_server = open_file.changes  # nothing is left to send
        log.warning(
            "%s was deleted or renamed away by another client (it, or a directory above"
            " it) while open here: what was written to it since its last write-back is"
            " lost, and each close of a descriptor that writes it fails (ENOENT)",
            open_file.path,
        )
        raise NotFound(_GONE.format(open_file.path))

    async def _invalidate_pages(self, inode: int) -> None:
        """Make the kernel drop ``inode``'s pages and attributes (not its name). Only
        where the kernel holds no page of the file locked for the request being
        answered (a RELEASE): a WRITE does, and this would wait for it for good."""
        self._paged.pop(inode, None)

        def forget() -> None:
            with contextlib.suppress(OSError):  # ENOENT: the kernel has forgotten it
                self._session.invalidate_inode(inode)

        await trio.to_thread.run_sync(forget)
        self._paged.pop(inode, None)  # (pages read meanwhile were read during it)

    async def _invalidate_attributes(self, inode: int) -> None:
        """Make the kernel ask for ``inode``'s attributes again. Unlike
        :meth:`_invalidate` this takes no lock in the kernel, so a handler may call it
        while the kernel holds the file or its directory for the request being
        answered (a rename, a truncate, a write): dropping a name would wait for the
        directory's lock, which a rename holds until this very handler answers. The
        pages the kernel keeps are the ones just written."""
        self._paged.pop(inode, None)

        def forget() -> None:
            with contextlib.suppress(OSError):  # ENOENT: the kernel has forgotten it
                self._session.invalidate_inode(inode, attributes_only=True)

        await trio.to_thread.run_sync(forget)


async def _upload(client: Client, path: str, spool: BinaryIO) -> None:
    """``spool`` from its start, uploaded whole to ``path`` (each try from the start)."""
    spool.seek(0)
    await client.write(path, spool)


async def _read_whole(client: Client, path: str, spool: BinaryIO) -> None:
    """``path``'s bytes into ``spool``, from its start (each try afresh)."""
    spool.seek(0)
    spool.truncate()
    await client.read_into(path, spool)


def _changed(open_file: _OpenFile) -> None:
    open_file.changes += 1
    open_file.modified_ns = time.time_ns()


async def mount(
    client: Client,
    mountpoint: str | os.PathLike[str],
    *,
    debug: bool = False,
    cache_bytes: int = MOUNT_CACHE_BYTES,
    outage_wait: float = OUTAGE_WAIT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mount the server behind ``client`` on ``mountpoint`` and serve it until
    unmounted (``fusermount3 -u``) or cancelled; always unmounts on the way out.

    The client's cache bound is set to ``cache_bytes`` (see the theory note).
    ``outage_wait``: how many seconds a request waits for a server it cannot reach
    before it fails with EIO (see "While the server is away").
    ``task_status.started()`` is called once the kernel has been answered INIT,
    so ``await nursery.start(mount, client, path)`` returns when it can be used.
    ``debug`` logs every FUSE request (logger ``fscache.fuse``)."""
    mountpoint = os.path.abspath(mountpoint)
    if shutil.which("fusermount3") is None:
        raise FscacheError("mounting needs fusermount3 (apt-get install fuse3)")
    check_mountpoint(mountpoint)
    if os.path.ismount(mountpoint):  # (not ours: we have none, so this cannot wait on us)
        raise FscacheError(f"{mountpoint} is already a mount point")
    _warn_if_not_empty(mountpoint)
    if debug:
        logging.getLogger("fscache.fuse").setLevel(logging.DEBUG)
    # No default_permissions: modes are not stored and only the mounting user can
    # reach the mount, while that option costs a getattr of every directory on a
    # path at each open (directories have no leases, so each is a round trip).
    options = [f"fsname=fscache:{client.address}", "subtype=fscache"]
    async with contextlib.AsyncExitStack() as stack:
        try:
            session = await stack.enter_async_context(
                mounted(mountpoint, options=options, debug=debug)
            )
        except OSError as exc:
            raise FscacheError(f"cannot mount on {mountpoint}: {exc.strerror or exc}") from None
        operations = FscacheOperations(client, session, outage_wait=outage_wait)
        stack.callback(client.before_approval.remove, operations.before_approval)
        stack.push_async_callback(operations.write_back_all)  # before the unmount
        client.cache.max_bytes = cache_bytes  # its leases live there: never none
        await session.serve(operations, not_permitted=NOT_PERMITTED, task_status=task_status)


def check_mountpoint(mountpoint: str) -> None:
    """Raise :class:`FscacheError` saying what keeps ``mountpoint`` from being
    mounted on, if it is not a directory. A FUSE mount whose process died (killed,
    crashed) is still mounted, and every call on it fails with ENOTCONN
    ("Transport endpoint is not connected"): that is what to say, and how to clear
    it, rather than that it is not a directory."""
    try:
        st = os.stat(mountpoint)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            raise FscacheError(
                f"{mountpoint} is a stale FUSE mount (the process that served it is gone);"
                f" clear it with: fusermount3 -u {mountpoint}"
            ) from None
        raise FscacheError(f"cannot mount on {mountpoint}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FscacheError(f"cannot mount on {mountpoint}: it is not a directory")


def _warn_if_not_empty(mountpoint: str) -> None:
    """Mounting on a directory that has files hides them until the unmount (they are
    not changed): say so, as one warning, rather than refuse (fuse3 mounts on a
    non-empty directory without its old ``nonempty`` option, as other file systems
    do) or say nothing (a user would see the files gone)."""
    with contextlib.suppress(OSError), os.scandir(mountpoint) as entries:
        if next(entries, None) is not None:
            log.warning(
                "%s is not empty: its files are hidden while it is mounted (not changed)",
                mountpoint,
            )


def _capacity(stats: dict[str, object], block_size: int) -> Capacity:
    """STATFS's figures from the server's ``stats`` (a field it lacks, or that is not a
    count, is 0)."""

    def count(field: str, unit: int = 1) -> int:
        value = stats.get(field)
        return min(value, _COUNT_LIMIT) // unit if type(value) is int and value > 0 else 0

    return Capacity(
        blocks=count("disk_bytes", block_size),
        free_blocks=count("disk_free_bytes", block_size),
        available_blocks=count("disk_available_bytes", block_size),
        files=count("disk_files"),
        free_files=count("disk_free_files"),
    )


_COUNT_LIMIT = 2**64 - 1  # STATFS's fields are 64 bits wide


def _directory_attributes(inode: int, uid: int, gid: int) -> Attributes:
    """A directory's attributes as a listing's ``.`` or ``..`` shows them: the kernel
    takes only the inode number and the type from these."""
    return Attributes(
        inode=inode, mode=stat.S_IFDIR | 0o755, size=0, mtime_ns=0, nlink=2, uid=uid, gid=gid,
        blksize=BLOCK_SIZE,
    )  # fmt: skip
