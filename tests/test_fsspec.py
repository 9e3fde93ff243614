"""fsspec speaks fscache: ``fsspec.open("fscache://host:port/path")``.

The conventions fsspec's own abstract tests do not pin down (those run in
test_fsspec_abstract.py): listings, the server's own directories, one request
per directory listed, atomic moves, the error types, exclusive creates that lose a
race, ranged reads that fetch only what they cover, spooled writes, streamed get
and put, open files pinned to one version, transactions, URLs that name their
server, times, and a file system that outlives its client (a close, a fork). The
file system is blocking, so each test drives it from a worker thread while the
server runs on the test's trio loop.
"""

from __future__ import annotations

import datetime
import errno
import multiprocessing
import os
import pathlib
import socket
import uuid
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import fsspec
import pytest
import trio

import fscache
from fscache import errors
from fscache.client import fsspec_fs
from fscache.client.fsspec_fs import FscacheFileSystem
from fscache.server.service import ServerSettings, serve
from fscache.settings import CHUNK_SIZE


@pytest.fixture(autouse=True)
def _close_cached_file_systems():
    """``fsspec.open`` keeps each file system it makes (and its client) in fsspec's
    instance cache: close them after each test, or their clients keep reconnecting
    to a server that is gone, in background threads, for the rest of the run."""
    yield
    for fs in list(FscacheFileSystem._cache.values()):
        fs._client.close()  # not fs.client, which would connect again
    FscacheFileSystem.clear_instance_cache()


@pytest.fixture
async def address(nursery, root):
    server = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    return f"127.0.0.1:{server.port}"


async def with_fs(address: str, use_it: Callable[[FscacheFileSystem], None]) -> None:
    """Run ``use_it`` on a worker thread with a file system of its own on ``address``."""

    def run() -> None:
        fs = new_fs(address)
        try:
            use_it(fs)
        finally:
            fs.client.close()

    await trio.to_thread.run_sync(run)


def new_fs(address: str) -> FscacheFileSystem:
    """A file system of its own (not fsspec's cached one) on ``address``."""
    host, port = address.split(":")
    return FscacheFileSystem(host=host, port=int(port), skip_instance_cache=True)


async def test_fsspec_reads_writes_lists_and_deletes(address):
    def use_it(fs: FscacheFileSystem) -> None:
        with fsspec.open(f"fscache://{address}/docs/a.txt", "wb") as f:
            f.write(b"through fsspec")
        with fsspec.open(f"fscache://{address}/docs/a.txt", "rb") as f:
            assert f.read() == b"through fsspec"
        assert fs.ls("docs", detail=False) == ["docs/a.txt"]
        assert fs.info("docs/a.txt")["size"] == 14
        assert fs.info("docs")["type"] == "directory"
        assert fs.cat_file("docs/a.txt", start=8) == b"fsspec"
        fs.pipe_file("docs/b.txt", b"b")
        assert fs.ls("docs", detail=False) == ["docs/a.txt", "docs/b.txt"]
        fs.rm_file("docs/a.txt")
        assert not fs.exists("docs/a.txt")
        with pytest.raises(FileNotFoundError):
            fs.cat_file("docs/a.txt")
        with pytest.raises(FileNotFoundError):
            fs.rm_file("docs/a.txt")

    await with_fs(address, use_it)


async def test_listings_follow_fsspecs_conventions(address):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe({"d/a": b"1", "d/sub/b": b"22", "d/sub/deep/c": b"333"})
        version = fs.info("d/a")["version"]
        assert fs.ls(f"fscache://{address}/d/a") == [
            {"name": "d/a", "size": 1, "type": "file", "version": version, "mtime": version / 1e9}
        ]  # a file lists itself; names carry no protocol
        assert [(i["name"], i["type"]) for i in fs.ls("d")] == [
            ("d/a", "file"),
            ("d/sub", "directory"),
        ]
        assert fs.ls("", detail=False) == ["d"]
        assert fs.find("d") == ["d/a", "d/sub/b", "d/sub/deep/c"]
        assert fs.find("d", withdirs=True, maxdepth=2) == [
            "d",
            "d/a",
            "d/sub",
            "d/sub/b",
            "d/sub/deep",
        ]
        assert fs.find("d/a") == ["d/a"]
        assert fs.glob("d/**/b") == ["d/sub/b"]
        assert fs.glob("d/*/") == ["d/sub"]
        assert fs.du("d") == 6
        assert fs.du("d", total=False) == {"d/a": 1, "d/sub/b": 2, "d/sub/deep/c": 3}
        assert list(fs.walk("d")) == [
            ("d", ["sub"], ["a"]),
            ("d/sub", ["deep"], ["b"]),
            ("d/sub/deep", [], ["c"]),
        ]
        assert fs.isdir("d/sub") and not fs.isfile("d/sub")
        assert fs.isfile("d/a") and not fs.isdir("d/a")
        with pytest.raises(FileNotFoundError):
            fs.ls("nothing")
        assert fs.find("nothing") == []

    await with_fs(address, use_it)


async def test_directories_are_the_servers_own(address, root):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.mkdir("made/deeper")  # create_parents by default
        assert (root / "made" / "deeper").is_dir()
        assert fs.isdir("made/deeper") and fs.ls("made/deeper") == []
        assert fs.ls("made", detail=False) == ["made/deeper"]
        assert fs.find("", withdirs=True) == ["made", "made/deeper"]
        with pytest.raises(FileExistsError):
            fs.mkdir("made")
        with pytest.raises(FileNotFoundError):
            fs.mkdir("absent/child", create_parents=False)
        fs.mkdir("made/flat", create_parents=False)
        fs.makedirs("made/deeper", exist_ok=True)
        with pytest.raises(FileExistsError):
            fs.makedirs("made/deeper")
        fs.pipe_file("made/deeper/f", b"x")
        with pytest.raises(FileExistsError):
            fs.makedirs("made/deeper/f", exist_ok=True)
        with pytest.raises(NotADirectoryError):
            fs.makedirs("made/deeper/f/below", exist_ok=True)

        with pytest.raises(OSError) as not_empty:
            fs.rmdir("made/deeper")
        assert not_empty.value.errno == errno.ENOTEMPTY
        with pytest.raises(NotADirectoryError):
            fs.rmdir("made/deeper/f")
        with pytest.raises(FileNotFoundError):
            fs.rmdir("never")
        fs.rm_file("made/deeper/f")
        assert fs.exists("made/deeper")  # an emptied directory stays
        fs.rmdir("made/deeper")
        assert not (root / "made" / "deeper").exists()

        fs.pipe({"tree/a": b"", "tree/s/b": b"", "tree/s/t/c": b""})
        fs.mkdir("tree/empty")
        with pytest.raises(IsADirectoryError, match=r"recursive=True"):
            fs.rm("tree")
        with pytest.raises(IsADirectoryError, match=r"recursive=True"):
            fs.rm(["tree/a", "tree/empty"])
        fs.rm("tree", recursive=True)
        assert not fs.exists("tree") and not (root / "tree").exists()

    await with_fs(address, use_it)


async def test_a_listing_is_one_request_per_directory_and_stats_no_file(address):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe({f"d/{i}": b"x" * i for i in range(20)} | {"d/sub/a": b"a", "d/sub/b": b"bb"})
        before = fs.client.server_stats()
        found = fs.find("d", detail=True)
        after = fs.client.server_stats()
        assert len(found) == 22 and found["d/sub/b"]["size"] == 2
        assert after["listings"] - before["listings"] == 2  # d and d/sub
        assert after["reads"] == before["reads"]

    await with_fs(address, use_it)


async def test_errors_are_the_oserrors_fsspec_expects(address):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("dir/file", b"data")
        with pytest.raises(FileNotFoundError):
            fs.info("dir/missing")
        with pytest.raises(FileNotFoundError):
            fs.open("dir/missing", "rb")
        with pytest.raises(IsADirectoryError):
            fs.open("dir", "rb")
        with pytest.raises(IsADirectoryError):
            fs.cat_file("dir")
        with pytest.raises(IsADirectoryError):
            fs.pipe_file("dir", b"over a directory")
        with pytest.raises(NotADirectoryError):
            fs.pipe_file("dir/file/below", b"under a file")
        with pytest.raises(FileExistsError):
            fs.pipe_file("dir/file", b"again", mode="create")
        with pytest.raises(FileExistsError):
            fs.open("dir/file", "xb")
        with pytest.raises(ValueError, match="not supported"):
            fs.open("dir/file", "ab")
        with pytest.raises(FileNotFoundError):  # below a file: as MemoryFileSystem says
            fs.info("dir/file/below")
        assert not fs.exists("dir/file/below")
        assert fs.cat_file("dir/file", start=3, end=1) == b""  # a slice's limits
        assert fs.cat_file("dir/file") == b"data"

    await with_fs(address, use_it)


async def test_a_path_that_is_no_string_is_a_type_error_not_a_file_name(address, root):
    """``str()`` of None, 3.5 or b"x" would name a file "None", "3.5" or "b'x'"."""

    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"x"

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("a", b"a")
        calls: list[Callable[[Any], object]] = [
            lambda bad: fs.pipe_file(bad, b"d"),
            lambda bad: fs.pipe({bad: b"d"}),
            lambda bad: fs.open(bad, "wb"),
            lambda bad: fs.cat_file(bad),
            lambda bad: fs.cat(["a", bad]),
            lambda bad: fs.exists(bad),
            lambda bad: fs.info(bad),
            lambda bad: fs.makedirs(bad),
            lambda bad: fs.rm(bad),
            lambda bad: fs.rm(["a", bad]),
            lambda bad: fs.mv(bad, "x"),
            lambda bad: fs.mv("a", bad),
            lambda bad: fs.mv(["a"], [bad]),
            lambda bad: fs.cp_file("a", bad),
        ]
        for bad in (None, b"bp/x.txt", 3.5, BytesPath()):
            for call in calls:
                with pytest.raises(TypeError, match="path must be a string"):
                    call(bad)
        assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["a"]
        fs.pipe_file(pathlib.PurePosixPath("p/x.txt"), b"x")  # an os.PathLike is a path
        assert fs.cat_file(pathlib.Path("p/x.txt")) == b"x"
        assert fs.cat([pathlib.Path("a"), "p/x.txt"]) == {"a": b"a", "p/x.txt": b"x"}

    await with_fs(address, use_it)


async def test_only_bytes_like_values_are_piped_and_only_fsspecs_modes(address, tmp_path):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("p", b"kept")
        for value in (5, 10**10, [65, 66], "text", None):
            with pytest.raises(TypeError, match="bytes, bytearray or memoryview"):
                fs.pipe_file("p", value)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"'overwrite' or 'create'.*'bogus'"):
            fs.pipe_file("p", b"new", mode="bogus")
        local = tmp_path / "local"
        local.write_bytes(b"new")
        with pytest.raises(ValueError, match="'overwrite' or 'create'"):
            fs.put_file(str(local), "p", mode="bogus")
        assert fs.cat_file("p") == b"kept"
        for value in (bytearray(b"ba"), memoryview(b"xmvx")[1:3]):
            fs.pipe_file("p", value)
            assert fs.cat_file("p") == bytes(value)
        fs.pipe_file("p", b"over", mode="overwrite")
        with pytest.raises(FileExistsError):
            fs.pipe_file("p", b"create", mode="create")
        assert fs.cat_file("p") == b"over"

    await with_fs(address, use_it)


async def test_an_exclusive_create_that_loses_the_race_keeps_the_winners_data(address):
    def use_it(fs: FscacheFileSystem) -> None:
        loser = fs.open("race", "xb")  # nothing there yet
        loser.write(b"loser")
        fs.pipe_file("race", b"winner")
        with pytest.raises(FileExistsError):
            loser.close()
        assert fs.cat_file("race") == b"winner"

        with fs.open("fresh", "xb") as f:
            f.write(b"first")
        assert fs.cat_file("fresh") == b"first"

    await with_fs(address, use_it)


async def test_ranged_reads_are_answered_from_the_lease_cache(address):
    def use_it(fs: FscacheFileSystem) -> None:
        data = bytes(range(256)) * 64
        fs.pipe_file("big", data)
        misses = fs.client.stats["misses"]
        with fs.open("big", "rb", block_size=1000) as f:
            assert f.size == len(data)
            f.seek(5000)
            assert f.read(3000) == data[5000:8000]
            f.seek(-10, 2)
            assert f.read() == data[-10:]
        assert fs.cat_file("big", start=-100, end=-50) == data[-100:-50]
        assert fs.cat_file("big", start=10, end=20) == data[10:20]
        assert fs.cat_file("big", start=20, end=10) == b""
        assert fs.cat_file("big", start=len(data) + 1) == b""
        assert fs.client.stats["misses"] == misses  # the writer's cache holds the data

    await with_fs(address, use_it)


async def test_a_range_counted_back_from_the_end_is_of_one_version(address):
    v1, v2 = b"x" * 90 + b"0123456789", b"y" * 40 + b"ABCDEFGHIJ"

    def use_it(fs: FscacheFileSystem) -> None:
        other = new_fs(address)
        read_range = fs._read_range
        landed = []

        def write_first(path: str, start: int, end: int | None) -> bytes:
            if not landed:  # a write lands between the size lookup and the read
                other.pipe_file("f", v2)
                landed.append(True)
            return read_range(path, start, end)

        try:
            fs.pipe_file("f", v1)
            fs._read_range = write_first  # type: ignore[method-assign]
            assert fs.cat_file("f", start=-10) == b"ABCDEFGHIJ"  # v2's end, not v1's size
            assert landed
            landed.clear()
            other.pipe_file("f", v1)
            assert fs.cat_file("f", start=-20, end=-10) == b"y" * 10  # v2's

            replacement = [b"0123456789changed"]

            def write_always(path: str, start: int, end: int | None) -> bytes:
                other.pipe_file("f", replacement[0])  # a new version under every read
                return read_range(path, start, end)

            fs._read_range = write_always  # type: ignore[method-assign]
            assert fs.cat_file("f", start=-10, end=-3) == b"789chan"  # read whole, at last
            replacement[0] = bytes(CHUNK_SIZE + 1)  # too big to read whole for a few bytes
            fs.pipe_file("f", replacement[0])
            with pytest.raises(fsspec_fs.FileExpired) as expired:
                fs.cat_file("f", start=-10)
            assert expired.value.filename == "f" and expired.value.errno == errno.ESTALE
        finally:
            other.client.close()

    await with_fs(address, use_it)


async def test_head_and_tail_are_of_one_version_and_need_no_pin(address):
    v1, v2 = b"x" * 90 + b"0123456789", b"y" * 40 + b"ABCDEFGHIJ"

    def use_it(fs: FscacheFileSystem) -> None:
        other = new_fs(address)
        info = fs.info
        rewrite = []

        def rewritten_after(path: str, **kwargs: Any) -> dict[str, Any]:
            found = info(path, **kwargs)
            if rewrite:  # another client rewrites the file once its size is known
                other.pipe_file("f", rewrite.pop())
            return found

        try:
            fs.pipe_file("f", v1)
            assert fs.head("f", 5) == b"x" * 5 and fs.tail("f", 5) == b"56789"
            assert fs.head("f", 1000) == fs.head("f", -1) == fs.tail("f", 1000) == v1
            assert fs.head("f", 0) == fs.tail("f", 0) == fs.tail("f", -3) == b""
            fs.info = rewritten_after  # type: ignore[method-assign]
            rewrite.append(v2)
            assert fs.tail("f", 10) == b"ABCDEFGHIJ"
            rewrite.append(v1)
            assert fs.head("f", 10) in (b"x" * 10, b"y" * 10)  # fsspec's: FileExpired
            rewrite.clear()
            fs.mkdir("d")
            for wrong, error in (("missing", FileNotFoundError), ("d", IsADirectoryError)):
                for read in (fs.head, fs.tail):
                    with pytest.raises(error):
                        read(wrong, 0)
        finally:
            other.client.close()

    await with_fs(address, use_it)


async def test_a_block_size_is_a_number_of_bytes_above_zero(address):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("f", b"0123456789")
        for mode in ("rb", "wb", "xb"):
            for bad in (-1, 0):
                with pytest.raises(ValueError, match="block_size must be a number of bytes"):
                    fs.open("f2", mode, block_size=bad)
                with pytest.raises(ValueError, match="block_size"):
                    fs.open("f", mode, block_size=bad, cache_type="bytes")
            for wrong in (2.5, "10", True):
                with pytest.raises(TypeError, match="block_size must be an int"):
                    fs.open("f", mode, block_size=wrong)
        assert not fs.exists("f2")
        for good in (None, "default", 1, 3):
            with fs.open("f", "rb", block_size=good) as f:
                assert f.read() == b"0123456789"

    await with_fs(address, use_it)


async def test_a_ranged_read_fetches_only_the_chunks_it_covers(address, root):
    data = bytes(range(251)) * (4 * CHUNK_SIZE // 251)  # four chunks, give or take
    (root / "huge").write_bytes(data)  # written behind the server: no cache holds it

    def use_it(fs: FscacheFileSystem) -> None:
        before = fs.client.server_stats()["range_reads"]
        at = 2 * CHUNK_SIZE + 10
        with fs.open("huge", "rb", block_size=1000, cache_type="none") as f:
            f.seek(at)
            assert f.read(100) == data[at : at + 100]
        assert fs.cat_file("huge", start=at, end=at + 5) == data[at : at + 5]  # leased now
        assert fs.client.server_stats()["range_reads"] - before == 1

    await with_fs(address, use_it)


async def test_writes_are_spooled_and_replace_the_file_whole_on_close(address, root):
    def use_it(fs: FscacheFileSystem) -> None:
        block = bytes(range(256)) * 4096  # 1 MiB
        fs.pipe_file("whole", b"old")
        with fs.open("whole", "wb", block_size=CHUNK_SIZE) as f:
            for _ in range(3):
                f.write(block)
                assert len(f.buffer.getbuffer()) < CHUNK_SIZE  # full blocks left memory
            assert fs.cat_file("whole") == b"old"  # nothing replaces it before close
        assert fs.cat_file("whole") == block * 3
        assert fs.client.server_stats()["uploads"] == 1

        with fs.open("new/dirs/small", "wb", block_size=10) as f:
            f.write(b"0123456789" * 10)
        assert fs.cat_file("new/dirs/small") == b"0123456789" * 10
        with fs.open("other/dirs/large", "wb") as f:  # an upload: its parents are made
            f.write(block * 2)
        assert (root / "other" / "dirs" / "large").read_bytes() == block * 2

    await with_fs(address, use_it)


async def test_a_write_whose_with_body_raises_writes_nothing(address):
    class Changed(Exception):
        pass

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("d/old", b"old")
        uploads = fs.client.server_stats()["uploads"]
        for mode, path in (("wb", "d/old"), ("xb", "d/new")):
            for autocommit in (True, False):
                with (
                    pytest.raises(Changed),
                    fs.open(path, mode, block_size=10, autocommit=autocommit) as f,
                ):
                    f.write(b"partial" * 10)  # spooled past a block
                    raise Changed
                assert f.closed
                if not autocommit:
                    f.commit()  # nothing to publish
        with fs.transaction:
            with pytest.raises(Changed), fs.open("d/old", "wb") as f:
                f.write(b"partial")
                raise Changed
            fs.pipe_file("d/other", b"other")
        assert fs.cat_file("d/old") == b"old" and not fs.exists("d/new")
        assert fs.ls("d", detail=False) == ["d/old", "d/other"]  # no temporary file left
        assert fs.client.server_stats()["uploads"] == uploads
        with fs.open("d/old", "wb", block_size=10) as f:  # a body that ends well
            f.write(b"new" * 10)
        assert fs.cat_file("d/old") == b"new" * 10

    await with_fs(address, use_it)


async def test_get_and_put_stream_files_and_make_directories(address, tmp_path):
    def use_it(fs: FscacheFileSystem) -> None:
        data = bytes(range(256)) * (3 * CHUNK_SIZE // 256 + 7)
        (tmp_path / "local").mkdir()
        (tmp_path / "local" / "empty").mkdir()
        (tmp_path / "local" / "big").write_bytes(data)
        fs.put(str(tmp_path / "local"), "up/", recursive=True)
        assert fs.find("up", withdirs=True) == ["up", "up/local", "up/local/big", "up/local/empty"]
        fs.get("up/local", str(tmp_path / "down"), recursive=True)
        assert (tmp_path / "down" / "big").read_bytes() == data
        assert (tmp_path / "down" / "empty").is_dir()

    await with_fs(address, use_it)


async def test_copy_and_move_files_and_trees(address):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe({"src/a": b"a", "src/s/b": b"b"})
        fs.cp_file("src/a", "copy/a")
        assert fs.cat_file("copy/a") == b"a"
        before = fs.client.server_stats()
        fs.mv("src", "moved")
        after = fs.client.server_stats()
        assert after["renames"] - before["renames"] == 1  # the whole tree at once
        assert after["writes"] == before["writes"] and after["reads"] == before["reads"]
        assert not fs.exists("src")
        assert fs.find("moved") == ["moved/a", "moved/s/b"]
        assert fs.cat_file("moved/s/b") == b"b"
        fs.mv("moved/a", "moved/renamed")
        assert fs.find("moved") == ["moved/renamed", "moved/s/b"]
        fs.mv("moved/renamed", "copy/a")  # replaces the file there
        assert fs.cat_file("copy/a") == b"a" and not fs.exists("moved/renamed")
        fs.mv("copy", "moved")  # onto a directory: inside it
        assert fs.find("moved") == ["moved/copy/a", "moved/s/b"]
        fs.mv("moved/*", "flat")  # a glob: each source inside the target
        assert fs.ls("flat", detail=False) == ["flat/copy", "flat/s"]
        fs.mv(["flat/copy/a", "flat/s/b"], ["x", "y"])
        assert fs.cat(["x", "y"]) == {"x": b"a", "y": b"b"}
        with pytest.raises(FileNotFoundError) as caught:
            fs.mv("x", "no/parent/x")  # as rename(2): the parent must exist
        assert (caught.value.filename, caught.value.filename2) == ("x", "no/parent/x")
        assert caught.value.strerror == (
            "cannot rename 'x' to 'no/parent/x': the destination's directory 'no/parent'"
            " does not exist"
        )
        fs.makedirs("p1/empty")
        fs.pipe_file("p1/full/f", b"f")
        with pytest.raises(OSError) as refused:
            fs.mv(["p1/empty"], ["p1/full"])  # pairs: each source renamed to its target
        assert refused.value.errno == errno.ENOTEMPTY
        assert (refused.value.filename, refused.value.filename2) == ("p1/empty", "p1/full")
        assert refused.value.strerror == (
            "cannot rename 'p1/empty' to 'p1/full': 'p1/full' is a directory that is not empty"
        )
        with pytest.raises(FileNotFoundError):
            fs.mv("absent", "elsewhere")

    await with_fs(address, use_it)


async def test_a_move_to_a_path_ending_in_a_slash_goes_inside_that_directory(address):
    """fsspec's convention (its cp, and MemoryFileSystem's mv): a destination that
    ends in "/" is a directory, made if it is missing."""
    memory = fsspec.filesystem("memory", skip_instance_cache=True)
    base = f"/{uuid.uuid4().hex}"  # (MemoryFileSystem's store is one for the process)

    def both(fs: FscacheFileSystem, do: Callable[[Any, str], object]) -> list[str]:
        do(fs, "")
        do(memory, base + "/")
        ours = fs.find("mvt")  # files: an emptied directory stays here, not in memory
        assert [base + "/" + name for name in ours] == memory.find(base + "/mvt")
        return ours  # type: ignore[no-any-return]

    def use_it(fs: FscacheFileSystem) -> None:
        both(fs, lambda f, at: f.pipe({at + "mvt/f1": b"1", at + "mvt/d/a": b"a"}))
        assert both(fs, lambda f, at: f.mv(at + "mvt/f1", at + "mvt/nd1/")) == [
            "mvt/d/a", "mvt/nd1/f1",
        ]  # fmt: skip
        both(fs, lambda f, at: f.mv(at + "mvt/d", at + "mvt/nd2/", recursive=True))
        assert fs.find("mvt/nd2") == ["mvt/nd2/d/a"]  # a directory too, inside
        both(fs, lambda f, at: f.mv(at + "mvt/nd1/f1", at + "mvt/nd2/"))  # one that exists
        assert fs.ls("mvt/nd2", detail=False) == ["mvt/nd2/d", "mvt/nd2/f1"]
        with pytest.raises(NotADirectoryError):
            fs.mv("mvt/nd2/f1", "mvt/nd2/d/a/")  # a file is no directory to go inside
        assert fs.exists("mvt/nd2/f1")
        memory.rm(base, recursive=True)

    await with_fs(address, use_it)


# ---------------------------------------------------------------- errors
def test_the_clients_errors_become_what_fsspecs_callers_expect():
    def mapped(error: Exception) -> BaseException:
        with pytest.raises(Exception) as caught, fsspec_fs._os_errors("p"):
            raise error
        assert caught.value.__cause__ is error
        return caught.value

    assert type(mapped(errors.Unauthorized("no"))) is PermissionError
    assert type(mapped(errors.Unavailable("gone"))) is ConnectionError
    try:
        raise trio.TooSlowError
    except trio.TooSlowError:
        timed_out = errors.Unavailable("no answer to the handshake")  # raised from None
        timed_out.__context__, timed_out.__suppress_context__ = trio.TooSlowError(), True
    assert type(mapped(timed_out)) is TimeoutError
    bad = mapped(errors.BadPath("path is empty"))
    assert type(bad) is ValueError and "'p'" in str(bad)
    assert type(mapped(errors.NotFound("x"))) is FileNotFoundError


async def test_errors_of_access_paths_and_reach_are_raised_not_taken_for_absence(
    nursery, root, tmp_path
):
    access = tmp_path / "access.toml"
    access.write_text('[[rule]]\nidentity = "anonymous"\nprefix = "pub"\naccess = "read-write"\n')
    settings = ServerSettings(root=str(root), port=0, access_file=str(access))
    server = await nursery.start(serve, settings)
    (root / "secret").write_bytes(b"s")

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("pub/f", b"f")
        with pytest.raises(PermissionError) as refused:
            fs.exists("secret")
        assert isinstance(refused.value.__cause__, errors.Unauthorized)
        with pytest.raises(PermissionError):
            fs.cat_file("secret")
        with pytest.raises(ValueError, match="NUL") as bad:
            fs.exists("pub/a\x00b")
        assert isinstance(bad.value.__cause__, errors.BadPath)
        with pytest.raises(ValueError):
            fs.rm("")
        assert not fs.exists("pub/missing") and not fs.exists("pub/f/below")
        assert fs.exists("pub/f") and fs.exists("pub")

    await with_fs(f"127.0.0.1:{server.port}", use_it)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nowhere = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nothing listens there now

    def connect_to_nothing() -> None:
        with pytest.raises(ConnectionError) as unreachable:
            new_fs(f"127.0.0.1:{nowhere}")
        assert isinstance(unreachable.value.__cause__, errors.Unavailable)

    await trio.to_thread.run_sync(connect_to_nothing)


async def test_a_server_gone_makes_exists_isdir_and_isfile_raise(nursery, root):
    async with trio.open_nursery() as serving:
        server = await serving.start(serve, ServerSettings(root=str(root), port=0))
        fs = await trio.to_thread.run_sync(new_fs, f"127.0.0.1:{server.port}")
        serving.cancel_scope.cancel()
    try:
        for question in (fs.exists, fs.isdir, fs.isfile):
            with pytest.raises(ConnectionError):
                await trio.to_thread.run_sync(question, "never/leased")
    finally:
        await trio.to_thread.run_sync(fs.client.close)


async def test_a_server_that_never_answers_is_a_timeout(nursery):
    async def hold(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    listeners = await nursery.start(partial(trio.serve_tcp, hold, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]

    def try_it() -> None:
        with pytest.raises(TimeoutError):
            new_fs(f"127.0.0.1:{port}")

    await trio.to_thread.run_sync(try_it)


# ---------------------------------------------------------------- URLs
async def test_urls_name_the_instances_server(address, nursery, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = await nursery.start(serve, ServerSettings(root=str(elsewhere), port=0))

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe({"t/a.txt": b"a", "t/b.txt": b"b"})
        assert fs.unstrip_protocol("t/a.txt") == f"fscache://{address}/t/a.txt"
        assert fs.unstrip_protocol(f"fscache://{address}/t/a.txt") == (
            f"fscache://{address}/t/a.txt"
        )
        files = fsspec.open_files(f"fscache://{address}/t/*.txt")
        assert [f.full_name for f in files] == [
            f"fscache://{address}/t/a.txt",
            f"fscache://{address}/t/b.txt",
        ]
        with fsspec.open(files[1].full_name, "rb") as f:
            assert f.read() == b"b"
        wrong = f"fscache://127.0.0.1:{other.port}/t/a.txt"
        with pytest.raises(ValueError, match=f"127.0.0.1:{other.port}.*{address}"):
            fs.cat(wrong)
        with pytest.raises(ValueError):
            fs.exists(wrong)
        assert fs.cat(f"fscache://{address}/t/a.txt") == b"a"

    await with_fs(address, use_it)


async def test_a_url_and_keywords_naming_its_server_too_agree_or_are_refused(address):
    host, port = address.split(":")
    url = f"fscache://{address}/a.txt"

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("a.txt", b"a")
        for agreeing in ({}, {"host": host}, {"port": int(port)}, {"host": host, "port": port}):
            url_fs, path = fsspec.url_to_fs(url, **agreeing)
            assert (url_fs.host, url_fs.port, path) == (host, int(port), "a.txt")
            with fsspec.open(url, "rb", **agreeing) as f:
                assert f.read() == b"a"
        other = int(port) % 65535 + 1
        for contradicting, named in (
            ({"port": other}, f"port={other}"),
            ({"host": "localhost"}, "host='localhost'"),
            ({"host": "localhost", "port": str(other)}, f"host='localhost' and port='{other}'"),
        ):
            with pytest.raises(ValueError, match=f"names the server {address}, which {named}"):
                fsspec.open(url, "rb", **contradicting).open()
        with pytest.raises(ValueError, match=f"names the server 127.0.0.1:{other}"):
            fsspec.url_to_fs(f"fscache://127.0.0.1:{other}/a.txt", port=port)
        with pytest.raises(ValueError, match=f"{other}.*but this file system is on {address}"):
            fs.cat(f"fscache://127.0.0.1:{other}/a.txt")  # an instance's own check, as before

    await with_fs(address, use_it)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
async def test_urls_of_an_ipv6_server_open_the_same_file_again(nursery, root):
    server = await nursery.start(serve, ServerSettings(root=str(root), host="::1", port=0))
    url = f"fscache://[0:0:0:0:0:0:0:1]:{server.port}/v6/a"

    def use_it() -> None:
        fs = FscacheFileSystem(host="::1", port=server.port, skip_instance_cache=True)
        try:
            fs.pipe_file("v6/a", b"six")
            assert fs.unstrip_protocol("v6/a") == url  # fsspec cuts URLs at "::"
            assert fs.cat_file(url) == b"six"  # the same server, not another
            with fsspec.open(url, "rb") as f:
                assert f.read() == b"six"
            [opened] = fsspec.open_files(url)
            assert opened.full_name == url and opened.fs.host == "::1"
            assert fsspec.url_to_fs(url, host="[::1]")[1] == "v6/a"
            with pytest.raises(ValueError, match=r"without '::' \(\[0:0:0:0:0:0:0:1\]"):
                fsspec.open(f"fscache://[::1]:{server.port}/v6/a")
            bracketed = FscacheFileSystem(host="[0::1]", port=server.port, skip_instance_cache=True)
            try:
                assert bracketed.host == "::1" and bracketed.cat_file(url) == b"six"
            finally:
                bracketed.client.close()
        finally:
            fs.client.close()

    await trio.to_thread.run_sync(use_it)


# ---------------------------------------------------------------- times
async def test_a_bad_host_or_port_is_a_bad_setting_that_names_it(address):
    host, port = address.split(":")

    def try_them() -> None:
        for bad in ("abc", None, 0, -1, 70000, 7821.9, True, "", " 7830", "-1", "7830x", "٧"):
            with pytest.raises(fscache.BadSetting, match=r"port must be 1\.\.65535"):
                FscacheFileSystem(host=host, port=bad, skip_instance_cache=True)  # type: ignore[arg-type]
        for bad in (None, 5, b"127.0.0.1", "", " ", "a:b", "[a]", "[127.0.0.1]", "bad\udcff"):
            with pytest.raises(fscache.BadSetting, match="host must be a host name or an addr"):
                FscacheFileSystem(host=bad, port=port, skip_instance_cache=True)  # type: ignore[arg-type]
        for good_host, good_port in ((host, port), (f" {host}", int(port))):
            fs = FscacheFileSystem(host=good_host, port=good_port, skip_instance_cache=True)
            try:
                assert (fs.host, fs.port) == (host, int(port)) and fs.netloc == address
                fs.pipe_file("f", b"reached")
                assert fs.cat_file("f") == b"reached"
            finally:
                fs.client.close()

    await trio.to_thread.run_sync(try_them)


async def test_modified_is_the_version_in_utc_and_info_has_mtime(address, root):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("d/f", b"x")
        st = os.stat(root / "d" / "f")
        ns = max(st.st_mtime_ns, st.st_ctime_ns)  # the version: the later of the two
        assert fs.info("d/f")["version"] == ns
        modified = fs.modified("d/f")
        assert modified.tzinfo is not None and modified.utcoffset() == datetime.timedelta(0)
        assert modified == datetime.datetime.fromtimestamp(ns // 1000 / 1e6, datetime.UTC)
        assert fs.info("d/f")["mtime"] == ns / 1e9
        assert [e["mtime"] for e in fs.ls("d")] == [ns / 1e9]
        with pytest.raises(NotImplementedError):
            fs.created("d/f")

    await with_fs(address, use_it)


async def test_touch_empties_or_creates_and_otherwise_leaves_a_file_as_it_is(address):
    """As LocalFileSystem's touch, but for the times, which fscache cannot set."""

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("t/f", b"data")
        version = fs.info("t/f")["version"]
        fs.touch("t/f", truncate=False)
        assert fs.cat_file("t/f") == b"data" and fs.info("t/f")["version"] == version
        fs.touch("t/new", truncate=False)
        fs.touch("t/deeper/new")  # its parent made, as by every write
        assert fs.cat(["t/new", "t/deeper/new"]) == {"t/new": b"", "t/deeper/new": b""}
        fs.touch("t/f")  # truncate=True, the default
        assert fs.cat_file("t/f") == b""
        fs.mkdir("t/d")
        fs.touch("t/d", truncate=False)  # there: left as it is
        assert fs.isdir("t/d")
        with pytest.raises(IsADirectoryError):
            fs.touch("t/d")
        with pytest.raises(NotADirectoryError):
            fs.touch("t/f/below", truncate=False)
        with fs.transaction:
            fs.touch("t/later", truncate=False)
            fs.touch("t/new", truncate=False)
            assert not fs.exists("t/later")
        assert fs.cat(["t/later", "t/new"]) == {"t/later": b"", "t/new": b""}

    await with_fs(address, use_it)


# ---------------------------------------------------------------- an open file is one version
async def test_an_open_file_reads_the_version_it_opened_or_raises_file_expired(address):
    def use_it(fs: FscacheFileSystem) -> None:
        other = new_fs(address)
        try:
            old, new = b"o" * 5000, b"n" * 5000
            for replacement in (new, b"short", None, "dir"):  # also deleted, a directory
                fs.pipe_file("f", old)
                with fs.open("f", "rb", block_size=1000, cache_type="none") as f:
                    assert f.read(1000) == old[:1000]
                    if isinstance(replacement, bytes):
                        other.pipe_file("f", replacement)
                    else:
                        other.rm_file("f")
                        if replacement == "dir":
                            other.mkdir("f")
                    with pytest.raises(fsspec_fs.FileExpired) as expired:
                        f.read()
                    assert expired.value.filename == "f"
                    assert expired.value.errno == errno.ESTALE
            other.rmdir("f")
            fs.pipe_file("f", old)
            with fs.open("f", "rb", block_size=1000) as f:  # unchanged: reads on
                assert f.read(10) == old[:10] and f.read() == old[10:]
        finally:
            other.client.close()

    await with_fs(address, use_it)


async def test_the_lines_of_a_binary_file_are_each_copied_once(address):
    """fsspec's readline read a whole block (5 MiB) for every line and sought back,
    so iterating lines copied a block per line. Counted, not timed: the bytes that
    ``read`` hands to the line reader come to the file's size and one piece more."""
    lines = [b"line %d of the file\n" % i for i in range(20_000)]
    lines += [b"x" * (3 * fsspec_fs.LINE_PIECE) + b"\n", b"\n", b"no newline at the end"]
    data = b"".join(lines)

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("lines.txt", data)
        with fs.open("lines.txt", "rb") as f:
            handed: list[int] = []
            read = f.read

            def counted(length: int = -1) -> bytes:
                out = read(length)
                handed.append(len(out))
                return out

            f.read = counted
            assert list(f) == lines
            assert sum(handed) <= len(data) + fsspec_fs.LINE_PIECE, sum(handed)
            assert f.readline() == b"" and f.tell() == len(data)
        with pytest.raises(ValueError, match="closed"):
            f.readline()

        with fs.open("lines.txt", "rb") as f:  # as io's readline: size, seek, read between
            assert f.readline(4) == b"line" and f.readline() == b" 0 of the file\n"
            assert f.readline(0) == b"" and f.tell() == len(lines[0])
            assert f.read(5) == b"line " and f.readline() == b"1 of the file\n"
            f.seek(len(lines[0]) + 2)
            assert f.readline() == lines[1][2:] and f.readline() == lines[2]
            f.seek(len(data) - 4)
            assert f.readline() == b" end" and f.readline() == b""
        fs.pipe_file("empty", b"")
        with fs.open("empty", "rb") as f:
            assert list(f) == [] and f.readline() == b""
        with fs.open("new", "wb") as f, pytest.raises(ValueError, match="not in read mode"):
            f.readline()

    await with_fs(address, use_it)


async def test_lines_read_after_the_file_changed_raise_file_expired(address):
    def use_it(fs: FscacheFileSystem) -> None:
        other = new_fs(address)
        try:
            data = b"".join(b"%09d\n" % i for i in range(100_000))  # 1 MB
            fs.pipe_file("f", data)
            with fs.open("f", "rb", block_size=fsspec_fs.LINE_PIECE) as f:
                assert f.readline() == b"000000000\n"
                other.pipe_file("f", data.upper())
                with pytest.raises(fsspec_fs.FileExpired):
                    for _ in f:  # the lines fetched before the change, then the error
                        pass
        finally:
            other.client.close()

    await with_fs(address, use_it)


async def test_a_copy_or_download_of_a_file_that_kept_changing_is_file_expired(
    address, tmp_path, monkeypatch
):
    """A file read by chunks that changed between every try (the client's Conflict)
    is FileExpired for get, cp and cat alike, not FileExistsError."""

    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("f", b"data")

        def kept_changing(*args: object, **kwargs: object) -> object:
            raise fscache.Conflict("'f' changed while it was read, each of 3 times")

        monkeypatch.setattr(fs.client, "read_into", kept_changing)
        monkeypatch.setattr(fs.client, "read", kept_changing)
        for call in (
            lambda: fs.get_file("f", str(tmp_path / "f")),
            lambda: fs.cp_file("f", "g"),
            lambda: fs.cat_file("f"),
        ):
            with pytest.raises(fsspec_fs.FileExpired, match="changed while it was read"):
                call()

    await with_fs(address, use_it)


# ---------------------------------------------------------------- transactions
async def test_a_transaction_publishes_its_files_only_when_it_ends_well(address):
    def use_it(fs: FscacheFileSystem) -> None:
        other = new_fs(address)
        try:
            big = bytes(range(256)) * (2 * CHUNK_SIZE // 256 + 3)  # an upload in parts
            fs.pipe_file("t/a", b"old a")
            with fs.transaction:
                with fs.open("t/a", "wb") as f:
                    f.write(b"new a")
                with fs.open("t/big", "wb", block_size=CHUNK_SIZE) as f:
                    f.write(big)
                fs.pipe_file("t/piped", b"p")
                fs.pipe_file("t/fscache-notes", b"n")  # its temporary name is no reserved one
                assert other.cat_file("t/a") == b"old a"
                assert not other.exists("t/big") and not other.exists("t/piped")
            assert other.cat(["t/a", "t/big", "t/piped", "t/fscache-notes"]) == {
                "t/a": b"new a",
                "t/big": big,
                "t/piped": b"p",
                "t/fscache-notes": b"n",
            }
            assert other.ls("t", detail=False) == ["t/a", "t/big", "t/fscache-notes", "t/piped"]

            with pytest.raises(RuntimeError, match="changed my mind"), fs.transaction:
                with fs.open("t/a", "wb") as f:
                    f.write(b"never")
                fs.pipe_file("t/never", b"never")
                raise RuntimeError("changed my mind")
            assert other.cat_file("t/a") == b"new a" and not other.exists("t/never")
            assert other.ls("t", detail=False) == ["t/a", "t/big", "t/fscache-notes", "t/piped"]
        finally:
            other.client.close()

    await with_fs(address, use_it)


async def test_a_file_opened_without_autocommit_waits_for_commit(address):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("d/kept", b"old")
        f = fs.open("d/kept", "wb", autocommit=False)
        f.write(b"new")
        f.close()
        assert fs.cat_file("d/kept") == b"old"
        f.commit()
        assert fs.cat_file("d/kept") == b"new"

        f = fs.open("d/kept", "wb", autocommit=False)
        f.write(b"dropped")
        f.close()
        f.discard()
        unclosed = fs.open("d/fresh", "wb", autocommit=False)
        unclosed.write(b"dropped")
        unclosed.discard()  # before any close: nothing goes up
        assert fs.cat_file("d/kept") == b"new" and not fs.exists("d/fresh")
        assert fs.ls("d", detail=False) == ["d/kept"]  # no temporary file left
        with pytest.raises(RuntimeError):
            fs.open("d/kept", "wb").commit()

    await with_fs(address, use_it)


async def test_an_exclusive_create_in_a_transaction_does_not_replace_a_newcomer(address):
    def use_it(fs: FscacheFileSystem) -> None:
        other = new_fs(address)
        try:
            with pytest.raises(FileExistsError), fs.transaction:
                with fs.open("x/new", "xb") as f:
                    f.write(b"mine")
                other.pipe_file("x/new", b"theirs")
            assert fs.cat_file("x/new") == b"theirs"
            assert fs.ls("x", detail=False) == ["x/new"]
            with pytest.raises(FileExistsError), fs.transaction:
                fs.pipe_file("x/new", b"again", mode="create")
            with fs.transaction:
                fs.pipe_file("x/other", b"o", mode="create")
            assert fs.cat_file("x/other") == b"o"
        finally:
            other.client.close()

    await with_fs(address, use_it)


# ---------------------------------------------------------------- listings' freshness
async def test_listed_names_are_fresh_and_info_is_exact(address):
    """What the theory note promises: names in a listing are never stale; sizes in
    a cached listing are as of the listing; ``info``, ``size`` and ``du`` are exact."""

    def use_it(fs: FscacheFileSystem) -> None:
        other = new_fs(address)
        try:
            fs.pipe_file("d/f", b"1")
            assert [e["size"] for e in fs.ls("d")] == [1]  # the listing is leased here
            other.pipe_file("d/f", b"22")  # in place: the listing's names are unchanged
            other.pipe_file("d/g", b"333")  # a new name: the listing is dropped first
            assert fs.ls("d", detail=False) == ["d/f", "d/g"]
            assert fs.info("d/f")["size"] == fs.size("d/f") == 2
            other.pipe_file("d/g", b"4444")
            assert fs.du("d", total=False) == {"d/f": 2, "d/g": 4}  # an info per file
            assert fs.info("d/g")["size"] == 4
        finally:
            other.client.close()

    await with_fs(address, use_it)


# ---------------------------------------------------------------- the client's lifetime
async def test_a_file_system_whose_client_closed_connects_again(address):
    def use_it(fs: FscacheFileSystem) -> None:
        fs.pipe_file("f", b"1")
        fs.client.close()
        assert fs.cat_file("f") == b"1"
        host, port = address.split(":")
        cached = fsspec.filesystem("fscache", host=host, port=int(port))
        cached.client.close()
        again = fsspec.filesystem("fscache", host=host, port=int(port))
        assert again is cached
        assert again.cat_file("f") == b"1"

    await with_fs(address, use_it)


# The file system a forked child uses: made by the parent before the fork.
_forked_fs: FscacheFileSystem | None = None


def _read_in_child(conn: Connection) -> None:
    """In a forked child: on the parent's word, read ``shared`` through the file
    system the parent made, and send back what was read (or the error)."""
    assert _forked_fs is not None
    conn.recv()
    try:
        conn.send(_forked_fs.cat_file("shared"))
    except Exception as exc:
        conn.send(repr(exc))
    finally:
        _forked_fs.client.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
async def test_a_forked_child_reads_fresh_data_through_the_parents_file_system(address):
    def use_it(fs: FscacheFileSystem) -> None:
        global _forked_fs
        _forked_fs = fs
        fs.pipe_file("shared", b"before the fork")
        assert fs.cat_file("shared") == b"before the fork"  # cached here, under a lease
        context = multiprocessing.get_context("fork")
        ours, theirs = context.Pipe()
        child: Any = context.Process(target=_read_in_child, args=(theirs,))
        child.start()
        try:
            fs.pipe_file("shared", b"after the fork")
            ours.send("go")
            assert ours.poll(30), "the child did not answer"
            assert ours.recv() == b"after the fork"
            child.join(30)
            assert child.exitcode == 0
        finally:
            _forked_fs = None
            if child.is_alive():
                child.kill()
                child.join()
            ours.close()
            theirs.close()

    await with_fs(address, use_it)


def test_a_full_disk_is_the_oserror_enospc() -> None:
    """A write the server's full disk refused (``NoSpace``) reaches fsspec's callers
    as ``OSError(ENOSPC)``, what a local file system raises, naming the path."""
    with pytest.raises(OSError) as refused, fsspec_fs._os_errors("big.bin"):
        raise errors.NoSpace("cannot upload 'big.bin': the store's disk is full")
    assert (refused.value.errno, refused.value.filename) == (errno.ENOSPC, "big.bin")
    assert isinstance(refused.value.__cause__, errors.NoSpace)
