"""The client's reader: one task per connection applies the server's frames in order.

The test plays the server by hand over a memory stream pair (no TCP, no time), so it
chooses exactly which frames arrive together and in what order.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.client.client import (
    DEAD_AFTER,
    PING_AFTER,
    Client,
    ClientCounters,
    _Link,
    _ReadTurn,
    _TransportErrors,
)
from fscache.net import SocketWire

from .harness import RawPeer

WELCOME = p.Welcome(
    version=p.PROTOCOL_VERSION,
    epoch="e",
    term=10.0,
    skew=0.1,
    max_frame=p.DEFAULT_MAX_FRAME,
    session="s",
    secret=b"k",
    resumed=False,
)


Script = Callable[[RawPeer], Awaitable[None]]
OpenScripted = Callable[[], AbstractAsyncContextManager[Client]]
ScriptedServer = Callable[[Script], Awaitable[OpenScripted]]


async def with_scripted_server(
    nursery: trio.Nursery, script: Script, transport: str = "memory"
) -> OpenScripted:
    """Start a server played by ``script`` (from after the handshake); return how to
    open a client of it. Over a memory stream the client's reader task reads every
    frame; over plain TCP a request's sender reads for its own reply when no other
    request does (``_ReadTurn``)."""

    async def play(stream: trio.abc.Stream) -> None:
        server = RawPeer(stream)
        assert isinstance(await server.receive(), p.Hello)
        await server.send(WELCOME)
        await script(server)

    opener: Callable[[], Awaitable[trio.abc.Stream]]
    if transport == "memory":
        client_side, server_side = trio.testing.memory_stream_pair()
        nursery.start_soon(play, server_side)

        async def opener() -> trio.abc.Stream:
            return client_side

    else:
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listener.socket.getsockname()[1]

        async def accept_one() -> None:
            async with listener:
                stream = await listener.accept()
            async with stream:
                await play(stream)

        nursery.start_soon(accept_one)

        async def opener() -> trio.abc.Stream:
            return await trio.open_tcp_stream("127.0.0.1", port)

    def client() -> AbstractAsyncContextManager[Client]:
        return fscache.open_client(opener=opener, client_id="c", clock=trio.current_time)

    return client


@pytest.fixture(params=["memory", "tcp"])
def scripted_server(request: pytest.FixtureRequest, nursery: trio.Nursery) -> ScriptedServer:
    """:func:`with_scripted_server` over each transport: every test here holds for both."""

    async def start(script: Script) -> OpenScripted:
        return await with_scripted_server(nursery, script, request.param)

    return start


async def test_replies_out_of_order_reach_their_own_requests(
    scripted_server: ScriptedServer,
) -> None:
    async def script(server: RawPeer) -> None:
        first, second = await server.receive(), await server.receive()
        assert isinstance(first, p.Read) and isinstance(second, p.Read)
        replies = {
            read.id: p.encode(p.Data(id=read.id, version=1, term=10.0, data=read.path.encode()))
            for read in (first, second)
        }
        await server.send_bytes(replies[second.id] + replies[first.id])  # one chunk, reversed

    client = await scripted_server(script)
    async with client() as c:
        results: dict[str, bytes] = {}

        async def read(path: str) -> None:
            results[path] = await c.read(path)

        async with trio.open_nursery() as readers:
            readers.start_soon(read, "a")
            readers.start_soon(read, "b")
        assert results == {"a": b"a", "b": b"b"}
        assert c.leased("a") is not None and c.leased("b") is not None


async def test_a_reply_then_an_approval_request_in_one_chunk_are_applied_in_order(
    scripted_server: ScriptedServer,
) -> None:
    """The data is cached, then dropped, and only then approved."""
    client: Client | None = None
    approved = trio.Event()

    async def script(server: RawPeer) -> None:
        read = await server.receive()
        assert isinstance(read, p.Read)
        await server.send_bytes(
            p.encode(p.Data(id=read.id, version=1, term=10.0, data=b"old"))
            + p.encode(p.ApprovalRequest(path="f", write=1))
        )
        approve = await server.receive()
        assert approve == p.Approve(path="f", write=1)
        assert client is not None and "f" not in client.cache  # dropped before approving
        approved.set()

    open_scripted = await scripted_server(script)
    async with open_scripted() as c:
        client = c
        assert await c.read("f") == b"old"  # the reader applied both frames at once
        assert c.leased("f") is None
        await approved.wait()
        assert c.stats["approvals"] == 1


async def test_an_approval_request_while_no_request_waits_is_answered(
    scripted_server: ScriptedServer,
) -> None:
    cached = trio.Event()
    approved = trio.Event()

    async def script(server: RawPeer) -> None:
        read = await server.receive()
        assert isinstance(read, p.Read)
        await server.send(p.Data(id=read.id, version=1, term=10.0, data=b"old"))
        await cached.wait()
        await server.send(p.ApprovalRequest(path="f", write=2))
        assert await server.receive() == p.Approve(path="f", write=2)
        approved.set()

    open_scripted = await scripted_server(script)
    async with open_scripted() as c:
        assert await c.read("f") == b"old"
        cached.set()
        await approved.wait()
        assert "f" not in c.cache


async def test_a_connection_closed_while_a_request_waits_fails_it_as_unavailable(
    scripted_server: ScriptedServer,
) -> None:
    async def script(server: RawPeer) -> None:
        assert isinstance(await server.receive(), p.Read)
        await server.close()

    open_scripted = await scripted_server(script)
    async with open_scripted() as c:
        with pytest.raises(fscache.Unavailable, match="connection lost"):
            await c.read("f")


async def test_an_idle_client_keeps_no_timer_yet_gives_a_silent_server_up(
    scripted_server: ScriptedServer, autojump_clock: trio.testing.MockClock
) -> None:
    """While no request waits, the liveness watchdog sleeps without a deadline (ten
    thousand idle clients in a process cost it nothing); the first request wakes it,
    and a server that then stays silent is still given up after DEAD_AFTER."""

    async def script(server: RawPeer) -> None:
        await trio.sleep_forever()  # takes requests, answers none

    client = await scripted_server(script)
    async with client() as c:
        await trio.testing.wait_all_tasks_blocked()
        assert trio.lowlevel.current_statistics().seconds_to_next_deadline == math.inf
        asked = trio.current_time()
        with pytest.raises(fscache.Unavailable):
            await c.read("f")
        assert DEAD_AFTER <= trio.current_time() - asked <= DEAD_AFTER + PING_AFTER


async def test_a_garbled_reply_ends_the_connection_and_fails_the_request(
    scripted_server: ScriptedServer,
) -> None:
    async def script(server: RawPeer) -> None:
        assert isinstance(await server.receive(), p.Read)
        await server.send_bytes(b"\x00\x00\x00\x01\xff")  # a frame that is not CBOR
        await trio.sleep_forever()

    open_scripted = await scripted_server(script)
    async with open_scripted() as c:
        with pytest.raises(fscache.Unavailable, match="connection lost"):
            await c.read("f")


# ---------------------------------------------------------------- the read turn (plain TCP)
ON_TCP = pytest.mark.parametrize("scripted_server", ["tcp"], indirect=True)


@ON_TCP
async def test_the_sender_of_a_request_reads_its_reply_then_the_reader_task_reads_again(
    scripted_server: ScriptedServer,
) -> None:
    """The idle connection's reader task waits for data; a read interrupts that wait and
    reads its own reply; then the reader task reads again, and answers an approval
    request that comes while no request waits."""
    turns: list[_ReadTurn] = []
    read_returned, approved = trio.Event(), trio.Event()

    async def script(server: RawPeer) -> None:
        read = await server.receive()
        assert isinstance(read, p.Read)
        assert turns[0].claimed  # the read's sender holds the turn while it waits
        await server.send(p.Data(id=read.id, version=1, term=10.0, data=b"x"))
        await read_returned.wait()  # so the approval request finds no request reading
        await server.send(p.ApprovalRequest(path="f", write=3))
        assert await server.receive() == p.Approve(path="f", write=3)
        approved.set()

    open_scripted = await scripted_server(script)
    async with open_scripted() as c:
        await trio.testing.wait_all_tasks_blocked()
        turn = c._link.turn if c._link is not None else None
        assert turn is not None and turn._spell is not None  # the reader task waits for data
        turns.append(turn)
        assert await c.read("f") == b"x"
        assert not turn.claimed
        read_returned.set()
        await approved.wait()  # read and answered by the reader task
        assert "f" not in c.cache and c.stats["approvals"] == 1


@ON_TCP
async def test_a_request_cancelled_while_it_reads_still_sends_the_approval_it_met(
    scripted_server: ScriptedServer,
) -> None:
    """An approval request that a request's sender reads is answered in full though the
    request is cancelled meanwhile; the turn goes back, and the connection goes on."""
    approved = trio.Event()

    async def script(server: RawPeer) -> None:
        first = await server.receive()
        assert isinstance(first, p.Read)
        await server.send(p.ApprovalRequest(path="g", write=7))
        assert await server.receive() == p.Approve(path="g", write=7)
        approved.set()
        await server.send(p.Data(id=first.id, version=1, term=10.0, data=b"late"))  # unwanted
        second = await server.receive()
        assert isinstance(second, p.Read) and second.path == "f"
        await server.send(p.Data(id=second.id, version=2, term=10.0, data=b"now"))

    open_scripted = await scripted_server(script)
    async with open_scripted() as c:
        await trio.testing.wait_all_tasks_blocked()
        link = c._link
        assert link is not None and link.turn is not None
        with trio.CancelScope() as scope:

            async def cancel_the_read(path: str) -> None:
                assert link.turn is not None and link.turn.claimed  # the read's sender reads
                scope.cancel()
                await trio.lowlevel.checkpoint()  # the approval is shielded: it goes on

            c.before_approval.append(cancel_the_read)
            await c.read("f")
        assert scope.cancelled_caught
        await approved.wait()
        c.before_approval.clear()
        assert await c.read("f") == b"now"
        assert c.stats["approvals"] == 1


async def test_an_approval_hook_that_waits_for_another_reply_does_not_hang_the_client(
    scripted_server: ScriptedServer,
) -> None:
    """The mount's hook waits for the kernel, which may wait for a lookup whose reply
    has come in behind the approval request: the hook runs beside the reader, which
    applies that reply, and the approval goes out when the hook returns."""

    async def script(server: RawPeer) -> None:
        await server.send(p.ApprovalRequest(path="g", write=5))
        read = await server.receive()  # sent by the hook
        assert isinstance(read, p.Read) and read.path == "f"
        await server.send(p.Data(id=read.id, version=1, term=10.0, data=b"f"))
        assert await server.receive() == p.Approve(path="g", write=5)
        approved.set()

    approved = trio.Event()
    open_scripted = await scripted_server(script)
    async with open_scripted() as c:
        hooked: list[bytes] = []

        async def hook(path: str) -> None:
            hooked.append(await c.read("f"))  # a reply the reader has yet to apply

        c.before_approval.append(hook)
        with trio.fail_after(30):  # a hang detector: it took no time at all
            await approved.wait()
        assert hooked == [b"f"]
        assert c.stats["approvals"] == 1


async def test_frames_the_kernel_takes_in_part_leave_whole_and_in_order() -> None:
    """A send the kernel takes only in part goes on waiting for room, and a later sender
    waits for it even when room has come: on the wire the frames are whole, in order."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setblocking(False)
    wire = SocketWire(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
    client = Client(opener=trio.open_tcp_stream)  # never connects: it names the errors
    link = _Link(wire, p.FrameDecoder(), WELCOME, trio.CancelScope(), _TransportErrors(client, "x"))
    first, second = b"a" * 300_000, b"b" * 300_000
    received = bytearray()

    def drain() -> None:
        with contextlib.suppress(BlockingIOError):
            while chunk := theirs.recv(1 << 20):
                received.extend(chunk)

    async def receive_the_rest() -> None:
        while len(received) < len(first) + len(second):
            await trio.lowlevel.wait_readable(theirs)
            drain()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.send_frame, first)
        await trio.testing.wait_all_tasks_blocked()
        assert link._sending  # the kernel took part of the first: it waits for room
        drain()  # room now, before the first sender has run again
        nursery.start_soon(receive_the_rest)
        await link.send_frame(second)
    assert bytes(received) == first + second
    await wire.aclose()
    theirs.close()


def test_a_misspelt_client_counter_is_an_error() -> None:
    """Counters are a slotted dataclass: a typo fails (and mypy names it), never a new key."""
    counters = ClientCounters()
    counters.misses += 1
    with pytest.raises(AttributeError):
        counters.mises += 1  # type: ignore[attr-defined]
