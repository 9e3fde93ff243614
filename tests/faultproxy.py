"""A fault-injecting TCP proxy for the fault tests: the network between one client and
the server, with a switch for each way a network fails.

Theory of operation
-------------------
:class:`FaultProxy` listens on 127.0.0.1 (port 0) and, for every connection it
accepts, opens one to the target and runs a :class:`_Pipe` each way. A pipe's
reader takes chunks off one socket and queues them, stamped with the time they may
leave (now + delay); its writer sends them on in order. A peer's close is queued
like a chunk, so it arrives in order too. The proxy's *mode* decides what happens:

``forward``  every byte goes through (after ``delay`` seconds, if set);
``pause``    nothing goes through either way and nothing is lost: bytes are held
             until :meth:`heal` delivers them, in order -- a partition that mends
             before TCP gives up;
``hold``     the server's bytes are held, the clients' go through: the server
             has answered, and its answers are slow to arrive;
``drop``     bytes read meanwhile are discarded -- a partition that loses data.
             A byte stream with a hole in it cannot resume, so :meth:`heal` closes
             every connection that lost bytes (as TCP would, by resetting it).

Connections opened while paused or dropping are accepted and held the same way, so
a client that reconnects during a partition sees its handshake hang, as it would.
:meth:`cut` closes both sides of every current connection at once (each peer sees
the other close); it does not change the mode.

The proxy never parses frames: it is a bad network, not a bad peer.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import trio

RECEIVE_SIZE = 64 * 1024


class _Closed(Exception):
    """A peer's close reached the other side: the connection is over."""


class _Pipe:
    """One direction of one proxied connection."""

    def __init__(
        self,
        proxy: FaultProxy,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        *,
        from_server: bool,
    ):
        self.proxy = proxy
        self.source = source
        self.sink = sink
        self.from_server = from_server
        self.queue: deque[tuple[float, bytes]] = deque()  # (due, chunk); b"" is a close
        self.wake = trio.Event()
        self.lost = False  # bytes were dropped: the stream has a hole

    async def read(self) -> None:
        while True:
            data = await self.source.receive_some(RECEIVE_SIZE)
            if self.proxy.mode == "drop":
                self.lost = True
                self.proxy.dropped_bytes += len(data)
            else:
                self.queue.append((trio.current_time() + self.proxy.delay, data))
                self.wake.set()
            if not data:
                return

    def _may_forward(self) -> bool:
        mode = self.proxy.mode
        return mode == "forward" or (mode == "hold" and not self.from_server)

    async def write(self) -> None:
        while True:
            while not self.queue or not self._may_forward():
                await self.wake.wait()
                self.wake = trio.Event()
            due, data = self.queue[0]
            if due > trio.current_time():
                with trio.move_on_at(due):
                    await self.wake.wait()  # the mode may change meanwhile
                    self.wake = trio.Event()
                continue
            self.queue.popleft()
            if not data:
                raise _Closed
            await self.sink.send_all(data)
            self.proxy.forwarded_bytes += len(data)


class FaultProxy:
    """``async with open_fault_proxy(host, port) as proxy``: clients connect to
    ``proxy.port``; the test calls ``pause()``, ``drop()``, ``set_delay()``, ``cut()``
    and ``heal()`` while they run."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.mode = "forward"
        self.delay = 0.0
        self.forwarded_bytes = 0
        self.dropped_bytes = 0
        self.connections_accepted = 0
        self._connections: dict[trio.CancelScope, tuple[_Pipe, _Pipe]] = {}

    # ------------------------------------------------------------ controls
    def pause(self) -> None:
        """Stop forwarding both ways; hold every byte until :meth:`heal`."""
        self._set_mode("pause")

    def hold_replies(self) -> None:
        """Hold the server's bytes until :meth:`heal`; let the clients' through."""
        self._set_mode("hold")

    def drop(self) -> None:
        """Discard every byte read from now on, both ways."""
        self._set_mode("drop")

    def set_delay(self, seconds: float) -> None:
        """Add ``seconds`` of latency, each way, to every chunk read from now on."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"delay must be a finite number >= 0, not {seconds!r}")
        self.delay = seconds

    def heal(self) -> None:
        """Forward again with no added delay: deliver held bytes in order, and close the
        connections that lost bytes."""
        self.delay = 0.0
        for cancel, pipes in list(self._connections.items()):
            if any(pipe.lost for pipe in pipes):
                cancel.cancel()
        self._set_mode("forward")

    def cut(self) -> None:
        """Close both sides of every current connection (the mode stays as it is)."""
        for cancel in list(self._connections):
            cancel.cancel()

    @property
    def connections(self) -> int:
        return len(self._connections)

    def _set_mode(self, mode: str) -> None:
        self.mode = mode
        for pipes in self._connections.values():
            for pipe in pipes:
                pipe.wake.set()

    # ------------------------------------------------------------ running
    async def run(
        self, *, task_status: trio.TaskStatus[FaultProxy] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._serve, listeners)
            task_status.started(self)

    async def _serve(self, downstream: trio.SocketStream) -> None:
        self.connections_accepted += 1
        try:
            upstream = await trio.open_tcp_stream(self.target_host, self.target_port)
        except OSError:
            await trio.aclose_forcefully(downstream)
            return
        pipes = (
            _Pipe(self, downstream, upstream, from_server=False),
            _Pipe(self, upstream, downstream, from_server=True),
        )
        with trio.CancelScope() as cancel:
            self._connections[cancel] = pipes
            try:
                async with trio.open_nursery() as nursery:
                    for pipe in pipes:
                        nursery.start_soon(_until_closed, pipe.read, cancel)
                        nursery.start_soon(_until_closed, pipe.write, cancel)
            finally:
                del self._connections[cancel]
                await trio.aclose_forcefully(upstream)
                await trio.aclose_forcefully(downstream)


async def _until_closed(run: Callable[[], Awaitable[None]], cancel: trio.CancelScope) -> None:
    """Run one half of a pipe; once either side is gone, close the connection both ways."""
    try:
        await run()
    except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        cancel.cancel()


@contextlib.asynccontextmanager
async def open_fault_proxy(target_host: str, target_port: int) -> AsyncIterator[FaultProxy]:
    """A running :class:`FaultProxy` in front of ``target_host:target_port``."""
    proxy = FaultProxy(target_host, target_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
