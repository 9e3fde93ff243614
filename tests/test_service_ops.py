"""The service's name, directory, range and upload operations, spoken in raw frames.

Every test but the last runs under ``autojump_clock`` over memory streams (see
harness.py) with writes applied without a worker thread, so
``trio.current_time()`` after an await is the exact instant the service decided.
The last speaks real TCP to a server that writes in worker threads, and asserts
bytes and order only. Terms are the defaults (10 s, skew 0.1 s).
"""

from __future__ import annotations

import os

import pytest
import trio

from fscache import protocol as p
from fscache.errors import BadPath
from fscache.paths import normalize_key
from fscache.server.service import ServerSettings, serve
from fscache.server.store import TEMP_PREFIX
from fscache.settings import CHUNK_SIZE, MAX_UPLOADS

from .harness import Cluster, RawPeer
from .test_service_timing import SKEW, TERM, at


@pytest.fixture
async def cluster(nursery, root):
    cluster = Cluster(nursery, root, term=TERM, skew=SKEW)
    await cluster.start()
    return cluster


async def ask(peer: RawPeer, message: p.Message) -> p.Message | None:
    await peer.send(message)
    return await peer.receive()


async def put(peer: RawPeer, path: str, data: bytes, request_id: int = 900) -> int:
    reply = await ask(peer, p.Write(id=request_id, path=path, data=data))
    assert isinstance(reply, p.Written), reply
    return reply.version


def temp_files(root: os.PathLike[str]) -> list[str]:
    return [name for _, _, names in os.walk(root) for name in names if name.startswith(TEMP_PREFIX)]


# ---------------------------------------------------------------- keys on the wire
@pytest.mark.parametrize(
    ("key", "normal"),
    [("docs/", "docs/"), ("/", "/"), ("a//b/", "a/b/"), ("./docs/", "docs/"), ("a/b", "a/b")],
)
def test_a_directory_key_keeps_its_slash(key, normal):
    assert normalize_key(key) == normal


@pytest.mark.parametrize("key", ["/docs/", "../x/", "a/../", "//"])
def test_a_bad_directory_key_is_a_bad_path(key):
    with pytest.raises(BadPath):
        normalize_key(key)


# ---------------------------------------------------------------- renames
async def test_a_rename_against_a_silent_holder_of_the_destination_waits_out_its_lease(
    cluster, autojump_clock
):
    writer = await cluster.raw("writer")
    await put(writer, "a", b"source")
    await put(writer, "b", b"destination")
    silent = await cluster.raw("silent")
    await trio.sleep(1.0)
    granted_at = trio.current_time()
    assert isinstance(await silent.read("b"), p.Data)
    await trio.sleep(2.0)
    reply = await ask(writer, p.Rename(id=1, src="a", dst="b"))
    assert isinstance(reply, p.Written) and reply.term == TERM
    assert trio.current_time() == at(granted_at + TERM + SKEW)
    read = await writer.read("b", request_id=2)
    assert isinstance(read, p.Data) and read.data == b"source" and read.version == reply.version
    assert isinstance(await ask(writer, p.Read(id=3, path="a")), p.Error)


async def test_a_rename_of_a_directory_asks_the_holders_of_files_beneath_it(
    cluster, root, autojump_clock
):
    writer = await cluster.raw("writer")
    await put(writer, "d/f", b"x")
    holder = await cluster.raw("holder")
    assert isinstance(await holder.read("d/f"), p.Data)
    async with trio.open_nursery() as nursery:
        replies: list[p.Message | None] = []

        async def rename() -> None:
            replies.append(await ask(writer, p.Rename(id=1, src="d", dst="e")))

        nursery.start_soon(rename)
        request = await holder.receive()
        assert isinstance(request, p.ApprovalRequest) and request.path == "d/f"
        await trio.sleep(2.0)
        approved_at = trio.current_time()
        await holder.send(p.Approve(path=request.path, write=request.write))
    [reply] = replies
    assert isinstance(reply, p.Written) and reply.term == 0.0  # no listing to cache
    assert trio.current_time() == at(approved_at)
    assert (root / "e" / "f").read_bytes() == b"x" and not (root / "d").exists()


async def test_rename_errors_are_posix_ones(cluster, autojump_clock):
    peer = await cluster.raw("peer")
    await put(peer, "f", b"x")
    await put(peer, "d/inside", b"y")
    await put(peer, "full/inside", b"z")
    cases = [
        (p.Rename(id=1, src="missing", dst="g"), "not_found", "'missing' does not exist"),
        (p.Rename(id=2, src="f", dst="d"), "is_a_directory", "'d' is a directory"),
        (p.Rename(id=3, src="d", dst="f"), "not_a_directory", "'f' is a file"),
        (p.Rename(id=4, src="d", dst="full"), "not_empty", "'full' is a directory that is not"),
        (p.Rename(id=5, src="d", dst="d/below"), "bad_path", "cannot go inside itself"),
        (
            p.Rename(id=6, src="f", dst="no_such_dir/dst"),
            "not_found",
            "the destination's directory 'no_such_dir' does not exist",
        ),
    ]
    for message, code, reason in cases:
        reply = await ask(peer, message)
        assert isinstance(reply, p.Error) and (reply.id, reply.code) == (message.id, code)
        assert reply.message.startswith(f"cannot rename {message.src!r} to {message.dst!r}: ")
        assert reason in reply.message


# ---------------------------------------------------------------- directories
async def test_a_create_in_a_directory_waits_for_its_listing_holders_to_approve(
    cluster, autojump_clock
):
    writer = await cluster.raw("writer")
    await put(writer, "d/old", b"x")
    lister = await cluster.raw("lister")
    listing = await ask(lister, p.ScanDir(id=1, path="d"))
    assert isinstance(listing, p.Entries) and listing.names == ["old"] and listing.term == TERM
    async with trio.open_nursery() as nursery:
        replies: list[p.Message | None] = []

        async def create() -> None:
            replies.append(await ask(writer, p.Write(id=2, path="d/new", data=b"n")))

        nursery.start_soon(create)
        request = await lister.receive()
        assert isinstance(request, p.ApprovalRequest) and request.path == "d/"
        await trio.sleep(3.0)
        assert replies == []  # still waiting for the listing's holder
        approved_at = trio.current_time()
        await lister.send(p.Approve(path=request.path, write=request.write))
    assert isinstance(replies[0], p.Written)
    assert trio.current_time() == at(approved_at)
    again = await ask(lister, p.ScanDir(id=3, path="d", have=listing.version))
    assert isinstance(again, p.Entries) and again.names == ["new", "old"]
    assert again.version > listing.version


async def test_an_overwrite_leaves_the_listing_lease_alone(cluster, autojump_clock):
    writer = await cluster.raw("writer")
    await put(writer, "d/f", b"x")
    lister = await cluster.raw("lister")
    listing = await ask(lister, p.ScanDir(id=1, path="d"))
    assert isinstance(listing, p.Entries)
    start = trio.current_time()
    await put(writer, "d/f", b"y")
    assert trio.current_time() == at(start)
    again = await ask(lister, p.ScanDir(id=2, path="d"))
    assert isinstance(again, p.Entries) and again.names == ["f"] and again.term == TERM


async def test_a_delete_against_a_silent_listing_holder_waits_out_its_lease(
    cluster, autojump_clock
):
    writer = await cluster.raw("writer")
    await put(writer, "d/f", b"x")
    silent = await cluster.raw("silent")
    granted_at = trio.current_time()
    assert isinstance(await ask(silent, p.ScanDir(id=1, path="d")), p.Entries)
    reply = await ask(writer, p.Delete(id=2, path="d/f"))
    assert isinstance(reply, p.Done)
    assert trio.current_time() == at(granted_at + TERM + SKEW)


async def test_a_write_that_makes_directories_waits_for_the_listings_they_join(
    cluster, autojump_clock
):
    writer = await cluster.raw("writer")
    silent = await cluster.raw("silent")
    granted_at = trio.current_time()
    assert isinstance(await ask(silent, p.ScanDir(id=1, path="")), p.Entries)
    await put(writer, "new/dirs/f", b"x")  # the root gains "new"
    assert trio.current_time() == at(granted_at + TERM + SKEW)


async def test_mkdir_scandir_and_rmdir(cluster, autojump_clock):
    peer = await cluster.raw("peer")
    assert isinstance(await ask(peer, p.MkDir(id=1, path="d")), p.Done)
    error = await ask(peer, p.MkDir(id=2, path="d"))
    assert isinstance(error, p.Error) and error.code == "exists"
    error = await ask(peer, p.MkDir(id=3, path="no/such"))
    assert isinstance(error, p.Error) and error.code == "not_found"
    version = await put(peer, "d/f", b"abc")
    await put(peer, "d/sub/g", b"")
    root = await ask(peer, p.ScanDir(id=4, path=""))
    assert isinstance(root, p.Entries) and root.names == ["d"] and root.dirs == [True]
    listing = await ask(peer, p.ScanDir(id=5, path="d"))
    assert isinstance(listing, p.Entries)
    assert (listing.names, listing.dirs, listing.sizes) == (["f", "sub"], [False, True], [3, 0])
    assert listing.versions[0] == version
    error = await ask(peer, p.RmDir(id=6, path="d"))
    assert isinstance(error, p.Error) and error.code == "not_empty"
    error = await ask(peer, p.RmDir(id=7, path="d/f"))
    assert isinstance(error, p.Error) and error.code == "not_a_directory"
    error = await ask(peer, p.ScanDir(id=8, path="d/f"))
    assert isinstance(error, p.Error) and error.code == "not_a_directory"
    assert isinstance(await ask(peer, p.Delete(id=9, path="d/sub/g")), p.Done)
    assert isinstance(await ask(peer, p.RmDir(id=10, path="d/sub")), p.Done)
    error = await ask(peer, p.RmDir(id=11, path="d/sub"))
    assert isinstance(error, p.Error) and error.code == "not_found"
    stats = await ask(peer, p.GetStats(id=12))
    assert isinstance(stats, p.StatsResult)
    counters = stats.counters
    assert (counters["mkdirs"], counters["rmdirs"], counters["listings"]) == (3, 4, 3)


async def test_directory_keys_are_extended_relinquished_and_approved(cluster, autojump_clock):
    writer = await cluster.raw("writer")
    await put(writer, "d/f", b"x")
    lister = await cluster.raw("lister")
    listing = await ask(lister, p.ScanDir(id=1, path="d"))
    root = await ask(lister, p.ScanDir(id=2, path=""))
    assert isinstance(listing, p.Entries) and isinstance(root, p.Entries)
    extended = await ask(
        lister, p.Extend(id=3, paths=["d/", "/", "e/"], versions=[listing.version, 1, 1])
    )
    assert isinstance(extended, p.Extended) and extended.terms == [TERM, None, None]
    assert isinstance(await ask(lister, p.Relinquish(id=4, paths=["d/"])), p.Done)
    start = trio.current_time()
    await put(writer, "d/g", b"y")  # no one holds d/ now: no wait
    assert trio.current_time() == at(start)


# ---------------------------------------------------------------- ranges and big files
async def test_a_ranged_read_returns_its_bytes_under_the_files_lease(cluster, autojump_clock):
    writer = await cluster.raw("writer")
    data = bytes(range(100))
    version = await put(writer, "f", data)
    reader = await cluster.raw("reader")
    cases = [(10, 20, data[10:30]), (90, 50, data[90:]), (100, 5, b""), (500, 5, b"")]
    for request_id, (offset, length, expected) in enumerate(cases, start=1):
        reply = await ask(reader, p.ReadRange(request_id, "f", offset, length))
        assert isinstance(reply, p.Chunk)
        assert (reply.version, reply.term, reply.size, reply.data) == (version, TERM, 100, expected)
    same = await ask(reader, p.ReadRange(9, "f", 0, 10, have=version))
    assert isinstance(same, p.NotModified) and same.version == version
    async with trio.open_nursery() as nursery:
        nursery.start_soon(put, writer, "f", b"new")
        request = await reader.receive()  # the range reader holds the file's lease
        assert isinstance(request, p.ApprovalRequest) and request.path == "f"
        await reader.send(p.Approve(path="f", write=request.write))
    error = await ask(reader, p.ReadRange(10, "f", -1, 10))
    assert isinstance(error, p.Error) and error.code == "protocol"


async def test_a_ranged_read_waits_behind_a_waiting_write(cluster, autojump_clock):
    writer = await cluster.raw("writer")
    await put(writer, "f", b"old")
    silent = await cluster.raw("silent")
    granted_at = trio.current_time()
    await silent.read("f")
    reader = await cluster.raw("reader")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(put, writer, "f", b"new")
        await trio.sleep(1.0)
        reply = await ask(reader, p.ReadRange(1, "f", 0, 10))
    assert isinstance(reply, p.Chunk) and reply.data == b"new"
    assert trio.current_time() == at(granted_at + TERM + SKEW)


async def test_a_large_file_is_read_in_chunks_of_one_version(cluster, root, autojump_clock):
    data = os.urandom(2 * CHUNK_SIZE + 12345)
    (root / "big").write_bytes(data)
    reader = await cluster.raw("reader")
    first = await reader.read("big")
    assert isinstance(first, p.Chunk) and first.size == len(data) and first.term == TERM
    assert first.data == data[:CHUNK_SIZE]
    parts = [first.data]
    for offset in range(CHUNK_SIZE, len(data), CHUNK_SIZE):
        chunk = await ask(reader, p.ReadRange(offset, "big", offset, CHUNK_SIZE))
        assert isinstance(chunk, p.Chunk) and chunk.version == first.version
        parts.append(chunk.data)
    assert b"".join(parts) == data
    same = await ask(reader, p.Read(id=2, path="big", have=first.version))
    assert isinstance(same, p.NotModified)


async def test_a_file_larger_than_a_frame_is_still_read(nursery, root, autojump_clock):
    cluster = Cluster(nursery, root, term=TERM, skew=SKEW, max_frame=64 * 1024)
    await cluster.start()
    data = os.urandom(200 * 1024)
    (root / "big").write_bytes(data)
    reader = await cluster.raw("reader")
    first = await reader.read("big")
    assert isinstance(first, p.Chunk) and first.size == len(data)
    assert first.data == data[: 63 * 1024]  # a chunk that fits the frame
    error = await ask(reader, p.ReadRange(2, "big", 0, CHUNK_SIZE))
    assert isinstance(error, p.Error) and error.code == "too_large"


async def test_in_place_write_and_truncate_are_seen_by_the_next_read(cluster, autojump_clock):
    peer = await cluster.raw("peer")
    v1 = await put(peer, "f", b"0123456789")
    reader = await cluster.raw("reader")
    assert isinstance(await reader.read("f"), p.Data)
    async with trio.open_nursery() as nursery:
        replies: list[p.Message | None] = []

        async def write_range() -> None:
            replies.append(await ask(peer, p.WriteRange(1, "f", 3, b"abc", if_version=v1)))

        nursery.start_soon(write_range)
        request = await reader.receive()
        assert isinstance(request, p.ApprovalRequest) and request.path == "f"
        await reader.send(p.Approve(path="f", write=request.write))
    [written] = replies
    assert isinstance(written, p.Written) and written.version > v1
    read = await reader.read("f", request_id=2)
    assert isinstance(read, p.Data) and read.data == b"012abc6789"
    assert read.version == written.version
    async with trio.open_nursery() as nursery:
        replies.clear()

        async def truncate() -> None:
            replies.append(await ask(peer, p.Truncate(3, "f", 4)))

        nursery.start_soon(truncate)
        request = await reader.receive()
        assert isinstance(request, p.ApprovalRequest)
        await reader.send(p.Approve(path="f", write=request.write))
    [cut] = replies
    assert isinstance(cut, p.Written) and cut.version > written.version
    read = await reader.read("f", request_id=4)
    assert isinstance(read, p.Data) and (read.data, read.version) == (b"012a", cut.version)
    conflict = await ask(peer, p.Truncate(5, "f", 0, if_version=v1))
    assert isinstance(conflict, p.Error) and conflict.code == "conflict"


async def test_an_in_place_write_that_creates_a_file_waits_for_the_listing(cluster, autojump_clock):
    peer = await cluster.raw("peer")
    assert isinstance(await ask(peer, p.MkDir(id=1, path="d")), p.Done)
    silent = await cluster.raw("silent")
    granted_at = trio.current_time()
    assert isinstance(await ask(silent, p.ScanDir(id=1, path="d")), p.Entries)
    reply = await ask(peer, p.WriteRange(2, "d/new", 2, b"xy"))
    assert isinstance(reply, p.Written)
    assert trio.current_time() == at(granted_at + TERM + SKEW)
    read = await peer.read("d/new", request_id=3)
    assert isinstance(read, p.Data) and read.data == b"\0\0xy"


# ---------------------------------------------------------------- uploads
async def upload(peer: RawPeer, path: str, parts: list[bytes], upload_id: int = 100) -> None:
    assert isinstance(await ask(peer, p.UploadBegin(id=upload_id, path=path)), p.Done)
    offset = 0
    for i, part in enumerate(parts, start=1):
        reply = await ask(peer, p.UploadPart(upload_id + i, upload_id, offset, part))
        assert isinstance(reply, p.Done), reply
        offset += len(part)


async def test_an_upload_commit_against_a_silent_reader_waits_out_its_lease(
    cluster, root, autojump_clock
):
    writer = await cluster.raw("writer")
    await put(writer, "f", b"old")
    silent = await cluster.raw("silent")
    await trio.sleep(1.0)
    granted_at = trio.current_time()
    await silent.read("f")
    await upload(writer, "f", [b"new ", b"contents"])
    reply = await ask(writer, p.UploadCommit(id=200, upload=100))
    assert isinstance(reply, p.Written) and reply.term == TERM
    assert trio.current_time() == at(granted_at + TERM + SKEW)
    read = await writer.read("f", request_id=201)
    assert isinstance(read, p.Data) and read.data == b"new contents"
    assert read.version == reply.version
    assert temp_files(root) == []


async def test_an_upload_withdrawn_while_it_waits_for_a_silent_reader_is_never_applied(
    cluster, root, autojump_clock
):
    writer = await cluster.raw("writer")
    await put(writer, "f", b"old")
    silent = await cluster.raw("silent")
    await silent.read("f")
    await upload(writer, "f", [b"new ", b"contents"])
    await writer.send(p.UploadCommit(id=200, upload=100))
    await trio.sleep(1.0)  # the commit waits for silent's approval
    withdrawn = await ask(writer, p.UploadAbort(id=201, upload=100))
    assert isinstance(withdrawn, p.Error) and withdrawn.id == 200
    assert withdrawn.code == "conflict" and "withdrawn by its writer" in withdrawn.message
    assert await writer.receive() == p.Done(id=201)
    await trio.sleep(TERM + SKEW)  # silent's lease is over: nothing is left to apply
    read = await writer.read("f", request_id=202)
    assert isinstance(read, p.Data) and read.data == b"old"
    assert temp_files(root) == []
    assert cluster.service is not None
    stats = cluster.service.stats()
    assert (stats["writes_withdrawn"], stats["writes_pending"]) == (1, 0)


@pytest.mark.parametrize("applying", [False, True])
async def test_an_upload_withdrawn_while_its_data_is_synced_or_too_late_while_applied(
    cluster, root, autojump_clock, applying
):
    """Withdrawn while its data is fsynced, the commit is never queued; once the write
    is being applied, the abort is refused and the write goes on."""
    assert cluster.service is not None
    service, gate = cluster.service, trio.Event()
    calls = []  # the commit's blocking calls: its fsync, then (no holder) its apply

    async def slow_io(fn, *args):  # type: ignore[no-untyped-def]
        calls.append(fn)
        if len(calls) == 1 + applying:
            await gate.wait()
        return fn(*args)

    writer = await cluster.raw("writer")
    await put(writer, "f", b"old")
    await upload(writer, "f", [b"new"])
    service._blocking_io = slow_io  # type: ignore[method-assign]
    await writer.send(p.UploadCommit(id=200, upload=100))
    await trio.sleep(1.0)  # parked in the gated call
    abort = await ask(writer, p.UploadAbort(id=201, upload=100))
    gate.set()
    committed = await writer.receive()
    if applying:
        assert isinstance(abort, p.Error) and abort.code == "conflict"
        assert "too late to withdraw" in abort.message
        assert isinstance(committed, p.Written) and committed.id == 200
    else:
        assert abort == p.Done(id=201)
        assert isinstance(committed, p.Error) and committed.id == 200
    read = await writer.read("f", request_id=202)
    assert isinstance(read, p.Data) and read.data == (b"new" if applying else b"old")
    assert temp_files(root) == []


async def test_an_upload_that_makes_directories_waits_for_the_listings_they_join(
    cluster, root, autojump_clock
):
    writer = await cluster.raw("writer")
    silent = await cluster.raw("silent")
    granted_at = trio.current_time()
    assert isinstance(await ask(silent, p.ScanDir(id=1, path="")), p.Entries)
    await upload(writer, "new/dirs/f", [b"x" * CHUNK_SIZE, b"y"])
    reply = await ask(writer, p.UploadCommit(id=200, upload=100))
    assert isinstance(reply, p.Written)
    assert trio.current_time() == at(granted_at + TERM + SKEW)  # the root gains "new"
    assert (root / "new" / "dirs" / "f").stat().st_size == CHUNK_SIZE + 1
    assert temp_files(root) == []


async def test_an_upload_left_by_a_disconnect_leaves_no_temp_file(cluster, root, autojump_clock):
    peer = await cluster.raw("peer")
    await upload(peer, "f", [b"half of it"])
    assert len(temp_files(root)) == 1
    await peer.close()
    await trio.sleep(0.1)
    assert temp_files(root) == []
    assert not (root / "f").exists()


async def test_upload_refusals(cluster, root, autojump_clock):
    peer = await cluster.raw("peer")
    await upload(peer, "f", [b"abc"])
    bad_offset = await ask(peer, p.UploadPart(1, 100, 0, b"again"))
    assert isinstance(bad_offset, p.Error) and bad_offset.code == "protocol"
    no_such = await ask(peer, p.UploadPart(2, 999, 0, b"x"))
    assert isinstance(no_such, p.Error) and no_such.code == "protocol"
    assert isinstance(await ask(peer, p.UploadAbort(3, 100)), p.Done)
    after_abort = await ask(peer, p.UploadCommit(4, 100))
    assert isinstance(after_abort, p.Error) and after_abort.code == "protocol"
    for upload_id in range(10, 10 + MAX_UPLOADS):
        assert isinstance(await ask(peer, p.UploadBegin(upload_id, f"f{upload_id}")), p.Done)
    too_many = await ask(peer, p.UploadBegin(99, "one-more"))
    assert isinstance(too_many, p.Error) and too_many.code == "too_large"
    assert len(temp_files(root)) == MAX_UPLOADS
    stale = await ask(peer, p.UploadCommit(5, 10, if_version=12345))
    assert isinstance(stale, p.Error) and stale.code == "conflict"
    assert len(temp_files(root)) == MAX_UPLOADS - 1


# ---------------------------------------------------------------- real TCP, real threads
async def test_a_multi_chunk_upload_and_read_over_tcp(root):
    """Parts written and commits fsynced in worker threads, over a real socket."""
    settings = ServerSettings(root=str(root), port=0, term=TERM, skew=SKEW)
    data = os.urandom(3 * CHUNK_SIZE + 7)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            service = await nursery.start(serve, settings)
            stream = await trio.open_tcp_stream(service.host, service.port)
            peer = RawPeer(stream)
            welcome = await ask(peer, p.Hello(version=p.PROTOCOL_VERSION, client_id="tcp"))
            assert isinstance(welcome, p.Welcome)
            parts = [data[i : i + CHUNK_SIZE] for i in range(0, len(data), CHUNK_SIZE)]
            assert isinstance(await ask(peer, p.MkDir(1, "dir")), p.Done)
            await upload(peer, "dir/big", parts)
            committed = await ask(peer, p.UploadCommit(id=2, upload=100))
            assert isinstance(committed, p.Written)
            first = await peer.read("dir/big", request_id=3)
            assert isinstance(first, p.Chunk) and first.version == committed.version
            received = [first.data]
            while sum(map(len, received)) < first.size:
                offset = sum(map(len, received))
                chunk = await ask(peer, p.ReadRange(4, "dir/big", offset, CHUNK_SIZE))
                assert isinstance(chunk, p.Chunk) and chunk.version == committed.version
                received.append(chunk.data)
            assert b"".join(received) == data
            stats = await ask(peer, p.GetStats(id=5))
            assert isinstance(stats, p.StatsResult)
            assert stats.counters["uploads"] == 1 and stats.counters["range_reads"] == 3
            await peer.close()
            nursery.cancel_scope.cancel()
    assert temp_files(root) == []
