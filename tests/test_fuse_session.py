"""The FUSE session on a real kernel mount, serving a small in-memory file system.

The mount's test rules are those of ``tests/test_mount.py``: file calls on the
mount run in worker threads (this trio loop answers the kernel), every mount is
torn down, and the module skips, saying why, only where the machine cannot mount.
The session counts the requests it reads, so these tests say which requests the
kernel sends, not only what the calls return.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterable, Sequence

import pytest
import trio

from fscache.client.fuse_protocol import (
    FOPEN_KEEP_CACHE,
    FOPEN_NOFLUSH,
    ROOT_INODE,
    Attributes,
    DirEntry,
    Entry,
    FuseError,
    Opened,
)
from fscache.client.fuse_session import mounted
from tests import test_mount

mountable = test_mount.mountable
mountpoint = test_mount.mountpoint
on_mount = test_mount.on_mount
read_file = test_mount.read_file

TERM = 60.0  # the kernel keeps names and attributes for the whole test


class MemoryFS:
    """A flat directory of files held in a dict; an open of ``slow`` waits for ``gate``
    (an open, not a read: the kernel reads pages in the background, where a
    signal does not interrupt the request)."""

    block_size = 4096
    name_max = 255

    def __init__(self, files: dict[bytes, bytes]) -> None:
        self.data = dict(files)
        self.inodes = {name: ROOT_INODE + 1 + n for n, name in enumerate(sorted(files))}
        self.names = {inode: name for name, inode in self.inodes.items()}
        self.gate = trio.Event()
        self.waiting = 0  # opens waiting for the gate
        self.listed_entries = 0

    def _entry(self, inode: int) -> Entry:
        if inode == ROOT_INODE:
            return Entry(Attributes(inode, stat.S_IFDIR | 0o755, 0, 0, nlink=2), TERM)
        size = len(self.data[self.names[inode]])
        return Entry(Attributes(inode, stat.S_IFREG | 0o644, size, 0), TERM)

    async def lookup(self, parent: int, name: bytes) -> Entry:
        if name not in self.inodes:
            raise FuseError(errno.ENOENT)
        return self._entry(self.inodes[name])

    def forget(self, items: Sequence[tuple[int, int]]) -> None:
        pass

    async def getattr(self, inode: int) -> Entry:
        return self._entry(inode)

    async def setattr(self, inode: int, size: int | None) -> Entry:
        raise RuntimeError("a bug in a handler")

    async def open(self, inode: int, flags: int) -> Opened:
        if self.names[inode] == b"slow":
            self.waiting += 1
            await self.gate.wait()
        read_only = flags & os.O_ACCMODE == os.O_RDONLY
        return Opened(1, FOPEN_KEEP_CACHE | (FOPEN_NOFLUSH if read_only else 0))

    async def create(self, parent: int, name: bytes, mode: int, flags: int) -> tuple[Opened, Entry]:
        raise FuseError(errno.EROFS)

    async def read(self, inode: int, fh: int, offset: int, size: int) -> bytes:
        return self.data[self.names[inode]][offset : offset + size]

    async def write(self, inode: int, fh: int, offset: int, data: bytes) -> int:
        return len(data)

    async def flush(self, inode: int, fh: int) -> None:
        pass

    async def fsync(self, inode: int, fh: int, datasync: bool) -> None:
        pass

    async def release(self, inode: int, fh: int) -> None:
        pass

    async def opendir(self, inode: int) -> Opened:
        return Opened(1)

    async def readdir(self, inode: int, fh: int, offset: int) -> Iterable[DirEntry]:
        names = sorted(self.inodes)
        return (
            DirEntry(name, self._entry(self.inodes[name]), index + 1)
            for index, name in enumerate(names[offset:], start=offset)
        )

    def listed(self, entries: Sequence[DirEntry]) -> None:
        self.listed_entries += len(entries)

    async def releasedir(self, inode: int, fh: int) -> None:
        pass

    async def mkdir(self, parent: int, name: bytes, mode: int) -> Entry:
        raise FuseError(errno.EROFS)

    async def unlink(self, parent: int, name: bytes) -> None:
        raise FuseError(errno.EROFS)

    async def rmdir(self, parent: int, name: bytes) -> None:
        raise FuseError(errno.EROFS)

    async def rename(
        self, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None:
        raise FuseError(errno.EROFS)


@pytest.fixture
async def served(mountable, mountpoint):
    """A :class:`MemoryFS` mounted; yields it, the session and the mount point."""
    fs = MemoryFS({b"f": b"x" * 100, b"slow": b"slow data"})
    async with mounted(str(mountpoint)) as session, trio.open_nursery() as nursery:
        await nursery.start(session.serve, fs)
        yield fs, session, mountpoint
        nursery.cancel_scope.cancel()


async def until(condition) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)


def open_read_close(path, flags: int = os.O_RDONLY) -> bytes:
    fd = os.open(path, flags)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


async def test_a_read_only_close_sends_no_flush_and_a_cached_loop_only_open_and_release(served):
    _, session, mnt = served
    assert await on_mount(open_read_close, mnt / "f") == b"x" * 100  # names, attributes, pages
    await until(lambda: session.requests["Release"] == 1)
    before = session.requests.copy()
    for _ in range(20):
        assert await on_mount(open_read_close, mnt / "f") == b"x" * 100
    await until(lambda: session.requests["Release"] == 21)
    sent = session.requests - before
    assert sent == {"Open": 20, "Release": 20}  # no flush, no read, no lookup, no getattr

    assert await on_mount(open_read_close, mnt / "f", os.O_RDWR) == b"x" * 100
    assert session.requests["Flush"] == 1  # a writable close waits for the file system


async def test_a_request_that_waits_holds_up_no_other(served):
    fs, _, mnt = served
    async with trio.open_nursery() as nursery:
        slow: list[bytes] = []

        async def read_slow() -> None:
            slow.append(await on_mount(read_file, mnt / "slow"))

        nursery.start_soon(read_slow)
        try:
            await until(lambda: fs.waiting == 1)
            for _ in range(3):  # answered while the slow open waits
                assert await on_mount(read_file, mnt / "f") == b"x" * 100
            assert slow == []
        finally:
            fs.gate.set()  # (a process waiting on the mount cannot even be killed)
    assert slow == [b"slow data"]


async def test_errnos_unexpected_errors_and_unsupported_requests(served):
    _, _, mnt = served
    with pytest.raises(FileNotFoundError):
        await on_mount(os.stat, mnt / "missing")
    with pytest.raises(OSError) as bug:
        await on_mount(os.truncate, mnt / "f", 0)
    assert bug.value.errno == errno.EIO
    with pytest.raises(OSError) as refused:
        await on_mount(os.mkdir, mnt / "d")
    assert refused.value.errno == errno.EROFS
    with pytest.raises(OSError) as unsupported:
        await on_mount(os.symlink, "f", mnt / "link")
    assert unsupported.value.errno == errno.ENOSYS
    assert await on_mount(read_file, mnt / "f") == b"x" * 100  # the session goes on


async def test_a_listing_longer_than_one_reply_comes_whole(served):
    fs, session, mnt = served
    names = {f"file-{n:04}-with-a-longer-name".encode(): b"" for n in range(500)}
    fs.data.update(names)
    for name in names:
        fs.inodes[name] = len(fs.names) + 2
        fs.names[fs.inodes[name]] = name
    listed = await on_mount(os.listdir, mnt)
    assert sorted(listed) == sorted(name.decode() for name in fs.inodes)
    assert session.requests["Readdir"] > 2  # several replies
    assert fs.listed_entries == len(fs.inodes)  # each sent once: each a lookup to forget


async def test_invalidations_drop_the_kernels_pages_and_names(served):
    fs, session, mnt = served
    assert await on_mount(read_file, mnt / "f") == b"x" * 100
    fs.data[b"f"] = b"y" * 100  # same size and mtime: the kernel cannot tell
    assert await on_mount(read_file, mnt / "f") == b"x" * 100  # from its page cache
    await trio.to_thread.run_sync(session.invalidate_inode, fs.inodes[b"f"])
    assert await on_mount(read_file, mnt / "f") == b"y" * 100

    del fs.inodes[b"f"]
    assert (await on_mount(os.stat, mnt / "f")).st_size == 100  # a cached name
    await trio.to_thread.run_sync(session.invalidate_entry, ROOT_INODE, b"f")
    with pytest.raises(FileNotFoundError):
        await on_mount(os.stat, mnt / "f")

    with pytest.raises(OSError) as unknown:  # what the kernel does not hold
        await trio.to_thread.run_sync(session.invalidate_entry, ROOT_INODE, b"never-seen")
    assert unknown.value.errno == errno.ENOENT


READ_THROUGH_A_SIGNAL = """
import signal, sys
signal.signal(signal.SIGALRM, lambda *_: None)
signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)  # signals while the read waits
with open(sys.argv[1], "rb") as f:
    data = f.read()
signal.setitimer(signal.ITIMER_REAL, 0)
sys.stdout.buffer.write(data)
"""


async def test_an_interrupted_request_is_answered_enosys_and_still_completes(served):
    fs, session, mnt = served
    argv = [sys.executable, "-c", READ_THROUGH_A_SIGNAL, str(mnt / "slow")]
    async with trio.open_nursery() as nursery:
        done: list[trio.CompletedProcess[bytes]] = []

        async def child() -> None:
            done.append(await trio.run_process(argv, capture_stdout=True, check=False))

        nursery.start_soon(child)
        try:
            await until(lambda: session.requests["Interrupt"] >= 1)
        finally:
            fs.gate.set()
    assert done[0].returncode == 0
    assert done[0].stdout == b"slow data"
    assert session.requests["Interrupt"] == 1  # ENOSYS: the kernel sends no other
