"""The FUSE mount: a real kernel mount of a real server, used with plain file calls.

Test rules for this module:

* File calls on the mount run in a worker thread (``trio.to_thread.run_sync``):
  the kernel's requests are answered by this very trio loop, so a system call on
  the mount from the loop's own thread would wait for itself forever.
* "Another client" is a second fscache client on the same server: what it reads
  and writes is what the rest of the world sees.
* Every mount is torn down, pass or fail: the fixture cancels it (``mount`` always
  unmounts on the way out) and then checks ``/proc/self/mounts``; a mount still
  there is detached with ``fusermount3 -u -z`` and the test fails.
* The module skips, saying why, only where the machine does not let us mount
  (no ``/dev/fuse``, no ``fusermount3``; tried for real once per module).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest.mock import ANY

import pytest
import trio
import trio.testing

import fscache
from fscache.cli import parse_serving_line
from fscache.client.fuse_session import mounted
from fscache.client.mount import DIRTY_BOUND, FscacheOperations, mount
from fscache.server.service import ServerSettings, serve


def _mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point, without a system call on the mount itself
    (``os.path.ismount`` says False for a dead FUSE mount: its lstat fails)."""
    with open("/proc/self/mounts") as mounts:
        points = {line.split()[1].replace("\\040", " ") for line in mounts}
    return str(path) in points


def _why_mounting_fails(mountpoint: Path) -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no fuse kernel module, or a container without it)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse: {exc.strerror}"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"

    async def probe() -> None:
        async with mounted(str(mountpoint)):
            pass

    try:
        trio.run(probe)
    except OSError as exc:
        return f"{exc.strerror or exc} (mounting is not permitted here)"
    return None


@pytest.fixture(scope="module")
def mountable(tmp_path_factory) -> None:
    reason = _why_mounting_fails(tmp_path_factory.mktemp("probe"))
    if reason is not None:
        pytest.skip(f"cannot mount FUSE on this machine: {reason}")


def _tear_down(mountpoint: Path) -> None:
    """The last resort: a mount that outlived its ``mount()`` fails the test."""
    if _mounted(mountpoint) or os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        pytest.fail(f"{mountpoint} was still mounted after the mount ended")


@pytest.fixture
def mountpoint(tmp_path):
    """An empty directory to mount on; still mounted at the end fails the test."""
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    _tear_down(path)


@pytest.fixture
async def server(nursery, root):
    return await nursery.start(serve, ServerSettings(root=str(root), port=0))


@pytest.fixture
async def other(server):
    """Another client of the same server: the rest of the world."""
    async with fscache.open_client("127.0.0.1", server.port) as client:
        yield client


@pytest.fixture
async def mnt(mountable, server, mountpoint):
    """The server, mounted; yields the mount point."""
    async with (
        fscache.open_client("127.0.0.1", server.port) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(mount, client, str(mountpoint))
        yield mountpoint
        nursery.cancel_scope.cancel()


async def on_mount(fn, *args):
    """``fn(*args)`` in a worker thread; a cancelled test does not wait for it (the
    unmount in teardown ends any system call still waiting on the mount)."""
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


def read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_file(path: Path, data: bytes, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)


# ---------------------------------------------------------------- reads and writes
async def test_a_file_written_through_the_mount_is_read_by_another_client(mnt, other):
    await on_mount(write_file, mnt / "notes.txt", b"written through the kernel")
    assert await other.read("notes.txt") == b"written through the kernel"
    await on_mount(os.makedirs, mnt / "docs")
    await on_mount(write_file, mnt / "docs" / "a.txt", b"a" * 300_000)  # many FUSE writes
    assert await other.read("docs/a.txt") == b"a" * 300_000
    assert await on_mount(read_file, mnt / "docs" / "a.txt") == b"a" * 300_000
    assert await other.listdir("") == ["docs/", "notes.txt"]


async def test_another_clients_writes_are_read_through_the_mount_never_stale(mnt, other):
    await other.write("shared.txt", b"version one")
    assert await on_mount(read_file, mnt / "shared.txt") == b"version one"
    await other.write("shared.txt", b"two")  # shorter: a stale size would show too
    assert await on_mount(read_file, mnt / "shared.txt") == b"two"
    await other.write("shared.txt", b"version three, the longest")
    assert await on_mount(read_file, mnt / "shared.txt") == b"version three, the longest"

    # An open descriptor has no stale pages either: they went with the approval.
    fd = await on_mount(os.open, mnt / "shared.txt", os.O_RDONLY)
    try:
        assert await on_mount(os.pread, fd, 100, 0) == b"version three, the longest"
        await other.write("shared.txt", b"four")
        assert await on_mount(os.pread, fd, 100, 0) == b"four"
    finally:
        await on_mount(os.close, fd)


async def test_overwrite_append_and_truncate_through_the_mount(mnt, other):
    path = mnt / "f.txt"
    await on_mount(write_file, path, b"a long first line\n")
    await on_mount(write_file, path, b"short\n")  # O_TRUNC
    assert await other.read("f.txt") == b"short\n"
    await on_mount(write_file, path, b"more\n", "ab")
    assert await other.read("f.txt") == b"short\nmore\n"
    await on_mount(os.truncate, path, 5)
    assert await other.read("f.txt") == b"short"

    def write_then_stat_before_close() -> int:
        with open(path, "r+b") as f:
            f.seek(10)
            f.write(b"!")
            f.flush()
            return os.fstat(f.fileno()).st_size  # the writer sees its own buffer

    assert await on_mount(write_then_stat_before_close) == 11
    assert await other.read("f.txt") == b"short\0\0\0\0\0!"


async def test_a_write_elsewhere_reads_new_at_once_though_the_kernel_had_it_cached(mnt, other):
    await other.write("cached.txt", b"old contents")
    path = mnt / "cached.txt"
    for _ in range(3):  # leased: the second and third come from the kernel's page cache
        assert await on_mount(read_file, path) == b"old contents"
    fd = await on_mount(os.open, path, os.O_RDONLY)  # an open descriptor with pages
    try:
        assert await on_mount(os.pread, fd, 100, 0) == b"old contents"
        await other.write("cached.txt", b"new, and longer than before")
        # The mount invalidated the kernel's pages and attributes before it approved.
        assert await on_mount(read_file, path) == b"new, and longer than before"
        assert (await on_mount(os.stat, path)).st_size == len(b"new, and longer than before")
        assert await on_mount(os.pread, fd, 100, 0) == b"new, and longer than before"
    finally:
        await on_mount(os.close, fd)


async def test_a_read_only_close_waits_for_no_flush_a_writers_close_does(mnt, other, monkeypatch):
    calls: collections.Counter[str] = collections.Counter()

    def counting(name: str):
        original = getattr(FscacheOperations, name)

        async def counted(self, *args):
            calls[name] += 1
            return await original(self, *args)

        return counted

    for name in ("open", "flush", "release"):
        monkeypatch.setattr(FscacheOperations, name, counting(name))
    await other.write("r.txt", b"read only")
    for _ in range(5):
        assert await on_mount(read_file, mnt / "r.txt") == b"read only"
    assert (calls["open"], calls["flush"]) == (5, 0)  # FOPEN_NOFLUSH: close asks nothing
    await on_mount(write_file, mnt / "r.txt", b"written")
    assert calls["flush"] == 1
    assert await other.read("r.txt") == b"written"  # the close returned after the upload


async def test_an_evicted_file_leaves_the_kernel_before_its_lease_is_given_back(
    mountable, server, mountpoint, other
):
    async with (
        fscache.open_client("127.0.0.1", server.port) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(functools.partial(mount, client, mountpoint, cache_bytes=100_000))
        await other.write("a", b"a" * 60_000)
        await other.write("b", b"b" * 60_000)
        assert await on_mount(read_file, mountpoint / "a") == b"a" * 60_000  # leased, so
        assert (await on_mount(os.stat, mountpoint / "a")).st_size == 60_000  # kept
        assert await on_mount(read_file, mountpoint / "b") == b"b" * 60_000  # evicts "a"
        while client.stats["relinquished"] + client.stats["evictions"] == 0:
            await trio.sleep(0.01)
        await trio.sleep(0.1)  # the relinquish reaches the server: it asks no approval
        await other.write("a", b"new")
        assert (await on_mount(os.stat, mountpoint / "a")).st_size == 3
        assert await on_mount(read_file, mountpoint / "a") == b"new"
        nursery.cancel_scope.cancel()


async def in_child(script: str, *args: object) -> bytes:
    """Run ``script`` in another process: a page fault on a mapped file holds the GIL
    until this process's trio loop has answered it, so it cannot happen here."""
    argv = [sys.executable, "-c", script, *map(str, args)]
    done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


MAP_AND_READ = """
import mmap, sys
with open(sys.argv[1], "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
    sys.stdout.buffer.write(m[int(sys.argv[2]) : int(sys.argv[3])])
"""


async def test_mmap_reads_a_leased_file(mnt, other):
    await other.write("mapped.bin", b"0123456789" * 1000)
    assert await in_child(MAP_AND_READ, mnt / "mapped.bin", 9990, 10000) == b"0123456789"
    await other.write("mapped.bin", b"changed")
    assert await in_child(MAP_AND_READ, mnt / "mapped.bin", 0, 100) == b"changed"


MAP_AND_WATCH = """
import mmap, os, sys
with open(sys.argv[1], "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
    for line in sys.stdin:  # "read": the mapping's first 10 bytes; "fstat"
        if line == "fstat\\n":
            os.fstat(f.fileno())
        print(m[:10].hex() if line == "read\\n" else "done", flush=True)
"""


async def test_a_mapping_of_a_write_shared_file_is_current_after_an_fstat(mnt, other):
    """The limit the README states: a file written often elsewhere is leased for no
    time (write-shared), so no approval drops the kernel's pages when another client
    writes it, and an ``mmap`` of it keeps the bytes it mapped; an ``fstat`` (like a
    ``read`` or an ``open``) asks for its attributes, whose new version drops the
    pages, and the mapping reads the new bytes from then on."""
    for n in range(5):  # past the server's hot-writes: term 0 from now on
        await other.write("hot.txt", b"version %d\n" % n)
    argv = [sys.executable, "-c", MAP_AND_WATCH, str(mnt / "hot.txt")]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(what: str) -> str:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(what + "\n")
        child.stdin.flush()
        return child.stdout.readline().strip()

    async def mapped() -> bytes:
        return bytes.fromhex(await on_mount(ask, "read"))

    try:
        assert await mapped() == b"version 4\n"
        await other.write("hot.txt", b"VERSION 5\n")
        assert await mapped() == b"version 4\n"  # no lease, no approval: as mapped
        assert await on_mount(ask, "fstat") == "done"
        assert await mapped() == b"VERSION 5\n"
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        assert await on_mount(child.wait) == 0
        child.stdout.close()


async def test_a_shared_writable_mmap_is_written_back_on_msync(mnt, other):
    await other.write("w.bin", b"a" * 8192)
    poke = """
import mmap, sys
with open(sys.argv[1], "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
    m[4096:4100] = b"MMAP"
    m.flush()  # msync: the dirty page goes out, then fsync writes the file through
    sys.stdout.buffer.write(b"synced")
"""
    assert await in_child(poke, mnt / "w.bin") == b"synced"
    assert await other.read("w.bin") == b"a" * 4096 + b"MMAP" + b"a" * 4092


# ---------------------------------------------------------------- names and attributes
async def test_ls_stat_unlink_and_enoent(mnt, other):
    version = await other.write("docs/a.txt", b"12345")
    await other.write("b.bin", b"")
    assert sorted(await on_mount(os.listdir, mnt)) == ["b.bin", "docs"]
    assert await on_mount(os.listdir, mnt / "docs") == ["a.txt"]

    st = await on_mount(os.stat, mnt / "docs" / "a.txt")
    assert (st.st_size, st.st_mtime_ns, st.st_mode) == (5, version, 0o100644)
    assert await on_mount(read_file, mnt / "docs" / "a.txt") == b"12345"  # now leased:
    st = await on_mount(os.stat, mnt / "docs" / "a.txt")  # attributes from the cache
    assert (st.st_size, st.st_mtime_ns) == (5, version)
    assert (await on_mount(os.stat, mnt / "docs")).st_mode == 0o40755

    await other.write("docs/a.txt", b"123")  # cached attributes go with the approval
    assert (await on_mount(os.stat, mnt / "docs" / "a.txt")).st_size == 3

    await on_mount(os.unlink, mnt / "docs" / "a.txt")
    with pytest.raises(fscache.NotFound):
        await other.read("docs/a.txt")
    for call in (os.stat, read_file, os.unlink):
        with pytest.raises(FileNotFoundError):
            await on_mount(call, mnt / "docs" / "a.txt")
    with pytest.raises(FileNotFoundError):
        await on_mount(os.listdir, mnt / "nowhere")
    await other.delete("b.bin")  # a file another client removes is gone here too
    assert await on_mount(os.listdir, mnt) == ["docs"]


async def test_a_listing_begins_with_dot_and_dot_dot(mnt, other):
    """``ls -a`` shows ``.`` and ``..`` with their directories' inode numbers, and a
    listing read in several READDIRPLUS calls (a small buffer: many names) skips
    and repeats none."""
    names = [f"n{i:03d}-{'x' * 60}" for i in range(300)]
    for name in names:
        await other.write(f"big/{name}", b"")

    def ls_a(path: Path) -> list[tuple[int, str]]:
        out = subprocess.run(["ls", "-a1i", "-U", str(path)], check=True, capture_output=True)
        return [(int(ino), name) for ino, name in (line.split(maxsplit=1) for line in
                out.stdout.decode().splitlines())]  # fmt: skip

    listed = await on_mount(ls_a, mnt / "big")
    assert [name for _, name in listed[:2]] == [".", ".."]
    assert listed[0][0] == (await on_mount(os.stat, mnt / "big")).st_ino
    assert listed[1][0] == (await on_mount(os.stat, mnt)).st_ino
    assert sorted(name for _, name in listed[2:]) == names
    assert [name for _, name in await on_mount(ls_a, mnt)] == [".", "..", "big"]
    await on_mount(shutil.rmtree, mnt / "big")  # the dots took no lookups to forget
    assert await on_mount(os.listdir, mnt) == []


async def test_df_shows_the_disk_that_holds_the_servers_root(mnt, other, root):
    disk = os.statvfs(root)
    stats = await other.server_stats()
    assert stats["disk_bytes"] == disk.f_blocks * disk.f_frsize
    assert stats["disk_files"] == disk.f_files

    st = await on_mount(os.statvfs, mnt)
    assert st.f_bsize == st.f_frsize == 4096
    assert st.f_blocks == disk.f_blocks * disk.f_frsize // 4096
    assert st.f_files == disk.f_files
    assert 0 < st.f_bavail <= st.f_bfree <= st.f_blocks
    assert 0 < st.f_ffree <= st.f_files
    assert (await on_mount(shutil.disk_usage, mnt)).total == st.f_blocks * 4096


async def test_statfs_asks_the_server_once_a_second_and_keeps_its_figures_while_it_is_away(
    autojump_clock,
):
    class Server:
        def __init__(self):
            self.asked = 0
            self.away = False
            self.before_approval = []

        async def server_stats(self):
            if self.away:
                raise fscache.Unavailable("no server")
            self.asked += 1
            return {"disk_bytes": 8192 * self.asked, "disk_free_files": "not a count"}

    server = Server()
    ops = FscacheOperations(server, session=None)  # type: ignore[arg-type]
    assert (await ops.statfs()).blocks == 2
    assert (await ops.statfs()).blocks == 2  # within the second: not asked again
    await trio.sleep(1.0)
    assert (await ops.statfs()).blocks == 4
    server.away = True
    await trio.sleep(1.0)
    capacity = await ops.statfs()
    assert (capacity.blocks, capacity.free_files, server.asked) == (4, 0, 2)


class ScriptedStats:
    """A client whose stat answers with the size the server had when it was asked,
    after ``answer`` is set; writes land at once."""

    def __init__(self):
        self.before_approval = []
        self.data = bytearray()
        self.answer = trio.Event()
        self.answer.set()
        self.landing = trio.Event()  # writes land once set
        self.landing.set()

    def leased(self, path):
        return None

    async def stat(self, path):
        size = len(self.data)  # as the server has it now
        await self.answer.wait()
        return fscache.StatResult(path, 1, size, False)

    async def write(self, path, data, *, offset):
        await self.landing.wait()
        self.data[offset : offset + len(data)] = data
        return 2


class NoKernel:
    def invalidate_inode(self, inode, attributes_only=False):
        pass


async def test_an_append_is_placed_after_ranges_a_write_back_sends_meanwhile():
    """An append asks the server for the file's size: a write-back that sent (and
    cleared) the unsent ranges before the answer came must not make it land on them."""
    client = ScriptedStats()
    ops = FscacheOperations(client, session=NoKernel())  # type: ignore[arg-type]
    inode = ops._remember("log")
    opened = ops._opened(inode, os.O_WRONLY | os.O_APPEND, spool=False)
    await ops.write(inode, opened.fh, 0, b"first\n")  # unsent: a dirty range
    client.answer = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ops.write, inode, opened.fh, 0, b"second\n")
        await trio.testing.wait_all_tasks_blocked()  # its stat waits for the answer
        nursery.start_soon(ops.flush, inode, opened.fh)  # a close elsewhere: write-back
        await trio.testing.wait_all_tasks_blocked()
        client.answer.set()
    await ops.flush(inode, opened.fh)
    assert bytes(client.data) == b"first\nsecond\n"


async def test_handles_closed_at_once_end_the_files_open_state_once():
    """The writer's release awaits its write-back while the last one (a reader's)
    comes: only the last one out drops the file's state, after every write-back is
    done."""
    client = ScriptedStats()
    ops = FscacheOperations(client, session=NoKernel())  # type: ignore[arg-type]
    inode = ops._remember("f")
    first = ops._opened(inode, os.O_WRONLY, spool=False)
    second = ops._opened(inode, os.O_RDONLY, spool=False)
    await ops.write(inode, first.fh, 0, b"one")
    client.landing = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ops.release, inode, first.fh)  # its write-back waits to land
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ops.release, inode, second.fh)
        await trio.testing.wait_all_tasks_blocked()
        client.landing.set()
    assert bytes(client.data) == b"one"
    assert inode not in ops._open


async def test_a_name_removed_elsewhere_is_not_made_again_from_here(mnt, other):
    """Writes to a file open here that another client deletes go nowhere, and the
    close says so (ENOENT), and a directory removed elsewhere is not made again by a
    create through a descriptor of it (a shell's stale working directory)."""
    await other.write("gone", b"abcdefgh")
    fd = await on_mount(os.open, mnt / "gone", os.O_RDWR)
    await on_mount(os.pwrite, fd, b"XY", 4)  # unsent until the close
    await other.delete("gone")
    with pytest.raises(FileNotFoundError):
        await on_mount(os.close, fd)
    with pytest.raises(fscache.NotFound):
        await other.read("gone")

    await on_mount(os.mkdir, mnt / "cwd")
    cwd = await on_mount(os.open, mnt / "cwd", os.O_RDONLY)
    await other.rename("cwd", "moved")
    made = functools.partial(os.open, "g", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=cwd)
    with pytest.raises(FileNotFoundError):
        await on_mount(made)
    await on_mount(os.close, cwd)
    assert await other.listdir("") == ["moved/"]


async def test_unsent_writes_of_open_files_go_out_when_the_mount_is_stopped(
    mountable, server, mountpoint, other
):
    """Stopping the mount (SIGTERM or Ctrl-C of ``fscache mount`` cancel it) with a
    file still open and written: its writes are sent before the unmount."""
    async with (
        fscache.open_client("127.0.0.1", server.port) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(mount, client, str(mountpoint))
        fd = await on_mount(os.open, mountpoint / "late", os.O_CREAT | os.O_WRONLY, 0o644)
        await on_mount(os.write, fd, b"important")
        nursery.cancel_scope.cancel()
    with contextlib.suppress(OSError):  # the mount it belonged to has gone
        os.close(fd)
    assert await other.read("late") == b"important"


async def test_an_empty_file_made_here_is_one_write(mnt, other):
    """``touch`` (or a lock file made with O_EXCL and closed empty): the create makes
    the file on the server; its close has nothing more to send."""
    before = (await other.server_stats())["writes"]
    fd = await on_mount(os.open, mnt / "touched", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    await on_mount(os.close, fd)
    assert (await other.server_stats())["writes"] == before + 1
    assert await other.read("touched") == b""
    await on_mount(write_file, mnt / "written", b"data")  # a create that is written: two
    assert (await other.server_stats())["writes"] == before + 3
    assert await other.read("written") == b"data"


async def test_removing_a_listed_tree_lists_it_once(mnt, other, root):
    """The kernel keeps the names a leased listing gave it, so ``rm -rf`` unlinks
    each without a lookup (each unlink drops our cached listing: a lookup would list
    the directory again, once per name)."""
    (root / "many").mkdir()  # made on disk: forty writes by a client would make the
    for i in range(40):  # directory write-shared (term 0), and its listing unleased
        (root / "many" / f"f{i:02d}").write_bytes(b"x")
    before = (await other.server_stats())["listings"]
    await on_mount(shutil.rmtree, mnt / "many")
    assert (await other.server_stats())["listings"] - before <= 3
    assert await other.listdir("") == []


async def test_creates_in_a_big_directory_do_not_list_it_again_each(mnt, other, root):
    """Each create drops our cached listing of its directory, and the kernel looks
    the new name up first: that lookup asks for the one name, not for a listing of
    the whole directory (which made filling a directory quadratic). Names another
    client makes or removes meanwhile are seen at once all the same."""
    (root / "big").mkdir()  # made on disk, as in the test above
    for i in range(300):
        (root / "big" / f"f{i:03d}").write_bytes(b"x")
    assert len(await on_mount(os.listdir, mnt / "big")) == 300
    before = (await other.server_stats())["listings"]

    def create_fifty() -> None:
        for i in range(50):
            with open(mnt / "big" / f"new{i:02d}", "wb") as f:
                f.write(b"y")

    await on_mount(create_fifty)
    assert (await other.server_stats())["listings"] - before <= 2  # was one per create
    assert await other.read("big/new49") == b"y"

    assert not await on_mount(os.path.exists, mnt / "big" / "theirs")
    await other.write("big/theirs", b"made elsewhere")
    assert await on_mount(read_file, mnt / "big" / "theirs") == b"made elsewhere"
    await other.delete("big/new00")
    assert not await on_mount(os.path.exists, mnt / "big" / "new00")
    await other.mkdir("big/sub")
    assert await on_mount(os.path.isdir, mnt / "big" / "sub")
    assert len(await on_mount(os.listdir, mnt / "big")) == 300 + 50 + 1


async def test_a_listed_tree_is_walked_again_without_asking_the_server(mnt, other, root):
    """A directory's attributes are kept for the lease on its listing, so a second
    walk (``find``, ``du``) asks nothing, and the first asks a directory open for
    reading for its listing, not for a stat and then the listing; another client's
    new name in one of them shows at once, with the directory's new mtime."""
    for sub in ("a/x", "a/y", "b/z", "c"):
        (root / "tree" / sub).mkdir(parents=True)  # on disk: see the tests above

    def walk() -> dict[str, int]:
        return {
            path: os.stat(path).st_mtime_ns
            for path, dirs, _ in os.walk(mnt / "tree")
            for path in [path, *(os.path.join(path, d) for d in dirs)]
        }

    before = (await other.server_stats())["messages_in"]
    first = await on_mount(walk)
    assert len(first) == 7  # each stated twice: as a child, then as a path walked
    asked = (await other.server_stats())["messages_in"] - before - 1
    assert asked <= 3 * 7 + 1  # two stats and a listing per directory (and the root's)
    before = (await other.server_stats())["messages_in"]
    assert await on_mount(walk) == first
    assert (await other.server_stats())["messages_in"] - before == 1  # the stats request

    await other.write("tree/a/new", b"theirs")
    version = (await other.stat("tree/a")).version
    assert version != first[str(mnt / "tree" / "a")]
    assert await on_mount(lambda: os.stat(mnt / "tree" / "a").st_mtime_ns) == version
    assert "new" in await on_mount(os.listdir, mnt / "tree" / "a")


async def test_directories_live_on_the_server_with_posix_errnos(mnt, other):
    await on_mount(os.makedirs, mnt / "new" / "sub")
    assert await other.scandir("new") == [fscache.client.client.DirEntry("sub", True, 0, ANY)]
    for call, target, code in [
        (os.mkdir, "new", errno.EEXIST),
        (os.rmdir, "new", errno.ENOTEMPTY),
        (os.mkdir, "missing/x", errno.ENOENT),
        (os.unlink, "new", errno.EISDIR),
    ]:
        with pytest.raises(OSError) as failed:
            await on_mount(call, mnt / target)
        assert failed.value.errno == code, (call, target)
    await on_mount(os.rmdir, mnt / "new" / "sub")
    assert await other.listdir("new") == []
    await other.mkdir("theirs")  # another client's mkdir is seen here at once
    assert sorted(await on_mount(os.listdir, mnt)) == ["new", "theirs"]
    await other.rmdir("theirs")
    assert await on_mount(os.listdir, mnt) == ["new"]
    await on_mount(write_file, mnt / "f", b"f")
    with pytest.raises(NotADirectoryError):
        await on_mount(os.rmdir, mnt / "f")


async def test_rename_is_atomic_on_the_server(mnt, other):
    await on_mount(write_file, mnt / "r", b"r")
    await on_mount(os.rename, mnt / "r", mnt / "s")
    assert await other.read("s") == b"r"
    with pytest.raises(fscache.NotFound):
        await other.read("r")
    await other.write("t", b"old t")
    assert await on_mount(read_file, mnt / "t") == b"old t"  # leased here
    await on_mount(os.replace, mnt / "s", mnt / "t")  # replaces a file
    assert await other.read("t") == b"r"
    assert await on_mount(read_file, mnt / "t") == b"r"

    await on_mount(os.makedirs, mnt / "d" / "e")
    await on_mount(write_file, mnt / "d" / "e" / "g", b"g")
    await on_mount(os.rename, mnt / "d", mnt / "d2")  # a directory moves whole
    assert await other.read("d2/e/g") == b"g"
    assert await on_mount(read_file, mnt / "d2" / "e" / "g") == b"g"
    assert sorted(await on_mount(os.listdir, mnt)) == ["d2", "t"]
    await other.rename("d2/e/g", "h")  # another client's rename is seen here
    assert sorted(await on_mount(os.listdir, mnt)) == ["d2", "h", "t"]
    assert await on_mount(os.listdir, mnt / "d2" / "e") == []

    for src, dst, code in [
        ("t", "d2", errno.EISDIR),  # a file over a directory
        ("d2", "t", errno.ENOTDIR),  # a directory over a file
        ("nowhere", "x", errno.ENOENT),
    ]:
        with pytest.raises(OSError) as failed:
            await on_mount(os.rename, mnt / src, mnt / dst)
        assert failed.value.errno == code, (src, dst)
    await on_mount(write_file, mnt / "d2" / "e" / "full", b"")
    await on_mount(os.mkdir, mnt / "empty")
    with pytest.raises(OSError) as full:
        await on_mount(os.rename, mnt / "empty", mnt / "d2")  # over a non-empty directory
    assert full.value.errno == errno.ENOTEMPTY


async def test_a_file_open_with_unflushed_writes_can_be_renamed(mnt, other):
    """The rename writes the file back first, while the kernel holds both directories
    for the rename: nothing it does then may wait for the kernel."""
    await on_mount(os.mkdir, mnt / "conf")
    await other.write("conf/settings", b"old settings")
    assert await on_mount(read_file, mnt / "conf" / "settings") == b"old settings"

    def save_by_rename_before_close() -> None:  # an editor's or a library's atomic save
        with open(mnt / "conf" / ".settings.tmp", "wb") as f:
            f.write(b"new settings")
            f.flush()
            os.replace(mnt / "conf" / ".settings.tmp", mnt / "conf" / "settings")
            f.write(b", and more")  # the open file follows its name

    def rewrite_in_place_and_rename_before_close() -> None:
        with open(mnt / "conf" / "settings", "r+b") as f:
            f.write(b"NEW")
            f.flush()
            os.rename(mnt / "conf" / "settings", mnt / "conf" / "moved")

    with trio.fail_after(60):
        await on_mount(save_by_rename_before_close)
        assert await other.read("conf/settings") == b"new settings, and more"
        await on_mount(rewrite_in_place_and_rename_before_close)
    assert await other.read("conf/moved") == b"NEW settings, and more"
    assert await other.listdir("conf") == ["moved"]
    assert await on_mount(read_file, mnt / "conf" / "moved") == b"NEW settings, and more"


async def test_an_unlinked_open_file_keeps_its_contents_until_the_last_close(mnt, other):
    """POSIX: unlinking a name leaves the open descriptors working; the rest of the
    world sees the name gone at once, and no close brings it back."""

    def scratch_file() -> tuple[bytes, int, int]:
        fd = os.open(mnt / "scratch", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.unlink(mnt / "scratch")
            os.write(fd, b"scratch data")
            st = os.fstat(fd)
            return os.pread(fd, 100, 0), st.st_size, st.st_nlink
        finally:
            os.close(fd)

    assert await on_mount(scratch_file) == (b"scratch data", 12, 0)

    def temporary_file() -> bytes:
        with tempfile.TemporaryFile(dir=mnt) as f:
            f.write(b"x" * 100_000)
            f.seek(0)
            return f.read()

    assert await on_mount(temporary_file) == b"x" * 100_000

    await other.write("kept", b"contents before the unlink")
    fd = await on_mount(os.open, mnt / "kept", os.O_RDWR)
    try:
        await on_mount(os.pwrite, fd, b"CONTENTS", 0)  # not yet flushed
        await on_mount(os.unlink, mnt / "kept")
        with pytest.raises(fscache.NotFound):
            await other.read("kept")
        assert await on_mount(os.pread, fd, 100, 0) == b"CONTENTS before the unlink"
        await on_mount(os.ftruncate, fd, 8)
        assert (await on_mount(os.fstat, fd)).st_size == 8
        await on_mount(os.fsync, fd)  # nothing to write back: the name is gone
        assert await on_mount(os.pread, fd, 100, 0) == b"CONTENTS"
    finally:
        await on_mount(os.close, fd)

    await other.write("old", b"the old file")
    await other.write("new", b"the new file")
    fd = await on_mount(os.open, mnt / "old", os.O_RDONLY)
    try:
        await on_mount(os.replace, mnt / "new", mnt / "old")  # a rename over an open file
        assert await on_mount(os.pread, fd, 100, 0) == b"the old file"
        assert await on_mount(read_file, mnt / "old") == b"the new file"
    finally:
        await on_mount(os.close, fd)
    assert await other.listdir("") == ["old"]
    assert await other.read("old") == b"the new file"


async def test_in_place_writes_past_the_dirty_bound_go_out_during_the_write(mnt, other):
    """Past DIRTY_BOUND the ranges are written back while the kernel's WRITE waits
    for its answer, and memory stays bounded by it whatever the size written."""
    await other.write("db", b"\0" * 1024)
    size = DIRTY_BOUND + 3 * 1024 * 1024
    data = bytes(range(256)) * (size // 256)

    def write_in_place() -> None:
        with open(mnt / "db", "r+b") as f:
            f.seek(512)
            f.write(data)

    with trio.fail_after(120):
        await on_mount(write_in_place)
    assert await other.read("db") == b"\0" * 512 + data


RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # <linux/fs.h>


def renameat2(src: Path, dst: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, bytes(src), at_fdcwd, bytes(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


async def test_rename_flags_it_cannot_honour_are_refused(mnt, other):
    """As the README says: no-replace onto an existing name is the kernel's EEXIST,
    and EINVAL otherwise (the server cannot make it atomic); exchange is EINVAL."""
    await other.write("a", b"a")
    await other.write("b", b"b")
    for dst, flags, code in (
        ("b", RENAME_NOREPLACE, errno.EEXIST),
        ("c", RENAME_NOREPLACE, errno.EINVAL),
        ("b", RENAME_EXCHANGE, errno.EINVAL),
    ):
        with pytest.raises(OSError) as refused:
            await on_mount(renameat2, mnt / "a", mnt / dst, flags)
        assert refused.value.errno == code, (dst, flags)
    assert (await other.read("a"), await other.read("b")) == (b"a", b"b")
    assert sorted(await other.listdir("")) == ["a", "b"]


async def test_a_name_made_in_nfd_lists_in_nfc(mnt, other):
    """As the README says (and why git sees a tracked NFD name as untracked here)."""
    nfd, nfc = "cafe\u0301.txt", "caf\u00e9.txt"
    await on_mount(write_file, mnt / nfd, b"accent")
    assert await on_mount(os.listdir, mnt) == [nfc]
    assert await on_mount(read_file, mnt / nfd) == await on_mount(read_file, mnt / nfc)
    assert await other.listdir("") == [nfc]


async def test_links_and_special_files_are_not_permitted(mnt, other):
    """Symlinks, hard links, FIFOs and device nodes all get EPERM, as on a file
    system without them (vfat), not ENOSYS ("Function not implemented")."""
    await other.write("target", b"t")
    for call, args in [
        (os.symlink, ("target", mnt / "sym")),
        (os.link, (mnt / "target", mnt / "hard")),
        (os.mkfifo, (mnt / "fifo",)),
        (os.mknod, (mnt / "node", stat.S_IFCHR | 0o600, os.makedev(1, 3))),
    ]:
        with pytest.raises(OSError) as refused:
            await on_mount(call, *args)
        assert refused.value.errno == errno.EPERM, call
    assert await other.listdir("") == ["target"]


async def test_bad_names_are_refused_and_the_log_says_why(mnt, other, caplog):
    caplog.set_level(logging.INFO, logger="fscache.mount")
    with pytest.raises(OSError) as reserved:
        await on_mount(write_file, mnt / ".fscache-mine", b"")
    assert reserved.value.errno == errno.EINVAL
    with pytest.raises(OSError) as backslash:
        await on_mount(write_file, mnt / "back\\slash", b"")
    assert backslash.value.errno == errno.EINVAL
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert any(".fscache-mine" in line and "reserved" in line for line in refusals), refusals
    assert any("back\\\\slash" in line and "'/' as separator" in line for line in refusals), (
        refusals
    )


async def test_a_refused_name_is_a_warning_at_most_once_in_a_while(mnt, other, caplog, monkeypatch):
    """The mount logs at WARNING by default: a refused name must show there, or
    EINVAL comes with no reason at all; but once per rule in a while, since a
    program may try the same name over and over."""
    monkeypatch.setattr("fscache.client.mount.REFUSAL_LOG_INTERVAL", 3600.0)
    caplog.set_level(logging.WARNING, logger="fscache.mount")
    for _ in range(20):
        with pytest.raises(OSError) as reserved:
            await on_mount(write_file, mnt / ".fscache-mine", b"")
        assert reserved.value.errno == errno.EINVAL
    with pytest.raises(OSError):
        await on_mount(os.stat, mnt / ".fscache-other")
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned
    assert ".fscache-mine" in warned[0] and "reserved" in warned[0]


async def test_without_the_server_reads_fail_with_eio_not_stale_data(mountable, root, mountpoint):
    async with trio.open_nursery() as outer:
        server_scope = trio.CancelScope()

        async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with server_scope:
                await serve(ServerSettings(root=str(root), port=0), task_status=task_status)

        server = await outer.start(run_server)
        async with fscache.open_client("127.0.0.1", server.port) as client:
            await client.write("a", b"a")
            await outer.start(functools.partial(mount, outage_wait=1.0), client, mountpoint)
            assert await on_mount(read_file, mountpoint / "a") == b"a"
            server_scope.cancel()
            # "a" is leased, but looking up the directories on the way needs the server
            for call in (os.listdir, os.stat):
                with pytest.raises(OSError) as gone:
                    await on_mount(call, mountpoint)
                assert gone.value.errno == errno.EIO
            outer.cancel_scope.cancel()


# ---------------------------------------------------------------- mounting and unmounting
async def test_mounting_on_a_directory_with_files_warns_that_they_are_hidden(
    mountable, server, mountpoint, caplog
):
    caplog.set_level(logging.WARNING, logger="fscache.mount")
    (mountpoint / "mine.txt").write_bytes(b"local")
    async with (
        fscache.open_client("127.0.0.1", server.port) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(mount, client, mountpoint)
        assert await on_mount(os.listdir, mountpoint) == []
        nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"{mountpoint} is not empty: its files are hidden while it is mounted (not changed)"
    ]
    assert (mountpoint / "mine.txt").read_bytes() == b"local"


async def test_fusermount_u_ends_the_mount(mountable, server, mountpoint, other, tmp_path):
    second = tmp_path / "second"
    second.mkdir()
    await other.write("both.txt", b"seen from both mounts")
    try:
        async with (
            fscache.open_client("127.0.0.1", server.port) as client,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(mount, client, mountpoint)
            assert _mounted(mountpoint)
            await nursery.start(mount, client, second)  # a second mount in this process
            for point in (mountpoint, second):
                assert await on_mount(read_file, point / "both.txt") == b"seen from both mounts"
            for point in (mountpoint, second):
                await trio.to_thread.run_sync(
                    lambda p=point: subprocess.run(["fusermount3", "-u", str(p)], check=True)
                )
        assert not _mounted(mountpoint)  # mount() returned by itself
    finally:
        _tear_down(second)


HOLD_A_MOUNT = """
import sys, trio
from fscache.client.fuse_session import mounted

async def main():
    async with mounted(sys.argv[1]):
        print("mounted", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def test_mounting_on_a_stale_fuse_mount_says_so_and_how_to_clear_it(mountable, mountpoint):
    """A mount whose process was killed stays mounted, and every call on it fails
    with ENOTCONN: the command says so, and how to clear it (not "not a
    directory")."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_MOUNT, str(mountpoint)], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"mounted\n"
    finally:
        holder.kill()
        holder.wait(timeout=10)
        holder.stdout.close()
    try:
        with pytest.raises(OSError) as dead:
            os.stat(mountpoint)
        assert dead.value.errno == errno.ENOTCONN
        done = subprocess.run(
            [sys.executable, "-m", "fscache", "mount", "127.0.0.1:9", str(mountpoint)],
            capture_output=True,
            timeout=30,
        )
        assert done.returncode == 1
        said = done.stderr.decode()
        assert "stale FUSE mount" in said and f"fusermount3 -u {mountpoint}" in said, said
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=True)
    assert os.path.isdir(mountpoint)


def test_the_mount_command_serves_until_sigint(mountable, mountpoint, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "hello.txt").write_bytes(b"hello from the server\n")
    command = [sys.executable, "-m", "fscache"]
    server = subprocess.Popen(
        [*command, "serve", "--root", str(root), "--port", "0"], stdout=subprocess.PIPE
    )
    mounter = None
    try:
        host, port = parse_serving_line(server.stdout.readline().decode()) or ("", 0)
        address = f"{host}:{port}"
        mounter = subprocess.Popen(
            [*command, "mount", address, str(mountpoint)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        line = mounter.stdout.readline().decode()
        assert line.startswith(f"fscache mounted {address} on {mountpoint}"), (
            line + mounter.stderr.read().decode()
        )
        assert (mountpoint / "hello.txt").read_bytes() == b"hello from the server\n"

        def reads() -> list[int]:
            stats = subprocess.run(
                [*command, "stats", address], capture_output=True, check=True, timeout=30
            )
            counters = json.loads(stats.stdout)
            return [counters[name] for name in ("reads", "range_reads", "reads_not_modified")]

        before = reads()  # the mount's client holds a lease: the next reads ask nobody
        for _ in range(5):
            assert (mountpoint / "hello.txt").read_bytes() == b"hello from the server\n"
        assert reads() == before
        (mountpoint / "back.txt").write_bytes(b"back")
        assert (root / "back.txt").read_bytes() == b"back"
        again = subprocess.run(
            [*command, "mount", address, str(mountpoint)], capture_output=True, timeout=30
        )
        assert again.returncode == 1 and b"already a mount point" in again.stderr
        mounter.send_signal(signal.SIGINT)
        assert mounter.wait(timeout=10) == 0, mounter.stderr.read().decode()
        assert not _mounted(mountpoint)
    finally:
        for process in (mounter, server):
            if process is not None:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=10)
                process.stdout.close()
                if process.stderr is not None:
                    process.stderr.close()
