"""A bare frame client: one trio stream, one request in flight, length-prefixed CBOR.

Used as the *same* load generator against the fscache server and the echo server,
so the two figures differ only in what the server does. Replies are decoded with
plain ``cbor2.loads``, as the echo server does.
"""

from __future__ import annotations

import uuid
from typing import Any

import cbor2
import trio

from fscache import protocol as p


class FrameConnection:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = bytearray()

    @classmethod
    async def open(cls, host: str, port: int) -> FrameConnection:
        """Connect and say hello (the fscache server answers Welcome, the echo server
        echoes the hello back)."""
        stream = await trio.open_tcp_stream(host, port)
        connection = cls(stream)
        hello = p.Hello(version=p.PROTOCOL_VERSION, client_id=uuid.uuid4().hex)
        try:
            await connection.call(p.encode(hello))
        except BaseException:
            await stream.aclose()
            raise
        return connection

    async def call(self, frame: bytes) -> Any:
        """Send one frame and return the next frame's decoded CBOR body."""
        await self.stream.send_all(frame)
        return await self.receive()

    async def receive(self) -> Any:
        buffer = self._buffer
        while True:
            if len(buffer) >= p.HEADER.size:
                (length,) = p.HEADER.unpack_from(buffer)
                end = p.HEADER.size + length
                if len(buffer) >= end:
                    body = cbor2.loads(bytes(buffer[p.HEADER.size : end]))
                    del buffer[:end]
                    return body
            data = await self.stream.receive_some(256 * 1024)
            if not data:
                raise trio.BrokenResourceError("connection closed")
            buffer += data

    async def aclose(self) -> None:
        await self.stream.aclose()
