"""The async client: one multiplexed connection, the lease cache, reconnection.

Theory of operation
-------------------
All requests share one connection; each carries an id and waits for the reply
with that id. Every frame from the server is handled *in order*, and its effect
on the cache is applied as it is read, before anyone is woken: a reply's data is
cached, then a later approval request drops it again, never the reverse. On an
approval request the entry is dropped first, then the approval is sent.

Frames are applied in order by whoever reads the connection: a reply is taken
from the table of waiting requests (by id), its cache effect is applied, its
result set and its task woken; an approval request drops the entry and is then
answered, before the next frame is read. One reader task per connection reads
while no request does. On plain TCP the sender of a request reads for its own
reply when no other request is reading, which saves two passes through the
scheduler per round trip (:class:`_ReadTurn`, the one place this is arranged).

A read that finds a trusted entry returns it without touching the socket (the
rule is :meth:`fscache.cache.LeaseCache.lookup`: a dict lookup and a clock
comparison). Otherwise concurrent
misses on one path share one request, sent with the cached version (if any) so
an unchanged file costs a not-modified reply and no data.

A file larger than one chunk comes in chunks (:data:`~fscache.settings.CHUNK_SIZE`):
the first with a ``read``, the rest with ``read_range``, a few in flight at once,
each cached under the file's lease as it arrives (but for a streaming copy of a
big file: see Scans in :mod:`fscache.cache`). Every chunk of one read must
have one version; if they differ the file changed between them, and the read is
dropped and starts over. A big write goes up in parts (``upload_*``), a few in
flight; an upload that fails or is cancelled is aborted. Transfers hold at most
:data:`IN_FLIGHT` chunks of their own in memory.

An operation that changes names (a write that may create, a delete, rename,
mkdir, rmdir) voids this client's own copies of every key it touches as it is
sent, the parents' listings included: the server asks every holder but the
writer for approval.

The transport's errors (a broken, closed or failed socket) become fscache's at
one boundary, :class:`_TransportErrors`. If the connection breaks (or stops
answering pings while requests wait), every waiting request fails with
:class:`Unavailable`, entries stay trusted until their expiry, and a background
task reconnects with jittered exponential backoff. The server re-sends approval requests
we may have missed when we come back.

A client belongs to the trio run that opened it. A call from another run is
refused (:meth:`Client._check_run`) where it would first send a request or wait on
the client -- on a miss, never on a hit. The client's own tasks (the connection's,
lock renewers, approval hooks) run in a nursery of their own (:func:`open_client`),
which closing cancels: closing cancels nothing of its caller, and every call after
it raises that the client is closed.

Ephemeral files this client wrote are remembered (path and data) until it deletes
or overwrites them otherwise; when a welcome says the session is a new one (the
server restarted, or the old session expired), each is written again, ephemeral,
in the new session, unless another session has written the path since. Watches
(:mod:`fscache.client.watch`) are lease holders too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import ipaddress
import logging
import random
import socket
import ssl
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import IO, Any, NoReturn, TypeVar

import trio

from fscache import protocol as p
from fscache.cache import DEFAULT_MAX_BYTES, DirEntry, LeaseCache, dir_entries
from fscache.client import locks
from fscache.client.watch import Change, watch
from fscache.errors import (
    Conflict,
    FscacheError,
    ProtocolError,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_for_code,
)
from fscache.names import dir_key, parent
from fscache.net import SocketWire, Wire, is_ipv6, shown_address, wire_for
from fscache.paths import normalize_argument as normalize
from fscache.settings import (
    CHUNK_SIZE,
    DEFAULT_HOST,
    DEFAULT_LOCK_TTL,
    DEFAULT_MAX_FRAME,
    DEFAULT_PORT,
    DEFAULT_SKEW,
    MAX_PATHS,
    BadSetting,
    check_duration,
    check_extent,
    identity_problem,
)
from fscache.tls import CredentialsRefused, is_auth_failure, ssl_error_in

log = logging.getLogger("fscache.client")

# The client's own tasks (the connection's, the lock renewals, the approval hooks) are
# protected from KeyboardInterrupt. Trio raises a Ctrl-C in whatever unprotected code
# runs when it comes; inside one of these tasks it would end the connection (the
# caller's read would fail with Unavailable and the interrupt would be lost with the
# task) or cut a wait off half made. Protected, it reaches the caller's task instead,
# at once if that task is waiting, else at its next checkpoint: the caller sees
# KeyboardInterrupt, and the client closes as for any error in the body.
_background = trio.lowlevel.enable_ki_protection

Opener = Callable[[], Awaitable[trio.abc.Stream]]
M = TypeVar("M", bound=p.Message)

CONNECT_TIMEOUT = 5.0
# s: how long a reconnecting client waits for the welcome once the server has taken its
# connection. A server busy with a storm of reconnections answers them in arrival order;
# a client that gave up would only go to the back of the line, and the server would
# have done the work of its handshake for nothing.
RECONNECT_WELCOME_TIMEOUT = 30.0
RECONNECT_WAIT = 1.0  # a request waits this long for a lost connection to come back
BACKOFF_FIRST = 0.25  # s: the cap of the wait before the first attempt after a loss
BACKOFF_MAX = 4.0  # s: the cap doubles per failed attempt up to this
PING_AFTER = 1.0  # silence while requests wait before we ping
DEAD_AFTER = 3.0  # silence while requests wait before the connection is given up
RELINQUISH_BATCH = 256
IN_FLIGHT = 4  # chunk reads or upload parts a transfer keeps in flight (memory: 4 MiB)
READ_ATTEMPTS = 8  # a big file read whole that changes this often between chunks: give up

Source = IO[bytes] | bytes | bytearray | memoryview
Received = bytes | bytearray | memoryview  # what a wire's read gives
Fencing = locks.Fenced | p.Fence | None  # what fence= takes: a lock, or (name, token)

# A read's default offset. A cache hit tests ``offset is not _WHOLE`` for "a ranged
# read": as cheap as testing ``offset`` for truth, but every other offset (False,
# 0.0, None among them) takes the ranged branch and its checks, as on a miss. (Any
# int 0 is this one object in CPython; one that were not would only be sliced whole.)
_WHOLE = 0


_SHOWN_BYTES = 24  # of a peer that is no fscache server, in the error that says so

CLOSED = "client is closed"
OTHER_RUN = (
    "an async client belongs to the trio run that opened it: call it from that run's"
    " tasks (from another thread, with trio.from_thread.run), or open a client in this one"
)


def backoff_delay(failures: int) -> float:
    """The wait before a connection attempt after ``failures`` failed ones in a row
    since the connection was lost (the first attempt too: ``failures`` is 0): full
    jitter, uniform in [0, min(BACKOFF_MAX, BACKOFF_FIRST * 2**failures)]. Clients
    that lost one server together retry at spread-out times, not in lockstep waves
    that overflow its listen queue when it comes back; and each makes a few
    attempts while it is down, not one every few milliseconds."""
    cap = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(failures, 32))
    return _jitter.uniform(0.0, cap)


# The client's own generator: a reconnecting client in a background thread leaves the
# program's global random state (its seed, its sequence) alone.
_jitter = random.Random()


class _Changed(Exception):
    """The file changed between two chunks of one read (their versions differ)."""


@dataclasses.dataclass(slots=True)
class ClientCounters:
    """What a client counts besides its hits (kept apart: a hit is the hot path);
    :attr:`Client.stats` reports each field under its name."""

    misses: int = 0
    not_modified: int = 0
    reads_shared: int = 0
    writes: int = 0
    deletes: int = 0
    approvals: int = 0
    relinquished: int = 0
    reconnects: int = 0
    unavailable: int = 0
    extensions: int = 0
    stale_extensions: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class StatResult:
    """What :meth:`Client.stat` (and :meth:`Client.leased`) tells of a path: its
    version, its size in bytes (0 for a directory) and whether it is a directory."""

    path: str
    version: int
    size: int
    is_dir: bool


class _Request:
    """One request waiting for its reply; the reader fills in ``reply`` or ``error``
    and calls :meth:`finish`.

    Most requests are waited for by their own sender reading the connection
    (:class:`_ReadTurn`), which looks at ``done``; only a task that waits while
    another reads (:meth:`wait`) needs an event, so one is made for it alone: a
    miss makes none.

    The fields start as the class's values below, and a request sets only those it
    uses: a miss sets three of them. (No ``__slots__``: every field would have to be
    set in ``__init__``, 42 more bytecodes on every miss.)"""

    message: p.Message | None = None  # built with its id as it is sent (not reads)
    id = 0
    sent_at = 0.0
    have: int | None = None  # a revalidating read: the version it names ...
    data = b""  # ... and the cached data of that version
    entries: tuple[DirEntry, ...] = ()  # (a revalidating scandir: the listing)
    # A later page of a listing: the entries of the pages before it, and their version.
    earlier: Sequence[DirEntry] = ()
    earlier_version: int | None = None
    page: tuple[DirEntry, ...] = ()  # an Entries reply's rows, made by the reader
    size = 0  # (a revalidating chunk read: the file's size at that version)
    reply: p.Message | None = None
    error: BaseException | None = None
    done = False
    _finished: trio.Event | None = None  # made by the first wait()

    def __init__(self, path: str = "", *, scan: bool = False) -> None:
        self.path = path
        self.scan = scan  # a chunk read by a streaming copy (see the cache's Scans)

    def finish(self) -> None:
        """The reply (or error) is in: wake whoever waits."""
        self.done = True
        if self._finished is not None:
            self._finished.set()

    async def wait(self) -> None:
        """Until :meth:`finish` (a checkpoint, as ``trio.Event.wait`` is)."""
        if self.done:
            await trio.lowlevel.checkpoint()
            return
        if self._finished is None:
            self._finished = trio.Event()
        await self._finished.wait()


TRANSPORT_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class _TransportErrors:
    """``with _TransportErrors(client, doing):`` -- the one place where the transport's
    errors (trio's broken or closed stream, the socket's OSError) become fscache's:
    :class:`~fscache.tls.CredentialsRefused` (an :class:`Unauthorized`) when TLS
    refused a certificate (or, with ``tls_handshake``, when a TLS peer closed during
    our handshake: it refused our certificate), else :class:`Unavailable`.

    While a connection is being set up (``starting``) a mismatch is named, since
    neither end can say it: TLS that fails for a reason other than a certificate
    (a plain server answers a TLS hello with no TLS record), and ``plain_hint``'s
    words when a plain connection is closed (a TLS server drops a plain hello)."""

    __slots__ = ("client", "doing", "plain_hint", "starting", "tls_handshake")

    def __init__(
        self,
        client: Client,
        doing: str,
        *,
        tls_handshake: bool = False,
        starting: bool = False,
        plain_hint: str | None = None,
    ) -> None:
        self.client = client
        self.doing = doing
        self.tls_handshake = tls_handshake
        self.starting = starting
        self.plain_hint = plain_hint

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, TRANSPORT_ERRORS):
            self.raise_for(exc)

    def raise_for(self, exc: BaseException) -> NoReturn:
        """Raise fscache's error for ``exc``, a transport error (one of TRANSPORT_ERRORS):
        what the ``with`` does, for a ``try`` on a hot path (a ``with`` costs two calls)."""
        client = self.client
        if is_auth_failure(exc):
            raise CredentialsRefused(_refusal(client.address, exc)) from exc
        if self.tls_handshake:
            raise CredentialsRefused(
                f"{client.address} closed the TLS connection during the handshake; "
                "it probably refused our client certificate"
            ) from exc
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        reason = reason or "connection broken"
        if self.starting and ssl_error_in(exc) is not None:
            reason = (
                f"TLS handshake failed ({_ssl_reason(exc)});"
                " the server may not speak TLS (is it serving without --tls?)"
            )
        elif self.plain_hint is not None:
            reason = f"{reason}; {self.plain_hint}"
        raise client._unavailable(f"{self.doing}: {reason}") from exc


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
        # Plain TCP: a request's sender may read for its own reply (see _ReadTurn).
        self.turn = _ReadTurn(wire) if isinstance(wire, SocketWire) else None
        self.decoder = decoder
        self.welcome = welcome
        self.cancel = cancel
        self.errors = errors
        self.waiting: dict[int, _Request] = {}
        # Plain TCP: a frame is written from the sending task when the kernel takes it.
        self._send_now = wire.send_now if isinstance(wire, SocketWire) else None
        self._sending = False  # one send_all at a time; waiters park in FIFO order
        self._send_turn = trio.lowlevel.ParkingLot()
        self.last_heard = 0.0
        self.broken = False
        # Set by the first request while the watchdog sleeps for want of one: an idle
        # link keeps no timer (ten thousand idle clients in one process cost no CPU).
        self.watchdog_parked: trio.Event | None = None

    def requests_began(self) -> None:
        """A request waits where none did: silence from now on counts."""
        if self.watchdog_parked is not None:
            self.watchdog_parked.set()
            self.watchdog_parked = None

    async def send(self, message: p.Message) -> None:
        await self.send_frame(p.encode(message))

    async def send_frame(self, frame: bytes) -> None:
        """Send one frame (Unavailable if the connection is lost). Uncontended, this
        does not yield at all on plain TCP (the wait for the reply is the request's
        checkpoint); a lock's acquire would add a pass through the scheduler. When no
        send is under way and the kernel takes the frame whole, it is written here,
        with no further coroutine (a write's thousands of approvals each pass here)."""
        if not self._sending and self._send_now is not None:
            try:
                sent = self._send_now(frame)
            except TRANSPORT_ERRORS as exc:
                self.errors.raise_for(exc)
            if sent == len(frame):
                return
            frame = frame[sent:]  # the rest waits for room below, still first in line
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


class _ReadTurn:
    """Whose turn it is to read a plain TCP connection: the link's reader task, or the
    sender of one request, reading for its own reply.

    The plain design -- one reader task applies every frame and wakes the request each
    reply answers -- costs every round trip two more passes through trio's scheduler:
    one to wake the request's task, one for the reader to wait again. On the client
    they are about a sixth of a miss. So the sender of a request takes the turn when
    the reader task is not in the middle of applying frames and no other request holds
    it (:meth:`claim`): it reads and applies every frame that comes, in order and just
    as the reader task would (:meth:`Client._apply_frames`), until its own reply is in,
    and gives the turn back (:meth:`release`). A request that cannot claim the turn
    waits for its reply to be handed over, as in the plain design.

    The reader task (:meth:`run_reader`) reads whenever no request holds the turn, so
    that an idle connection still hears the server's approval requests. Exactly one
    task reads at a time, and frames are applied in arrival order:

    - the reader task reads inside a cancel scope, one per spell of reading (not one
      per wait: a cancel scope costs a tenth of the reader's time per frame), which
      :meth:`claim` cancels only while the reader waits for data (the wait ends at
      once, so the claimant may wait on the socket itself);
    - after a wait the reader reads only if no request took the turn meanwhile (a wait
      that had ended before the claim);
    - while the reader applies frames (an approval request may wait on a hook) no
      request can claim the turn, so no later frame overtakes them.

    An error the claimant meets comes back with the turn, and the reader task raises
    it: the connection ends in one place, whoever was reading. TLS and in-memory
    streams keep the plain design (``_Link.turn`` is None)."""

    __slots__ = ("_delivering", "_failed", "_released", "_spell", "claimed", "wire")

    def __init__(self, wire: SocketWire) -> None:
        self.wire = wire
        self.claimed = False  # a request's sender reads now
        # The reader task applies frames (first, what came with the welcome: until it
        # has, no request may read, or it could apply later frames before those).
        self._delivering = True
        self._spell: trio.CancelScope | None = None  # set while the reader waits for data
        self._released: trio.Event | None = None  # the reader task's wait for the turn
        self._failed: Exception | None = None  # met by a claimant, for the reader to raise

    def claim(self) -> bool:
        """Take the turn for a request about to wait for its reply; False if another
        request holds it, the reader task is applying frames, or a claimant met an
        error (the connection is ending)."""
        if self.claimed or self._delivering or self._failed is not None:
            return False
        self.claimed = True
        if self._spell is not None:
            self._spell.cancel()
            self._spell = None
        return True

    def release(self, failed: Exception | None = None) -> None:
        """The claimant has its reply, or stopped reading (``failed``: the error it met)."""
        self.claimed = False
        if failed is not None:
            self._failed = failed
        if self._released is not None:
            self._released.set()
            self._released = None

    async def run_reader(self, deliver: Callable[[Received], Awaitable[None]]) -> None:
        """The reader task's loop: hand ``deliver`` what comes while no request holds the
        turn (first, empty bytes: frames may have come with the welcome); return at EOF,
        raise what a claimant met."""
        await self._deliver(deliver, b"")
        while True:
            while self.claimed:
                self._released = released = trio.Event()
                await released.wait()
            if self._failed is not None:
                raise self._failed
            with trio.CancelScope() as spell:  # a spell of reading, until a claim
                while True:
                    self._spell = spell
                    await trio.lowlevel.wait_readable(self.wire.fd)
                    self._spell = None
                    if self.claimed:  # (a wait that ended before the claim: leave now)
                        break
                    data = self.wire.read_now()
                    if data is None:
                        continue
                    if not data:
                        return
                    await self._deliver(deliver, data)

    async def _deliver(
        self, deliver: Callable[[Received], Awaitable[None]], data: Received
    ) -> None:
        self._delivering = True
        try:
            await deliver(data)
        finally:
            self._delivering = False


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
        if client_id is not None:  # the server's checks, before anything is sent
            p.check_fields(p.Hello(p.PROTOCOL_VERSION, client_id))
            if (problem := identity_problem(client_id, "client_id")) is not None:
                raise BadSetting(problem)
        self.client_id = client_id or uuid.uuid4().hex
        self._clock = clock
        self._skew_override = None if skew is None else check_duration("skew", skew)
        check_extent("cache_bytes", cache_bytes)  # (the cache's own error names max_bytes)
        self._cache = LeaseCache(
            skew=DEFAULT_SKEW if self._skew_override is None else self._skew_override,
            max_bytes=cache_bytes,
        )
        self._hits = 0
        self.address = address
        self.epoch: str | None = None
        self._session: tuple[str, bytes] | None = None  # (id, secret) from the welcome
        self._link: _Link | None = None
        self._first_pending = False  # open_client's connection, welcomed, not yet served
        self._link_changed = trio.Event()
        self._link_wanted = trio.Event()  # set by a request waiting for a lost connection
        self._next_id = 0
        self._inflight: dict[str, _Request] = {}  # single-flight misses, by path
        self._to_relinquish: list[str] = []
        # path: id of the last Relinquish sent for it. A reply to a request sent before
        # that must not be cached: the server has already dropped the lease it granted.
        self._relinquished: dict[str, int] = {}
        self._relinquish_wake = trio.Event()
        self._closing = False
        # The run the client lives in: its calls are refused from any other (_check_run).
        self._trio_token = (
            trio.lowlevel.current_trio_token() if trio.lowlevel.in_trio_run() else None
        )
        # The client's own tasks (the connection's, renewers, hooks): closing cancels
        # them, not the code that uses the client (see open_client).
        self._nursery: trio.Nursery | None = None
        # Awaited with the path of each approval request after its entry is dropped and
        # before the approval is sent, and with each evicted path before its lease is
        # given back: the mount clears the kernel's copy here.
        self.before_approval: list[Callable[[str], Awaitable[None]]] = []
        self._counters = ClientCounters()
        self._lock_watches = locks.LockWatches()
        self._held_locks: dict[tuple[str, int], locks.Lock] = {}  # live locks by (name, token)
        self._ephemeral: dict[str, bytes] = {}  # path: data, written again in a new session
        self._ephemeral_held = trio.Event()  # set when _ephemeral may have become non-empty
        self._write_again = False  # a new session came; not all of _ephemeral written yet

    # ------------------------------------------------------------ public API
    async def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """The contents of ``path`` (bytes ``[offset, offset + length)`` of it; to the
        end when ``length`` is None): from the cache while a lease covers it, else from
        the server (which grants a new lease). A big file comes chunk by chunk, each
        cached under the file's lease. A bad ``offset`` or ``length`` raises
        ``TypeError`` or :class:`~fscache.settings.BadSetting` before anything is sent,
        on a hit as on a miss.

        Pass ``offset`` and ``length`` by keyword. They are not keyword-only because
        CPython fills keyword-only defaults from a dict on every call, which costs
        a cache hit about a sixth of its time."""
        entry = self._cache.lookup(path, self._clock())
        if entry is not None:
            self._hits += 1
            if offset is not _WHOLE or length is not None:
                return _cut(entry.data, offset, length)
            return entry.data
        return await self._read_miss(path, offset, length)

    async def read_into(self, path: str, file: IO[bytes]) -> int:
        """Copy the whole of ``path`` into the binary ``file``, chunk by chunk, holding
        at most a few chunks; returns the bytes copied. A scan (see the cache's
        theory note): the chunks of a file larger than a quarter of the cache's byte
        bound are handed over, not kept. If the file changes between chunks the copy
        starts over (a seekable ``file`` is rewound and cut; any other raises
        :class:`Conflict`). A ``file`` that cannot take bytes (a text file, one open
        for reading only) is refused with ``TypeError`` before anything is read."""
        path = normalize(path)
        if isinstance(file, io.TextIOBase) or not callable(getattr(file, "write", None)):
            raise TypeError(
                "file must be a binary file object open for writing (open(name, 'wb')),"
                f" not {type(file).__name__}"
            )
        writable = getattr(file, "writable", None)  # (a bare writer has only write)
        if writable is not None and not writable():
            raise TypeError(
                "file must be a binary file object open for writing (open(name, 'wb')):"
                f" this {type(file).__name__} is not writable (open for reading only?)"
            )
        seekable = getattr(file, "seekable", None)  # (a bare writer has only write)
        start = file.tell() if seekable is not None and seekable() else None

        async def sink(data: bytes) -> None:
            await trio.to_thread.run_sync(file.write, data)

        for _ in range(READ_ATTEMPTS):
            try:
                copied = await self._stream(path, 0, None, sink, scan=True)
            except _Changed:
                if start is None:
                    raise Conflict(f"{path} changed while it was copied") from None
                file.seek(start)
                file.truncate()
                continue
            if path not in self._cache:  # nothing kept: its lease would only hold up writers
                self._to_relinquish.append(path)
                self._relinquish_wake.set()
            return copied
        raise Conflict(f"{path} kept changing while it was copied")

    async def write(
        self,
        path: str,
        data: Source,
        *,
        if_version: int | None = None,
        offset: int | None = None,
        fence: Fencing = None,
        ephemeral: bool = False,
    ) -> int:
        """Write ``data`` (bytes, or a binary file object read chunk by chunk) to
        ``path`` durably; returns the new version. Waits until every other cache
        holding ``path`` has approved or its lease has run out.

        Without ``offset`` the file is replaced atomically (readers see the old or the
        new contents); more than one chunk goes up as an upload, a few parts in
        flight, aborted if anything fails. With ``offset`` the bytes are written in
        place at ``offset`` (the file is created if missing), one chunk per request:
        only each chunk is atomic. ``if_version``: compare-and-set. ``fence``: a lock
        (or its ``(name, token)``) whose token must still be the newest when the write
        is applied, else :class:`Conflict` (so for every change below).

        ``ephemeral``: the file lives as long as this client's session (a whole-file
        write: no ``offset``, else :class:`~fscache.settings.BadSetting`). The client
        keeps the data and writes it again, ephemeral, whenever it is given a new
        session (the server restarted, or the old session expired), so the file lasts
        as long as this client, until it deletes or overwrites it (or another session
        writes the path: then that write stands). A file object is therefore read
        whole into memory first, and then sent as bytes are (an upload if over one
        chunk): the client holds all of it for as long as it keeps the file."""
        path = normalize(path)
        fenced = locks.fence_of(fence)
        if not isinstance(data, bytes | bytearray | memoryview) and not hasattr(data, "read"):
            raise TypeError(f"data must be bytes or a binary file, not {type(data).__name__}")
        # The field checks of the options, before anything is sent: an upload's commit,
        # which carries them, goes after its parts.
        p.check_fields(p.Write(0, path, b"", if_version, fenced, ephemeral))
        _check_if_version(if_version)
        if ephemeral and offset is not None:
            raise BadSetting(
                "an ephemeral write replaces the whole file: it takes no offset (a write in"
                " place is a ranged write, which unties an ephemeral file)"
            )
        if ephemeral and not isinstance(data, bytes | bytearray | memoryview):
            data = await _read_all(data)  # kept whole to write again: see above
        if offset is not None:
            version = await self._write_in_place(path, data, offset, if_version, fenced)
        elif isinstance(data, bytes | bytearray | memoryview) and len(data) <= CHUNK_SIZE:
            version = await self._write_whole(path, bytes(data), if_version, fenced, ephemeral)
        else:
            next_part = _parts(data)
            first = await next_part()
            second = await next_part()
            if not second:  # a file of one chunk at most: one write, as for bytes
                version = await self._write_whole(path, first, if_version, fenced, ephemeral)
            else:
                parts = _chain((first, second), next_part)
                version = await self._upload(path, parts, if_version, fenced, ephemeral)
        self._ephemeral.pop(path, None)
        if ephemeral:
            assert isinstance(data, bytes | bytearray | memoryview)
            self._ephemeral[path] = bytes(data)
            self._ephemeral_held.set()  # the keep-alive pings from now on
        return version

    async def _write_whole(
        self,
        path: str,
        data: bytes,
        if_version: int | None,
        fence: p.Fence | None,
        ephemeral: bool = False,
    ) -> int:
        link = await self._current_link()
        if len(data) > link.welcome.max_frame - 1024:
            raise TooLarge(f"{len(data)} bytes is over the server's limit")
        self._counters.writes += 1
        write = partial(
            p.Write, path=path, data=data, if_version=if_version, fence=fence, ephemeral=ephemeral
        )
        reply = await self._change(link, _with_parent(path), write, path)
        assert isinstance(reply, p.Written)
        return reply.version

    async def _upload(
        self,
        path: str,
        next_part: Callable[[], Awaitable[bytes]],
        if_version: int | None,
        fence: p.Fence | None,
        ephemeral: bool = False,
    ) -> int:
        """Send the parts ``next_part`` gives as an upload: begin, parts (IN_FLIGHT at
        most), commit; abort on any error or cancellation before the commit's reply."""
        link = await self._current_link()
        self._counters.writes += 1
        begin = await self._start(link, _Request(path), lambda i: p.UploadBegin(id=i, path=path))
        upload = begin.id
        try:
            await self._finish(link, begin)
            sent = 0
            parts: deque[_Request] = deque()
            while part := await next_part():
                if len(parts) >= IN_FLIGHT:
                    await self._finish(link, parts.popleft())
                parts.append(
                    await self._start(
                        link,
                        _Request(path),
                        lambda i, at=sent, part=part: p.UploadPart(  # type: ignore[misc]
                            id=i, upload=upload, offset=at, data=part
                        ),
                    )
                )
                sent += len(part)
            while parts:
                await self._finish(link, parts.popleft())
            commit = partial(
                p.UploadCommit,
                upload=upload,
                if_version=if_version,
                fence=fence,
                ephemeral=ephemeral,
            )
            reply = await self._change(link, _with_parent(path), commit, path)
        except BaseException:
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(RECONNECT_WAIT),
                contextlib.suppress(FscacheError),
            ):
                await self._call(link, lambda i: p.UploadAbort(id=i, upload=upload))
            raise
        assert isinstance(reply, p.Written)
        return reply.version

    async def _write_in_place(
        self, path: str, data: Source, offset: int, if_version: int | None, fence: p.Fence | None
    ) -> int:
        check_extent("offset", offset)
        next_part = _parts(data)
        link = await self._current_link()
        self._counters.writes += 1
        version = None
        first = True
        while (part := await next_part()) or first:
            first = False
            write = partial(
                p.WriteRange,
                path=path,
                offset=offset,
                data=part,
                if_version=if_version,
                fence=fence,
            )
            reply = await self._change(link, _with_parent(path), write, path)
            assert isinstance(reply, p.Written)
            version = reply.version
            if if_version is not None:
                if_version = version  # the next chunk only on top of this one
            offset += len(part)
        assert version is not None
        return version

    async def truncate(
        self, path: str, size: int, *, if_version: int | None = None, fence: Fencing = None
    ) -> int:
        """Cut or extend ``path`` to ``size`` bytes (an extension reads as zero bytes);
        returns the new version. A missing file is created, ``size`` zero bytes long,
        as a write would create it, but only in a directory that exists
        (:class:`NotFound` otherwise: unlike :meth:`write`, truncate makes no
        directories); ``if_version=0`` creates it only if it does not exist.
        :class:`IsADirectory` for a directory."""
        path = normalize(path)
        check_extent("size", size)
        _check_if_version(if_version)
        self._counters.writes += 1
        link = await self._current_link()
        truncate = partial(
            p.Truncate, path=path, size=size, if_version=if_version, fence=locks.fence_of(fence)
        )
        reply = await self._change(link, _with_parent(path), truncate, path)
        assert isinstance(reply, p.Written)
        self._ephemeral.pop(path, None)
        return reply.version

    async def rename(self, src: str, dst: str, *, fence: Fencing = None) -> int:
        """Move ``src`` to ``dst`` atomically (POSIX ``rename``: an existing file at
        ``dst`` is replaced); returns the version now at ``dst``. Every other client's
        copies of either name (and of anything below a renamed directory) are gone
        before this returns."""
        src, dst = normalize(src), normalize(dst)
        for below in (dir_key(src), dir_key(dst)):
            self._cache.drop_beneath(below)
        keys = (*_with_parent(src), *_with_parent(dst), dir_key(src), dir_key(dst))
        link = await self._current_link()
        rename = partial(p.Rename, src=src, dst=dst, fence=locks.fence_of(fence))
        reply = await self._change(link, keys, rename, dst)
        assert isinstance(reply, p.Written)
        for path in [f for f in self._ephemeral if f == src or f.startswith(src + "/")]:
            self._ephemeral[dst + path[len(src) :]] = self._ephemeral.pop(path)  # moves too
        return reply.version

    async def mkdir(self, path: str, *, fence: Fencing = None) -> None:
        """Make directory ``path`` (:class:`Exists` if the name is taken,
        :class:`NotFound` if its parent is missing)."""
        path = normalize(path)
        keys = (dir_key(path), dir_key(parent(path)))
        link = await self._current_link()
        await self._change(link, keys, partial(p.MkDir, path=path, fence=locks.fence_of(fence)))

    async def rmdir(self, path: str, *, fence: Fencing = None) -> None:
        """Remove the empty directory ``path`` (:class:`NotEmpty`, :class:`NotADirectory`)."""
        path = normalize(path)
        keys = (dir_key(path), dir_key(parent(path)))
        link = await self._current_link()
        await self._change(link, keys, partial(p.RmDir, path=path, fence=locks.fence_of(fence)))

    async def scandir(self, path: str = "") -> list[DirEntry]:
        """The entries of directory ``path`` sorted by name, from the cache while a
        lease on the listing covers it, else from the server."""
        path = normalize(path, allow_root=True)
        key = dir_key(path)
        listing = self._cache.lookup_listing(key, self._clock())
        if listing is not None:
            self._hits += 1
            return list(listing.entries)
        self._counters.misses += 1
        for _ in range(READ_ATTEMPTS):
            entries = await self._scan_pages(path, key)
            if entries is not None:
                return list(entries)
        raise Conflict(f"{path or '/'} kept changing while it was listed")

    async def _scan_pages(self, path: str, key: str) -> tuple[DirEntry, ...] | None:
        """Every page of the listing of ``path``, all of one version (None if the
        directory changed between pages). The whole listing is cached as the reader
        handles its last page, so an approval request read after it drops it."""
        cached = self._cache.get_listing(key)
        earlier: list[DirEntry] = []
        version: int | None = None
        after: str | None = None
        while True:
            request = _Request(key)
            if after is None and cached is not None:  # revalidate: costs no entries
                request.have, request.entries = cached.version, cached.entries
            request.earlier, request.earlier_version = earlier, version
            link = await self._current_link()
            page = partial(p.ScanDir, path=path, have=request.have, after=after)
            await self._send_request(link, request, page)  # page(id): the id comes first
            reply = request.reply
            if not isinstance(reply, p.Entries):
                return request.entries  # not modified: the cached listing is current
            if version is not None and reply.version != version:
                return None
            version = reply.version
            earlier += request.page
            if not reply.more:
                return tuple(earlier)
            if not reply.names:  # its entries vanished as it was read: the directory changed
                return None
            after = reply.names[-1]

    async def delete(
        self, path: str, *, if_version: int | None = None, fence: Fencing = None
    ) -> None:
        """Delete the file ``path``, once every other cache holding it has approved or
        its lease has run out. :class:`NotFound` if there is none,
        :class:`IsADirectory` for a directory (:meth:`rmdir` removes one);
        ``if_version``: only if the file is at that version, else :class:`Conflict`;
        ``fence``: as for :meth:`write`."""
        path = normalize(path)
        _check_if_version(if_version)
        self._counters.deletes += 1
        link = await self._current_link()
        delete = partial(p.Delete, path=path, if_version=if_version, fence=locks.fence_of(fence))
        await self._change(link, _with_parent(path), delete, path)
        self._ephemeral.pop(path, None)

    async def _change(
        self, link: _Link, keys: Iterable[str], make: Callable[..., p.Message], path: str = ""
    ) -> p.Message:
        """Send ``make(id=...)``, a change of the names and listings ``keys``, voiding our
        own copies of them as it goes out (:meth:`_void_own_copies`); its reply."""
        return await self._call(link, lambda i: self._void_own_copies(i, keys, make(id=i)), path)

    def _void_own_copies(self, request_id: int, keys: Iterable[str], message: M) -> M:
        """Builds ``message``, a change of the names and listings ``keys``, as it is sent.

        The server asks every holder but the writer for approval, and other clients can
        read the new contents before our reply arrives -- or if it never does. So from
        now on our old copies are void: drop them, let no new reader join an older
        read, and do not cache the reply to any request sent before this one."""
        for key in keys:
            self._cache.drop(key)
            self._inflight.pop(key, None)
            self._relinquished[key] = request_id
        return message

    # ------------------------------------------------------------ locks (client/locks.py)
    async def acquire(
        self,
        name: str,
        ttl: float = DEFAULT_LOCK_TTL,
        *,
        timeout: float | None = None,
        identity: str | None = None,
    ) -> locks.Lock:
        """Take the lock ``name`` for ``ttl`` seconds, renewed in the background until
        released or lost; waits in line (at most ``timeout`` seconds, then
        :class:`LockTimeout`; 0: one try), through lost connections (it asks again
        once reconnected). ``identity``: who holds it, for :meth:`leader` (default:
        our client_id)."""
        return await locks.acquire(self, name, ttl, timeout=timeout, identity=identity)

    def lock(
        self,
        name: str,
        ttl: float = DEFAULT_LOCK_TTL,
        *,
        timeout: float | None = None,
        identity: str | None = None,
    ) -> contextlib.AbstractAsyncContextManager[locks.Lock]:
        """``async with c.lock(name, ttl) as lock``: hold the lock for the body, which is
        cancelled if the lock is lost (then :class:`LockLost` is raised)."""
        return locks.lock(self, name, ttl, timeout=timeout, identity=identity)

    def leadership(
        self, name: str, *, identity: str | None = None, ttl: float = DEFAULT_LOCK_TTL
    ) -> contextlib.AbstractAsyncContextManager[locks.Lock]:
        """``async with c.leadership(name, identity=...)``: wait to lead, lead for the
        body (a lock whose holder is known by ``identity``)."""
        return locks.lock(self, name, ttl, identity=identity)

    async def leader(self, name: str) -> str | None:
        """The identity of who leads ``name`` now (holds its lock), or None."""
        return await locks.leader(self, name)

    def watch_leader(self, name: str) -> locks.LeaderWatch:
        """``async for identity in c.watch_leader(name)``: the leader now, then at each
        change (None while nobody leads), through reconnects. Stop it with ``aclose()``
        or by ``async with c.watch_leader(name) as leaders`` (then the server stops
        sending its notices)."""
        return locks.LeaderWatch(self, name)

    async def stat(self, path: str) -> StatResult:
        """Version and size of ``path``: from the cache while a lease on the file is
        held, else from the server."""
        path = normalize(path, allow_root=True)
        leased = self.leased(path)
        if leased is not None:
            return leased
        link = await self._current_link()
        reply = await self._call(link, lambda i: p.Stat(id=i, path=path))
        assert isinstance(reply, p.StatResult)
        return StatResult(path, reply.version, reply.size, reply.is_dir)

    async def listdir(self, path: str = "") -> list[str]:
        """Sorted names in directory ``path``, directories with a trailing ``/``: the
        names of its :meth:`scandir` listing, so from the cache while the lease on the
        listing holds (:class:`NotADirectory` for a file, as :meth:`scandir` says)."""
        entries = await self.scandir(path)
        return [e.name + "/" if e.is_dir else e.name for e in entries]

    def watch(self, path: str = "", *, initial: bool = False) -> AsyncIterator[Change]:
        """The changes of the file or directory ``path`` (``""``: the root), as they
        happen: ``async for change in client.watch("services/api")``. ``initial``:
        first one ``created`` per existing entry. See :mod:`fscache.client.watch`."""
        return watch(self, path, initial=initial)

    async def relinquish(self, *paths: str) -> None:
        """Drop ``paths`` from the cache and give their leases back to the server."""
        normal = [normalize(path) for path in paths]
        for path in normal:
            self._cache.drop(path)
        if not normal:
            return
        self._counters.relinquished += len(normal)
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
                if ok:
                    self._counters.extensions += 1
                else:
                    self._counters.stale_extensions += 1
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
        now = self._clock()
        entry = self._cache.lookup(path, now)
        if entry is not None:
            return StatResult(path, entry.version, len(entry.data), False)
        chunks = self._cache.chunks(path)
        if chunks is not None and now < chunks.expiry:
            return StatResult(path, chunks.version, chunks.size, False)
        return None

    def lease_remaining(self, path: str) -> float:
        """Seconds the lease on ``path`` is still trusted (0.0 if none)."""
        entry = (  # whole, in chunks, or a listing's key
            self._cache.get(path) or self._cache.chunks(path) or self._cache.get_listing(path)
        )
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
        lookups = hits + self._counters.misses
        return {
            "hits": hits,
            **dataclasses.asdict(self._counters),
            "evictions": self._cache.evictions,
            "cached_entries": len(self._cache),
            "cached_bytes": self._cache.nbytes,
            "hit_ratio": hits / lookups if lookups else 0.0,
        }

    @property
    def session_id(self) -> str | None:
        """The session the server issued (its leases are this session's), for logs;
        None before the first welcome."""
        return None if self._session is None else self._session[0]

    @property
    def connected(self) -> bool:
        """Whether a connection is up (the first counts from its welcome on)."""
        if self._first_pending:
            return not self._closing
        return self._link is not None and not self._link.broken

    # ------------------------------------------------------------ reads
    async def _read_miss(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self._check_run()  # (before it may join another's read: see _current_link)
        normal = normalize(path)
        if normal != path:  # another spelling of a path that may be cached
            return await self.read(normal, offset=offset, length=length)
        if offset != 0 or length is not None or type(offset) is not int:
            return await self._read_part(path, offset, length)
        if path in self._cache.files:  # cached by chunks: read (and revalidate) them
            return await self._read_chunked(path, 0, None, None)
        result = await self._read_whole(path)
        if isinstance(result, p.Chunk):  # bigger than one chunk: fetch the rest
            return await self._read_chunked(path, 0, None, result)
        return result

    async def _read_part(self, path: str, offset: int, length: int | None) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``path`` (to the end when ``length`` is
        None), not from a trusted lease: a small range by itself, else by chunks, but
        for a file cached whole (its lease run out), which is revalidated whole."""
        _check_range(offset, length)
        if path not in self._cache.entries or path in self._cache.files:
            if length is not None and 0 < length < CHUNK_SIZE and path not in self._cache.entries:
                return await self._read_range(path, offset, length)
            return await self._read_chunked(path, offset, length, None)
        result = await self._read_whole(path)
        if isinstance(result, p.Chunk):  # it has grown past one chunk: fetch the rest
            result = await self._read_chunked(path, 0, None, result)
        return _cut(result, offset, length)

    async def _read_whole(self, path: str, *, join: bool = True) -> bytes | p.Chunk:
        """``path`` read whole from the server, or the answer to a read of it already
        on its way (if ``join``, and if that answer may be taken: see :meth:`_leased`)."""
        if join:  # (not when asking again: the miss is counted once)
            self._counters.misses += 1
            shared = self._inflight.get(path)
            if shared is not None:
                await shared.wait()
                if self._leased(shared) or isinstance(shared.error, Unavailable):
                    self._counters.reads_shared += 1
                    return self._read_result(shared)
                return await self._read_whole(path, join=False)  # a request of our own
        entry = self._cache.get(path)
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
            await self._start(link, request, lambda i: p.read_frame(i, path, have))
            await self._finish(link, request)
        except BaseException as exc:
            if not request.done:
                request.error = exc
                request.finish()
            raise
        finally:
            if self._inflight.get(path) is request:
                del self._inflight[path]
        return self._read_result(request)

    def _leased(self, request: _Request) -> bool:
        """Whether a reader that joined ``request`` (sent before that reader began) may
        take its answer: only if the server granted a lease with it that we still trust
        (the cache's rule, :meth:`LeaseCache.expiry`). A write the server applies after
        a lease's grant waits for our approval, which the server asks only after that
        reply on the same connection, or for the lease to run out: so no write was
        acknowledged between the answer and a join. Without a lease (term 0: a file
        written often, or a server with no caching), with one already run out, with an
        error (``NotFound``) or a cancelled sender, a write may have been acknowledged
        to its writer since the request was sent, and the joiner, which began after
        that, must not be answered from before it."""
        reply = request.reply
        return (
            request.error is None
            and isinstance(reply, p.Data | p.NotModified | p.Chunk)
            and self._cache.expiry(reply.term, request.sent_at) > self._clock()
        )

    def _read_result(self, request: _Request) -> bytes | p.Chunk:
        if request.error is not None:
            raise _copy_error(request.error)
        reply = request.reply
        if isinstance(reply, p.Data | p.Chunk):
            return reply if type(reply) is p.Chunk else reply.data
        assert isinstance(reply, p.NotModified)
        return request.data

    async def _read_range(self, path: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``path`` (less than one chunk): from
        the cached pieces of the chunks it touches, else exactly that range from the
        server, cached as those chunks' pieces (see :mod:`fscache.cache`)."""
        chunks = self._cache.chunks(path)
        if chunks is not None:
            trusted = self._clock() < chunks.expiry
            cached = self._cached_range(path, offset, min(offset + length, chunks.size), trusted)
            if cached is not None and trusted:
                self._hits += 1
                return cached
        else:
            cached = None
        self._counters.misses += 1
        request = _Request(path)
        if cached is not None and chunks is not None:  # revalidate: costs no data
            request.have, request.data, request.size = chunks.version, cached, chunks.size
        have = request.have
        link = await self._current_link()
        await self._start(
            link,
            request,
            lambda i: p.ReadRange(id=i, path=path, offset=offset, length=length, have=have),
        )
        await self._finish(link, request)
        return self._chunk_result(request)[0]

    def _cached_range(self, path: str, offset: int, end: int, trusted: bool) -> bytes | None:
        """Bytes ``[offset, end)`` of ``path`` if cached pieces hold them all (trusted
        ones only if ``trusted``), else None."""
        now = self._clock()
        parts = []
        for index in range(offset // CHUNK_SIZE, max(end - 1, offset) // CHUNK_SIZE + 1):
            base = index * CHUNK_SIZE
            lo, hi = max(offset - base, 0), max(min(end - base, CHUNK_SIZE), 0)
            if trusted:
                entry = self._cache.lookup_chunk(path, index, now, lo, hi)
            else:
                entry = self._cache.chunk(path, index, lo, hi)
            if entry is None:
                return None
            parts.append(entry.data[lo - entry.start : hi - entry.start])
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _read_chunked(
        self, path: str, offset: int, length: int | None, first: p.Chunk | None
    ) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``path`` chunk by chunk, all of one
        version (started over if the file changes between chunks)."""
        parts: list[bytes] = []

        async def sink(data: bytes) -> None:
            parts.append(data)

        for _ in range(READ_ATTEMPTS):
            parts.clear()
            try:
                await self._stream(path, offset, length, sink, first)
            except _Changed:
                first = None
                continue
            return b"".join(parts)
        raise Conflict(f"{path} kept changing while it was read")

    async def _stream(
        self,
        path: str,
        offset: int,
        length: int | None,
        sink: Callable[[bytes], Awaitable[None]],
        first: p.Chunk | None = None,
        *,
        scan: bool = False,
    ) -> int:
        """Hand bytes ``[offset, offset + length)`` of ``path`` to ``sink`` in order,
        chunk by chunk from the cache or the server (IN_FLIGHT requests at most);
        returns the bytes handed over. :class:`_Changed` (after dropping the file's
        chunks) if two chunks differ in version. ``first``: chunk 0, already read.
        ``scan``: a streaming copy, whose chunks the cache keeps only if the file is
        small (see the cache's Scans). Each chunk counts as a hit or a miss."""
        chunks = self._cache.chunks(path)
        known: dict[int, bytes] = {}
        if first is not None:
            version, size, known[0] = first.version, first.size, first.data
        elif chunks is not None and self._clock() < chunks.expiry:
            version, size = chunks.version, chunks.size
        else:
            index = offset // CHUNK_SIZE
            known[index], version, size = await self._fetch_chunk(path, index, scan)
        end = size if length is None else min(size, offset + length)
        if end <= offset:
            return 0
        link = await self._current_link()
        pending: deque[tuple[int, bytes | _Request]] = deque()  # chunk, its bytes to hand over
        copied = 0

        def bounds(index: int) -> tuple[int, int]:  # what is handed over of chunk ``index``
            base = index * CHUNK_SIZE
            return max(offset - base, 0), min(end - base, CHUNK_SIZE)

        async def hand_over() -> None:
            nonlocal copied
            index, got = pending.popleft()
            if isinstance(got, _Request):
                await self._finish(link, got)
                data, got_version, _ = self._chunk_result(got)
                if got_version != version:
                    self._cache.drop(path)
                    raise _Changed
                lo, hi = bounds(index)
                got = data[lo:hi]
            copied += len(got)
            await sink(got)

        for index in range(offset // CHUNK_SIZE, (end - 1) // CHUNK_SIZE + 1):
            if len(pending) >= IN_FLIGHT:
                await hand_over()
            lo, hi = bounds(index)
            if index in known:
                pending.append((index, known.pop(index)[lo:hi]))
                continue
            entry = self._cache.lookup_chunk(path, index, self._clock(), lo, hi)
            if entry is not None and entry.version == version:
                self._hits += 1
                pending.append((index, entry.data[lo - entry.start : hi - entry.start]))
                continue
            pending.append((index, await self._start_chunk(link, path, index, scan)))
        while pending:
            await hand_over()
        return copied

    async def _fetch_chunk(
        self, path: str, index: int, scan: bool = False
    ) -> tuple[bytes, int, int]:
        """Chunk ``index`` of ``path`` from the server: (data, version, file size)."""
        link = await self._current_link()
        request = await self._start_chunk(link, path, index, scan)
        await self._finish(link, request)
        return self._chunk_result(request)

    async def _start_chunk(
        self, link: _Link, path: str, index: int, scan: bool = False
    ) -> _Request:
        """Ask for the whole of chunk ``index`` of ``path`` (revalidating it if the
        cached piece of it is the whole chunk); ``scan``: for a streaming copy."""
        self._counters.misses += 1
        request = _Request(path, scan=scan)
        chunks = self._cache.chunks(path)
        cached = None
        if chunks is not None:
            whole = min(CHUNK_SIZE, chunks.size - index * CHUNK_SIZE)
            cached = self._cache.chunk(path, index, 0, whole)
        if cached is not None and chunks is not None:  # revalidate: costs no data
            request.have, request.data, request.size = cached.version, cached.data, chunks.size
        have = request.have
        return await self._start(
            link,
            request,
            lambda i: p.ReadRange(
                id=i, path=path, offset=index * CHUNK_SIZE, length=CHUNK_SIZE, have=have
            ),
        )

    @staticmethod
    def _chunk_result(request: _Request) -> tuple[bytes, int, int]:
        reply = request.reply
        if isinstance(reply, p.Chunk):
            return reply.data, reply.version, reply.size
        assert isinstance(reply, p.NotModified)
        return request.data, reply.version, request.size

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
        request = await self._begin(link, make, path)
        await self._finish(link, request)
        return request

    async def _begin(
        self, link: _Link, make: Callable[[int], p.Message], path: str = ""
    ) -> _Request:
        """Send a new request; :meth:`_finish` waits for its reply."""
        return await self._start(link, _Request(path), make)

    async def _send_request(
        self, link: _Link, request: _Request, make: Callable[[int], p.Message | bytes]
    ) -> None:
        """Send what ``make`` builds for the request's id (a message, or a read's frame),
        wait for the reply (the reader fills it in), raise the server's error."""
        await self._start(link, request, make)
        await self._finish(link, request)

    async def _start(
        self, link: _Link, request: _Request, make: Callable[[int], p.Message | bytes]
    ) -> _Request:
        """Send the request without waiting for its reply (:meth:`_finish` waits):
        how a transfer keeps several in flight."""
        self._next_id += 1
        request_id = self._next_id
        built = make(request_id)
        if type(built) is bytes:
            frame = built
        else:
            assert isinstance(built, p.Message)
            p.check_fields(built)  # a bad argument is the caller's error, not the link's
            request.message = built
            frame = p.encode(built)
            if len(frame) - p.HEADER.size > link.welcome.max_frame:
                raise TooLarge(
                    f"{built.TYPE}: a frame of {len(frame)} bytes is over the server's frame"
                    f" limit of {link.welcome.max_frame}"
                )
        request.id = request_id
        request.sent_at = self._clock()
        if not link.waiting:
            link.last_heard = request.sent_at  # silence is measured from the first request
            link.requests_began()
        link.waiting[request_id] = request
        try:
            await link.send_frame(frame)
        except BaseException as exc:
            link.waiting.pop(request_id, None)
            if isinstance(exc, Unavailable):
                self._link_lost(link)
            raise
        return request

    async def _finish(self, link: _Link, request: _Request) -> None:
        """Wait for the reply to a request :meth:`_start` sent, reading the connection
        for it if no other request does (:class:`_ReadTurn`); raise the server's error."""
        try:
            turn = link.turn
            if turn is None or request.done or not turn.claim():
                await request.wait()
            else:
                await self._read_for(link, turn, request)
                if not request.done:  # the claimant stopped: the reader task reads
                    await request.wait()
        finally:
            link.waiting.pop(request.id, None)
        if request.error is not None:
            raise _copy_error(request.error)

    # ------------------------------------------------------------ the reader
    async def _read_link(self, link: _Link) -> None:
        """The connection's reader task: apply every frame in arrival order, reading
        whenever no request's sender reads for its own reply (:class:`_ReadTurn`).
        Returns when the server closes."""
        with link.errors:
            if link.turn is not None:
                await link.turn.run_reader(functools.partial(self._apply_received, link))
                return
            await self._apply_frames(link)  # first, the frames that came with the welcome
            while data := await link.wire.receive():
                await self._apply_received(link, data)

    async def _apply_received(self, link: _Link, data: Received) -> None:
        """Apply what the reader task read."""
        if data:
            link.last_heard = self._clock()
            link.decoder.feed(data)
        await self._apply_frames(link)

    async def _read_for(self, link: _Link, turn: _ReadTurn, request: _Request) -> None:
        """Holding the turn, read and apply the connection's frames until ``request``'s
        reply is in; then give the turn back, with the error met if any (the reader task
        ends the connection with it). At EOF the reader task meets the EOF itself."""
        failed: Exception | None = None
        try:
            while not request.done:
                data = await link.wire.receive()
                if not data:
                    return
                link.last_heard = self._clock()
                link.decoder.feed(data)
                await self._apply_frames(link, claimant=True)
        except Exception as exc:
            failed = exc
        finally:
            turn.release(failed)

    async def _apply_frames(self, link: _Link, *, claimant: bool = False) -> None:
        """Apply every whole frame the decoder holds, in arrival order: a reply wakes its
        request; an approval request drops the entry and is answered before the next
        frame (or, when there are hooks to run first, beside it: :meth:`_approve`).
        ``claimant``: a request's sender reads, whose cancellation must not stop an
        approval half sent."""
        decoder = link.decoder
        while (message := decoder.next_message()) is not None:
            if type(message) is p.ApprovalRequest:
                if claimant:
                    with trio.CancelScope(shield=True):
                        await self._approve(link, message)
                else:
                    await self._approve(link, message)
            elif type(message) is p.LockChanged:
                self._lock_watches.notice(message)
            else:
                self._on_reply(link, message)

    async def _approve(self, link: _Link, message: p.ApprovalRequest) -> None:
        self._cache.drop(message.path)  # drop first ...
        self._inflight.pop(message.path, None)  # (no reader joins an older answer)
        self._counters.approvals += 1
        if self.before_approval and self._nursery is not None:
            # A hook may wait for something that waits for a reply not yet read off
            # this connection: the mount's kernel invalidation waits for a directory
            # lock that a lookup holds until its reply comes. So the hooks, and then
            # the approval, run beside the reader, which goes on applying frames.
            self._nursery.start_soon(self._approve_after_hooks, link, message)
            return
        await link.send_frame(p.approve_frame(message.path, message.write))  # ... then approve

    @_background
    async def _approve_after_hooks(self, link: _Link, message: p.ApprovalRequest) -> None:
        for hook in self.before_approval:  # e.g. the mount's kernel cache
            try:
                await hook(message.path)
            except Exception:  # the approval goes out all the same
                log.exception("the approval hook %r failed for %s", hook, message.path)
        with contextlib.suppress(Unavailable):  # lost with the connection: the lease runs out
            await link.send_frame(p.approve_frame(message.path, message.write))

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
            request.finish()
        if not link.waiting and self._relinquished:
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
        elif type(reply) is p.Chunk:
            if may_cache:
                evicted = self._store_range(
                    path, sent.offset if isinstance(sent, p.ReadRange) else 0, reply, request
                )
        elif isinstance(reply, p.NotModified):
            self._counters.not_modified += 1
            if request.have != reply.version:  # also None: not a revalidating read
                request.reply = None  # a server bug; fail safe rather than guess
                request.error = ProtocolError("not-modified for a version not asked about")
            elif not may_cache:
                pass
            elif isinstance(sent, p.ReadRange):
                self._cache.extend(path, reply.version, reply.term, request.sent_at)
            elif isinstance(sent, p.ScanDir):
                evicted = self._cache.store_listing(
                    path, request.entries, reply.version, reply.term, request.sent_at
                )
            else:
                evicted = self._cache.store(
                    request.path, request.data, reply.version, reply.term, request.sent_at
                )
        elif type(reply) is p.Entries:
            request.page = dir_entries(reply.names, reply.dirs, reply.sizes, reply.versions)
            whole = not reply.more and request.earlier_version in (None, reply.version)
            if may_cache and whole:
                entries = (*request.earlier, *request.page)
                evicted = self._cache.store_listing(
                    path, entries, reply.version, reply.term, request.sent_at
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

    def _store_range(self, path: str, offset: int, reply: p.Chunk, request: _Request) -> list[str]:
        """Cache the bytes of ``reply`` (from ``offset``) as pieces of the chunks they
        touch; returns the paths evicted."""
        evicted: list[str] = []
        index, start = divmod(offset, CHUNK_SIZE)
        data = reply.data
        while True:  # one piece per chunk touched (a whole chunk: one piece, not copied)
            room = CHUNK_SIZE - start
            piece, data = (data[:room], data[room:]) if len(data) > room else (data, b"")
            evicted += self._cache.store_chunk(
                path,
                index,
                piece,
                version=reply.version,
                size=reply.size,
                term=reply.term,
                sent_at=request.sent_at,
                start=start,
                scan=request.scan,
            )
            if not data:
                return evicted
            index, start = index + 1, 0

    # ------------------------------------------------------------ connection management
    async def _connect_once(
        self, welcome_timeout: float = CONNECT_TIMEOUT
    ) -> tuple[trio.abc.Stream, p.Welcome, p.FrameDecoder]:
        try:
            connecting = _TransportErrors(self, "cannot connect", starting=True)
            with trio.fail_after(CONNECT_TIMEOUT), connecting:
                stream = await self._opener()
        except trio.TooSlowError:
            raise self._unavailable("timed out connecting") from None
        decoder = p.FrameDecoder(DEFAULT_MAX_FRAME)
        tls = isinstance(stream, trio.SSLStream)
        handshake = _TransportErrors(
            self,
            "connection closed during the handshake",
            tls_handshake=tls,
            starting=True,
            plain_hint=None if tls else "the server may expect TLS (--tls)",
        )
        began = b""  # the peer's first bytes: what it is, if it is no fscache server
        try:
            with trio.fail_after(welcome_timeout), handshake:
                await stream.send_all(p.encode(self._hello()))
                while (message := decoder.next_message()) is None:
                    data = await stream.receive_some(256 * 1024)
                    if not data:
                        raise trio.BrokenResourceError("the server closed the connection")
                    began = (began + data)[:_SHOWN_BYTES]
                    decoder.feed(data)
        except BaseException as exc:
            await trio.aclose_forcefully(stream)
            if isinstance(exc, trio.TooSlowError):
                raise self._unavailable("no answer to the handshake") from None
            if isinstance(exc, ProtocolError | TooLarge):  # an SSH or HTTP banner, say
                raise self._unavailable(
                    f"not an fscache server: its first bytes were {began!r} ({exc})"
                ) from None
            raise
        if not isinstance(message, p.Welcome):
            await trio.aclose_forcefully(stream)
        if isinstance(message, p.Error):
            if message.code == Unauthorized.code and self._session is not None:
                log.warning("%s refused our session; opening a new one", self.address)
                self._session = None  # as if it had expired: the server waits out its leases
            raise error_for_code(message.code, f"server refused the connection: {message.message}")
        if not isinstance(message, p.Welcome):
            raise ProtocolError(f"expected welcome, got {message.TYPE}")
        if self._session is not None and not message.resumed and message.epoch == self.epoch:
            # Like a server restart: entries stay trusted to their own expiry, no longer.
            log.info("session %s expired; now %s", self._session[0], message.session)
        self._session = (message.session, message.secret)
        return stream, message, decoder

    def _hello(self) -> p.Hello:
        """Our hello: on a reconnect it resumes our session."""
        session, secret = self._session or (None, None)
        return p.Hello(p.PROTOCOL_VERSION, self.client_id, session=session, secret=secret)

    @_background
    async def _run(self, first: tuple[trio.abc.Stream, p.Welcome, p.FrameDecoder]) -> None:
        """Keep a connection up until closed: serve it, reconnect with backoff."""
        connection: tuple[trio.abc.Stream, p.Welcome, p.FrameDecoder] | None = first
        failures = 0
        while not self._closing:
            if connection is None:
                # The backoff's wait, cut short when a request waits for the connection
                # (it would fail for want of an attempt after the server is back): then
                # the wait is a first attempt's, still jittered.
                with trio.move_on_after(backoff_delay(failures)):
                    await self._link_wanted.wait()
                    await trio.sleep(backoff_delay(0))
                self._link_wanted = trio.Event()
                try:
                    connection = await self._connect_once(RECONNECT_WELCOME_TIMEOUT)
                except FscacheError as exc:
                    log.debug("reconnect to %s failed: %s", self.address, exc)
                    failures += 1
                    continue
                self._counters.reconnects += 1
            failures = 0
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
            self._write_again = self._write_again or (not welcome.resumed and bool(self._ephemeral))
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watchdog, link)
                    nursery.start_soon(self._relinquisher, link)
                    nursery.start_soon(self._keep_alive, link)
                    if self._write_again:
                        nursery.start_soon(self._write_ephemeral_again)
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

    @_background
    async def _watchdog(self, link: _Link) -> None:
        """Ping while requests wait in silence; give the link up after DEAD_AFTER.
        While none waits it sleeps without a timer until one is sent."""
        while True:
            if not link.waiting:
                link.watchdog_parked = parked = trio.Event()
                await parked.wait()
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

    @_background
    async def _relinquisher(self, link: _Link) -> None:
        """Give back the leases of evicted entries, in batches."""
        while True:
            await self._relinquish_wake.wait()
            self._relinquish_wake = trio.Event()
            while self._to_relinquish:
                batch = self._to_relinquish[:RELINQUISH_BATCH]
                del self._to_relinquish[:RELINQUISH_BATCH]
                for path in batch:  # copies made under the lease go before it does
                    for hook in self.before_approval:
                        await hook(path)
                batch = [path for path in batch if path not in self._cache]
                if batch:
                    self._next_id += 1
                    await link.send(self._relinquish_message(self._next_id, batch))

    @_background
    async def _keep_alive(self, link: _Link) -> None:
        """While we hold ephemeral files, ping every third of the server's session TTL:
        the server cuts a session that holds them and is silent for the TTL (a hung
        client keeps its files no longer than a dead one). Asks the TTL once per
        connection (``stats``); parks, with no timer, while we hold none."""
        interval: float | None = None
        while True:
            if not self._ephemeral:
                self._ephemeral_held = held = trio.Event()
                await held.wait()
                continue
            if interval is None:
                interval = await self._keep_alive_interval(link)
            await trio.sleep(interval)
            if self._ephemeral:
                await self._call(link, lambda i: p.Ping(id=i))

    async def _keep_alive_interval(self, link: _Link) -> float:
        """A third of the server's session TTL (PING_AFTER if it does not say)."""
        try:
            stats = await self._call(link, lambda i: p.GetStats(id=i))
        except Unavailable:
            raise
        except FscacheError:  # refused: ping often enough anyway
            return PING_AFTER
        assert isinstance(stats, p.StatsResult)
        ttl = stats.counters.get("session_ttl")
        if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl > 0:
            return ttl / 3
        return PING_AFTER

    @_background
    async def _write_ephemeral_again(self) -> None:
        """A new session: the files our old one tied are deleted (or will be) with it.
        Write each again, ephemeral, where it is gone (``if_version=0``: applied after
        the old session's delete, which arrived first); one written since by another
        session stands and is forgotten. A lost connection leaves the rest to the next."""
        for path, data in list(self._ephemeral.items()):
            if self._ephemeral.get(path) is not data:
                continue  # changed meanwhile
            try:
                await self.write(path, data, ephemeral=True, if_version=0)
            except Unavailable:
                return
            except FscacheError as exc:
                if self._ephemeral.get(path) is data:
                    del self._ephemeral[path]
                log.warning("ephemeral %s not written again: %s", path, exc)
        self._write_again = False

    def _set_link(self, link: _Link) -> None:
        self._link = link
        self._first_pending = False
        self._link_changed.set()
        self._link_changed = trio.Event()
        self._lock_watches.relinked()

    def _link_lost(self, link: _Link) -> None:
        if link.broken:
            return
        link.broken = True
        link.cancel.cancel()  # the link's task closes the wire: a reader's wait ends
        if self._link is link:
            self._link = None
        for request in list(link.waiting.values()):
            if not request.done:
                if self._closing:
                    request.error = FscacheError(CLOSED)
                else:
                    request.error = self._unavailable("connection lost before the reply")
                request.finish()
        link.waiting.clear()

    async def _current_link(self) -> _Link:
        """The live link; waits up to RECONNECT_WAIT for one, then Unavailable. Every
        request but a read's passes here before it is sent, so this is where a call
        from another trio run is refused (:meth:`_check_run`); a read is refused on
        its miss, never on a hit."""
        self._check_run()
        if self._closing:
            raise FscacheError(CLOSED)
        link = self._link
        if link is not None and not link.broken:
            return link
        self._link_wanted.set()  # try to connect now, not at the end of a backoff
        with trio.move_on_after(RECONNECT_WAIT):
            while self._link is None or self._link.broken:
                await self._link_changed.wait()
            return self._link
        raise self._unavailable("not connected")

    def _check_run(self) -> None:
        """Refuse a call from a task of another trio run (or from no trio run at all):
        the client's connection, events and tasks belong to the run that opened it,
        and a request sent from another would wait for ever for a reply that run's
        reader hands to nobody there."""
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:  # not in a trio run
            token = None
        if token is not self._trio_token:
            raise FscacheError(OTHER_RUN)

    def _unavailable(self, why: str) -> Unavailable:
        self._counters.unavailable += 1
        return Unavailable(f"{self.address}: {why}")

    async def aclose(self) -> None:
        """Say goodbye (the server releases our leases and locks) and close: the
        client's own tasks end, and every later call raises that the client is closed.

        The locks still held are lost from this instant (:attr:`Lock.lost` set,
        :attr:`Lock.held` False), before the goodbye goes: once it has, another
        client may be granted any of them. The body of an ``async with`` of one is
        cancelled and the ``async with`` raises :class:`~fscache.errors.LockLost`, as
        for any lost lock. The goodbye is sent even from such a body: it is shielded
        (and given at most a second). A call that waits for a reply meanwhile fails
        with the same error as a later one; its caller is not cancelled."""
        self._check_run()
        if self._closing:
            return
        self._closing = True
        for lock in list(self._held_locks.values()):
            lock._lose(locks.CLOSED_WHY)
        self._lock_watches.closing()
        link = self._link
        self._cache.clear()
        if link is not None and not link.broken:
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(1.0),
                contextlib.suppress(Exception),
            ):
                await link.send(p.Goodbye())
            link.cancel.cancel()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


def _ssl_reason(exc: BaseException) -> str:
    """The SSL error's words (e.g. 'certificate verify failed'), else ``exc``'s."""
    seen = ssl_error_in(exc)
    if seen is None:
        return str(exc)
    return str(getattr(seen, "verify_message", None) or seen.reason or seen)


_HOSTNAME_MISMATCH = 62  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH


def _refusal(address: str, exc: BaseException) -> str:
    """What a certificate refused in the TLS handshake says: whose refusal it was (we
    refused the server's, or the server refused ours) and what to look at."""
    seen = ssl_error_in(exc)
    reason = _ssl_reason(exc)
    if not isinstance(seen, ssl.SSLCertVerificationError):  # the server's alert
        return f"TLS with {address} failed: the server refused our client certificate ({reason})"
    if seen.verify_code == _HOSTNAME_MISMATCH:
        hint = (
            "it does not name the host we connected to: connect by a name it has, or make"
            " the server's bundle with `fscache certs --host HOST`"
        )
    else:
        hint = (
            "our bundle's CA did not sign it: the server's bundle and ours must come"
            " from one `fscache certs` directory"
        )
    return f"TLS with {address} failed: we refused the server's certificate ({reason}); {hint}"


def _check_if_version(if_version: int | None) -> None:
    """Refuse a negative ``if_version`` before anything is sent: a version is >= 0 (0:
    no file there), and the server would answer a negative one with :class:`Conflict`,
    the caller's slip made to look like a lost race. (Its type and its upper bound are
    the field checks'.)"""
    if type(if_version) is int and if_version < 0:
        raise BadSetting(
            f"if_version must be >= 0 (a version; 0: only if there is no file), not {if_version}"
        )


def _check_host(host: object, port: int) -> None:
    """Refuse an ``open_client`` host that is no host: ``TypeError`` if it is no str,
    :class:`~fscache.settings.BadSetting` if it is empty, cannot be encoded, or
    carries a port or brackets (:func:`parse_address` is the rule)."""
    if not isinstance(host, str):
        raise TypeError(f"host must be a str (a name or an address), not {type(host).__name__}")
    if not host.strip():
        raise BadSetting(f"host must be a name or an address, such as 127.0.0.1, not {host!r}")
    named, its_port = parse_address(host, port)
    if named != host:
        raise BadSetting(
            f"bad host {host!r}: give the host alone (an IPv6 address without brackets)"
            f" and the port apart: open_client({named!r}, {its_port})"
        )


def _check_port(port: object) -> None:
    """Refuse an ``open_client`` port that is no TCP port to connect to: ``TypeError``
    unless it is an int (a bool, a float or a numeric string is the caller's slip),
    :class:`~fscache.settings.BadSetting` unless it is 1..65535, the range
    :func:`parse_address` allows in ``HOST:PORT`` (0 would ask for any port, which
    only a listener may)."""
    if isinstance(port, bool) or not isinstance(port, int):
        shown = f" {port!r}" if isinstance(port, str | float) else ""
        raise TypeError(f"port must be an int 1..65535, not {type(port).__name__}{shown}")
    if not 0 < port < 65536:
        raise BadSetting(f"port must be 1..65535, not {port}")


def _check_range(offset: int, length: int | None) -> None:
    """The one check of a read's ``offset`` and ``length``, whether the read is then
    answered from the cache or from the server: ``TypeError`` for a value that is not
    an int (a bool, a float, a string), :class:`~fscache.settings.BadSetting` for one
    out of 0..2**63-1, as the server would refuse it."""
    check_extent("offset", offset)
    if length is not None:
        check_extent("length", length)


def _cut(data: bytes, offset: int, length: int | None) -> bytes:
    """Bytes ``[offset, offset + length)`` of ``data`` (a ranged read of a file cached
    whole), the arguments checked first (:func:`_check_range`)."""
    _check_range(offset, length)
    return data[offset:] if length is None else data[offset : offset + length]


def _with_parent(path: str) -> tuple[str, str]:
    """A file's key and its directory's (a write may create the name, a delete removes it)."""
    return path, dir_key(parent(path))


def _parts(data: Source) -> Callable[[], Awaitable[bytes]]:
    """The next chunk of ``data`` on each call (b"" at the end): bytes are sliced, a
    file is read on a worker thread (a pipe may block)."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        at = 0

        async def next_slice() -> bytes:
            nonlocal at
            part = bytes(view[at : at + CHUNK_SIZE])
            at += len(part)
            return part

        return next_slice
    file = data

    async def next_read() -> bytes:
        part = await trio.to_thread.run_sync(file.read, CHUNK_SIZE)
        if not isinstance(part, bytes | bytearray):
            raise TypeError(f"the file gave {type(part).__name__}, not bytes: open it in 'rb'")
        return bytes(part)

    return next_read


async def _read_all(file: IO[bytes]) -> bytes:
    """The rest of ``file``, read as an upload reads it (chunk by chunk, on a worker
    thread)."""
    next_part = _parts(file)
    parts = []
    while part := await next_part():
        parts.append(part)
    return b"".join(parts)


def _chain(
    parts: tuple[bytes, ...], rest: Callable[[], Awaitable[bytes]]
) -> Callable[[], Awaitable[bytes]]:
    """``parts`` already read, then whatever ``rest`` gives."""
    waiting = list(parts)

    async def next_part() -> bytes:
        return waiting.pop(0) if waiting else await rest()

    return next_part


def _copy_error(error: BaseException) -> BaseException:
    """A fresh exception of the same kind, so concurrent waiters don't share tracebacks."""
    if isinstance(error, FscacheError):
        return type(error)(*error.args)
    return error


def parse_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST:PORT``, ``HOST`` or ``[IPv6]:PORT`` -> (host, port); a bare IPv6 address,
    without a port, is a host too. Anything else is the caller's mistake:
    :class:`~fscache.settings.BadSetting` (a ValueError) names the address and the
    forms it may take, and a host name IDNA cannot encode is refused here rather than
    by the resolver (which raises UnicodeError, not OSError). TypeError if
    ``address`` is not a string."""
    if not isinstance(address, str):
        raise TypeError(f"an address is a str such as 'HOST:PORT', not {type(address).__name__}")
    text = address.strip()
    if not text:
        raise _bad_address(address, "it is empty")
    if "://" in text:
        raise _bad_address(address, "it is a URL; give only the host and port")
    port_text: str | None = None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not is_ipv6(host):
            raise _bad_address(address, "brackets hold an IPv6 address")
        if rest:
            if not rest.startswith(":"):
                raise _bad_address(address, f"{rest!r} after the brackets")
            port_text = rest[1:]
    elif is_ipv6(text):
        return text, default_port
    elif text.count(":") > 1:
        raise _bad_address(address, "more than one ':' (an IPv6 address goes in brackets)")
    else:
        host, colon, after = text.partition(":")
        port_text = after if colon else None
    if not host:
        raise _bad_address(address, "no host")
    if port_text == "":
        raise _bad_address(address, "no port after ':'")
    if port_text is not None and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
        raise _bad_address(address, "port must be 1..65535")
    if not is_ipv6(host):
        try:
            host.encode("idna")
        except UnicodeError:
            raise _bad_address(address, f"{host!r} is not a valid host name") from None
    return host, default_port if port_text is None else int(port_text)


def _bad_address(address: str, why: str) -> BadSetting:
    return BadSetting(f"bad address {address!r}: {why}; expected HOST:PORT, HOST or [IPv6]:PORT")


async def open_tcp(host: str, port: int) -> trio.SocketStream:
    """A TCP connection to ``host``: an address literal with one socket and one
    connect, a name through ``trio.open_tcp_stream``, which resolves it and races its
    addresses (for an address, five passes through the scheduler and a task: three
    times the CPU of a connect, a cost a reconnecting client pays on every attempt)."""
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        return await trio.open_tcp_stream(host, port)
    sock = trio.socket.socket(socket.AF_INET6 if version == 6 else socket.AF_INET)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def tcp_opener(host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> Opener:
    async def open_stream() -> trio.abc.Stream:
        if ssl_context is None:
            return await open_tcp(host, port)
        stream = trio.SSLStream(await open_tcp(host, port), ssl_context, server_hostname=host)
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
    ``opener`` replaces TCP with any trio stream (tests use memory streams).

    ``host`` is a name or an address (an IPv6 one without brackets), ``port`` an int
    1..65535; both are checked before anything is sent. ``TypeError`` if ``host`` is
    no str or ``port`` no int (a bool, a float, or a numeric string: text such as
    ``"HOST:PORT"`` is what :func:`fscache.connect` takes);
    :class:`~fscache.settings.BadSetting` (a ValueError) if ``port`` is out of
    range, or if ``host`` is empty, a name IDNA cannot encode, or ``HOST:PORT`` (the
    port goes in ``port``)."""
    _check_port(port)
    if opener is None:
        _check_host(host, port)
    address = shown_address(host, port)
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
        # The client's tasks run in a nursery of their own, which aclose cancels: the
        # body runs outside it, so a client closed from inside the body does not
        # cancel the body (its next call raises that the client is closed).
        client._nursery = await nursery.start(_own_tasks)
        # epoch and connected are right at once, before _run serves the first connection
        # (it does so only once the body has begun: hooks it adds see every message)
        client.epoch = first[1].epoch
        client._first_pending = True
        client._nursery.start_soon(client._run, first)
        try:
            yield client
        except BaseException as exc:  # re-raised below, outside the nursery: the
            body_error = exc  # caller sees NotFound itself, not an ExceptionGroup
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
    if body_error is not None:
        raise body_error


@_background
async def _own_tasks(task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
    """A nursery for a client's own tasks, open until its scope is cancelled."""
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


__all__ = [
    "DEFAULT_PORT",
    "Client",
    "DirEntry",
    "StatResult",
    "open_client",
    "parse_address",
    "tcp_opener",
]
