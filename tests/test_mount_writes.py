"""The mount's write-back rules, on a real FUSE mount of a real server: what a close
publishes, and what the kernel keeps when a write-back fails.

The fixtures and the mount's test rules are those of ``tests/test_mount.py``. A
RELEASE reaches the mount after the ``close`` that caused it has returned, so a test
that asserts what a release did not do first waits until the mount has handled it
(:class:`Releases`).
"""

from __future__ import annotations

import errno
import functools
import logging
import os

import pytest
import trio

import fscache
from fscache.client.mount import FscacheOperations, mount
from fscache.server.service import ServerSettings, serve
from tests import test_mount

mountable = test_mount.mountable
mountpoint = test_mount.mountpoint
server = test_mount.server
other = test_mount.other
mnt = test_mount.mnt
on_mount = test_mount.on_mount
read_file = test_mount.read_file

MIB = 1 << 20


class Releases:
    """Counts the releases the mount has finished handling."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.done = 0
        original = FscacheOperations.release

        async def counted(ops: FscacheOperations, inode: int, fh: int) -> None:
            try:
                await original(ops, inode, fh)
            finally:
                self.done += 1

        monkeypatch.setattr(FscacheOperations, "release", counted)

    async def wait_for(self, count: int) -> None:
        with trio.fail_after(30):
            while self.done < count:
                await trio.sleep(0.01)


@pytest.fixture
def releases(monkeypatch):
    return Releases(monkeypatch)


async def test_a_read_only_close_does_not_publish_a_file_being_written(mnt, other, releases):
    """A new file, and an existing one opened with O_TRUNC, are uploaded whole when
    their writer closes them: a reader opening and closing the file meanwhile on the
    same mount sees the writer's bytes (one page cache) but publishes nothing."""
    await other.write("old.txt", b"the old contents")
    for name, before in (("new.txt", b""), ("old.txt", b"the old contents")):
        fd = await on_mount(os.open, mnt / name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            await on_mount(os.write, fd, b"NEW-PART-1 ")
            seen = releases.done
            assert await on_mount(read_file, mnt / name) == b"NEW-PART-1 "  # read-only
            await releases.wait_for(seen + 1)  # its release has been handled
            assert await other.read(name) == before
            await on_mount(os.write, fd, b"NEW-PART-2")
        finally:
            await on_mount(os.close, fd)
        assert await other.read(name) == b"NEW-PART-1 NEW-PART-2"  # at the close


async def test_a_new_file_written_through_a_duplicate_descriptor_goes_up_whole(
    mnt, other, releases
):
    """A shell's ``> file`` and ``dd of=file`` open the file, duplicate the
    descriptor and close the first one before writing: the file stays on the spool
    and goes up as one upload at the last close, never as ranged writes that another
    client could see half done."""
    data = bytes(range(256)) * (3 * MIB // 256)  # three chunks: an upload
    for name in ("made.bin", "truncated.bin"):
        if name == "truncated.bin":
            await other.write(name, b"the old contents")
        before = await other.server_stats()
        fd = await on_mount(os.open, mnt / name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        dup = await on_mount(os.dup, fd)
        try:
            await on_mount(os.close, fd)  # a FLUSH with nothing written yet
            for at in range(0, len(data), MIB):
                await on_mount(os.write, dup, data[at : at + MIB])
                assert await other.read(name) == b""  # made empty, or truncated at the close
        finally:
            await on_mount(os.close, dup)
        assert await other.read(name) == data
        after = await other.server_stats()
        assert after["range_writes"] == before["range_writes"], name
        assert after["uploads"] == before["uploads"] + 1, name


async def fails(*args, **kwargs):
    await trio.sleep(0.5)  # as the client waits for a connection before it gives up
    raise fscache.Unavailable("the server is away")


async def test_bytes_a_failed_write_back_could_not_send_leave_the_kernel(
    mountable, server, mountpoint, other, releases, monkeypatch
):
    """A write-back that fails (the server gone, its disk full) fails the close,
    and the bytes it could not send are dropped with the file's open state: the
    kernel must not go on serving them from its pages, to a new open or to a
    descriptor that was open all along. The release after the failed close does
    not try again (which would serve them while it waited): an open right after
    the close already reads the file as the server has it."""
    path = mountpoint / "p.txt"
    async with (
        fscache.open_client("127.0.0.1", server.port) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(functools.partial(mount, outage_wait=1.0), client, mountpoint)
        for name, flags in (("in place", os.O_RDWR), ("spooled", os.O_RDWR | os.O_TRUNC)):
            await other.write("p.txt", b"ORIGINAL-CONTENT\n")
            assert await on_mount(read_file, path) == b"ORIGINAL-CONTENT\n"  # pages, leased
            reader = await on_mount(os.open, path, os.O_RDONLY)
            try:
                with monkeypatch.context() as patched:
                    patched.setattr(client, "write", fails)
                    seen = releases.done
                    fd = await on_mount(os.open, path, flags)
                    await on_mount(os.write, fd, b"NEVER-STORED")
                    with pytest.raises(OSError) as failed:
                        await on_mount(os.close, fd)
                    assert failed.value.errno == errno.EIO
                    assert await on_mount(read_file, path) == b"ORIGINAL-CONTENT\n", name
                    await releases.wait_for(seen + 2)  # the writer's, and that read's
                assert await on_mount(read_file, path) == b"ORIGINAL-CONTENT\n", name
                assert await on_mount(os.pread, reader, 100, 0) == b"ORIGINAL-CONTENT\n", name
                assert (await on_mount(os.stat, path)).st_size == 17, name
            finally:
                await on_mount(os.close, reader)
        nursery.cancel_scope.cancel()


async def test_a_full_disk_on_the_server_is_enospc_at_the_close(
    mountable, small_disk, mountpoint, caplog
):
    """The server's full disk reaches the writer as ENOSPC (not EIO), a new file
    and a write in place alike, and leaves no torn file; the log says why."""
    caplog.set_level(logging.WARNING, logger="fscache.mount")
    async with trio.open_nursery() as servers:
        server = await servers.start(serve, ServerSettings(root=str(small_disk), port=0))
        async with (
            fscache.open_client("127.0.0.1", server.port) as other,
            fscache.open_client("127.0.0.1", server.port) as client,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(mount, client, mountpoint)
            await other.write("kept", b"acknowledged")
            too_big = b"x" * (3 * MIB)  # the disk has 1 MiB
            for name, flags in (("new", os.O_CREAT | os.O_TRUNC), ("kept", 0)):
                fd = await on_mount(os.open, mountpoint / name, os.O_WRONLY | flags, 0o644)
                try:
                    for at in range(0, len(too_big), MIB):
                        await on_mount(os.pwrite, fd, too_big[at : at + MIB], at)
                finally:
                    with pytest.raises(OSError) as full:
                        await on_mount(os.close, fd)
                assert full.value.errno == errno.ENOSPC, name
            assert await other.read("new") == b""  # made empty at the create: not torn
            assert await other.read("kept") == b"acknowledged"
            assert await on_mount(read_file, mountpoint / "kept") == b"acknowledged"
            nursery.cancel_scope.cancel()
        servers.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert said and all("disk is full" in line for line in said), said


async def test_writes_after_another_client_renames_the_directory_fail_the_close(mnt, other, caplog):
    """A file open here whose directory another client renames away: what is written
    after the rename has nowhere to go (the server does not say where the file went),
    so the close fails (ENOENT) and the log names the file, for a new file (spooled)
    and for one written in place alike. Every later close of it fails too (a shell
    ignores the failed close of its ``>&5``'s duplicate). Nothing is written under
    the old name."""
    caplog.set_level(logging.WARNING, logger="fscache.mount")
    await other.write("in/place/app.log", b"line0\n")
    for name, flags in (("new", os.O_CREAT | os.O_TRUNC), ("place", 0)):
        directory = mnt / "in" / name
        await on_mount(functools.partial(os.makedirs, directory, exist_ok=True))
        path = directory / "app.log"
        fd = await on_mount(os.open, path, os.O_WRONLY | flags, 0o644)
        try:
            await on_mount(os.write, fd, b"line1\n")
            await on_mount(os.fsync, fd)  # on the server
            await other.rename(f"in/{name}", f"in/{name}.old")
            dup = await on_mount(os.dup, fd)
            await on_mount(os.pwrite, dup, b"line2\n", 6)
            with pytest.raises(OSError) as lost:
                await on_mount(os.close, dup)
            assert lost.value.errno == errno.ENOENT, name
        finally:
            with pytest.raises(OSError) as lost:
                await on_mount(os.close, fd)
        assert lost.value.errno == errno.ENOENT, name
        said = [r.getMessage() for r in caplog.records]
        assert any(f"in/{name}/app.log" in line and "renamed away" in line for line in said)
        assert await other.read(f"in/{name}.old/app.log") == b"line1\n", name
        assert f"in/{name}" not in [f"in/{n}" for n in await other.listdir("in")], name
