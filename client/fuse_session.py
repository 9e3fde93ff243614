"""A FUSE mount's connection to the kernel: mount, serve requests, unmount.

Theory of operation
-------------------
:func:`mounted` runs ``fusermount3`` with one end of a socket pair in
``_FUSE_COMMFD``; it mounts and passes the opened ``/dev/fuse`` back over the
socket (``SCM_RIGHTS``), as libfuse does, for root and ordinary users alike.
On the way out the device is closed first (no request can then wait for this
process) and the mount point is unmounted, lazily if it is busy.

:meth:`Session.serve` answers INIT, then reads requests and answers them until
the kernel says the mount is gone (ENODEV) or DESTROY comes. Bytes become
requests and replies become bytes in :mod:`fscache.client.fuse_protocol`; this
module only reads, dispatches to the :class:`Operations` and writes.

The loop is built for the cached case, where a request is answered without
waiting for anything:

* The device is non-blocking. The reader reads first and waits for the device
  to be readable only when a read says EAGAIN, into one buffer of
  ``max_write`` plus headers (the kernel refuses smaller reads).
* A request is handled inline, in the reader's own task, by driving its
  handler's coroutine by hand. If the handler returns without waiting, the
  reply is written and the reader reads on: no task, no lock, no wake-up. If
  the handler waits (the network, a lock), its coroutine is not moved: the
  reader's task becomes that request's task and finishes it, and a new reader
  task is started first, so the requests behind it are answered meanwhile.
  After ``_INLINE_RUN`` requests in a row the reader lets other tasks run.
* Replies are single ``write(2)``\\ s (``writev`` for data). A reply to a
  request the kernel has given up on (interrupted) fails with ENOENT and is
  dropped.
* Notifications (:meth:`Session.invalidate_inode`,
  :meth:`Session.invalidate_entry`) are blocking writes meant for a worker
  thread: the kernel may hold such a write until requests that only this loop
  can answer are answered.
* INTERRUPT is answered ENOSYS, so the kernel stops sending it: a handler
  runs to its end and its reply to an abandoned request is dropped. Any other
  request the operations do not answer gets ENOSYS too, but those the file
  system names in ``serve(not_permitted=...)``, which get EPERM.

A session holds no global state: a process can serve several mounts.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import socket
import subprocess
import types
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Sequence,
)
from typing import Any, Protocol

import trio

from fscache.client import fuse_protocol as fp
from fscache.client.fuse_protocol import Capacity, DirEntry, Entry, FuseError, Opened

__all__ = ["Operations", "Session", "mounted"]

log = logging.getLogger("fscache.fuse")

MAX_WRITE = 1 << 20  # bytes of one WRITE request (and of one READ, with max_pages)
# The flags we ask for in INIT: reads in parallel, O_TRUNC passed to open, the
# page cache dropped when the attributes show a new mtime or size, listings
# with attributes, directory operations in parallel, and 1 MiB requests.
WANT = (
    fp.FUSE_ASYNC_READ
    | fp.FUSE_ATOMIC_O_TRUNC
    | fp.FUSE_BIG_WRITES
    | fp.FUSE_AUTO_INVAL_DATA
    | fp.FUSE_DO_READDIRPLUS
    | fp.FUSE_ASYNC_DIO
    | fp.FUSE_PARALLEL_DIROPS
    | fp.FUSE_MAX_PAGES
)
_BUFFER_SLACK = 4096  # headers beyond max_write in one request
_INLINE_RUN = 64  # requests answered in a row before other tasks get a turn


class Operations(Protocol):
    """What a file system answers. Raise :class:`FuseError` for an errno reply;
    any other exception is logged and answered EIO."""

    block_size: int
    name_max: int

    async def lookup(self, parent: int, name: bytes) -> Entry: ...
    def forget(self, items: Sequence[tuple[int, int]]) -> None: ...
    async def getattr(self, inode: int) -> Entry: ...
    async def setattr(self, inode: int, size: int | None) -> Entry: ...
    async def open(self, inode: int, flags: int) -> Opened: ...
    async def create(
        self, parent: int, name: bytes, mode: int, flags: int
    ) -> tuple[Opened, Entry]: ...
    async def read(self, inode: int, fh: int, offset: int, size: int) -> bytes: ...
    async def write(self, inode: int, fh: int, offset: int, data: bytes) -> int: ...
    async def flush(self, inode: int, fh: int) -> None: ...
    async def fsync(self, inode: int, fh: int, datasync: bool) -> None: ...
    async def release(self, inode: int, fh: int) -> None: ...
    async def opendir(self, inode: int) -> Opened: ...
    async def readdir(self, inode: int, fh: int, offset: int) -> Iterable[DirEntry]:
        """The listing from ``offset`` on; the session takes as many as fit."""

    def listed(self, entries: Sequence[DirEntry]) -> None:
        """``entries`` went to the kernel in a listing: one lookup each."""

    async def releasedir(self, inode: int, fh: int) -> None: ...
    async def mkdir(self, parent: int, name: bytes, mode: int) -> Entry: ...
    async def unlink(self, parent: int, name: bytes) -> None: ...
    async def rmdir(self, parent: int, name: bytes) -> None: ...
    async def rename(
        self, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None: ...
    async def statfs(self) -> Capacity: ...


Reply = bytes | list[bytes] | None


@types.coroutine
def _finish(coro: Coroutine[Any, Any, None], trap: Any) -> Generator[Any, Any, None]:
    """Go on with ``coro``, which has just yielded ``trap`` to this very task."""
    while True:
        try:
            sent = yield trap
        except BaseException as exc:
            try:
                trap = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                trap = coro.send(sent)
            except StopIteration:
                return


class Session:
    """One mount's ``/dev/fuse``: requests in, replies and notifications out."""

    def __init__(self, fd: int, mountpoint: str, *, debug: bool = False) -> None:
        self.fd = fd
        self.mountpoint = mountpoint
        self.requests: collections.Counter[str] = collections.Counter()  # by request type
        self._debug = debug
        self.closed = False
        self._inline = 0  # requests answered since the reader last let other tasks run
        self._buffer = bytearray(MAX_WRITE + _BUFFER_SLACK)
        self._view = memoryview(self._buffer)
        self._ops: Operations | None = None
        self._not_permitted: frozenset[int] = frozenset()
        self._handlers: dict[type[fp.Request], Callable[[Any], Awaitable[Reply]]] = {
            fp.Lookup: self._lookup,
            fp.Getattr: self._getattr,
            fp.Setattr: self._setattr,
            fp.Open: self._open,
            fp.Create: self._create,
            fp.Read: self._read,
            fp.Write: self._write,
            fp.Flush: self._flush,
            fp.Release: self._release,
            fp.Fsync: self._fsync,
            fp.Opendir: self._opendir,
            fp.Readdir: self._readdir,
            fp.Mkdir: self._mkdir,
            fp.Unlink: self._unlink,
            fp.Rename: self._rename,
            fp.Statfs: self._statfs,
        }

    # ------------------------------------------------------------ notifications
    def invalidate_inode(self, inode: int, *, attributes_only: bool = False) -> None:
        """Drop the kernel's attributes (and pages) of ``inode``. Blocking: call it
        from a worker thread. OSError(ENOENT): the kernel does not know it."""
        self._check_open()
        os.write(self.fd, fp.notify_inval_inode(inode, attributes_only=attributes_only))

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Drop the kernel's name ``name`` in ``parent``. Blocking, like
        :meth:`invalidate_inode`."""
        self._check_open()
        os.write(self.fd, fp.notify_inval_entry(parent, name))

    def _check_open(self) -> None:
        if self.closed:  # the descriptor's number may be another file's by now
            raise OSError(errno.EBADF, "the FUSE session is closed")

    # ------------------------------------------------------------ the loop
    async def serve(
        self,
        operations: Operations,
        *,
        not_permitted: Iterable[int] = (),
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Answer INIT, call ``task_status.started()``, then answer requests until
        the mount goes away. Requests of the opcodes ``not_permitted`` (of those
        :class:`Operations` has no method for) are answered EPERM rather than
        ENOSYS: what a file system without, say, links answers for making one."""
        self._ops = operations
        self._not_permitted = frozenset(not_permitted)
        os.set_blocking(self.fd, False)
        while True:
            request = await self._next()
            if request is None:
                return
            if isinstance(request, fp.Init):
                break
            self._send(request.unique, fp.reply_error(request.unique, errno.EIO))  # not yet
        negotiated = fp.negotiate(request, want=WANT, max_write=MAX_WRITE)
        self._send(request.unique, negotiated.reply)
        log.debug(
            "FUSE 7.%d, flags %#x, max_write %d",
            negotiated.minor,
            negotiated.flags,
            negotiated.max_write,
        )
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_requests, nursery)

    async def _next(self) -> fp.Request | None:
        """The next request, or None once the mount is gone."""
        while True:
            try:
                length = os.readv(self.fd, (self._buffer,))
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)
                self._inline = 0  # other tasks have had their turn
                continue
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.EINTR):  # interrupted before we read it
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    return None
                raise
            request = fp.parse_request(self._view, length)
            self.requests[type(request).__name__] += 1
            if self._debug:
                log.debug("%r", request)
            return request

    async def _read_requests(self, nursery: trio.Nursery) -> None:
        while True:
            if self._inline >= _INLINE_RUN:
                await trio.lowlevel.checkpoint()
                self._inline = 0
            request = await self._next()
            if request is None or isinstance(request, fp.Destroy):
                if request is not None:
                    self._send(request.unique, fp.reply_empty(request.unique))
                nursery.cancel_scope.cancel()
                return
            coro = self._handle(request)
            try:
                trap = coro.send(None)
            except StopIteration:
                self._inline += 1
                continue
            # The handler waits: this task finishes it; a new one reads on.
            nursery.start_soon(self._read_requests, nursery)
            await _finish(coro, trap)
            return

    async def _handle(self, request: fp.Request) -> None:
        reply: Reply
        try:
            handler = self._handlers.get(type(request))
            if handler is not None:
                reply = await handler(request)
            elif isinstance(request, fp.Forget):
                assert self._ops is not None
                self._ops.forget(request.items)
                return
            elif isinstance(request, fp.Init):
                reply = fp.reply_error(request.unique, errno.EPROTO)
            elif isinstance(request, fp.Unsupported) and request.opcode in self._not_permitted:
                reply = fp.reply_error(request.unique, errno.EPERM)
            else:  # Interrupt, Unsupported and anything not asked for: ENOSYS
                reply = fp.reply_error(request.unique, errno.ENOSYS)
        except FuseError as exc:
            if self._debug:
                log.debug("%d: %s", request.unique, errno.errorcode.get(exc.errno, exc.errno))
            reply = fp.reply_error(request.unique, exc.errno)
        except Exception:
            log.exception("unexpected error answering %r", request)
            reply = fp.reply_error(request.unique, errno.EIO)
        self._send(request.unique, reply)

    def _send(self, unique: int, reply: Reply) -> None:
        if reply is None:
            return
        try:
            if isinstance(reply, bytes):
                os.write(self.fd, reply)
            else:
                os.writev(self.fd, reply)
        except OSError as exc:
            # ENOENT: the kernel gave up on that request; ENODEV: unmounted, which
            # the reader sees too.
            if exc.errno in (errno.ENOENT, errno.ENODEV):
                return
            log.exception("the kernel refused the reply to request %d", unique)
            with contextlib.suppress(OSError):  # the caller must not wait forever
                os.write(self.fd, fp.reply_error(unique, errno.EIO))

    # ------------------------------------------------------------ requests
    @property
    def _operations(self) -> Operations:
        assert self._ops is not None
        return self._ops

    async def _lookup(self, r: fp.Lookup) -> Reply:
        return fp.reply_entry(r.unique, await self._operations.lookup(r.parent, r.name))

    async def _getattr(self, r: fp.Getattr) -> Reply:
        return fp.reply_attr(r.unique, await self._operations.getattr(r.inode))

    async def _setattr(self, r: fp.Setattr) -> Reply:
        return fp.reply_attr(r.unique, await self._operations.setattr(r.inode, r.size))

    async def _open(self, r: fp.Open) -> Reply:
        return fp.reply_open(r.unique, await self._operations.open(r.inode, r.flags))

    async def _create(self, r: fp.Create) -> Reply:
        opened, entry = await self._operations.create(r.parent, r.name, r.mode, r.flags)
        return fp.reply_create(r.unique, entry, opened)

    async def _read(self, r: fp.Read) -> Reply:
        data = await self._operations.read(r.inode, r.fh, r.offset, r.size)
        return [fp.reply_data_header(r.unique, len(data)), data]

    async def _write(self, r: fp.Write) -> Reply:
        written = await self._operations.write(r.inode, r.fh, r.offset, r.data)
        return fp.reply_write(r.unique, written)

    async def _flush(self, r: fp.Flush) -> Reply:
        await self._operations.flush(r.inode, r.fh)
        return fp.reply_empty(r.unique)

    async def _release(self, r: fp.Release) -> Reply:
        if r.directory:
            await self._operations.releasedir(r.inode, r.fh)
        else:
            await self._operations.release(r.inode, r.fh)
        return fp.reply_empty(r.unique)

    async def _fsync(self, r: fp.Fsync) -> Reply:
        if not r.directory:
            await self._operations.fsync(r.inode, r.fh, r.datasync)
        return fp.reply_empty(r.unique)

    async def _opendir(self, r: fp.Opendir) -> Reply:
        return fp.reply_open(r.unique, await self._operations.opendir(r.inode))

    async def _readdir(self, r: fp.Readdir) -> Reply:
        entries = await self._operations.readdir(r.inode, r.fh, r.offset)
        packed, sent = fp.pack_direntplus(entries, r.size)
        self._operations.listed(sent)
        return fp.reply_data_header(r.unique, len(packed)) + packed

    async def _mkdir(self, r: fp.Mkdir) -> Reply:
        return fp.reply_entry(r.unique, await self._operations.mkdir(r.parent, r.name, r.mode))

    async def _unlink(self, r: fp.Unlink) -> Reply:
        if r.directory:
            await self._operations.rmdir(r.parent, r.name)
        else:
            await self._operations.unlink(r.parent, r.name)
        return fp.reply_empty(r.unique)

    async def _rename(self, r: fp.Rename) -> Reply:
        await self._operations.rename(r.parent, r.name, r.new_parent, r.new_name, r.flags)
        return fp.reply_empty(r.unique)

    async def _statfs(self, r: fp.Statfs) -> Reply:
        ops = self._operations
        capacity = await ops.statfs()
        return fp.reply_statfs(r.unique, capacity, block_size=ops.block_size, name_max=ops.name_max)


# ---------------------------------------------------------------- mounting
def _mounts() -> set[str]:
    """The mount points of this process's mount namespace, without a system call on
    any of them (a dead FUSE mount fails every ``stat``)."""
    with open("/proc/self/mounts") as mounts:
        return {line.split()[1].replace("\\040", " ") for line in mounts}


def _fusermount(mountpoint: str, options: Sequence[str]) -> int:
    """Mount with ``fusermount3``; return the ``/dev/fuse`` descriptor it opened."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        try:
            process = subprocess.Popen(
                ["fusermount3", "-o", ",".join(options), "--", mountpoint],
                env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())},
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError:
            missing = "fusermount3 is not installed (apt-get install fuse3)"
            raise OSError(errno.ENOENT, missing) from None
        theirs.close()
        try:
            _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        finally:
            _, err = process.communicate()
        if not fds:
            words = err.decode(errors="replace").strip() or f"exit status {process.returncode}"
            raise OSError(errno.EIO, f"fusermount3: {words}")
    for extra in fds[1:]:
        os.close(extra)
    os.set_inheritable(fds[0], False)
    return fds[0]


def _unmount(mountpoint: str) -> None:
    """Unmount ``mountpoint`` if it is still mounted; lazily if it is busy."""
    if mountpoint not in _mounts():
        return
    done = subprocess.run(
        ["fusermount3", "-u", "-q", "--", mountpoint],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    if done.returncode != 0 and mountpoint in _mounts():
        subprocess.run(
            ["fusermount3", "-u", "-z", "-q", "--", mountpoint],
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )


@contextlib.asynccontextmanager
async def mounted(
    mountpoint: str, *, options: Sequence[str] = (), debug: bool = False
) -> AsyncIterator[Session]:
    """``mountpoint`` mounted (``nosuid,nodev`` and ``options``, e.g. ``fsname=...``)
    for the block: serve it with :meth:`Session.serve`. Always unmounted after."""
    mountpoint = os.path.realpath(mountpoint)  # as /proc/self/mounts will name it
    all_options = ["rw", "nosuid", "nodev", *options]
    fd = await trio.to_thread.run_sync(_fusermount, mountpoint, all_options)
    session = Session(fd, mountpoint, debug=debug)
    try:
        yield session
    finally:
        session.closed = True
        os.close(fd)  # first: nothing the unmount does can wait for us
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_unmount, mountpoint)
