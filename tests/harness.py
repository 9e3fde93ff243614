"""A scripted network for service tests: one FileService fed by memory streams.

In the style of h11's ConnectionPair and raft-rs's test Network: a test starts a
:class:`Cluster`, attaches caching clients (the real ``fscache`` client over an
in-memory stream) and raw peers (hand-written protocol frames: a holder that goes
silent, one that crashes), and can cut any link. Writes are applied without a
worker thread, so virtual time does not move while a file is written and every
deadline can be asserted exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.client.client import Client
from fscache.server.service import FileService, ServerSettings


async def run_inline(fn: Callable[..., Any], *args: Any) -> Any:
    """The service's blocking-I/O seam, without a thread (so no time passes)."""
    return fn(*args)


class Cluster:
    def __init__(self, nursery: trio.Nursery, root: Any, **settings: Any) -> None:
        settings.setdefault("hot_writes", 0)
        self.nursery = nursery
        self.settings = ServerSettings(root=str(root), port=0, **settings)
        self.service: FileService | None = None
        self.links: dict[str, list[trio.abc.Stream]] = {}
        self.refuse = False  # when True, new connections fail (server unreachable)
        self.gates: dict[str, HeldStream] = {}

    async def start(self) -> FileService:
        self.service = FileService(self.settings, blocking_io=run_inline)
        await self.nursery.start(self.service.run_engine)
        return self.service

    def _connect(self, name: str) -> trio.abc.Stream:
        if self.refuse or self.service is None:
            raise OSError(111, "connection refused")
        client_side, server_side = trio.testing.memory_stream_pair()
        self.links.setdefault(name, []).append(client_side)
        held = self.gates.setdefault(name, HeldStream(client_side))
        held.inner = client_side
        held.broken = False
        self.nursery.start_soon(self.service.serve_stream, server_side)
        return held

    def hold(self, name: str) -> None:
        """Stop delivering the server's frames to ``name``: they are sent, and wait
        in flight (in order) until :meth:`release`."""
        self.gates[name].hold()

    def release(self, name: str) -> None:
        self.gates[name].release()

    def reset(self, name: str) -> None:
        """The next bytes ``name`` receives arrive as a connection reset instead."""
        self.gates[name].broken = True

    def opener(self, name: str) -> Callable[[], Any]:
        async def open_stream() -> trio.abc.Stream:
            return self._connect(name)

        return open_stream

    @contextlib.asynccontextmanager
    async def client(self, name: str, **kwargs: Any) -> AsyncIterator[Client]:
        async with fscache.open_client(
            client_id=name, opener=self.opener(name), clock=trio.current_time, **kwargs
        ) as client:
            yield client

    async def raw(self, name: str) -> RawPeer:
        peer = RawPeer(self._connect(name))
        await peer.send(p.Hello(version=p.PROTOCOL_VERSION, client_id=name))
        welcome = await peer.receive()
        assert isinstance(welcome, p.Welcome), welcome
        return peer

    async def cut(self, name: str) -> None:
        """Break every link of ``name`` at once (as a crash or a cable pull would)."""
        for stream in self.links.pop(name, []):
            await trio.aclose_forcefully(stream)


class HeldStream(trio.abc.Stream):
    """A client's end of a link, whose delivery of received bytes can be held."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.broken = False
        self._open = trio.Event()
        self._open.set()

    def hold(self) -> None:
        if self._open.is_set():
            self._open = trio.Event()

    def release(self) -> None:
        self._open.set()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        await self._open.wait()
        if self.broken:
            raise trio.BrokenResourceError("connection reset by peer")
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class RawPeer:
    """A client speaking frames by hand: it does only what the test tells it to."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = p.FrameDecoder()

    async def send(self, message: p.Message) -> None:
        await self.stream.send_all(p.encode(message))

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> p.Message | None:
        """The next message, or None once the server has closed the connection."""
        while (message := self.decoder.next_message()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.decoder.feed(data)
        return message

    async def read(self, path: str, request_id: int = 1) -> p.Message | None:
        await self.send(p.Read(id=request_id, path=path))
        return await self.receive()

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)
