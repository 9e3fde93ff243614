"""The client's reader: one task per connection applies the server's frames in order.

The test plays the server by hand over a memory stream pair (no TCP, no time), so it
chooses exactly which frames arrive together and in what order.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.client.client import DEAD_AFTER, PING_AFTER, Client, ClientCounters

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


async def with_scripted_server(
    nursery: trio.Nursery, script: Callable[[RawPeer], Awaitable[None]]
) -> Callable[[], AbstractAsyncContextManager[Client]]:
    """A client whose server is ``script`` (it starts after the handshake)."""
    client_side, server_side = trio.testing.memory_stream_pair()
    server = RawPeer(server_side)

    async def play() -> None:
        assert isinstance(await server.receive(), p.Hello)
        await server.send(WELCOME)
        await script(server)

    nursery.start_soon(play)

    async def opener() -> trio.abc.Stream:
        return client_side

    def client() -> AbstractAsyncContextManager[Client]:
        return fscache.open_client(opener=opener, client_id="c", clock=trio.current_time)

    return client


async def test_replies_out_of_order_reach_their_own_requests(nursery: trio.Nursery) -> None:
    async def script(server: RawPeer) -> None:
        first, second = await server.receive(), await server.receive()
        assert isinstance(first, p.Read) and isinstance(second, p.Read)
        replies = {
            read.id: p.encode(p.Data(id=read.id, version=1, term=10.0, data=read.path.encode()))
            for read in (first, second)
        }
        await server.send_bytes(replies[second.id] + replies[first.id])  # one chunk, reversed

    client = await with_scripted_server(nursery, script)
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
    nursery: trio.Nursery,
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

    open_scripted = await with_scripted_server(nursery, script)
    async with open_scripted() as c:
        client = c
        assert await c.read("f") == b"old"  # the reader applied both frames at once
        assert c.leased("f") is None
        await approved.wait()
        assert c.stats["approvals"] == 1


async def test_an_approval_request_while_no_request_waits_is_answered(
    nursery: trio.Nursery,
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

    open_scripted = await with_scripted_server(nursery, script)
    async with open_scripted() as c:
        assert await c.read("f") == b"old"
        cached.set()
        await approved.wait()
        assert "f" not in c.cache


async def test_a_connection_closed_while_a_request_waits_fails_it_as_unavailable(
    nursery: trio.Nursery,
) -> None:
    async def script(server: RawPeer) -> None:
        assert isinstance(await server.receive(), p.Read)
        await server.close()

    open_scripted = await with_scripted_server(nursery, script)
    async with open_scripted() as c:
        with pytest.raises(fscache.Unavailable, match="connection lost"):
            await c.read("f")


async def test_an_idle_client_keeps_no_timer_yet_gives_a_silent_server_up(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """While no request waits, the liveness watchdog sleeps without a deadline (ten
    thousand idle clients in a process cost it nothing); the first request wakes it,
    and a server that then stays silent is still given up after DEAD_AFTER."""

    async def script(server: RawPeer) -> None:
        await trio.sleep_forever()  # takes requests, answers none

    client = await with_scripted_server(nursery, script)
    async with client() as c:
        await trio.testing.wait_all_tasks_blocked()
        assert trio.lowlevel.current_statistics().seconds_to_next_deadline == math.inf
        asked = trio.current_time()
        with pytest.raises(fscache.Unavailable):
            await c.read("f")
        assert DEAD_AFTER <= trio.current_time() - asked <= DEAD_AFTER + PING_AFTER


def test_a_misspelt_client_counter_is_an_error() -> None:
    """Counters are a slotted dataclass: a typo fails (and mypy names it), never a new key."""
    counters = ClientCounters()
    counters.misses += 1
    with pytest.raises(AttributeError):
        counters.mises += 1  # type: ignore[attr-defined]
