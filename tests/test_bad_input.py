"""Bad input gets a clear typed error and harms nothing (``docs/design.md``,
"Guarantees", bad input; "Wire protocol", errors and codes).

Each test sends something malformed on one connection and then checks that a
well-behaved client on another connection carries on and the stored data is
untouched.

Test rules: memory streams and the mock clock (``tests.harness.Cluster``), except
where only a real socket shows the behaviour (a peer that stops reading); that test
is on 127.0.0.1, port 0, and polls under ``trio.fail_after`` without timing anything.
"""

from __future__ import annotations

import contextlib
import logging
import struct

import cbor2
import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.server.service import ServerSettings, serve
from fscache.settings import BadSetting

from .harness import Cluster, RawPeer


@pytest.fixture
async def cluster(nursery, root):
    cluster = Cluster(nursery, root, max_frame=64 * 1024)
    await cluster.start()
    async with cluster.client("seeder") as c:
        await c.write("f", b"intact")
    return cluster


async def assert_service_unharmed(cluster: Cluster) -> None:
    async with cluster.client("bystander") as c:
        assert await c.read("f") == b"intact"
        await c.write("g", b"still works")
        assert await c.read("g") == b"still works"


async def closing_error(peer) -> p.Error:
    """The connection-level error the server sends before it closes the connection."""
    reply = await peer.receive()
    assert isinstance(reply, p.Error) and reply.id is None, reply
    assert await peer.receive() is None  # then it closed
    return reply


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x03abc",  # not CBOR
        b"\x00\x00\x00\x01\x01",  # CBOR, but not a map
        p.HEADER.pack(3) + cbor2.dumps({"t": 1}),  # a type that is not a string
        p.HEADER.pack(len(cbor2.dumps({"t": "nope"}))) + cbor2.dumps({"t": "nope"}),
        p.encode(p.Welcome(2, "x", 1.0, 0.1, 1, "s", b"k", resumed=False)),  # server's
        p.encode(p.Hello(version=1, client_id="again")),  # a second hello
    ],
    ids=["not-cbor", "not-a-map", "type-not-string", "unknown-type", "server-message", "hello"],
)
async def test_a_malformed_frame_closes_only_its_connection(cluster, garbage):
    peer = await cluster.raw("bad")
    await peer.send_bytes(garbage)
    error = await closing_error(peer)
    assert error.code == "protocol"
    await assert_service_unharmed(cluster)


async def test_a_frame_over_the_maximum_is_refused_before_its_body_arrives(cluster):
    peer = await cluster.raw("big")
    await peer.send_bytes(struct.pack(">I", 10 * 1024 * 1024))  # a header, no body
    error = await closing_error(peer)
    assert error.code == "too_large"
    await assert_service_unharmed(cluster)


def disconnects(caplog) -> dict[str, str]:
    """The reason of each ``disconnect`` event logged so far, by the client's label."""
    return {
        r.fields["label"]: r.fields["reason"]
        for r in caplog.records
        if getattr(r, "event", None) == "disconnect"
    }


@pytest.mark.parametrize(
    ("garbage", "said"),
    [
        (b"\x00\x00\x00\x03abc", "CBOR"),
        (p.HEADER.pack(len(cbor2.dumps({"t": "nope"}))) + cbor2.dumps({"t": "nope"}), "nope"),
        (struct.pack(">I", 10 * 1024 * 1024), "10485760"),
    ],
    ids=["not-cbor", "unknown-type", "oversized"],
)
async def test_a_connection_the_server_closes_is_logged_and_counted_as_dropped(
    cluster, caplog, garbage, said
):
    caplog.set_level(logging.INFO, logger="fscache.events")
    peer = await cluster.raw("bad")
    await peer.send_bytes(garbage)
    error = await closing_error(peer)
    reason = disconnects(caplog)["bad"]
    assert reason == f"dropped by the server: {error.message}" and said in reason, reason
    await assert_service_unharmed(cluster)
    assert disconnects(caplog)["bystander"] == "goodbye"
    assert cluster.service.stats()["connections_dropped"] == 1


async def test_a_frame_that_never_ends_is_a_drop_by_the_server(
    nursery, root, autojump_clock, caplog
):
    caplog.set_level(logging.INFO, logger="fscache.events")
    cluster = Cluster(nursery, root)
    await cluster.start()
    peer = await cluster.raw("slow")
    await peer.send_bytes(struct.pack(">I", 100) + b"\xa1")  # half a frame, then silence
    error = await closing_error(peer)
    assert "frame_timeout" in error.message
    assert disconnects(caplog)["slow"] == f"dropped by the server: {error.message}"
    assert cluster.service.stats()["connections_dropped"] == 1


async def test_mistyped_fields_are_a_protocol_error(cluster):
    peer = await cluster.raw("typo")
    body = {"t": "read", "id": 1, "path": 42}
    payload = cbor2.dumps(body)
    await peer.send_bytes(p.HEADER.pack(len(payload)) + payload)
    error = await closing_error(peer)
    assert "path" in error.message
    await assert_service_unharmed(cluster)


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../outside", "a/../../b", "nul\x00byte", "x" * 2000, "", ".fscache/x"]
)
async def test_a_bad_path_is_answered_with_bad_path_and_the_connection_lives(cluster, path):
    peer = await cluster.raw("paths")
    reply = await peer.read(path, request_id=7)
    assert isinstance(reply, p.Error) and reply.id == 7 and reply.code == "bad_path"
    reply = await peer.read("f", request_id=8)  # same connection, still serving
    assert isinstance(reply, p.Data) and reply.data == b"intact"
    await peer.close()
    await assert_service_unharmed(cluster)


async def test_client_api_raises_typed_errors(cluster):
    async with cluster.client("c") as c:
        with pytest.raises(fscache.BadPath):
            await c.read("../x")
        with pytest.raises(fscache.BadPath):
            await c.write("/abs", b"x")
        with pytest.raises(fscache.NotFound):
            await c.read("missing")
        with pytest.raises(fscache.NotFound):
            await c.delete("missing")
        with pytest.raises(fscache.TooLarge):
            await c.write("huge", b"x" * (64 * 1024))
        version = (await c.stat("f")).version
        with pytest.raises(fscache.Conflict):
            await c.write("f", b"lost", if_version=version - 1)
        assert await c.write("f", b"won", if_version=version) > version
        with pytest.raises(fscache.NotADirectory):  # listing a file, as scandir says
            await c.listdir("f")
        assert isinstance(fscache.Conflict("x"), fscache.FscacheError)


async def test_a_client_id_the_server_would_refuse_is_refused_before_connecting(cluster):
    with pytest.raises(TypeError, match=r"hello\.client_id: expected str, got int"):
        async with cluster.client(5):
            pass
    assert cluster.service is not None
    connections = cluster.service.counters.connections_total
    for bad, length in (("", 0), ("x" * 257, 257)):  # the server's rule, one function
        with pytest.raises(
            BadSetting, match=rf"client_id must be 1\.\.256 characters, not {length}"
        ):
            async with cluster.client(bad):
                pass
    with pytest.raises(BadSetting, match="client_id must be printable on one line"):
        async with cluster.client("two\nlines"):
            pass
    assert cluster.service.counters.connections_total == connections  # none was tried


async def query_by_hand(c: fscache.Client, name: str) -> p.Message:
    """A lock query of a name no path rule has checked: only the frame limit stops it."""
    return await c._call(await c._current_link(), lambda i: p.LockQuery(id=i, name=name))


async def test_arguments_the_server_would_refuse_are_refused_before_they_are_sent(cluster):
    """A mistyped or out-of-range argument is the caller's error: it costs neither the
    connection nor another request waiting on it."""
    async with cluster.client("c") as c, cluster.client("h") as holder:
        held = await holder.acquire("l", 5.0)
        async with trio.open_nursery() as nursery:
            waiter: list[object] = []

            async def wait_in_line() -> None:
                waiter.append(await c.acquire("l", 5.0))

            nursery.start_soon(wait_in_line)
            await trio.sleep(0.1)
            bad_calls = [
                (TypeError, "acquire.identity: expected str",
                 lambda: c.acquire("m", 5.0, identity=123)),
                (TypeError, "write.if_version: expected int",
                 lambda: c.write("f", b"x", if_version="1")),
                (BadSetting, "write.if_version: integer out of range",
                 lambda: c.write("f", b"x", if_version=2**70)),
                (BadSetting, "write.fence: integer out of range",
                 lambda: c.write("f", b"x", fence=("l", 2**70))),
                (TypeError, "a fence's token must be an int",
                 lambda: c.write("f", b"x", fence=("l", "abc"))),
                (TypeError, r"fence must be a Lock or \(name, token\)",
                 lambda: c.write("f", b"x", fence=123)),
                (BadSetting, "a fence's token must be >= 1",
                 lambda: c.write("f", b"x", fence=("never/locked", 0))),
                (BadSetting, "a fence's token must be >= 1",
                 lambda: c.delete("f", fence=("l", -1))),
                (BadSetting, r"identity must be 1\.\.256 characters, not 0",
                 lambda: c.acquire("m", 5.0, identity="")),
                (BadSetting, r"identity must be 1\.\.256 characters, not 0",
                 lambda: c.leadership("m", identity="").__aenter__()),
                (BadSetting, r"identity must be 1\.\.256 characters, not 257",
                 lambda: c.acquire("m", 5.0, identity="x" * 257)),
                (BadSetting, "identity must be printable on one line",
                 lambda: c.acquire("m", 5.0, identity="a\nb")),
                (fscache.TooLarge, "lock_query: a frame of .* over the server's frame limit",
                 lambda: query_by_hand(c, "x" * (p.DEFAULT_MAX_FRAME + 1))),
                (BadSetting, r"size must be 0..2\*\*63-1", lambda: c.truncate("f", 2**63)),
                (BadSetting, r"offset must be 0..2\*\*63-1",
                 lambda: c.write("f", b"x", offset=2**63)),
                (BadSetting, r"offset must be 0..2\*\*63-1", lambda: c.read("f", offset=2**63)),
                (BadSetting, r"length must be 0..2\*\*63-1", lambda: c.read("f", length=-1)),
            ]  # fmt: skip
            for kind, message, call in bad_calls:
                with pytest.raises(kind, match=message):
                    await call()
            await held.release()
        assert [lock.token for lock in waiter] == [2]  # its wait went on undisturbed
        assert c.stats["reconnects"] == 0 and c.stats["unavailable"] == 0
    await assert_service_unharmed(cluster)


async def test_a_client_that_stops_reading_is_dropped_and_others_carry_on(nursery, root):
    """Real TCP: only a real socket pushes back when its reader stops reading. The
    connection is dropped when its replies pass max_outbox or a send stalls for
    send_timeout, whichever comes first."""
    service = await nursery.start(
        serve,
        ServerSettings(
            root=str(root),
            port=0,
            max_frame=128 * 1024,
            max_outbox=256 * 1024,
            send_timeout=0.5,
            hot_writes=0,
        ),
    )
    async with fscache.open_client("127.0.0.1", service.port) as c:
        await c.write("big", b"x" * 60_000)
        greedy = RawPeer(await trio.open_tcp_stream("127.0.0.1", service.port))
        await greedy.send(p.Hello(version=p.PROTOCOL_VERSION, client_id="greedy"))
        with contextlib.suppress(trio.BrokenResourceError):  # dropped before it finished
            for i in range(200):  # 12 MB of replies it never reads
                await greedy.send(p.Read(id=i + 1, path="big"))
        with trio.fail_after(10):
            while service.stats()["connections_dropped"] == 0:
                await trio.sleep(0.01)
        assert await c.read("big") == b"x" * 60_000
        await c.write("other", b"fine")
        await greedy.close()


async def test_a_silent_connection_is_closed_after_the_handshake_timeout(
    nursery, root, autojump_clock
):
    cluster = Cluster(nursery, root)
    await cluster.start()
    stream = cluster._connect("mute")
    start = trio.current_time()
    assert await stream.receive_some(100) == b""  # closed on us without a hello
    assert trio.current_time() - start == pytest.approx(10.0)


async def test_a_wrong_protocol_version_is_refused_clearly(cluster):
    stream = cluster._connect("old")
    await stream.send_all(p.encode(p.Hello(version=99, client_id="old")))
    peer_decoder = p.FrameDecoder()
    peer_decoder.feed(await stream.receive_some(65536))
    reply = peer_decoder.next_message()
    assert isinstance(reply, p.Error) and "version 99" in reply.message


async def test_a_bad_frame_in_the_hellos_packet_gets_the_same_typed_error(cluster):
    stream = cluster._connect("eager")
    hello = p.encode(p.Hello(version=p.PROTOCOL_VERSION, client_id="eager"))
    await stream.send_all(hello + b"\x00\x00\x00\x03abc")  # hello, then garbage
    decoder = p.FrameDecoder()
    replies = []
    while (data := await stream.receive_some(65536)) != b"":
        decoder.feed(data)
        replies.extend(decoder)
    assert isinstance(replies[0], p.Welcome)
    assert isinstance(replies[1], p.Error) and replies[1].code == "protocol"
    assert cluster.service.stats()["protocol_errors"] == 1
    await assert_service_unharmed(cluster)


async def test_a_not_modified_reply_for_a_version_not_asked_about_is_refused(nursery):
    """A server that answers a plain read with not-modified (a bug, or not a server)
    gets a ProtocolError for that read, and the client caches nothing from it."""
    client_side, server_side = trio.testing.memory_stream_pair()
    server = RawPeer(server_side)  # the test plays the server

    async def play_server() -> None:
        assert isinstance(await server.receive(), p.Hello)
        await server.send(p.Welcome(version=p.PROTOCOL_VERSION, epoch="e", term=10.0,
                                    skew=0.1, max_frame=p.DEFAULT_MAX_FRAME, session="s",
                                    secret=b"k", resumed=False))  # fmt: skip
        read = await server.receive()
        assert isinstance(read, p.Read) and read.have is None
        await server.send(p.NotModified(id=read.id, version=7, term=10.0))
        read = await server.receive()  # asked again: now a proper answer
        assert isinstance(read, p.Read) and read.have is None
        await server.send(p.Data(id=read.id, version=8, term=10.0, data=b"ok"))

    nursery.start_soon(play_server)

    async def opener() -> trio.abc.Stream:
        return client_side

    async with fscache.open_client(opener=opener, client_id="c", clock=trio.current_time) as c:
        with pytest.raises(fscache.ProtocolError, match="not asked about"):
            await c.read("f")
        assert c.leased("f") is None
        assert await c.read("f") == b"ok"
        assert c.leased("f") is not None
