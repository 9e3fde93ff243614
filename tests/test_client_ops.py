"""The client's names, directories and files of any size: ranged and chunked reads,
read_into, uploads, in-place writes, truncate, rename, mkdir, rmdir, scandir.

Exact behaviour is checked against a server scripted by hand over a memory stream
(the test chooses every frame); the rest against the real service over memory
streams (:class:`tests.harness.Cluster`, the service's I/O inline, so no time
passes while a file is written), with ``autojump_clock`` wherever a lease times out.
"""

from __future__ import annotations

import io
import tracemalloc

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.settings import CHUNK_SIZE

from .harness import Cluster, RawPeer
from .test_client_reader import with_scripted_server

C = CHUNK_SIZE


def blob(size: int, seed: int = 0) -> bytes:
    """``size`` bytes that differ from chunk to chunk (a misplaced chunk shows)."""
    pattern = bytes((seed + i) % 251 for i in range(251))
    return (pattern * (size // 251 + 1))[:size]


@pytest.fixture
async def cluster(nursery, root):
    cluster = Cluster(nursery, root)
    await cluster.start()
    return cluster


# ---------------------------------------------------------------- ranged and chunked reads
async def test_a_big_file_is_read_whole_in_chunks_and_then_answered_from_the_cache(cluster):
    data = blob(3 * C + 123)
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("big.bin", data)
        assert await r.read("big.bin") == data
        misses = r.stats["misses"]
        assert await r.read("big.bin") == data  # every chunk cached under the lease
        assert await r.read("big.bin", offset=C - 10, length=20) == data[C - 10 : C + 10]
        assert r.stats["misses"] == misses  # 4 chunks, then 2, all hits
        assert r.stats["not_modified"] == 0
        assert (await r.stat("big.bin")).size == len(data)  # from the cache
        assert r.stats["cached_bytes"] == len(data)


async def test_a_range_of_a_file_cached_whole_that_has_grown_past_a_chunk(cluster, autojump_clock):
    """Its lease ran out (no approval dropped it): the range is revalidated whole, the
    file now comes in chunks, and the read gives the range asked for, not all of it."""
    data = blob(3 * C)
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("f", b"small")
        assert await r.read("f") == b"small"
        await trio.sleep(60.0)  # r's lease is over; its entry stays, untrusted
        await w.write("f", data)
        assert await r.read("f", offset=C + 5, length=10) == data[C + 5 : C + 15]


async def test_a_small_ranged_read_fetches_and_caches_only_its_range(cluster):
    data = blob(4 * C)
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("big.bin", data)
        assert await r.read("big.bin", offset=2 * C + 5, length=10) == data[2 * C + 5 : 2 * C + 15]
        assert r.stats["cached_bytes"] == 10
        assert cluster.service.counters.range_reads == 1
        assert await r.read("big.bin", offset=2 * C + 5, length=10) == data[2 * C + 5 : 2 * C + 15]
        assert cluster.service.counters.range_reads == 1  # a hit
        await w.write("big.bin", blob(4 * C, seed=3))  # r approves: its piece is dropped
        assert "big.bin" not in r.cache and r.cache.nbytes == 0
        assert await r.read("big.bin", offset=4 * C, length=10) == b""


async def test_a_4k_ranged_read_sends_one_exact_range_then_hits_until_another_write(
    nursery, autojump_clock
):
    data, new = blob(3 * C), blob(3 * C, seed=7)
    offset = C + 12345
    sent: list[p.Message] = []

    async def script(server: RawPeer) -> None:
        for contents, version in ((data, 1), (new, 2)):
            request = await server.receive()
            sent.append(request)
            assert isinstance(request, p.ReadRange)
            piece = contents[request.offset : request.offset + request.length]
            await server.send(p.Chunk(request.id, version, 10.0, len(contents), piece))
            if version == 1:  # another client writes: the server asks for approval
                await trio.sleep(1.0)
                await server.send(p.ApprovalRequest(path="big.bin", write=1))
                assert isinstance(await server.receive(), p.Approve)

    client = await with_scripted_server(nursery, script)
    async with client() as c:
        assert await c.read("big.bin", offset=offset, length=4096) == data[offset : offset + 4096]
        assert sent == [p.ReadRange(id=sent[0].id, path="big.bin", offset=offset, length=4096)]
        assert c.cache.nbytes == 4096
        misses, hits = c.stats["misses"], c.stats["hits"]
        inner = await c.read("big.bin", offset=offset + 96, length=4000)
        assert inner == data[offset + 96 : offset + 4096]  # a hit: no request
        assert await c.read("big.bin", offset=offset, length=4096) == data[offset : offset + 4096]
        assert (c.stats["misses"], c.stats["hits"], len(sent)) == (misses, hits + 2, 1)
        await trio.sleep(2.0)  # the approval request came at 1.0 and dropped the piece
        assert "big.bin" not in c.cache and c.cache.nbytes == 0
        assert await c.read("big.bin", offset=offset, length=4096) == new[offset : offset + 4096]
        assert len(sent) == 2 and sent[1].have is None  # type: ignore[attr-defined]


async def test_a_ranged_read_of_a_small_cached_file_is_a_hit(cluster):
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("a.txt", b"hello world")
        assert await r.read("a.txt") == b"hello world"
        hits = r.stats["hits"]
        assert await r.read("a.txt", offset=6) == b"world"
        assert await r.read("a.txt", offset=0, length=5) == b"hello"
        assert r.stats["hits"] == hits + 2


async def test_another_clients_write_drops_every_cached_chunk(cluster):
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("big.bin", blob(2 * C + 1))
        await r.read("big.bin")
        new = blob(2 * C + 7, seed=9)
        await w.write("big.bin", new)
        assert "big.bin" not in r.cache and r.cache.nbytes == 0
        assert await r.read("big.bin") == new


async def test_chunks_count_against_the_byte_bound_and_evicted_files_are_relinquished(
    cluster,
):
    data = blob(3 * C)
    async with cluster.client("w") as w, cluster.client("r", cache_bytes=2 * C) as r:
        await w.write("big.bin", data)
        assert await r.read("big.bin") == data
        assert r.cache.nbytes <= 2 * C
        await w.write("other.bin", data)
        assert await r.read("other.bin") == data
        assert r.cache.nbytes <= 2 * C
        with trio.fail_after(5):
            while r.stats["evictions"] < 3:
                await trio.sleep(0.01)


async def test_chunks_of_two_versions_are_never_joined_the_read_starts_over(nursery):
    """The scripted server changes the file between chunk 0 and chunk 1."""
    old, new = blob(C + 10), blob(C + 20, seed=5)

    async def script(server: RawPeer) -> None:
        read = await server.receive()
        assert isinstance(read, p.Read)
        await server.send(p.Chunk(id=read.id, version=1, term=10.0, size=len(old), data=old[:C]))
        ranged = await server.receive()
        assert isinstance(ranged, p.ReadRange) and (ranged.offset, ranged.length) == (C, C)
        await server.send(p.Chunk(id=ranged.id, version=2, term=10.0, size=len(new), data=new[C:]))
        again = await server.receive()  # the read starts over, asking for nothing cached
        assert isinstance(again, p.ReadRange) and again.offset == 0 and again.have is None
        await server.send(p.Chunk(id=again.id, version=2, term=10.0, size=len(new), data=new[:C]))
        rest = await server.receive()
        assert isinstance(rest, p.ReadRange) and rest.offset == C
        await server.send(p.Chunk(id=rest.id, version=2, term=10.0, size=len(new), data=new[C:]))

    client = await with_scripted_server(nursery, script)
    async with client() as c:
        assert await c.read("f") == new
        assert c.cache.chunks("f") is not None and c.cache.chunks("f").version == 2  # type: ignore[union-attr]


async def test_an_expired_chunk_is_revalidated_with_its_version(nursery, autojump_clock):
    data = blob(10)

    async def script(server: RawPeer) -> None:
        first = await server.receive()
        assert isinstance(first, p.ReadRange) and first.have is None
        assert (first.offset, first.length) == (2, 3)  # only the range asked for
        await server.send(p.Chunk(id=first.id, version=4, term=1.0, size=len(data), data=data[2:5]))
        second = await server.receive()
        assert isinstance(second, p.ReadRange) and second.have == 4
        await server.send(p.NotModified(id=second.id, version=4, term=1.0))

    client = await with_scripted_server(nursery, script)
    async with client() as c:
        assert await c.read("f", offset=2, length=3) == data[2:5]
        await trio.sleep(2.0)
        assert await c.read("f", offset=2, length=3) == data[2:5]
        assert c.stats["not_modified"] == 1


async def test_read_into_keeps_no_chunk_of_a_file_over_a_quarter_of_the_cache(cluster):
    big, small = blob(3 * C + 5), blob(2 * C, seed=1)
    async with cluster.client("w") as w, cluster.client("r", cache_bytes=8 * C) as r:
        await w.write("big.bin", big)
        await w.write("small.bin", small)  # 2 MiB: a quarter of r's bound
        await w.write("other", b"kept")
        assert await r.read("other") == b"kept"
        out = io.BytesIO()
        assert await r.read_into("big.bin", out) == len(big) and out.getvalue() == big
        assert "big.bin" not in r.cache and r.cache.nbytes == 4  # nothing kept, nothing evicted
        assert await r.read("other") == b"kept" and r.stats["evictions"] == 0
        await trio.testing.wait_all_tasks_blocked()  # the relinquisher gave the lease back
        approvals = r.stats["approvals"]
        await w.write("big.bin", big[::-1])
        assert r.stats["approvals"] == approvals  # r held no lease on it: not asked
        out = io.BytesIO()
        assert await r.read_into("small.bin", out) == len(small) and out.getvalue() == small
        range_reads = cluster.service.counters.range_reads
        assert await r.read("small.bin") == small  # a small file is kept: every chunk a hit
        assert cluster.service.counters.range_reads == range_reads
        part = await r.read("big.bin", offset=C + 7, length=100)  # ranged reads keep chunks
        assert part == big[::-1][C + 7 : C + 107]
        assert await r.read("big.bin", offset=C + 7, length=100) == part
        assert cluster.service.counters.range_reads == range_reads + 1


# ---------------------------------------------------------------- uploads
async def test_an_upload_into_a_new_directory_makes_it_and_breaks_the_roots_listing(cluster):
    data = blob(2 * C)
    async with cluster.client("w") as w, cluster.client("r") as r:
        assert await r.scandir("") == []
        assert "/" in r.cache  # r holds the root's listing under a lease
        version = await w.write("newdirB/sub/f", data)  # over one chunk: an upload
        assert "/" not in r.cache  # r was asked to approve before the root gained newdirB
        assert [e.name for e in await r.scandir("")] == ["newdirB"]
        assert await r.read("newdirB/sub/f") == data
        assert (await r.stat("newdirB/sub/f")).version == version


# ---------------------------------------------------------------- streams
async def test_read_into_streams_a_file_with_bounded_memory(cluster):
    data = blob(8 * C + 3)
    async with cluster.client("w") as w, cluster.client("r", cache_bytes=C) as r:
        await w.write("big.bin", io.BytesIO(data))
        out = io.BytesIO()
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            assert await r.read_into("big.bin", out) == len(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert out.getvalue() == data
        assert peak - len(data) < 16 * C  # the output buffer, plus a few chunks in flight


async def test_an_upload_from_a_file_object_replaces_the_file_atomically(cluster):
    data = blob(5 * C + 17)
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("up.bin", b"old")
        assert await r.read("up.bin") == b"old"
        version = await w.write("up.bin", io.BytesIO(data))
        assert "up.bin" not in r.cache  # approved before the commit applied
        assert await r.read("up.bin") == data
        assert (await r.stat("up.bin")).version == version
        assert await w.write("up.bin", data) > version  # bytes over one chunk: an upload too


class Exploding(io.RawIOBase):
    """A file that fails after ``good`` bytes."""

    def __init__(self, good: int) -> None:
        self.left = good

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            raise OSError("disk on fire")
        part = blob(min(n, self.left))
        self.left -= len(part)
        return part


async def test_an_upload_that_fails_midway_is_aborted_and_changes_nothing(nursery):
    seen: list[type[p.Message]] = []
    aborted = trio.Event()

    async def script(server: RawPeer) -> None:
        while True:
            message = await server.receive()
            if message is None:
                return
            if isinstance(message, p.Goodbye):
                return
            seen.append(type(message))
            await server.send(p.Done(id=message.id))  # type: ignore[attr-defined]
            if isinstance(message, p.UploadAbort):
                aborted.set()

    client = await with_scripted_server(nursery, script)
    async with client() as c:
        with pytest.raises(OSError, match="disk on fire"):
            await c.write("f", Exploding(3 * C))  # type: ignore[arg-type]
        await aborted.wait()
    assert seen[0] is p.UploadBegin and seen[-1] is p.UploadAbort
    assert p.UploadCommit not in seen and seen.count(p.UploadPart) == 3


class Cancelling(io.RawIOBase):
    """A file that cancels ``scope`` (from the worker thread that reads it) after
    ``good`` bytes."""

    def __init__(self, good: int, scope: trio.CancelScope) -> None:
        self.left, self.scope = good, scope

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            trio.from_thread.run_sync(self.scope.cancel)
        part = blob(min(n, max(self.left, 1)))
        self.left -= len(part)
        return part


@pytest.mark.parametrize("good", [0, 2 * C])
async def test_a_cancelled_upload_is_aborted_on_the_real_server(cluster, root, good):
    async with cluster.client("w") as w:
        await w.write("keep.bin", b"kept")
        with trio.CancelScope() as scope:
            await w.write("keep.bin", Cancelling(good, scope))  # type: ignore[arg-type]
        assert scope.cancelled_caught
        # the abort was answered before write returned: no temp file is left
        assert sorted(p.name for p in root.iterdir() if "tmp" in p.name) == []
        assert await w.read("keep.bin") == b"kept"


async def test_a_cancelled_upload_still_waiting_for_a_holder_is_withdrawn(
    cluster, root, autojump_clock
):
    """Given up after its commit went out, while the write waits for a holder that
    does not answer: the server withdraws it. It is never applied, not even once the
    holder's lease has run out."""
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("f", b"old")
        assert await r.read("f") == b"old"
        cluster.hold("r")  # r's approval request waits in flight: its lease is waited out
        with trio.move_on_after(1.0) as scope:
            await w.write("f", blob(3 * C))
        assert scope.cancelled_caught
        assert cluster.service is not None
        assert cluster.service.counters.writes_withdrawn == 1
        await trio.sleep(cluster.settings.term + 1.0)  # past r's lease: nothing to apply
        cluster.release("r")
        assert await w.read("f") == b"old"
        assert await r.read("f") == b"old"
        assert (await w.server_stats())["writes_pending"] == 0
        assert sorted(p.name for p in root.iterdir() if "tmp" in p.name) == []


async def test_a_compare_and_set_upload_that_loses_raises_conflict(cluster):
    async with cluster.client("w") as w:
        version = await w.write("f", b"x")
        await w.write("f", b"y")
        with pytest.raises(fscache.Conflict):
            await w.write("f", blob(2 * C), if_version=version)
        assert await w.read("f") == b"y"


# ---------------------------------------------------------------- in place, truncate
async def test_in_place_writes_and_truncate_are_seen_by_another_client(cluster):
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("f", b"hello world")
        assert await r.read("f") == b"hello world"
        await w.write("f", b"WORLD", offset=6)
        assert "f" not in w.cache and "f" not in r.cache
        assert await r.read("f") == b"hello WORLD"
        size_version = await w.truncate("f", 5)
        assert await r.read("f") == b"hello"
        assert (await r.stat("f")).version == size_version
        await w.write("new", b"abc", offset=2)  # creates the file
        assert await r.read("new") == b"\0\0abc"


# ---------------------------------------------------------------- names
async def test_a_rename_is_seen_by_another_client_at_once(cluster):
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.write("a.txt", b"A")
        await w.write("b.txt", b"B")
        assert await r.read("a.txt") == b"A" and await r.read("b.txt") == b"B"
        names = [e.name for e in await r.scandir()]
        assert names == ["a.txt", "b.txt"]
        version = await w.rename("a.txt", "b.txt")
        assert "a.txt" not in r.cache and "b.txt" not in r.cache and "/" not in r.cache
        assert await r.read("b.txt") == b"A"
        assert (await r.stat("b.txt")).version == version
        with pytest.raises(fscache.NotFound):
            await r.read("a.txt")
        assert [e.name for e in await r.scandir()] == ["b.txt"]


async def test_a_directory_rename_drops_everything_cached_beneath_it(cluster):
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.mkdir("d")
        await w.write("d/x", b"x")
        assert await w.read("d/x") == b"x" and await r.read("d/x") == b"x"
        await w.scandir("d")
        await w.rename("d", "e")
        assert "d/x" not in w.cache and "d/" not in w.cache
        assert "d/x" not in r.cache
        assert await r.read("e/x") == b"x"
        with pytest.raises(fscache.NotFound):
            await r.read("d/x")


async def test_mkdir_rmdir_and_their_errors(cluster):
    async with cluster.client("w") as w:
        await w.mkdir("d")
        with pytest.raises(fscache.Exists):
            await w.mkdir("d")
        with pytest.raises(fscache.NotFound):
            await w.mkdir("missing/d")
        await w.write("d/f", b"")
        with pytest.raises(fscache.NotEmpty):
            await w.rmdir("d")
        with pytest.raises(fscache.NotADirectory):
            await w.rmdir("d/f")
        await w.delete("d/f")
        await w.rmdir("d")
        assert await w.listdir() == []


async def test_scandir_is_cached_and_another_clients_create_drops_it(cluster):
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.mkdir("d")
        await w.write("d/one", b"1")
        first = await r.scandir("d")
        assert first == [fscache.DirEntry("one", False, 1, first[0].version)]
        misses = r.stats["misses"]
        assert await r.scandir("d") == first  # a hit: the listing's lease holds
        assert await r.listdir("d") == ["one"]  # the same cached listing
        assert r.stats["misses"] == misses
        await w.write("d/two", b"22")  # a create: the server asks r to drop it first
        assert "d/" not in r.cache
        assert [(e.name, e.size) for e in await r.scandir("d")] == [("one", 1), ("two", 2)]
        await w.mkdir("d/sub")
        assert await r.listdir("d") == ["one", "sub/", "two"]


async def test_listdir_is_cached_under_the_directorys_lease(cluster):
    async with cluster.client("w") as w, cluster.client("r") as r:
        await w.mkdir("d")
        await w.write("d/one", b"1")
        await w.mkdir("d/sub")
        counters = cluster.service.counters
        messages, hits, misses = counters.messages_in, r.stats["hits"], r.stats["misses"]
        for _ in range(100):
            assert await r.listdir("d") == ["one", "sub/"]
        assert counters.messages_in == messages + 1  # one scandir, then hits
        assert (r.stats["hits"], r.stats["misses"]) == (hits + 99, misses + 1)
        assert await r.scandir("d") == [  # the same cached listing
            fscache.DirEntry("one", False, 1, (await w.stat("d/one")).version),
            fscache.DirEntry("sub", True, 0, (await w.stat("d/sub")).version),
        ]
        await w.write("d/two", b"22")  # a create: r is asked to drop its listing first
        assert await r.listdir("d") == ["one", "sub/", "two"]
        await w.rename("d/one", "d/zero")
        assert await r.listdir("d") == ["sub/", "two", "zero"]
        await w.delete("d/two")
        assert await r.listdir("d") == ["sub/", "zero"]
        with pytest.raises(fscache.NotADirectory, match="it is a file"):
            await r.listdir("d/zero")
        with pytest.raises(fscache.NotFound):
            await r.listdir("absent")


async def test_listings_past_the_budget_are_dropped_and_their_leases_given_back(
    cluster, monkeypatch
):
    monkeypatch.setattr(fscache.cache, "MIN_LISTING_BYTES", 0)
    async with (
        cluster.client("w") as w,
        cluster.client("r", cache_bytes=3 * fscache.cache.LISTING_NAME_BYTES) as r,
    ):
        for d in "abcd":
            await w.write(f"{d}/one", b"1")
        for d in "abcd":  # a name each: three fit
            assert await r.listdir(d) == ["one"]
        assert list(r.cache.listings) == ["b/", "c/", "d/"]
        await trio.sleep(1)  # the relinquisher gives a/ back
        await w.write("a/two", b"2")  # a create in a/: no one holds its listing now
        assert r.stats["approvals"] == 0
        await w.write("d/two", b"2")  # d/ is still r's: r is asked to approve
        assert r.stats["approvals"] == 1
        assert await r.listdir("a") == ["one", "two"]


async def test_the_writers_own_listing_is_dropped_by_its_create(cluster):
    async with cluster.client("w") as w:
        assert await w.scandir() == []
        await w.write("n", b"")
        assert [e.name for e in await w.scandir()] == ["n"]
        await w.rename("n", "m")
        assert [e.name for e in await w.scandir()] == ["m"]
        await w.delete("m")
        assert await w.scandir() == []


async def test_a_listing_lease_runs_out_and_is_revalidated(cluster, autojump_clock):
    async with cluster.client("r") as r:
        await r.scandir()
        await trio.sleep(60)
        assert r.cache.lookup_listing("/", trio.current_time()) is None
        assert await r.scandir() == []
        assert r.stats["not_modified"] == 1


# ---------------------------------------------------------------- the blocking client, real TCP
async def test_the_blocking_client_has_the_same_operations(nursery, root, tmp_path):
    from fscache.server.service import ServerSettings, serve

    server = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    address = f"{server.host}:{server.port}"
    source = tmp_path / "in.bin"
    source.write_bytes(blob(2 * C + 5))

    def use() -> None:
        with fscache.connect(address) as c:
            c.mkdir("d")
            with open(source, "rb") as f:
                version = c.write("d/big", f)
            assert c.stat("d/big").version == version
            assert c.read("d/big", offset=C, length=4) == blob(2 * C + 5)[C : C + 4]
            with open(tmp_path / "out.bin", "wb") as out:
                assert c.read_into("d/big", out) == 2 * C + 5
            c.write("d/big", b"XY", offset=1)
            assert c.truncate("d/big", 3) > version
            assert c.read("d/big") == blob(1) + b"XY"
            assert c.read("d/big", offset=1) == b"XY"  # a slice of the cached hit
            c.rename("d/big", "d/small")
            assert [(e.name, e.size) for e in c.scandir("d")] == [("small", 3)]
            assert c.listdir("d") == ["small"]
            c.delete("d/small")
            c.rmdir("d")

    await trio.to_thread.run_sync(use)
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()


async def test_epoch_and_connected_are_right_when_open_client_returns(cluster):
    service = cluster.service
    async with cluster.client("a") as a:
        assert a.connected and a.epoch == service.epoch and a.session_id is not None
    assert not a.connected
