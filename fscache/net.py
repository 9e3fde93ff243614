"""The byte transport under both ends of a connection: a trio stream, or for plain TCP
the socket's descriptor driven directly. Both ends use it: the server
(``fscache.server.service``) and the client (``fscache.client.client``); it imports
nothing of theirs.

Why not just ``trio.SocketStream``: its ``send_all`` and ``receive_some`` pass through
the scheduler once more after every successful system call (trio's "checkpoint
sandwich"). On a request/reply connection that is one extra pass per message at
each end, on the critical path of every round trip. :class:`SocketWire` instead
writes with one non-blocking ``write`` (waiting for writability only when the
kernel's buffer is full) and reads after ``trio.lowlevel.wait_readable`` -- one
pass per message, which is also the checkpoint. TLS and in-memory streams (tests)
go through :class:`StreamWire`, which is the plain trio stream.

Memory: an idle connection holds no receive buffer. Every :class:`SocketWire` in one
trio run reads into the same buffer of :data:`RECEIVE_SIZE` bytes, which is safe
because one trio run is one thread and a receiver consumes (copies into its frame
decoder) what :meth:`SocketWire.receive` returned before it next awaits. So ten
thousand idle connections cost one 64 KiB buffer, not ten thousand.
"""

from __future__ import annotations

import ipaddress
import os
import select
from typing import Protocol

import trio

RECEIVE_SIZE = 64 * 1024  # per read; a bigger frame simply takes several reads

# The one receive buffer of a trio run, and a view of it (see the note above).
_RECEIVE_BUFFER: trio.lowlevel.RunVar[tuple[bytearray, memoryview]] = trio.lowlevel.RunVar(
    "fscache.net receive buffer"
)


def _receive_buffer() -> tuple[bytearray, memoryview]:
    """This trio run's receive buffer, made on first use."""
    try:
        return _RECEIVE_BUFFER.get()
    except LookupError:
        buffer = bytearray(RECEIVE_SIZE)
        _RECEIVE_BUFFER.set((buffer, memoryview(buffer)))
        return _RECEIVE_BUFFER.get()


class Wire(Protocol):
    async def receive(self) -> bytes | bytearray | memoryview:
        """The next bytes received, or empty at EOF. Valid only until the caller next
        awaits: the buffer behind them is shared by the run's connections."""
        ...

    async def send_all(self, data: bytes) -> None: ...

    async def aclose(self) -> None: ...


class StreamWire:
    """Any trio stream (TLS, memory streams in tests)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def receive(self) -> bytes | bytearray:
        return await self.stream.receive_some(RECEIVE_SIZE)

    async def send_all(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


class SocketWire:
    """A connected TCP socket, read and written on its descriptor.

    Only this object may close the socket (:meth:`aclose`): once it is closed no
    read or write touches the descriptor number again, which the kernel may by then
    have given to another file. Errors come out as trio's stream errors."""

    __slots__ = ("_buffer", "_view", "closed", "fd", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.fd = stream.socket.fileno()
        self.closed = False
        self._buffer, self._view = _receive_buffer()  # shared: see the module's note

    async def receive(self) -> memoryview:
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            data = self.read_now()
            if data is not None:
                return data

    def read_now(self) -> memoryview | None:
        """What the kernel has now (empty at EOF), or None if nothing has come."""
        if self.closed:
            raise trio.ClosedResourceError("connection was closed")
        try:
            count = os.readv(self.fd, (self._buffer,))
        except BlockingIOError:
            return None
        except OSError as exc:
            raise trio.BrokenResourceError(f"receive failed: {exc}") from exc
        return self._view[:count]

    def send_now(self, data: bytes | memoryview) -> int:
        """Write what the kernel takes now, without waiting: how many bytes that was."""
        if self.closed:
            raise trio.ClosedResourceError("connection was closed")
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc}") from exc

    async def send_all(self, data: bytes) -> None:
        sent = self.send_now(data)
        if sent == len(data):
            return
        view = memoryview(data)
        while sent < len(data):
            await trio.lowlevel.wait_writable(self.fd)
            sent += self.send_now(view[sent:])

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await trio.aclose_forcefully(self.stream)


def is_ipv6(text: str) -> bool:
    """Whether ``text`` is an IPv6 address (without brackets)."""
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def shown_address(host: str, port: int) -> str:
    """``HOST:PORT`` as people and ``parse_address`` read it: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def wire_for(stream: trio.abc.Stream) -> Wire:
    """The fastest wire for ``stream``: :class:`SocketWire` for a plain TCP stream."""
    if type(stream) is trio.SocketStream:
        return SocketWire(stream)
    return StreamWire(stream)


def ready_now(wire: Wire, *, to_write: bool = False) -> bool:
    """Whether the socket under ``wire`` has something to read this instant (bytes, or
    its end), or with ``to_write`` room to write: a poll that does not wait. A server
    that was itself paused (SIGSTOP, a stalled machine) asks this before it judges a
    client by the time it last read from it or wrote to it: the client may have
    spoken, or read, all along. False for a wire with no socket (in-memory tests)."""
    fd = _fd_of(wire)
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT if to_write else select.POLLIN)
    return bool(poller.poll(0))


def _fd_of(wire: Wire) -> int | None:
    if isinstance(wire, SocketWire):
        return None if wire.closed else wire.fd
    stream = getattr(wire, "stream", None)
    while stream is not None and not isinstance(stream, trio.SocketStream):
        stream = getattr(stream, "transport_stream", None)  # TLS over a socket
    if stream is None:
        return None
    fd = stream.socket.fileno()
    return fd if fd >= 0 else None
