"""The async client: one multiplexed connection, the lease cache, reconnection.

Theory of operation
-------------------
All requests share one connection; each carries an id and waits for the reply
with that id. Every frame from the server is handled *in order*, and its effect
on the cache is applied as it is read, before anyone is woken: a reply's data is
cached, then a later approval request drops it again, never the reverse. On an
approval request the entry is dropped first, then the approval is sent.

One reader task per connection reads every frame and applies it in order: a
reply is taken from the table of waiting requests (by id), its cache effect is
applied, its result set and its task woken; an approval request drops the entry
and is then answered, before the next frame is read.

A read that finds a trusted entry returns it without touching the socket (the
rule is :meth:`fscache.cache.LeaseCache.lookup`: a dict lookup and a clock
comparison). Otherwise concurrent
misses on one path share one request, sent with the cached version (if any) so
an unchanged file costs a not-modified reply and no data.

The transport's errors (a broken, closed or failed socket) become fscache's at
one boundary, :class:`_TransportErrors`. If the connection breaks (or stops
answering pings while requests wait), every waiting request fails with
:class:`Unavailable`, entries stay trusted until their expiry, and a background
task reconnects with exponential backoff. The server re-sends approval requests
we may have missed when we come back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import trio

from fscache import protocol as p
from fscache.cache import DEFAULT_MAX_BYTES, LeaseCache
from fscache.errors import (
    FscacheError,
    ProtocolError,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_for_code,
)
from fscache.net import Wire, wire_for
from fscache.paths import normalize
from fscache.settings import (
    DEFAULT_HOST,
    DEFAULT_MAX_FRAME,
    DEFAULT_PORT,
    DEFAULT_SKEW,
    MAX_PATHS,
    check_duration,
)
from fscache.tls import is_auth_failure

log = logging.getLogger("fscache.client")

Opener = Callable[[], Awaitable[trio.abc.Stream]]
M = TypeVar("M", bound=p.Message)

CONNECT_TIMEOUT = 5.0
RECONNECT_WAIT = 1.0  # a request waits this long for a lost connection to come back
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0
PING_AFTER = 1.0  # silence while requests wait before we ping
DEAD_AFTER = 3.0  # silence while requests wait before the connection is given up
RELINQUISH_BATCH = 256


@dataclasses.dataclass(frozen=True, slots=True)
class StatResult:
    path: str
    version: int
    size: int
    is_dir: bool


@dataclasses.dataclass(eq=False, slots=True)
class _Request:
    """One request waiting for its reply; the reader fills in ``reply`` or ``error``
    and sets ``done``."""

    path: str = ""
    message: p.Message | None = None  # built with its id as it is sent (not for reads)
    sent_at: float = 0.0
    have: int | None = None  # a revalidating read: the version it names ...
    data: bytes = b""  # ... and the cached data of that version
    id: int = 0
    reply: p.Message | None = None
    error: BaseException | None = None
    done: trio.Event = dataclasses.field(default_factory=trio.Event)


TRANSPORT_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class _TransportErrors:
    """``with _TransportErrors(client, doing):`` -- the one place where the transport's
    errors (trio's broken or closed stream, the socket's OSError) become fscache's:
    :class:`Unauthorized` when TLS refused a certificate (or, with ``tls_handshake``,
    when a TLS peer closed during our handshake: it refused our certificate), else
    :class:`Unavailable`."""

    __slots__ = ("client", "doing", "tls_handshake")

    def __init__(self, client: Client, doing: str, *, tls_handshake: bool = False) -> None:
        self.client = client
        self.doing = doing
        self.tls_handshake = tls_handshake

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, TRANSPORT_ERRORS):
            client = self.client
            if is_auth_failure(exc):
                raise Unauthorized(f"TLS with {client.address} failed: {_ssl_reason(exc)}") from exc
            if self.tls_handshake:
                raise Unauthorized(
                    f"{client.address} closed the TLS connection during the handshake; "
                    "it probably refused our client certificate"
                ) from exc
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise client._unavailable(f"{self.doing}: {reason or 'connection broken'}") from exc


class _Link:
    """One live connection: its wire, its waiting requests by id, its send turn."""

    def __init__(
        self,
        wire: Wire,
        decoder: p.FrameDecoder,
        welcome: p.Welcome,
        cancel: trio.CancelScope,
        errors: _TransportErrors,
    ) -> None:
        self.wire = wire
        self.decoder = decoder
        self.welcome = welcome
        self.cancel = cancel
        self.errors = errors
        self.waiting: dict[int, _Request] = {}
        self._sending = False  # one send_all at a time; waiters park in FIFO order
        self._send_turn = trio.lowlevel.ParkingLot()
        self.last_heard = 0.0
        self.broken = False

    async def send(self, message: p.Message) -> None:
        await self.send_frame(p.encode(message))

    async def send_frame(self, frame: bytes) -> None:
        """Send one frame (Unavailable if the connection is lost). Uncontended, this
        does not yield at all on plain TCP (the wait for the reply is the request's
        checkpoint); a lock's acquire would add a pass through the scheduler."""
        while self._sending:
            await self._send_turn.park()
        self._sending = True
        try:
            with self.errors:
                await self.wire.send_all(frame)
        finally:
            self._sending = False
            if self._send_turn:  # someone waits for its turn
                self._send_turn.unpark()


class Client:
    """A caching fscache client. Use :func:`open_client` to get one."""

    def __init__(
        self,
        opener: Opener,
        *,
        client_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        cache_bytes: int = DEFAULT_MAX_BYTES,
        skew: float | None = None,
        address: str = "server",
    ) -> None:
        self._opener = opener
        self.client_id = client_id or uuid.uuid4().hex
        self._clock = clock
        self._skew_override = None if skew is None else check_duration("skew", skew)
        self._cache = LeaseCache(
            skew=DEFAULT_SKEW if self._skew_override is None else self._skew_override,
            max_bytes=cache_bytes,
        )
        self._hits = 0
        self.address = address
        self.epoch: str | None = None
        self._link: _Link | None = None
        self._link_changed = trio.Event()
        self._next_id = 0
        self._inflight: dict[str, _Request] = {}  # single-flight misses, by path
        self._to_relinquish: list[str] = []
        # path: id of the last Relinquish sent for it. A reply to a request sent before
        # that must not be cached: the server has already dropped the lease it granted.
        self._relinquished: dict[str, int] = {}
        self._relinquish_wake = trio.Event()
        self._closing = False
        self._nursery: trio.Nursery | None = None
        # Awaited with the path of each approval request after its entry is dropped and
        # before the approval is sent: the mount clears the kernel's copy here.
        self.before_approval: list[Callable[[str], Awaitable[None]]] = []
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "misses", "not_modified", "reads_shared", "writes", "deletes",
                "approvals", "relinquished", "evictions", "reconnects", "unavailable",
                "extensions", "stale_extensions",
            ),
            0,
        )  # fmt: skip

    # ------------------------------------------------------------ public API
    async def read(self, path: str) -> bytes:
        """The contents of ``path``: from the cache while a lease covers it, else from
        the server (which grants a new lease)."""
        entry = self._cache.lookup(path, self._clock())
        if entry is not None:
            self._hits += 1
            return entry.data
        return await self._read_miss(path)

    async def write(self, path: str, data: bytes, *, if_version: int | None = None) -> int:
        """Write ``data`` to ``path`` durably; returns the new version. Waits until every
        other cache holding ``path`` has approved or its lease has run out."""
        path = normalize(path)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data must be bytes, not {type(data).__name__}")
        data = bytes(data)
        link = await self._current_link()
        if len(data) > link.welcome.max_frame - 1024:
            raise TooLarge(f"{len(data)} bytes is over the server's limit")
        self._counters["writes"] += 1
        reply = await self._call(
            link,
            lambda i: self._void_own_copy(
                i, path, p.Write(id=i, path=path, data=data, if_version=if_version)
            ),
            path,
        )
        assert isinstance(reply, p.Written)
        return reply.version

    async def delete(self, path: str, *, if_version: int | None = None) -> None:
        path = normalize(path)
        self._counters["deletes"] += 1
        link = await self._current_link()
        await self._call(
            link,
            lambda i: self._void_own_copy(
                i, path, p.Delete(id=i, path=path, if_version=if_version)
            ),
            path,
        )

    def _void_own_copy(self, request_id: int, path: str, message: M) -> M:
        """Builds the write or delete ``message`` of ``path`` as it is sent.

        The server asks every holder but the writer for approval, and other clients can
        read the new contents before our reply arrives -- or if it never does. So from
        now on our old copy is void: drop it, let no new reader join an older read, and
        do not cache the reply to any request sent before this one."""
        self._cache.drop(path)
        self._inflight.pop(path, None)
        self._relinquished[path] = request_id
        return message

    async def stat(self, path: str) -> StatResult:
        path = normalize(path, allow_root=True)
        link = await self._current_link()
        reply = await self._call(link, lambda i: p.Stat(id=i, path=path))
        assert isinstance(reply, p.StatResult)
        return StatResult(path, reply.version, reply.size, reply.is_dir)

    async def listdir(self, path: str = "") -> list[str]:
        path = normalize(path, allow_root=True)
        names: list[str] = []
        after: str | None = None
        while True:  # one page per request; the server says when there is more
            link = await self._current_link()
            reply = await self._call(link, partial(p.ListDir, path=path, after=after))
            assert isinstance(reply, p.Listing)
            names += reply.names
            if not reply.more or not reply.names:
                return names
            after = reply.names[-1]

    async def relinquish(self, *paths: str) -> None:
        """Drop ``paths`` from the cache and give their leases back to the server."""
        normal = [normalize(path) for path in paths]
        for path in normal:
            self._cache.drop(path)
        if not normal:
            return
        self._counters["relinquished"] += len(normal)
        for start in range(0, len(normal), MAX_PATHS):  # the server takes MAX_PATHS a message
            batch = normal[start : start + MAX_PATHS]
            link = await self._current_link()
            await self._call(link, partial(self._relinquish_message, paths=batch))

    def _relinquish_message(self, request_id: int, paths: list[str]) -> p.Relinquish:
        for path in paths:
            self._relinquished[path] = request_id
        return p.Relinquish(id=request_id, paths=paths)

    async def extend(self, *paths: str) -> dict[str, bool]:
        """Extend the leases of cached ``paths`` in one message; per path, whether the
        entry was still current (False: it was stale and has been dropped)."""
        entries = {normalize(path): self._cache.get(normalize(path)) for path in paths}
        cached = {path: e for path, e in entries.items() if e is not None}
        result = dict.fromkeys(entries, False)
        if not cached:
            return result
        every = list(cached)
        for start in range(0, len(every), MAX_PATHS):  # the server takes MAX_PATHS a message
            names = every[start : start + MAX_PATHS]
            link = await self._current_link()
            versions = [cached[n].version for n in names]
            request = await self._call_request(
                link, partial(p.Extend, paths=names, versions=versions)
            )
            reply = request.reply
            assert isinstance(reply, p.Extended)
            for name, term in zip(names, reply.terms, strict=False):
                ok = term is not None and self._cache.extend(
                    name, cached[name].version, term, request.sent_at
                )
                self._counters["extensions" if ok else "stale_extensions"] += 1
                if not ok:
                    self._cache.drop(name)
                result[name] = ok
        return result

    async def server_stats(self) -> dict[str, Any]:
        """The server's counters (what ``fscache stats`` prints)."""
        link = await self._current_link()
        reply = await self._call(link, lambda i: p.GetStats(id=i))
        assert isinstance(reply, p.StatsResult)
        return reply.counters

    def leased(self, path: str) -> StatResult | None:
        """The attributes of ``path`` as cached, if a trusted lease covers it now (no
        request: the lease that keeps the data current keeps its size current too)."""
        entry = self._cache.lookup(path, self._clock())
        if entry is None:
            return None
        return StatResult(path, entry.version, len(entry.data), False)

    def lease_remaining(self, path: str) -> float:
        """Seconds the lease on ``path`` is still trusted (0.0 if none)."""
        entry = self._cache.get(path)
        return max(0.0, entry.expiry - self._clock()) if entry is not None else 0.0

    @property
    def cache(self) -> LeaseCache:
        """The lease cache. Any thread may answer a read with ``cache.lookup(path,
        now)`` (``now`` on this client's clock); only the client changes it."""
        return self._cache

    @property
    def stats(self) -> Mapping[str, int | float]:
        """Client-side counters: hits, misses, ... (a snapshot)."""
        hits = self._hits
        lookups = hits + self._counters["misses"]
        return {
            "hits": hits,
            **self._counters,
            "evictions": self._cache.evictions,
            "cached_entries": len(self._cache),
            "cached_bytes": self._cache.nbytes,
            "hit_ratio": hits / lookups if lookups else 0.0,
        }

    @property
    def connected(self) -> bool:
        return self._link is not None and not self._link.broken

    # ------------------------------------------------------------ reads
    async def _read_miss(self, path: str) -> bytes:
        normal = normalize(path)
        if normal != path:  # another spelling of a path that may be cached
            return await self.read(normal)
        entry = self._cache.get(path)
        self._counters["misses"] += 1
        shared = self._inflight.get(path)
        if shared is not None:
            self._counters["reads_shared"] += 1
            await shared.done.wait()
            if shared.error is None or isinstance(shared.error, FscacheError):
                return self._read_result(shared)
            return await self._read_miss(path)  # its sender was cancelled: ask ourselves
        request = _Request(path)
        if entry is not None:  # revalidate it: an unchanged file costs no data
            request.have = entry.version
            request.data = entry.data
        self._inflight[path] = request
        try:
            link = self._link
            if link is None or link.broken or self._closing:
                link = await self._current_link()
            have = request.have
            await self._send_request(link, request, lambda i: p.read_frame(i, path, have))
        except BaseException as exc:
            if not request.done.is_set():
                request.error = exc
                request.done.set()
            raise
        finally:
            if self._inflight.get(path) is request:
                del self._inflight[path]
        return self._read_result(request)

    def _read_result(self, request: _Request) -> bytes:
        if request.error is not None:
            raise _copy_error(request.error)
        reply = request.reply
        if isinstance(reply, p.Data):
            return reply.data
        assert isinstance(reply, p.NotModified)
        return request.data

    # ------------------------------------------------------------ requests
    async def _call(
        self, link: _Link, make: Callable[[int], p.Message], path: str = ""
    ) -> p.Message:
        request = await self._call_request(link, make, path)
        assert request.reply is not None
        return request.reply

    async def _call_request(
        self, link: _Link, make: Callable[[int], p.Message], path: str = ""
    ) -> _Request:
        request = _Request(path)
        await self._send_request(link, request, make)
        return request

    async def _send_request(
        self, link: _Link, request: _Request, make: Callable[[int], p.Message | bytes]
    ) -> None:
        """Send what ``make`` builds for the request's id (a message, or a read's frame),
        wait for the reply (the reader fills it in), raise the server's error."""
        self._next_id += 1
        request_id = self._next_id
        built = make(request_id)
        if type(built) is bytes:
            frame = built
        else:
            assert isinstance(built, p.Message)
            request.message = built
            frame = p.encode(built)
        request.id = request_id
        request.sent_at = self._clock()
        if not link.waiting:
            link.last_heard = request.sent_at  # silence is measured from the first request
        link.waiting[request_id] = request
        try:
            await link.send_frame(frame)
            await request.done.wait()
        except Unavailable:
            self._link_lost(link)
            raise
        finally:
            link.waiting.pop(request_id, None)
        if request.error is not None:
            raise _copy_error(request.error)

    # ------------------------------------------------------------ the reader
    async def _read_link(self, link: _Link) -> None:
        """The connection's one reader: apply every frame in arrival order, answering
        an approval request before reading on. Returns when the server closes."""
        decoder = link.decoder
        on_reply = self._on_reply
        with link.errors:
            data: bytes | bytearray | memoryview = b""  # the frames that came with the welcome
            while True:
                decoder.feed(data)
                while (message := decoder.next_message()) is not None:
                    if type(message) is p.ApprovalRequest:
                        self._cache.drop(message.path)  # drop first ...
                        self._inflight.pop(message.path, None)  # (no reader joins an older answer)
                        self._counters["approvals"] += 1
                        for hook in self.before_approval:  # e.g. the mount's kernel cache
                            await hook(message.path)
                        await link.send(
                            p.Approve(path=message.path, write=message.write)
                        )  # ... then approve
                    else:
                        on_reply(link, message)
                data = await link.wire.receive()
                if not data:
                    return
                link.last_heard = self._clock()

    def _on_reply(self, link: _Link, message: p.Message) -> None:
        """Apply one reply (or the server's error) and wake the request it answers."""
        if type(message) is p.Error and message.id is None:
            raise error_for_code(message.code, message.message)
        request_id = getattr(message, "id", None)
        request = link.waiting.pop(request_id, None) if request_id is not None else None
        if request is not None:
            if type(message) is p.Error:
                request.error = error_for_code(message.code, message.message)
            else:
                request.reply = message
                self._apply_reply(request, message)
            request.done.set()
        if not link.waiting:
            self._relinquished.clear()  # every later request is newer than these

    def _apply_reply(self, request: _Request, reply: p.Message) -> None:
        """Cache effects of a successful reply (runs in the reader, in order)."""
        sent = request.message
        path = request.path
        if self._inflight.get(path) is request:
            del self._inflight[path]  # later readers must ask anew
        may_cache = not self._relinquished or request.id >= self._relinquished.get(path, 0)
        evicted: list[str] = []
        if type(reply) is p.Data:
            if may_cache:
                evicted = self._cache.store(
                    request.path, reply.data, reply.version, reply.term, request.sent_at
                )
        elif isinstance(reply, p.NotModified):
            self._counters["not_modified"] += 1
            if request.have != reply.version:  # also None: not a revalidating read
                request.reply = None  # a server bug; fail safe rather than guess
                request.error = ProtocolError("not-modified for a version not asked about")
            elif may_cache:
                evicted = self._cache.store(
                    request.path, request.data, reply.version, reply.term, request.sent_at
                )
        elif isinstance(reply, p.Written) and isinstance(sent, p.Write):
            if may_cache:
                evicted = self._cache.store(
                    request.path, sent.data, reply.version, reply.term, request.sent_at
                )
        elif isinstance(sent, p.Delete):
            self._cache.drop(request.path)
        if evicted:
            self._to_relinquish.extend(evicted)
            self._relinquish_wake.set()

    # ------------------------------------------------------------ connection management
    async def _connect_once(self) -> tuple[trio.abc.Stream, p.Welcome, p.FrameDecoder]:
        try:
            with trio.fail_after(CONNECT_TIMEOUT), _TransportErrors(self, "cannot connect"):
                stream = await self._opener()
        except trio.TooSlowError:
            raise self._unavailable("timed out connecting") from None
        decoder = p.FrameDecoder(DEFAULT_MAX_FRAME)
        handshake = _TransportErrors(
            self,
            "connection closed during the handshake",
            tls_handshake=isinstance(stream, trio.SSLStream),
        )
        try:
            with trio.fail_after(CONNECT_TIMEOUT), handshake:
                await stream.send_all(
                    p.encode(p.Hello(version=p.PROTOCOL_VERSION, client_id=self.client_id))
                )
                while (message := decoder.next_message()) is None:
                    data = await stream.receive_some(256 * 1024)
                    if not data:
                        raise trio.BrokenResourceError("the server closed the connection")
                    decoder.feed(data)
        except BaseException as exc:
            await trio.aclose_forcefully(stream)
            if isinstance(exc, trio.TooSlowError):
                raise self._unavailable("no answer to the handshake") from None
            raise
        if isinstance(message, p.Error):
            raise error_for_code(message.code, f"server refused the connection: {message.message}")
        if not isinstance(message, p.Welcome):
            await trio.aclose_forcefully(stream)
            raise ProtocolError(f"expected welcome, got {message.TYPE}")
        return stream, message, decoder

    async def _run(self, first: tuple[trio.abc.Stream, p.Welcome, p.FrameDecoder]) -> None:
        """Keep a connection up until closed: serve it, reconnect with backoff."""
        connection: tuple[trio.abc.Stream, p.Welcome, p.FrameDecoder] | None = first
        backoff = BACKOFF_FIRST
        while not self._closing:
            if connection is None:
                try:
                    connection = await self._connect_once()
                except FscacheError as exc:
                    log.debug("reconnect to %s failed: %s", self.address, exc)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                self._counters["reconnects"] += 1
            backoff = BACKOFF_FIRST
            await self._serve_link(*connection)
            connection = None

    async def _serve_link(
        self, stream: trio.abc.Stream, welcome: p.Welcome, decoder: p.FrameDecoder
    ) -> None:
        wire = wire_for(stream)
        with trio.CancelScope() as cancel:
            link = _Link(wire, decoder, welcome, cancel, _TransportErrors(self, "connection lost"))
            link.last_heard = self._clock()
            if self._skew_override is None:
                self._cache.skew = welcome.skew
            if self.epoch is not None and self.epoch != welcome.epoch:
                log.info("server restarted (epoch %s -> %s)", self.epoch, welcome.epoch)
            self.epoch = welcome.epoch
            self._set_link(link)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watchdog, link)
                    nursery.start_soon(self._relinquisher, link)
                    await self._read_link(link)
                    cancel.cancel()
            # except*: whether the reader's error arrives bare or grouped by the nursery
            except* Unavailable as lost:
                log.debug("connection to %s lost: %s", self.address, lost.exceptions[0])
            except* FscacheError as refused:
                log.warning("connection to %s closed: %s", self.address, refused.exceptions[0])
            finally:
                self._link_lost(link)
                await wire.aclose()

    async def _watchdog(self, link: _Link) -> None:
        """Ping while requests wait in silence; give the link up after DEAD_AFTER."""
        while True:
            await trio.sleep(PING_AFTER / 2)
            if not link.waiting:
                continue
            silent = self._clock() - link.last_heard
            if silent >= DEAD_AFTER:
                log.info("%s silent for %.1f s; reconnecting", self.address, silent)
                link.cancel.cancel()
                return
            if silent >= PING_AFTER:
                self._next_id += 1
                await link.send(p.Ping(id=self._next_id))

    async def _relinquisher(self, link: _Link) -> None:
        """Give back the leases of evicted entries, in batches."""
        while True:
            await self._relinquish_wake.wait()
            self._relinquish_wake = trio.Event()
            while self._to_relinquish:
                batch = self._to_relinquish[:RELINQUISH_BATCH]
                del self._to_relinquish[:RELINQUISH_BATCH]
                batch = [path for path in batch if path not in self._cache]
                if batch:
                    self._next_id += 1
                    await link.send(self._relinquish_message(self._next_id, batch))

    def _set_link(self, link: _Link) -> None:
        self._link = link
        self._link_changed.set()
        self._link_changed = trio.Event()

    def _link_lost(self, link: _Link) -> None:
        if link.broken:
            return
        link.broken = True
        link.cancel.cancel()  # the link's task closes the wire: a reader's wait ends
        if self._link is link:
            self._link = None
        for request in list(link.waiting.values()):
            if not request.done.is_set():
                request.error = self._unavailable("connection lost before the reply")
                request.done.set()
        link.waiting.clear()

    async def _current_link(self) -> _Link:
        """The live link; waits up to RECONNECT_WAIT for one, then Unavailable."""
        if self._closing:
            raise FscacheError("client is closed")
        link = self._link
        if link is not None and not link.broken:
            return link
        with trio.move_on_after(RECONNECT_WAIT):
            while self._link is None or self._link.broken:
                await self._link_changed.wait()
            return self._link
        raise self._unavailable("not connected")

    def _unavailable(self, why: str) -> Unavailable:
        self._counters["unavailable"] += 1
        return Unavailable(f"{self.address}: {why}")

    async def aclose(self) -> None:
        """Say goodbye (the server releases our leases) and close."""
        if self._closing:
            return
        self._closing = True
        link = self._link
        self._cache.clear()
        if link is not None and not link.broken:
            with trio.move_on_after(1.0), contextlib.suppress(Exception):
                await link.send(p.Goodbye())
            link.cancel.cancel()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


def _ssl_reason(exc: BaseException) -> str:
    """The innermost SSL error's words (e.g. 'certificate verify failed')."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return str(getattr(seen, "verify_message", None) or seen.reason or seen)
        seen = seen.__cause__ or seen.__context__
    return str(exc)


def _copy_error(error: BaseException) -> BaseException:
    """A fresh exception of the same kind, so concurrent waiters don't share tracebacks."""
    if isinstance(error, FscacheError):
        return type(error)(*error.args)
    return error


def parse_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``host:port``, ``host``, ``[v6]:port`` -> (host, port); FscacheError if malformed."""
    text = address.strip()
    if not text:
        raise FscacheError("empty address; expected HOST:PORT")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise FscacheError(f"bad address {address!r}: no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise FscacheError(f"bad address {address!r}: port must be 1..65535")
    return host, int(port_text)


def tcp_opener(host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> Opener:
    async def open_stream() -> trio.abc.Stream:
        if ssl_context is None:
            return await trio.open_tcp_stream(host, port)
        stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=ssl_context)
        try:
            await stream.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream

    return open_stream


@contextlib.asynccontextmanager
async def open_client(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    client_id: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    cache_bytes: int = DEFAULT_MAX_BYTES,
    clock: Callable[[], float] = time.monotonic,
    opener: Opener | None = None,
) -> AsyncIterator[Client]:
    """Connect to an fscache server; the client is usable inside the ``async with``.

    Raises :class:`Unavailable` if the first connection cannot be made. ``clock`` is
    the monotonic clock leases are timed on (``trio.current_time`` under a MockClock);
    ``opener`` replaces TCP with any trio stream (tests use memory streams)."""
    address = f"{host}:{port}"
    client = Client(
        opener or tcp_opener(host, port, ssl_context),
        client_id=client_id,
        clock=clock,
        cache_bytes=cache_bytes,
        address=address,
    )
    first = await client._connect_once()
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        client._nursery = nursery
        nursery.start_soon(client._run, first)
        try:
            yield client
        except BaseException as exc:  # re-raised below, outside the nursery: the
            body_error = exc  # caller sees NotFound itself, not an ExceptionGroup
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
    if body_error is not None:
        raise body_error


__all__ = ["DEFAULT_PORT", "Client", "StatResult", "open_client", "parse_address", "tcp_opener"]
