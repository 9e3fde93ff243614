"""The socket wire and the server's outbox over real TCP: writes that do not fit the
kernel's buffer wait for the peer, and nothing is lost or reordered.

Test rules: real sockets, because the kernel's buffer is the point; 127.0.0.1 only,
every listener on port 0; a test sleeps only to poll, under ``trio.fail_after``, and
asserts what arrived and in which order, never how long it took.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from fscache.net import SocketWire, StreamWire, ready_now, wire_for
from fscache.server.service import Outbox

BIG = 32 << 20  # far more than a loopback socket buffers


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    async with listener:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listener.accept()
    return client, server


async def receive_exactly(stream: trio.SocketStream, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = await stream.receive_some(count - len(chunks))
        assert chunk, "connection closed early"
        chunks += chunk
    return bytes(chunks)


def pattern(size: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(256)) * (size // 256)


async def test_plain_tcp_gets_the_socket_wire_and_other_streams_the_stream_wire():
    client, server = await tcp_pair()
    async with client, server:
        assert isinstance(wire_for(client), SocketWire)
    left, _ = trio.testing.memory_stream_pair()
    assert isinstance(wire_for(left), StreamWire)


async def test_ready_now_says_whether_the_socket_has_bytes_or_room_this_instant():
    client, server = await tcp_pair()
    wire, stream_wire = SocketWire(server), StreamWire(server)  # the stream's socket too
    assert not ready_now(wire) and not ready_now(stream_wire)
    await client.send_all(b"ping")
    with trio.fail_after(5):
        while not ready_now(wire):  # (loopback delivers at once; a bound, not a wait)
            await trio.sleep(0.001)
    assert ready_now(stream_wire)
    assert ready_now(wire, to_write=True)
    while SocketWire(client).send_now(pattern(BIG, 2)):  # until the kernel takes nothing
        pass
    assert not ready_now(SocketWire(client), to_write=True)
    left, _ = trio.testing.memory_stream_pair()
    assert not ready_now(StreamWire(left))  # no socket: never ready
    await wire.aclose()
    assert not ready_now(wire)
    await client.aclose()


async def test_send_now_takes_what_fits_and_send_all_waits_for_the_rest():
    client, server = await tcp_pair()
    wire = SocketWire(client)
    data = pattern(BIG, 1)
    taken = wire.send_now(data)
    assert 0 < taken < len(data)  # the kernel took some, not all
    async with server, trio.open_nursery() as nursery:
        received: list[bytes] = []

        async def read_all() -> None:
            received.append(await receive_exactly(server, len(data)))

        nursery.start_soon(read_all)
        await wire.send_all(data[taken:])
    assert received == [data]
    await wire.aclose()
    with pytest.raises(trio.ClosedResourceError):
        wire.send_now(b"x")


async def test_the_outbox_sends_what_it_can_at_once_and_the_rest_in_order():
    client, server = await tcp_pair()
    wire = SocketWire(server)
    outbox = Outbox(wire, limit=4 * BIG)
    first, second, third = pattern(BIG, 1), pattern(4096, 2), pattern(BIG, 3)
    outbox.batching = True  # as the server's receive loop does while it dispatches
    outbox.put(first)
    outbox.put(second)
    assert outbox.flush_now() is False  # the peer is not reading: some is left
    assert 0 < outbox.nbytes < len(first) + len(second)
    outbox.put(third)  # queued while the rest waits: goes after it
    async with client, trio.open_nursery() as nursery:
        received: list[bytes] = []

        async def read_all() -> None:
            received.append(await receive_exactly(client, 2 * BIG + 4096))

        nursery.start_soon(read_all)
        await outbox.flush()
        nursery.start_soon(outbox.run)  # the sender task sends what flush left queued
        with trio.fail_after(30):
            while not received:
                await trio.sleep(0.01)
        outbox.close()
    assert received == [first + second + third]
    assert outbox.nbytes == 0
    await wire.aclose()


async def test_the_outbox_writes_a_small_batch_at_once():
    client, server = await tcp_pair()
    wire = SocketWire(server)
    outbox = Outbox(wire, limit=1 << 20)
    outbox.batching = True
    outbox.put(b"one")
    outbox.put(b"two")
    assert outbox.flush_now() is True
    assert outbox.nbytes == 0
    async with client:
        assert await receive_exactly(client, 6) == b"onetwo"
    await wire.aclose()
