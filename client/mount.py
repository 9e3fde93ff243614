"""FUSE mount: the fscache tree as a local directory (``fscache mount HOST:PORT DIR``).

Theory of operation
-------------------
pyfuse3 serves kernel requests as trio tasks, so the file system and the async
client share one trio loop: a ``read(2)`` of a file under a live lease is a dict
lookup in the client's cache, and a write waits for approvals like any other.

The kernel caches a file exactly as long as the client's lease lets the client
cache it, so a cached ``open``/``read``/``close`` is answered from the kernel's
page cache with two short calls into this process (open and flush):

- Attributes and the name's entry are returned with a timeout of the lease's
  remaining time (:meth:`Client.lease_remaining`: the local expiry, which already
  has the skew taken off), 0 without a lease, for directories (they have no
  leases) and for a file with an unflushed buffer.
- Pages: files are opened without ``direct_io`` (so ``mmap`` works), with
  ``keep_cache`` only when the client holds a lease on the very version the
  kernel's pages hold (``_paged``); otherwise the kernel drops its pages at open.
- Lease expiry: libfuse asks for ``auto_inval_data``, so a read through the page
  cache after the attribute timeout makes the kernel ask for the attributes again
  and drop its pages if the version (mtime) or size changed. For a file whose
  pages the kernel holds, that ``getattr`` revalidates with a read (a not-modified
  round trip that renews the lease) rather than a bare stat.
- Approval requests: the client calls :meth:`FscacheOperations.before_approval`
  after dropping its entry and awaits it before it sends the approval. It
  invalidates the kernel's pages, attributes and name entry and returns when the
  kernel has done so.

Why the kernel never serves a page after the approval has gone out. A page
enters the page cache locked and is filled by a READ answered here. The hook
first, before it yields, forgets every handle's snapshot, so from then on a
READ of the file is answered only by the client, whose entry is gone: it waits
at the server, which applies the write first, and gets the new data. A READ
answered with old data before that moment either completed before the
invalidation starts, or still holds its page locked, and the invalidation waits
for that lock; either way the invalidation removes the page, and the approval is
sent only after it returns. Cached attributes and the name entry go with the
same call, so the next ``stat`` or ``open`` asks us too. Without a lease there is
no approval: the kernel's timeouts end no later than the lease (its deadline is
the reply's arrival plus the remaining time, a few microseconds and at most a
clock tick after ours), well inside the ``2 * skew`` by which the server outlasts
the client's expiry.

The price of that order: a READ or lookup of the file that arrives during the
invalidation waits at the server for a write that waits for this approval, while
the invalidation waits for that READ's page; the write then goes ahead when the
lease runs out at the server, which ends the wait. It needs a kernel request for
the file in the microseconds between the approval request and the end of the
invalidation.

A read at offset 0 fetches the file from the client (a cache hit while the lease
lasts); reads further on serve the same copy until an approval request for the
file. Directories have no leases: each lookup of one asks the server (a round
trip per directory on a path), and while the server is unreachable those lookups
fail with EIO rather than guess.

Each kind of server change maps to the kernel in one place, :meth:`_invalidate`
(pages, attributes, the name in its parent): new operations that change names
(rename, mkdir on the server) call it for every path they touch.

fscache writes whole files, so writes are buffered per open file (shared by all
handles on one inode) and written through on ``close`` (flush), ``fsync`` and
release: the writer then has its data on the server's disk. Until then the
writer's own reads and ``stat`` see the buffer; other clients see the old file.

Not supported, on purpose
-------------------------
- ``rename``: fscache has no atomic rename; EXDEV makes ``mv`` and
  ``shutil.move`` fall back to copy and delete, which is honest about it.
- Directories are implicit on the server (a write creates its parents; they are
  never removed). ``mkdir`` makes a directory in this mount's memory only, until
  a file is written below it; ``rmdir`` removes only such a directory (EPERM for
  an empty server directory, ENOTEMPTY otherwise).
- Modes, owners and times are not stored: files are 0644, directories 0755, owned
  by the mounting user; mtime is the version (an mtime in ns). ``chmod``, ``chown``
  and ``utime`` succeed and change nothing. No links, symlinks, special files,
  xattrs.
- A writable shared ``mmap`` is written back like ``write(2)``: the kernel sends
  the dirty pages on ``msync`` and on close, and the file goes out whole on the
  flush that follows.
- FUSE's no-open mode (ENOSYS from ``open``, so cached opens never reach us)
  is not used: pyfuse3 hands ``read``, ``write`` and ``flush`` a file handle but
  not the inode, and without ``open`` every handle is 0.
- Concurrent writers through different mounts: the last close wins (whole-file
  writes, as with the client's ``write``). A new file is visible, empty, from
  ``create`` until its first close.
- pyfuse3 keeps one session per process: one mount at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import stat
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import trio

from fscache.client.client import Client, StatResult
from fscache.errors import (
    BadPath,
    Conflict,
    FscacheError,
    IsADirectory,
    NotFound,
    TooLarge,
    Unauthorized,
)
from fscache.paths import MAX_PATH_BYTES, MAX_SEGMENT_BYTES, normalize

_IMPORT_ERROR = ""
if TYPE_CHECKING:
    import pyfuse3
    from pyfuse3 import (
        EntryAttributes,
        FileHandleT,
        FileInfo,
        FileNameT,
        FlagT,
        InodeT,
        ModeT,
        Operations,
        ReaddirToken,
        RequestContext,
        SetattrFields,
        StatvfsData,
    )
else:
    try:
        import pyfuse3
        from pyfuse3 import Operations
    except ImportError as exc:  # the optional extra: pip install 'fscache[fuse]'
        pyfuse3 = None
        Operations = object
        _IMPORT_ERROR = str(exc)

__all__ = ["FscacheOperations", "mount"]

log = logging.getLogger("fscache.mount")

# The first class an error is an instance of decides; any other error is EIO.
_ERRNO: tuple[tuple[type[FscacheError], int], ...] = (
    (NotFound, errno.ENOENT),
    (BadPath, errno.EINVAL),
    (IsADirectory, errno.EISDIR),
    (TooLarge, errno.EFBIG),
    (Unauthorized, errno.EACCES),
)
MIXED = -1  # in ``_paged``: the kernel may hold pages of more than one version
STAT_CONCURRENCY = 32  # stat requests in flight while listing one directory
BLOCK_SIZE = 4096
_mounted = False  # pyfuse3 holds one session per process


@contextlib.contextmanager
def _errno_replies() -> Iterator[None]:
    """Turn whatever a handler raises into the one exception pyfuse3 answers with."""
    try:
        yield
    except pyfuse3.FUSEError:
        raise
    except FscacheError as exc:
        code = next((code for kind, code in _ERRNO if isinstance(exc, kind)), errno.EIO)
        raise pyfuse3.FUSEError(code) from None
    except Exception:
        log.exception("unexpected error in a FUSE request")
        raise pyfuse3.FUSEError(errno.EIO) from None


@dataclasses.dataclass(eq=False)
class _OpenFile:
    """One inode's open state, shared by every handle on it."""

    path: str
    handles: int = 0
    data: bytearray | None = None  # the local copy being written; None: read the server's
    dirty: bool = False
    changes: int = 0  # bumped by every change to ``data``
    modified_ns: int = 0
    unlinked: bool = False


@dataclasses.dataclass(eq=False)
class _Handle:
    inode: int
    append: bool
    snapshot: bytes | None = None  # what reads past offset 0 are served from
    version: int = MIXED  # the snapshot's version (MIXED: not known)


class FscacheOperations(Operations):
    """The pyfuse3 request handlers, over one async :class:`~fscache.client.client.Client`."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, client: Client) -> None:
        self._client = client
        root = pyfuse3.ROOT_INODE
        self._path_of: dict[int, str] = {root: ""}
        self._inode_of: dict[str, int] = {"": root}
        self._lookups: dict[int, int] = {root: 1}
        self._next_inode = root + 1
        self._open: dict[int, _OpenFile] = {}  # by inode
        self._handles: dict[int, _Handle] = {}
        self._listings: dict[int, tuple[str, list[tuple[str, StatResult]]]] = {}
        self._next_handle = 1
        self._local_dirs: dict[str, int] = {}  # mkdir'd here, not yet on the server: ctime ns
        self._paged: dict[int, int] = {}  # inode: the version of the pages the kernel may hold
        self._invalidations = 0  # approval requests seen: a read spanning one is MIXED
        client.before_approval.append(self.before_approval)
        self._uid = os.getuid()
        self._gid = os.getgid()

    # ------------------------------------------------------------ inodes and paths
    def _path(self, inode: int) -> str:
        path = self._path_of.get(inode)
        if path is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        return path

    def _child(self, parent_inode: int, name: bytes) -> str:
        if len(name) > MAX_SEGMENT_BYTES:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            raise pyfuse3.FUSEError(errno.EINVAL) from None  # fscache names are UTF-8
        parent = self._path(parent_inode)
        path = f"{parent}/{text}" if parent else text
        if len(path.encode("utf-8")) > MAX_PATH_BYTES:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        try:
            return normalize(path)
        except BadPath:
            raise pyfuse3.FUSEError(errno.EINVAL) from None

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

    # ------------------------------------------------------------ attributes
    async def _stat(self, path: str) -> StatResult:
        """What ``path`` looks like from this mount: an unflushed buffer, a leased
        cache entry, the server, or a directory that exists only here."""
        inode = self._inode_of.get(path)
        open_file = self._open.get(inode) if inode is not None else None
        if open_file is not None and open_file.data is not None:
            return StatResult(path, open_file.modified_ns, len(open_file.data), False)
        leased = self._client.leased(path)  # the lease keeps size and version current too
        if leased is not None:
            return leased
        if inode is not None and inode in self._paged:  # the kernel asks whether its
            await self._client.read(path)  # pages are current: renew the lease too
            leased = self._client.leased(path)
            if leased is not None:
                return leased
        try:
            st = await self._client.stat(path)
        except NotFound:
            if path in self._local_dirs:
                return StatResult(path, self._local_dirs[path], 0, True)
            raise
        if st.is_dir:
            self._local_dirs.pop(path, None)  # the server has it now
        return st

    def _attributes(self, inode: int, st: StatResult) -> EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = inode
        attrs.st_mode = (stat.S_IFDIR | 0o755) if st.is_dir else (stat.S_IFREG | 0o644)
        attrs.st_nlink = 2 if st.is_dir else 1
        attrs.st_uid = self._uid
        attrs.st_gid = self._gid
        attrs.st_size = st.size
        attrs.st_blksize = BLOCK_SIZE
        attrs.st_blocks = -(-st.size // 512)
        attrs.st_atime_ns = attrs.st_ctime_ns = attrs.st_mtime_ns = st.version
        attrs.attr_timeout = attrs.entry_timeout = self._kernel_term(inode, st)
        return attrs

    def _kernel_term(self, inode: int, st: StatResult) -> float:
        """How long the kernel may keep ``st``: what is left of the lease on exactly
        this version; 0 for a directory, an unflushed buffer or no lease."""
        if st.is_dir or (inode in self._open and self._open[inode].data is not None):
            return 0.0
        leased = self._client.leased(st.path)
        if leased is None or leased.version != st.version:
            return 0.0
        return self._client.lease_remaining(st.path)

    async def lookup(
        self, parent_inode: InodeT, name: FileNameT, ctx: RequestContext
    ) -> EntryAttributes:
        with _errno_replies():
            if name in (b".", b".."):
                path = self._path(parent_inode)
                if name == b"..":
                    path = path.rpartition("/")[0]
            else:
                path = self._child(parent_inode, name)
            st = await self._stat(path)
            return self._attributes(self._remember(path), st)

    async def forget(self, inode_list: Sequence[tuple[InodeT, int]]) -> None:
        for inode, count in inode_list:
            if inode == pyfuse3.ROOT_INODE:
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

    async def getattr(self, inode: InodeT, ctx: RequestContext) -> EntryAttributes:
        with _errno_replies():
            return self._attributes(inode, await self._stat(self._path(inode)))

    async def setattr(
        self,
        inode: InodeT,
        attr: EntryAttributes,
        fields: SetattrFields,
        fh: FileHandleT | None,
        ctx: RequestContext,
    ) -> EntryAttributes:
        with _errno_replies():
            path = self._path(inode)
            if fields.update_size:  # modes, owners and times are not stored
                open_file = self._open.get(inode)
                if open_file is not None:
                    _resize(await self._loaded(open_file), attr.st_size)
                    _changed(open_file)
                else:
                    data = bytearray(await self._client.read(path))
                    _resize(data, attr.st_size)
                    await self._client.write(path, bytes(data))
            return self._attributes(inode, await self._stat(path))

    async def statfs(self, ctx: RequestContext) -> StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = BLOCK_SIZE
        data.f_namemax = MAX_SEGMENT_BYTES
        return data

    # ------------------------------------------------------------ directories
    async def opendir(self, inode: InodeT, ctx: RequestContext) -> FileHandleT:
        with _errno_replies():
            path = self._path(inode)
            fh = self._new_handle()
            self._listings[fh] = (path, [])
            return fh

    async def readdir(self, fh: FileHandleT, start_id: int, token: ReaddirToken) -> None:
        with _errno_replies():
            path, entries = self._listings[fh]
            if start_id == 0:  # (re)start: list afresh
                entries = await self._list(path)
                self._listings[fh] = (path, entries)
            for index in range(start_id, len(entries)):
                name, st = entries[index]
                attrs = self._attributes(self._inode(st.path), st)
                if not pyfuse3.readdir_reply(token, name.encode("utf-8"), attrs, index + 1):
                    return
                self._lookups[attrs.st_ino] += 1

    async def _names(self, path: str) -> list[str]:
        """The names in directory ``path``: the server's, and directories made here."""
        try:
            names = [name.rstrip("/") for name in await self._client.listdir(path)]
        except NotFound:
            if path not in self._local_dirs:
                raise
            names = []
        prefix = f"{path}/" if path else ""
        for local in self._local_dirs:
            name = local[len(prefix) :]
            if local.startswith(prefix) and "/" not in name and name not in names:
                names.append(name)
        return names

    async def _list(self, path: str) -> list[tuple[str, StatResult]]:
        names = await self._names(path)
        prefix = f"{path}/" if path else ""
        found: dict[str, StatResult] = {}
        errors: list[FscacheError] = []
        limiter = trio.CapacityLimiter(STAT_CONCURRENCY)

        async def stat_one(name: str) -> None:
            async with limiter:
                try:
                    found[name] = await self._stat(prefix + name)
                except NotFound:
                    pass  # deleted since the listing
                except FscacheError as exc:
                    errors.append(exc)

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(stat_one, name)
        if errors:
            raise errors[0]
        return [(name, found[name]) for name in sorted(found)]

    async def releasedir(self, fh: FileHandleT) -> None:
        self._listings.pop(fh, None)

    async def mkdir(
        self, parent_inode: InodeT, name: FileNameT, mode: ModeT, ctx: RequestContext
    ) -> EntryAttributes:
        with _errno_replies():
            path = self._child(parent_inode, name)
            with contextlib.suppress(NotFound):
                await self._stat(path)
                raise pyfuse3.FUSEError(errno.EEXIST)
            made = self._local_dirs[path] = time.time_ns()
            return self._attributes(self._remember(path), StatResult(path, made, 0, True))

    async def rmdir(self, parent_inode: InodeT, name: FileNameT, ctx: RequestContext) -> None:
        with _errno_replies():
            path = self._child(parent_inode, name)
            st = await self._stat(path)
            if not st.is_dir:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            if await self._names(path):  # names only: no stat per entry
                raise pyfuse3.FUSEError(errno.ENOTEMPTY)
            if path not in self._local_dirs:
                raise pyfuse3.FUSEError(errno.EPERM)  # fscache never removes a server directory
            del self._local_dirs[path]
            self._inode_of.pop(path, None)

    # ------------------------------------------------------------ files
    def _new_handle(self) -> int:
        fh = self._next_handle
        self._next_handle += 1
        return fh

    async def open(self, inode: InodeT, flags: FlagT, ctx: RequestContext) -> FileInfo:
        with _errno_replies():
            open_file = self._open.get(inode)
            if open_file is None:
                open_file = self._open[inode] = _OpenFile(self._path(inode))
            open_file.handles += 1
            if flags & os.O_TRUNC:
                open_file.data = bytearray()
                _changed(open_file)
            fh = self._new_handle()
            self._handles[fh] = _Handle(inode, append=bool(flags & os.O_APPEND))
            leased = self._client.leased(open_file.path)
            keep = leased is not None and self._paged.get(inode) == leased.version
            if not keep:
                self._paged.pop(inode, None)  # the kernel drops its pages now
            return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=keep)

    async def create(
        self,
        parent_inode: InodeT,
        name: FileNameT,
        mode: ModeT,
        flags: FlagT,
        ctx: RequestContext,
    ) -> tuple[FileInfo, EntryAttributes]:
        with _errno_replies():
            path = self._child(parent_inode, name)
            try:
                await self._client.write(path, b"", if_version=0)  # 0: only if absent
            except Conflict:
                if flags & os.O_EXCL:
                    raise pyfuse3.FUSEError(errno.EEXIST) from None
            inode = self._remember(path)
            info = await self.open(inode, flags, ctx)
            return info, self._attributes(inode, await self._stat(path))

    async def read(self, fh: FileHandleT, off: int, size: int) -> bytes:
        with _errno_replies():
            handle = self._handles[fh]
            open_file = self._open[handle.inode]
            if open_file.data is not None:
                self._paged[handle.inode] = MIXED  # pages the server does not have yet
                return bytes(open_file.data[off : off + size])
            if off == 0 or handle.snapshot is None:
                seen = self._invalidations
                data = await self._client.read(open_file.path)
                leased = self._client.leased(open_file.path)
                handle.snapshot = data
                handle.version = MIXED
                if leased is not None and seen == self._invalidations:
                    handle.version = leased.version  # the entry ``data`` came from
            held = self._paged.get(handle.inode, handle.version)
            self._paged[handle.inode] = handle.version if held == handle.version else MIXED
            return handle.snapshot[off : off + size]

    async def write(self, fh: FileHandleT, off: int, buf: bytes) -> int:
        with _errno_replies():
            handle = self._handles[fh]
            open_file = self._open[handle.inode]
            data = await self._loaded(open_file)
            if handle.append:
                off = len(data)
            if off > len(data):
                _resize(data, off)
            data[off : off + len(buf)] = buf
            _changed(open_file)
            return len(buf)

    async def flush(self, fh: FileHandleT) -> None:
        with _errno_replies():
            await self._write_back(self._open[self._handles[fh].inode])

    async def fsync(self, fh: FileHandleT, datasync: bool) -> None:
        await self.flush(fh)

    async def release(self, fh: FileHandleT) -> None:
        handle = self._handles.pop(fh)
        open_file = self._open[handle.inode]
        open_file.handles -= 1
        try:
            await self._write_back(open_file)
        except FscacheError as exc:  # the kernel has no one to tell: say it here
            log.warning("%s was not written on its last close: %s", open_file.path, exc)
        except Exception:
            log.exception("writing %s back on its last close failed", open_file.path)
        finally:
            if open_file.handles == 0:
                del self._open[handle.inode]

    async def unlink(self, parent_inode: InodeT, name: FileNameT, ctx: RequestContext) -> None:
        with _errno_replies():
            path = self._child(parent_inode, name)
            await self._client.delete(path)
            inode = self._inode_of.pop(path, None)
            open_file = self._open.get(inode) if inode is not None else None
            if open_file is not None:  # no close may bring it back
                open_file.unlinked = True
                open_file.dirty = False

    async def rename(
        self,
        parent_inode_old: InodeT,
        name_old: FileNameT,
        parent_inode_new: InodeT,
        name_new: FileNameT,
        flags: FlagT,
        ctx: RequestContext,
    ) -> None:
        raise pyfuse3.FUSEError(errno.EXDEV)  # no atomic rename in fscache: callers copy and delete

    # ------------------------------------------------------------ the kernel's copy
    async def before_approval(self, path: str) -> None:
        """The client got an approval request for ``path`` and dropped its entry: clear
        the kernel's copy before the approval goes out (see the theory note)."""
        self._invalidations += 1
        inode = self._inode_of.get(path)
        if inode is None:
            return  # the kernel has forgotten it: it holds no pages, no entry
        for handle in self._handles.values():
            if handle.inode == inode:
                handle.snapshot = None  # before any yield: no old data from now on
        await self._invalidate(path, inode)

    async def _invalidate(self, path: str, inode: int) -> None:
        """Make the kernel forget ``path``'s pages, attributes and name. In a worker
        thread: the kernel may wait for requests only this trio loop can answer."""
        parent, _, name = path.rpartition("/")
        parent_inode = self._inode_of.get(parent)
        self._paged.pop(inode, None)

        def forget() -> None:
            with contextlib.suppress(OSError):  # ENOENT: the kernel has forgotten it
                pyfuse3.invalidate_inode(inode, attr_only=False)
            if parent_inode is not None:
                with contextlib.suppress(OSError):
                    pyfuse3.invalidate_entry(parent_inode, name.encode("utf-8"))

        await trio.to_thread.run_sync(forget)
        self._paged.pop(inode, None)  # (pages read meanwhile were read during it)

    async def _loaded(self, open_file: _OpenFile) -> bytearray:
        """The local copy to write into, read from the server on first use."""
        if open_file.data is None:
            try:
                contents = await self._client.read(open_file.path)
            except NotFound:
                contents = b""
            if open_file.data is None:  # another write may have loaded it meanwhile
                open_file.data = bytearray(contents)
        return open_file.data

    async def _write_back(self, open_file: _OpenFile) -> None:
        """Write the whole local copy through the client, if it has changed."""
        if not open_file.dirty or open_file.unlinked or open_file.data is None:
            return
        changes = open_file.changes
        await self._client.write(open_file.path, bytes(open_file.data))
        if open_file.changes == changes:  # else a write came in meanwhile: still dirty
            open_file.dirty = False
            open_file.data = None  # reads go back to the client (and its leases)
        inode = self._inode_of.get(open_file.path)
        if inode is not None:  # its cached mtime is the old version's
            await self._invalidate(open_file.path, inode)


def _changed(open_file: _OpenFile) -> None:
    open_file.dirty = True
    open_file.changes += 1
    open_file.modified_ns = time.time_ns()


def _resize(data: bytearray, size: int) -> None:
    if size < len(data):
        del data[size:]
    else:
        data.extend(bytes(size - len(data)))


async def mount(
    client: Client,
    mountpoint: str | os.PathLike[str],
    *,
    debug: bool = False,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mount the server behind ``client`` on ``mountpoint`` and serve it until
    unmounted (``fusermount3 -u``) or cancelled; always unmounts on the way out.

    ``task_status.started()`` is called once the mount is in place, so
    ``await nursery.start(mount, client, path)`` returns when it can be used."""
    global _mounted
    mountpoint = os.fspath(mountpoint)
    if pyfuse3 is None:
        raise FscacheError(f"mounting needs pyfuse3 (pip install 'fscache[fuse]'): {_IMPORT_ERROR}")
    if _mounted:
        raise FscacheError("this process already has a mount (pyfuse3 allows one)")
    if os.path.ismount(mountpoint):  # (not ours: we have none, so this cannot wait on us)
        raise FscacheError(f"{mountpoint} is already a mount point")
    # Not pyfuse3's default_permissions: modes are not stored and only the mounting
    # user can reach the mount, while that option costs a getattr of every directory
    # on a path at each open (directories have no leases, so each is a round trip).
    options = set(pyfuse3.default_options) - {"default_permissions"}
    options |= {f"fsname=fscache:{client.address}", "subtype=fscache"}
    if debug:
        options.add("debug")
    try:
        pyfuse3.init(FscacheOperations(client), mountpoint, options)
    except RuntimeError as exc:
        with contextlib.suppress(Exception):
            pyfuse3.close(unmount=False)
        raise FscacheError(f"cannot mount on {mountpoint}: {exc}") from None
    _mounted = True
    try:
        task_status.started()
        await pyfuse3.main()
    finally:
        _mounted = False
        pyfuse3.close(unmount=True)
