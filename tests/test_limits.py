"""Limits: no one frame, connection or client can take the server from the rest.

Each attack found by trying the code is a test here. Timing tests run under
``autojump_clock`` over memory streams (harness.py) and assert exact virtual
instants; the memory test runs a real server process over real TCP and asserts its
peak resident memory under a documented bound (a safety bound, not a speed).
"""

from __future__ import annotations

import datetime
import decimal
import fractions
import logging
import os
import re
import threading
from pathlib import Path

import cbor2
import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.server.service import ServerSettings, serve
from fscache.server.store import Store
from fscache.settings import (
    DEFAULT_MAX_FRAME,
    FRAME_TIMEOUT,
    LISTING_PAGE_ENTRIES,
    MAX_PATHS,
    MAX_PENDING_WRITE_BYTES,
)

from .harness import Cluster, RawPeer
from .test_faults import figures, raw_peer, server_process
from .test_service_timing import SKEW, TERM, at, seed


async def started(nursery, root, **settings) -> Cluster:
    cluster = Cluster(nursery, root, term=TERM, skew=SKEW, **settings)
    await cluster.start()
    return cluster


async def ask(peer: RawPeer, message: p.Message) -> p.Message | None:
    await peer.send(message)
    return await peer.receive()


async def writes_behind_a_silent_holder(
    cluster: Cluster, *writes: p.Message
) -> tuple[RawPeer, RawPeer, float]:
    """``writes`` (and any other frames) sent on one connection, pipelined, to ``f``
    held by a client that answers nothing more: that holder, the writer, and when the
    holder's lease ends."""
    await seed(cluster)
    holder = await cluster.raw("silent")
    granted_at = trio.current_time()
    assert isinstance(await holder.read("f"), p.Data)
    writer = await cluster.raw("writer")
    for message in writes:
        await writer.send(message)
    return holder, writer, granted_at + TERM + SKEW


# ---------------------------------------------------------------- connections
async def test_a_connection_beyond_the_server_wide_cap_is_told_and_closed(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root, max_connections=2)
    await seed(cluster)
    first, second = await cluster.raw("a"), await cluster.raw("b")

    third = RawPeer(cluster._connect("c"))
    error = await third.receive()
    assert isinstance(error, p.Error) and error.id is None and error.code == "unavailable"
    assert "max_connections" in error.message
    assert await third.receive() is None
    for peer in (first, second):  # the others are served as before
        assert isinstance(await peer.read("f"), p.Data)
    assert cluster.service is not None and cluster.service.counters.connections_refused == 1


async def test_a_connection_beyond_its_identitys_cap_is_refused_before_the_welcome(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root, max_connections_per_identity=1)
    await seed(cluster)  # the seeder has gone: the anonymous identity is free again
    first = await cluster.raw("a")

    second = RawPeer(cluster._connect("b"))
    await second.send(p.Hello(version=p.PROTOCOL_VERSION, client_id="b"))
    error = await second.receive()
    assert isinstance(error, p.Error) and error.code == "unavailable"
    assert "'anonymous'" in error.message and "max_connections_per_identity" in error.message
    assert await second.receive() is None
    assert isinstance(await first.read("f"), p.Data)

    await first.send(p.Goodbye())
    await first.close()
    await trio.sleep(0.1)
    assert isinstance(await (await cluster.raw("c")).read("f"), p.Data)  # a slot again


async def test_refusals_at_either_connection_limit_are_one_warning_and_an_event_each(
    nursery, root, autojump_clock, caplog
):
    """Both limits are logged alike: a ``refused`` event each time, a WARNING naming
    the limit, the identity and the peer, of which the text log shows at most one a
    second per limit, the next one counting the rest."""
    caplog.set_level(logging.INFO, logger="fscache.events")
    cluster = await started(nursery, root, max_connections=3, max_connections_per_identity=1)
    await seed(cluster)
    await cluster.raw("a")
    for name in ("b", "c"):  # the identity's one connection is a's
        peer = RawPeer(cluster._connect(name))
        await peer.send(p.Hello(version=p.PROTOCOL_VERSION, client_id=name))
        assert isinstance(await peer.receive(), p.Error)
    await trio.sleep(1.0)  # past the throttle's second
    held = [cluster._connect(name) for name in ("d", "e")]  # no hello: 3 open with a's
    await trio.testing.wait_all_tasks_blocked()  # both counted before the next arrives
    refused = RawPeer(cluster._connect("f"))
    assert isinstance(await refused.receive(), p.Error)

    records = [r for r in caplog.records if getattr(r, "event", None) == "refused"]
    fields = [r.fields for r in records]
    assert [f["limit"] for f in fields] == ["max_connections_per_identity"] * 2 + [
        "max_connections"
    ]
    assert all(f["identity"] == "anonymous" and f["peer"] for f in fields)
    assert [f["open"] for f in fields] == [1, 1, 3]
    assert all(r.levelno == logging.WARNING for r in records)  # every one, whenever
    warnings = [r.getMessage() for r in records if not r.quiet]  # what the text log shows
    assert len(warnings) == 2, warnings  # the second refusal in the same second is quiet
    assert "max_connections_per_identity" in warnings[0] and "'anonymous'" in warnings[0]
    assert "the limit max_connections (3 connections open" in warnings[1]
    assert cluster.service is not None and cluster.service.counters.connections_refused == 3
    for stream in held:
        await stream.aclose()


async def test_a_connection_being_turned_away_is_not_counted_as_open(
    nursery, root, autojump_clock, caplog
):
    """While a refused connection is still being told why (its peer reads slowly: a
    TLS handshake, a full socket), the connections open are the limit's, not one
    more: a later refusal reports them, its message names the limit, and a slot
    freed meanwhile admits the next connection."""
    caplog.set_level(logging.INFO, logger="fscache.events")
    cluster = await started(nursery, root, max_connections=2)
    await seed(cluster)
    first, _second = await cluster.raw("a"), await cluster.raw("b")
    assert cluster.service is not None
    slow, server_side = trio.testing.lockstep_stream_pair()  # reads nothing yet
    nursery.start_soon(cluster.service.serve_stream, server_side)
    await trio.testing.wait_all_tasks_blocked()  # its refusal waits to be sent

    third = RawPeer(cluster._connect("c"))
    error = await third.receive()
    assert isinstance(error, p.Error) and error.code == "unavailable"
    assert "its limit max_connections=2 (2 connections open)" in error.message
    fields = [r.fields for r in caplog.records if getattr(r, "event", None) == "refused"]
    assert [(f["limit"], f["open"]) for f in fields] == [("max_connections", 2)] * 2

    await first.send(p.Goodbye())
    await first.close()
    await trio.sleep(0.1)  # the slow refusal is still being sent
    assert isinstance(await (await cluster.raw("d")).read("f"), p.Data)  # a slot again
    assert cluster.service.counters.connections_refused == 2
    await slow.aclose()


async def test_a_client_turned_away_at_its_identitys_cap_closes_its_connection(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root, max_connections_per_identity=1)
    await seed(cluster)
    await cluster.raw("a")

    with pytest.raises(fscache.Unavailable, match="max_connections_per_identity"):
        async with cluster.client("b"):
            pass
    (refused,) = cluster.links["b"]
    with pytest.raises(trio.ClosedResourceError):  # closed by the client, not left to GC
        await refused.send_all(b"x")


# ---------------------------------------------------------------- requests and writes held
async def test_a_write_beyond_the_pending_bytes_limit_is_refused_at_once(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root, max_pending_write_bytes=2500)
    writes = [p.Write(id=i, path="f", data=bytes(1000)) for i in (1, 2, 3)]
    holder, writer, expiry = await writes_behind_a_silent_holder(cluster, *writes)

    refused = await writer.receive()
    assert trio.current_time() == at(0.0)  # not held: answered on arrival
    assert isinstance(refused, p.Error) and refused.id == 3 and refused.code == "too_large"
    assert "max_pending_write_bytes=2500" in refused.message
    for i in (1, 2):  # the two within the limit wait out the silent holder
        written = await writer.receive()
        assert isinstance(written, p.Written) and written.id == i
        assert trio.current_time() == at(expiry)
    await writer.send(p.Write(id=4, path="f", data=bytes(2000)))  # room again
    assert isinstance(await writer.receive(), p.Written)
    await holder.close()


async def test_all_sessions_waiting_write_bytes_are_bounded_server_wide(
    nursery, root, autojump_clock
):
    cluster = await started(
        nursery, root, max_pending_write_bytes=2000, max_pending_write_bytes_total=3000
    )
    holder, first, expiry = await writes_behind_a_silent_holder(
        cluster, p.Write(id=1, path="f", data=bytes(2000))
    )
    second = await cluster.raw("second writer")
    await second.send(p.Write(id=2, path="f", data=bytes(1000)))  # 3000 in all: room
    await second.send(p.Write(id=3, path="f", data=bytes(1)))  # within its own, not the server's
    refused = await second.receive()
    assert trio.current_time() == at(0.0)  # not held: answered on arrival
    assert isinstance(refused, p.Error) and refused.id == 3 and refused.code == "too_large"
    assert "max_pending_write_bytes_total=3000" in refused.message
    written = await first.receive()  # the two within it wait, in arrival order
    assert isinstance(written, p.Written) and written.id == 1
    assert trio.current_time() == at(expiry)
    written = await second.receive()
    assert isinstance(written, p.Written) and written.id == 2
    assert isinstance(await ask(second, p.Write(id=4, path="g", data=bytes(2000))), p.Written)
    await holder.close()


async def test_a_resumed_session_shares_its_pending_bytes_with_its_lost_connection(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root, max_pending_write_bytes=2500)
    holder, _, expiry = await writes_behind_a_silent_holder(cluster)
    first = RawPeer(cluster._connect("writer"))
    welcome = await ask(first, p.Hello(p.PROTOCOL_VERSION, "writer"))
    assert isinstance(welcome, p.Welcome)
    await first.send(p.Write(id=1, path="f", data=bytes(2000)))
    assert isinstance(await ask(first, p.Ping(id=2)), p.Done)  # the write waits by now
    await cluster.cut("writer")  # no goodbye: the write still waits, holding its bytes

    again = RawPeer(cluster._connect("writer"))
    resume = p.Hello(p.PROTOCOL_VERSION, "writer", session=welcome.session, secret=welcome.secret)
    resumed = await ask(again, resume)
    assert isinstance(resumed, p.Welcome) and resumed.resumed
    refused = await ask(again, p.Write(id=3, path="g", data=bytes(1000)))
    assert isinstance(refused, p.Error) and refused.code == "too_large"
    assert "2000 bytes of this session's writes" in refused.message
    assert isinstance(await ask(again, p.Write(id=4, path="g", data=bytes(500))), p.Written)

    await trio.sleep_until(expiry + 1)  # the lost connection's write is applied: room again
    assert isinstance(await ask(again, p.Write(id=5, path="g", data=bytes(2500))), p.Written)
    await holder.close()


async def test_at_the_in_flight_cap_the_server_stops_reading_the_connection(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root, max_in_flight=2)
    writes = [p.Write(id=i, path="f", data=b"x") for i in (1, 2, 3)]
    holder, writer, expiry = await writes_behind_a_silent_holder(cluster, *writes, p.Ping(id=4))

    answered: dict[int, tuple[type[p.Message], float]] = {}
    while len(answered) < 4:
        reply = await writer.receive()
        assert reply is not None and hasattr(reply, "id")
        answered[reply.id] = (type(reply), trio.current_time())
    assert answered[4] == (p.Done, at(expiry))  # not read until the first two were answered
    assert all(answered[i][0] is p.Written for i in (1, 2, 3))  # nothing refused
    other = await cluster.raw("other")  # other connections were never slowed
    assert isinstance(await other.read("f"), p.Data)
    await holder.close()


# ---------------------------------------------------------------- leases and batches
async def three_reads_at_a_limit_of_two_leases(nursery, root) -> tuple[Cluster, RawPeer, list]:
    """A server that grants a session 2 leases; a reader that has read a, b and c."""
    cluster = await started(nursery, root, max_leases_per_holder=2)
    for name in ("a", "b", "c"):
        await seed(cluster, name)
    reader = await cluster.raw("reader")
    replies = [await reader.read(name, request_id=i) for i, name in enumerate("abc")]
    assert all(isinstance(reply, p.Data) for reply in replies)
    return cluster, reader, replies


async def test_a_read_beyond_the_holders_lease_limit_is_served_uncached(
    nursery, root, autojump_clock
):
    cluster, _, replies = await three_reads_at_a_limit_of_two_leases(nursery, root)
    assert [reply.term for reply in replies] == [TERM, TERM, 0.0]

    async with cluster.client("writer") as writer:  # no lease on c: its write waits for none
        await writer.write("c", b"v2")
        assert trio.current_time() == at(0.0)
    assert cluster.service is not None
    assert cluster.service.counters.reads_over_lease_limit == 1


async def test_an_extend_beyond_the_holders_lease_limit_answers_those_paths_stale(
    nursery, root, autojump_clock
):
    cluster, reader, replies = await three_reads_at_a_limit_of_two_leases(nursery, root)
    versions = [reply.version for reply in replies]
    await trio.sleep(TERM / 2)

    extended = await ask(reader, p.Extend(id=9, paths=["a", "b", "c"], versions=versions))
    assert isinstance(extended, p.Extended) and extended.terms == [TERM, TERM, None]
    async with cluster.client("writer") as writer:  # no lease on c: its write waits for none
        began = trio.current_time()
        await writer.write("c", b"v2")
        assert trio.current_time() == began
    assert cluster.service is not None
    assert cluster.service.counters.reads_over_lease_limit == 2  # c's read, then its extension


@pytest.mark.parametrize("kind", [p.Extend, p.Relinquish])
async def test_an_extend_or_relinquish_of_more_than_max_paths_is_refused(
    nursery, root, autojump_clock, kind
):
    cluster = await started(nursery, root)
    peer = await cluster.raw("peer")

    def message(n: int) -> p.Message:
        paths = [f"f{i}" for i in range(n)]
        if kind is p.Extend:
            return p.Extend(id=n, paths=paths, versions=[1] * n)
        return p.Relinquish(id=n, paths=paths)

    refused = await ask(peer, message(MAX_PATHS + 1))
    assert isinstance(refused, p.Error) and refused.code == "protocol"
    assert f"MAX_PATHS={MAX_PATHS}" in refused.message
    assert isinstance(await ask(peer, message(MAX_PATHS)), p.Extended | p.Done)


async def test_the_client_sends_long_relinquish_and_extend_lists_in_batches(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root)
    count = MAX_PATHS + 10
    for i in range(count):
        (root / f"f{i}").write_bytes(b"x")
    async with cluster.client("c") as client:
        for i in range(count):
            await client.read(f"f{i}")
        extended = await client.extend(*(f"f{i}" for i in range(count)))
        assert all(extended.values()) and len(extended) == count
        await client.relinquish(*(f"f{i}" for i in range(count)))
    assert cluster.service is not None
    counters = cluster.service.counters
    assert (counters.extend_requests, counters.extend_paths) == (2, count)
    assert counters.relinquish_requests == 2 and counters.protocol_errors == 0


# ---------------------------------------------------------------- frames
async def test_a_frame_that_stops_arriving_closes_the_connection_after_the_timeout(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root)
    await seed(cluster)
    idle = await cluster.raw("idle")
    slow = await cluster.raw("slow")
    began = trio.current_time()
    frame = p.encode(p.Read(id=1, path="f"))
    await slow.send_bytes(frame[:7])
    await trio.sleep(FRAME_TIMEOUT / 2)
    await slow.send_bytes(frame[7:9])  # trickling does not move the deadline

    error = await slow.receive()
    assert trio.current_time() == at(began + FRAME_TIMEOUT)
    assert isinstance(error, p.Error) and error.code == "protocol"
    assert "frame_timeout" in error.message
    assert await slow.receive() is None

    await trio.sleep(10 * FRAME_TIMEOUT)  # a whole idle connection is fine
    assert isinstance(await idle.read("f"), p.Data)


async def test_a_frame_begun_after_a_whole_one_gets_its_own_timeout(nursery, root, autojump_clock):
    cluster = await started(nursery, root)
    await seed(cluster)
    peer = await cluster.raw("peer")
    frame = p.encode(p.Read(id=1, path="f"))
    await peer.send_bytes(frame[:5])
    await trio.sleep(FRAME_TIMEOUT - 1)
    began = trio.current_time()
    await peer.send_bytes(frame[5:] + frame[:5])  # the first ends, a second begins
    assert isinstance(await peer.receive(), p.Data)
    error = await peer.receive()
    assert isinstance(error, p.Error) and trio.current_time() == at(began + FRAME_TIMEOUT)


def tagged(value: object) -> bytes:
    """A read request whose path is ``value``, written by cbor2 (as a CBOR tag)."""
    return cbor2.dumps({"t": "read", "id": 1, "path": value})


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(tagged(fractions.Fraction(1, 3)), id="fraction (tag 30)"),
        pytest.param(tagged(decimal.Decimal("1.5")), id="decimal (tag 4)"),
        pytest.param(tagged(re.compile("a+")), id="regex (tag 35)"),
        pytest.param(tagged(2**200), id="bignum (tag 2)"),
        pytest.param(
            tagged(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)), id="datetime (tag 0)"
        ),
        pytest.param(tagged([[["x", cbor2.CBORTag(1, 0)]]]), id="epoch (tag 1), nested"),
        pytest.param(b"\xa2\x61t\x64done\x62id\xd9\x03\xe7\x01", id="unknown tag 999"),
    ],
)
def test_cbor_tags_are_refused_before_anything_decodes_them(monkeypatch, payload):
    def decoded(*_: object, **__: object) -> None:
        raise AssertionError("cbor2 was asked to decode a frame holding a tag")

    monkeypatch.setattr(p.cbor2, "load", decoded)
    with pytest.raises(fscache.ProtocolError, match="CBOR tags are not allowed"):
        p.decode_message(payload)


def test_tag_bytes_inside_strings_are_data_and_a_big_frame_decodes():
    data = bytes([0xC0, 0xD8, 0xFF]) * (5 << 20)  # 15 MiB of bytes that look like tags
    message = p.Write(id=1, path="\u00c0\u00d8", data=data)
    frame = p.encode(message)
    assert p.decode_message(frame[p.HEADER.size :]) == message


@pytest.mark.parametrize(
    "frame",
    [
        p.read_frame(7, "docs/a.txt"),
        p.data_frame(7, 1_700_000_000_000_000_000, 10.0, b"x" * 100),
        p.encode(p.NotModified(id=7, version=1_700_000_000_000_000_000, term=10.0)),
        p.encode(p.Written(id=7, version=1_700_000_000_000_000_000, term=10.0)),
        *(
            p.encode(
                p.Entries(
                    id=7,
                    version=1_700_000_000_000_000_000,
                    term=10.0,
                    names=[f"n{i:05}" for i in range(4096)],
                    dirs=[i % 7 == 0 for i in range(4096)],
                    sizes=[i * 1000 for i in range(4096)],
                    versions=[1_700_000_000_000_000_000 + i for i in range(4096)],
                    more=more,
                )
            )
            for more in (True, False)
        ),  # a listing's pages, the one with more after it and the last
    ],
)
def test_the_read_path_decodes_without_the_tag_scan(monkeypatch, frame):
    def scanned(_: bytes) -> None:
        raise AssertionError("the read path ran the tag scan")

    monkeypatch.setattr(p, "_refuse_tags", scanned)
    assert p.decode_message(frame[p.HEADER.size :]).id == 7  # type: ignore[attr-defined]


# ---------------------------------------------------------------- listings
async def test_a_directory_of_20000_names_lists_fully_in_pages(nursery, root, autojump_clock):
    cluster = await started(nursery, root)
    big = root / "big"
    big.mkdir()
    names = sorted(f"n{i:05}" for i in range(20_000))
    for name in names:
        (big / name).touch()
    (big / "sub").mkdir()

    async with cluster.client("c") as client:
        entries = await client.scandir("big")  # every page, then cached whole
        assert [e.name for e in entries] == [*names, "sub"] and entries[-1].is_dir
        misses = client.stats["misses"]
        assert await client.scandir("big") == entries
        assert await client.listdir("big") == [*names, "sub/"]
        assert client.stats["misses"] == misses  # the whole listing was a hit

    peer = await cluster.raw("peer")
    pages: list[p.Entries] = []
    after = None
    while not pages or pages[-1].more:
        reply = await ask(peer, p.ScanDir(id=len(pages) + 1, path="big", after=after))
        assert isinstance(reply, p.Entries) and len(reply.names) <= LISTING_PAGE_ENTRIES
        pages.append(reply)
        after = reply.names[-1]
    assert [name for page in pages for name in page.names] == [*names, "sub"]
    assert len({page.version for page in pages}) == 1 and len(pages) > 1
    assert pages[-1].dirs[-1] is True

    listed: list[p.Listing] = []  # the lease-free listdir message pages the same way
    after = None
    while not listed or listed[-1].more:
        reply = await ask(peer, p.ListDir(id=100 + len(listed), path="big", after=after))
        assert isinstance(reply, p.Listing) and len(reply.names) <= LISTING_PAGE_ENTRIES
        listed.append(reply)
        after = reply.names[-1]
    assert [name for page in listed for name in page.names] == [*names, "sub/"]
    assert len(listed) > 1


async def test_a_listing_read_before_a_write_on_its_directory_is_read_again_after_it(
    nursery, root, autojump_clock
):
    cluster = await started(nursery, root)
    (root / "d").mkdir()
    (root / "d" / "old").write_bytes(b"")
    holder = await cluster.raw("silent")
    granted_at = trio.current_time()
    assert isinstance(await ask(holder, p.ScanDir(id=1, path="d")), p.Entries)
    writer = await cluster.raw("writer")
    await writer.send(p.Write(id=1, path="d/new", data=b"x"))  # waits for the silent holder
    reader = await cluster.raw("reader")

    listing = await ask(reader, p.ScanDir(id=1, path="d"))  # its page is read at once
    assert trio.current_time() == at(granted_at + TERM + SKEW)
    assert isinstance(listing, p.Entries) and listing.names == ["new", "old"]
    assert listing.term == TERM and isinstance(await writer.receive(), p.Written)
    await holder.close()


async def test_listings_are_read_in_a_worker_thread(nursery, root, monkeypatch):
    threads: list[threading.Thread] = []

    def recorded(method):
        def call(*args, **kwargs):
            threads.append(threading.current_thread())
            return method(*args, **kwargs)

        return call

    monkeypatch.setattr(Store, "scandir", recorded(Store.scandir))
    monkeypatch.setattr(Store, "list_page", recorded(Store.list_page))
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"x")
    server = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    async with fscache.open_client("127.0.0.1", server.port) as client:
        assert [entry.name for entry in await client.scandir("d")] == ["f"]
    async with raw_peer(server.port, "lister") as peer:
        listing = await ask(peer, p.ListDir(id=1, path="d"))
        assert isinstance(listing, p.Listing) and listing.names == ["f"]
    assert len(threads) == 2 and threading.main_thread() not in threads


def test_a_page_field_at_its_default_leaves_the_frame_as_it_was():
    assert p.encode(p.Listing(id=1, names=["a"])) == p._encode_generic(p.Listing(id=1, names=["a"]))
    assert b"more" not in p.encode(p.Listing(id=1, names=["a"]))
    assert b"after" not in p.encode(p.ScanDir(id=1, path="d"))
    assert p.decode_message(p.encode(p.Listing(id=1, names=[], more=True))[4:]) == p.Listing(
        id=1, names=[], more=True
    )


# ---------------------------------------------------------------- memory, in a real process
MEMORY_BOUND = 256 * 1024 * 1024  # bytes: a server's peak RSS under the attack below


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
async def test_pipelined_writes_behind_a_stopped_holder_leave_server_memory_bounded(
    tmp_path: Path,
):
    size = DEFAULT_MAX_FRAME - 1024  # the largest write one frame holds
    count = 48  # 32 wait within max_pending_write_bytes, 16 are refused
    async with server_process(tmp_path / "root", term=30.0) as server:
        pid = server.child.process.pid
        async with raw_peer(server.port, "seeder") as seeder:
            assert isinstance(await ask(seeder, p.Write(id=1, path="f", data=b"v1")), p.Written)
            assert isinstance(await ask(seeder, p.Write(id=2, path="g", data=b"g")), p.Written)
        async with (
            raw_peer(server.port, "holder") as holder,
            raw_peer(server.port, "attacker") as attacker,
            raw_peer(server.port, "bystander") as bystander,
        ):
            assert isinstance(await holder.read("f"), p.Data)  # and then it answers nothing
            data = bytes(size)
            replies: list[p.Message | None] = []
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:

                    async def collect() -> None:
                        for _ in range(count - MAX_PENDING_WRITE_BYTES // size):
                            replies.append(await attacker.receive())

                    nursery.start_soon(collect)
                    for i in range(count):
                        await attacker.send(p.Write(id=i, path="f", data=data))
                assert isinstance(await bystander.read("g"), p.Data)  # served meanwhile
            assert all(isinstance(r, p.Error) and r.code == "too_large" for r in replies)
            peak = peak_rss(pid)
            figures("server memory", peak_rss_mib=peak / 2**20, bound_mib=MEMORY_BOUND / 2**20)
            assert peak < MEMORY_BOUND
