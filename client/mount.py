"""FUSE mount: the fscache tree as a local directory (``fscache mount HOST:PORT DIR``).

Theory of operation
-------------------
pyfuse3 serves kernel requests as trio tasks, so the file system and the async
client share one trio loop: a ``read(2)`` of a file under a live lease is a dict
lookup in the client's cache, and a write waits for approvals like any other.

Consistency stays the lease cache's job, never the kernel's: every attribute and
entry is returned with timeout 0 and every file is opened with ``direct_io``, so
the kernel keeps no pages and asks us each time. A read at offset 0 fetches the
file from the client (a cache hit while the lease lasts); reads further on serve
the same copy, so a reader sees one version from start to end, and a reader that
starts again after another client's write sees the new contents. A leased file's
size and version come from the cache as well. Directories have no leases: each
lookup of one asks the server (a round trip per directory on a path), and while
the server is unreachable those lookups fail with EIO rather than guess.

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
  xattrs. ``mmap`` is refused by the kernel on ``direct_io`` files.
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
        attrs.attr_timeout = 0  # the kernel asks us every time: consistency is the
        attrs.entry_timeout = 0  # lease cache's job, not the kernel's
        return attrs

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
            # direct_io: no page cache, so no read is ever answered with stale pages
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

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
                return bytes(open_file.data[off : off + size])
            if off == 0 or handle.snapshot is None:
                handle.snapshot = await self._client.read(open_file.path)
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
    options = set(pyfuse3.default_options)
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
