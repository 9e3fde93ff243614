"""The trio server: listener, connections, and the driver of the lease table.

Theory of operation
-------------------
One :class:`FileService` owns the :class:`~fscache.leases.LeaseTable` (the rules)
and the :class:`~fscache.server.store.Store` (the bytes). Every connection task
decodes frames and hands each request to the service *synchronously*: the lease
table is called with the time now (trio's clock) and the effects it returns are
carried out at once, in order, by :meth:`FileService._execute`. Replies are put
in the connection's :class:`Outbox`, which is drained in order, by the reading
task after each batch or by a sender task started for what is queued between
batches. So a read's reply is always queued before any approval request that a
later write causes for the same holder -- the race "approval overtakes a grant
in flight" cannot happen on one connection.

The only awaits between an event and its effects are the durable writes, which
run in a worker thread (fsync) while the path stays blocked in the table; their
completion is fed back through :meth:`LeaseTable.write_done`. A timer task
sleeps until :meth:`LeaseTable.next_deadline` and calls ``tick``.

Every request that changes the tree (write, delete, upload commit, ranged write,
truncate, rename, mkdir, rmdir) is one write in the table: its footprint, the
keys it may change, comes from :mod:`fscache.names` and the store's facts about
the names involved, read on arrival and trusted only while no write is queued on
them (otherwise the cautious value). Its store call waits in the pending map
until the table says :class:`ApplyWrite`. Ranged reads and listings (``scandir``)
are reads of the file's key and of the directory's key.

Uploads belong to their connection and end with it. The receive loop writes each
part in a worker thread before it reads the next frame, so a connection holds at
most one part in memory and parts land in order; a commit fsyncs the temp file
in a worker thread first, then enters the table like a ``write``.

A client that stops reading cannot stall anyone else: each connection sends its
own replies, and once its unsent replies exceed ``max_outbox`` bytes, or a send of
them has not finished within ``send_timeout`` (one watchdog task looks at every
connection), the connection is dropped (its leases are then waited out, like a
crashed client's). A client that pipelines cannot either: a connection handles at
most ``MAX_REQUESTS_PER_TURN`` requests, then yields to the others, and reads its
socket only when its replies are out. An idle connection keeps one task (its
reader) and no receive buffer (:mod:`fscache.net`).

Plain TCP connections are driven on the socket's descriptor
(:class:`fscache.net.SocketWire`): a request costs one pass through trio's
scheduler -- wake, read, handle, write -- and the replies to one batch of requests
leave in one write from the task that read them. After that write the store
closes the batch's files and caches their contents (:meth:`Store.settle`), off the
critical path of the replies.

A broken, closed or failing connection surfaces as the transport's exceptions;
:func:`_transport_errors`, entered once by each task that touches the wire, turns
them into :class:`~fscache.errors.Unavailable`, which ends that connection alone.
A restart is timed by one record in the store's state directory
(:func:`begin_incarnation`): writes wait out the previous incarnation's leases
unless it stopped cleanly with none live.

Ephemeral files (:mod:`fscache.ephemeral`): every change of a file carries its
effect on the ties, which :class:`~fscache.server.ephemeral.Ties` plans when the
table applies it and records around its store call. When a session ends (a
goodbye, an expiry) and at start (for the ties of an earlier incarnation) the files
to delete become deletes queued by the server's own connection, which sends nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import ipaddress
import itertools
import json
import logging
import math
import os
import resource
import secrets
import signal
import socket
import ssl
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any, ClassVar

import trio

from fscache import names
from fscache import protocol as p
from fscache.access import ANONYMOUS, Access, AccessRules, BadAccessFile, describe, parse
from fscache.ephemeral import DeleteTied, Move, Rewrite, TieChange
from fscache.errors import (
    Conflict,
    FscacheError,
    NotDurable,
    ProtocolError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from fscache.leases import (
    AdaptiveTermPolicy,
    ApplyWrite,
    Discarded,
    Effect,
    Footprint,
    Grant,
    HolderId,
    LeaseTable,
    OpId,
    SendApprovalRequest,
    TermPolicy,
    WriteCommitted,
)
from fscache.net import SocketWire, Wire, ready_now, shown_address, wire_for
from fscache.paths import normalize, normalize_key
from fscache.server.ephemeral import Nowhere, Ties
from fscache.server.latency import Latencies
from fscache.server.locks import LockService
from fscache.server.logs import EVENTS, Throttle, event, loud_event, rare_event, wall_time
from fscache.server.store import Facts, Store, Upload
from fscache.sessions import Attached, SessionTable, check_session_ttl, default_ttl
from fscache.settings import (
    CHUNK_SIZE,
    DEFAULT_HOST,
    DEFAULT_HOT_WRITES,
    DEFAULT_MAX_FRAME,
    DEFAULT_PORT,
    DEFAULT_SKEW,
    DEFAULT_TERM,
    FRAME_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IDENTITY,
    MAX_IN_FLIGHT,
    MAX_LEASES_PER_HOLDER,
    MAX_OUTBOX,
    MAX_PATHS,
    MAX_PENDING_WRITE_BYTES,
    MAX_PENDING_WRITE_BYTES_TOTAL,
    MAX_SECRET,
    MAX_TERM,
    MAX_UPLOADS,
    SEND_TIMEOUT,
    BadSetting,
    check_duration,
    check_host,
    identity_problem,
)

log = logging.getLogger("fscache.server")

BlockingIO = Callable[..., Awaitable[Any]]

INCARNATION_FILE = "incarnation.json"  # in the store's state directory
SECRET_BYTES = 16  # a session's secret: unguessable, as a 128-bit key is
# Requests one connection handles before the others get a turn: a client pipelining
# thousands of requests delays another's by at most this many (about 1 ms), while
# the replies to a turn still leave in one write.
MAX_REQUESTS_PER_TURN = 32
SWITCH_INTERVAL = 0.001  # seconds a thread may hold the GIL while another waits
# Connections the kernel queues for accept(): as many as it allows (it silently caps
# this at net.core.somaxconn, 4096 on current Linux), so that thousands of clients
# reconnecting at once after a restart wait in the queue instead of being dropped.
LISTEN_BACKLOG = 0xFFFF
# New connections whose handshake starts per pass of the scheduler. Everything the
# kernel has queued is accepted at once (its queue is never what fills up); the rest
# wait, accepted, in arrival order, so a pass during a storm of reconnections stays a
# few milliseconds long and the accept loop comes round again soon.
HANDSHAKES_PER_TURN = 64
ACCEPT_RETRY = 0.1  # s: out of descriptors or memory, accept again after this
OWN_FILES = 64  # descriptors the server needs besides its connections (store, threads)
# Young objects the garbage collector lets accumulate before a collection (Python's
# default is 700). A server with 10,000 connections holds some 640,000 objects that
# live as long as the connections; with the default, the burst of objects of one
# write's 10,000 approval requests was promoted to the old generation and each such
# write ended in a full collection that walked all of them (0.4-0.6 s of CPU). At this
# threshold short-lived objects die before a collection looks at them.
GC_YOUNG_THRESHOLD = 50_000


@dataclasses.dataclass
class ServerSettings:
    """What ``fscache serve`` can be told; checked here, once, on construction."""

    root: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    term: float = DEFAULT_TERM
    skew: float = DEFAULT_SKEW
    hot_writes: int = DEFAULT_HOT_WRITES
    max_frame: int = DEFAULT_MAX_FRAME
    max_outbox: int = MAX_OUTBOX
    send_timeout: float = SEND_TIMEOUT
    tls_dir: str | None = None
    access_file: str | None = None  # TOML rules (fscache.access); reloaded on SIGHUP
    shared: bool = False  # files and directories the store makes: group-readable, not private
    session_ttl: float | None = None  # a detached session's life; None: default_ttl
    # limits (fscache.settings says why each default)
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_identity: int = MAX_CONNECTIONS_PER_IDENTITY
    max_in_flight: int = MAX_IN_FLIGHT
    max_pending_write_bytes: int = MAX_PENDING_WRITE_BYTES
    max_pending_write_bytes_total: int = MAX_PENDING_WRITE_BYTES_TOTAL
    max_leases_per_holder: int = MAX_LEASES_PER_HOLDER
    frame_timeout: float = FRAME_TIMEOUT

    def __post_init__(self) -> None:
        self.host = check_host("host", self.host)
        self.term = check_duration("term", self.term)
        self.skew = check_duration("skew", self.skew)
        for name, value in (("term", self.term), ("skew", self.skew)):
            if value > MAX_TERM:  # (and so is a restart window)
                raise BadSetting(f"{name} must be at most {MAX_TERM:g} s, not {value:g}")
        if self.session_ttl is not None:
            self.session_ttl = check_session_ttl(self.session_ttl)
        if not 0 <= self.port <= 65535:
            raise BadSetting(f"port must be 0..65535, not {self.port}")
        if self.hot_writes < 0:
            raise BadSetting(f"hot_writes must be >= 0, not {self.hot_writes}")
        if self.max_frame < 1024:
            raise BadSetting(f"max_frame must be at least 1024 bytes, not {self.max_frame}")
        for timeout in TIMEOUTS:
            seconds = check_duration(timeout, getattr(self, timeout))
            if seconds == 0:
                raise BadSetting(f"{timeout} must be more than 0 seconds")
            setattr(self, timeout, seconds)
        for limit in LIMITS:
            if getattr(self, limit) < 1:
                raise BadSetting(f"{limit} must be at least 1, not {getattr(self, limit)}")
        if self.max_outbox < self.max_frame:  # else one big reply would drop its connection
            raise BadSetting(
                f"max_outbox must be at least max_frame ({self.max_frame}), not {self.max_outbox}"
            )

    @property
    def max_file_size(self) -> int:
        return self.max_frame - 1024  # room for the reply's other fields


# The settings that bound what clients can take (``fscache serve``'s limits, logged at
# start): whole numbers >= 1, and durations > 0.
LIMITS = (
    "max_connections",
    "max_connections_per_identity",
    "max_in_flight",
    "max_pending_write_bytes",
    "max_pending_write_bytes_total",
    "max_leases_per_holder",
    "max_outbox",
)
TIMEOUTS = ("frame_timeout", "send_timeout")
# The limits at which a new connection is refused (counted in connections_refused).
_CONNECTION_LIMITS = ("max_connections", "max_connections_per_identity")
# Store failures that are the operator's to fix, not the client's: a full disk or
# quota, a read-only file system, a failing disk, the server's own tree not
# permitted to it. Each is logged (a warning naming the operation and the path), at
# most once per cause per STORAGE_WARNING_INTERVAL seconds.
STORAGE_FAILURES = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EPERM, errno.EACCES}
)
STORAGE_WARNING_INTERVAL = 10.0


# ---------------------------------------------------------------- restart window
def begin_incarnation(store: Store, max_term: float, skew: float) -> float:
    """Record this incarnation and return how long writes must be held back (seconds).

    A fresh root (never served) and a root whose last server stopped cleanly with
    no live leases need no window. Otherwise leases granted by the previous
    incarnation may still be live: hold writes for the larger of its and our
    ``max_term + skew``, and of the window it owed itself (``owed``). That one
    matters when a server is restarted, and stops again, within the window of a
    server with a longer term: the leases of that one may still be live, whatever
    the term of the one between. So the record keeps what this incarnation owes
    until its window is over (:func:`close_restart_window`).

    A record that cannot be read, or holds a field that is not a number of seconds,
    counts as a crash with our term; a field over :data:`MAX_TERM` counts as that
    (no server takes a longer term, and a window longer than the calendar would
    keep the root from being served again).
    """
    previous = _load_incarnation(store)
    window = 0.0
    if previous is not None and not previous.get("clean", False):
        held = _seconds(previous, "max_term", max_term) + _seconds(previous, "skew", skew)
        window = max(held, _seconds(previous, "owed", 0.0), max_term + skew)
    _save_incarnation(store, max_term=max_term, skew=skew, clean=False, owed=window)
    return window


def close_restart_window(store: Store, max_term: float, skew: float) -> None:
    """Our restart window is over: no lease of an earlier incarnation is live, so the
    next start owes only ours."""
    _save_incarnation(store, max_term=max_term, skew=skew, clean=False)


def end_incarnation_cleanly(store: Store, max_term: float, skew: float) -> None:
    """No lease of ours is live: the next incarnation needs no restart window."""
    _save_incarnation(store, max_term=max_term, skew=skew, clean=True)


def _load_incarnation(store: Store) -> dict[str, Any] | None:
    """The last incarnation's record; unreadable counts as a crash (the window)."""
    data = store.load_state(INCARNATION_FILE)
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    return record if isinstance(record, dict) else {}


def _seconds(record: dict[str, Any], field: str, otherwise: float) -> float:
    """``record[field]`` as seconds, at most :data:`MAX_TERM`; ``otherwise`` if it is
    missing or not a finite number >= 0."""
    try:
        return min(check_duration(field, record.get(field)), MAX_TERM)
    except BadSetting:
        return otherwise


def _save_incarnation(store: Store, **record: float | bool) -> None:
    store.save_state(INCARNATION_FILE, json.dumps(record).encode())


# ---------------------------------------------------------------- transport errors
_TRANSPORT_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


@contextlib.contextmanager
def _transport_errors() -> Iterator[None]:
    """The one place where the transport's exceptions become fscache's: a connection
    that broke, was closed or failed at the socket raises :class:`Unavailable`.
    Entered once per connection task, never per message."""
    try:
        yield
    except _TRANSPORT_ERRORS as exc:
        raise Unavailable(f"connection lost: {exc}") from exc


# ---------------------------------------------------------------- per-connection outbox
class Outbox:
    """Frames waiting to be sent on one connection, in order, bounded in bytes.

    Replies to a batch of requests are sent by the task that read the batch
    (:meth:`flush`), joined into one send and without waking another task; frames
    queued at other times (approval requests caused by another client, replies to
    writes that waited) are sent by a sender task (:meth:`run`), started when such a
    frame is queued and ended when the queue is empty, so an idle connection has
    none. Only one send is ever under way, so frames leave in the order they were
    queued.
    """

    __slots__ = (
        "_frames", "_send_now", "_sender_running", "_sending", "batching", "closed",
        "limit", "nbytes", "send_started", "start_sender", "wire",
    )  # fmt: skip

    def __init__(self, wire: Wire, limit: int) -> None:
        self.wire = wire
        self.limit = limit
        # Writes without waiting (plain TCP): replies to a batch leave with no await.
        self._send_now = wire.send_now if isinstance(wire, SocketWire) else None
        self.send_started: float | None = None  # when the send under way began
        self._frames: list[bytes] = []
        self.nbytes = 0
        self._sending = False
        self._sender_running = False
        # Starts a task running :meth:`run`; None: no task may start (frames wait).
        self.start_sender: Callable[[], None] | None = None
        self.batching = False  # the reading task will flush: start no sender
        self.closed = False

    def put(self, frame: bytes) -> bool:
        """Queue ``frame``; False if the peer is too far behind (the caller drops it)."""
        if self.closed:
            return True
        self._frames.append(frame)
        self.nbytes += len(frame)
        if not self.batching:
            self.wake_sender()
        return self.nbytes <= self.limit

    def push(self, frame: bytes) -> bool:
        """Queue ``frame`` as :meth:`put` does, but write it now from the calling task
        when nothing is queued or being sent and the socket takes it whole: a write
        that asks thousands of holders to approve wakes no sender task for each."""
        if self._frames or self._sending or self.batching or self.closed or self._send_now is None:
            return self.put(frame)
        try:
            sent = self._send_now(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            sent = 0  # the sender task meets the error and ends the connection
        return sent == len(frame) or self.put(frame[sent:])

    def wake_sender(self) -> None:
        """Start a sender task if frames wait and none runs."""
        if self._frames and not self._sender_running and self.start_sender is not None:
            self._sender_running = True
            self.start_sender()

    def _take(self) -> bytes:
        """Everything queued, as one buffer (one send for many replies)."""
        frames = self._frames
        data = b"".join(frames)  # one frame: that very object, not a copy
        frames.clear()
        self.nbytes = 0
        return data

    async def _send_queued(self) -> None:
        self._sending = True
        try:
            data = self._take()
            self.send_started = trio.current_time()
            await self.wire.send_all(data)
        finally:
            self._sending = False
            self.send_started = None
        self.wake_sender()  # queued meanwhile: a sender sends it (this one, if it runs)

    def flush_now(self) -> bool:
        """Write what is queued as far as the kernel takes it now, unless a send is
        under way. True if nothing is left for :meth:`flush` to do."""
        self.batching = False
        if not self._frames or self._sending:
            return True
        if self._send_now is None:
            return False
        data = self._take()
        sent = self._send_now(data)
        if sent == len(data):
            return True
        self._frames.append(data[sent:])  # the rest, alone in the queue: it goes first
        self.nbytes = len(data) - sent
        return False

    async def flush(self) -> None:
        """Send what is queued now, from the calling task, unless a send is under way
        (then the sender task sends it when that one is done)."""
        self.batching = False
        if self._frames and not self._sending:
            await self._send_queued()

    async def run(self) -> None:
        """The sender: send what is queued, in order, until nothing is (or another
        task's send is under way: that task starts a sender again if it must)."""
        self._sender_running = True
        try:
            while self._frames and not self._sending:
                await self._send_queued()
        finally:
            self._sender_running = False

    def close(self) -> None:
        """No more frames; those queued still go out."""
        self.closed = True
        self.wake_sender()


@dataclasses.dataclass(slots=True)
class Counters:
    """What the server counts; ``fscache stats`` reports each field under its name."""

    reads: int = 0
    reads_not_modified: int = 0
    writes: int = 0
    deletes: int = 0
    writes_applied: int = 0
    extend_requests: int = 0
    extend_paths: int = 0
    approvals_received: int = 0
    relinquish_requests: int = 0
    stats_requests: int = 0
    pings: int = 0
    messages_in: int = 0
    messages_out: int = 0
    errors: int = 0
    connections_total: int = 0
    connections_dropped: int = 0
    connections_refused: int = 0  # beyond max_connections or max_connections_per_identity
    reads_over_lease_limit: int = 0  # term 0 or stale: the holder had max_leases_per_holder
    protocol_errors: int = 0
    range_reads: int = 0
    listings: int = 0
    uploads: int = 0
    range_writes: int = 0
    truncates: int = 0
    renames: int = 0
    mkdirs: int = 0
    rmdirs: int = 0
    writes_withdrawn: int = 0  # uploads whose writer gave up after the commit, not applied


@dataclasses.dataclass(eq=False, slots=True)
class _Commit:
    """An upload whose commit has come: the data is synced, then its write queues as
    ``op``. Its writer may still withdraw it (an ``UploadAbort``) until it is applied."""

    upload: Upload
    op: OpId | None = None  # None while its data is synced
    withdrawn: bool = False  # withdrawn while synced: never queued


@dataclasses.dataclass(eq=False)
class Connection:
    holder: HolderId  # its session
    outbox: Outbox
    cancel: trio.CancelScope
    peer: str
    counters: Counters
    goodbye: bool = False
    alive: bool = True
    uploads: dict[int, Upload] = dataclasses.field(default_factory=dict)  # by upload id
    commits: dict[int, _Commit] = dataclasses.field(default_factory=dict)  # sent, unanswered
    part: p.UploadPart | None = None  # for the receive loop to write before it reads on
    identity: str = ANONYMOUS  # the name on the client's certificate (fscache.access)
    attachment: int = 0  # its number in the session table
    in_flight: int = 0  # requests the lease table holds (queued reads, waiting writes)
    received_at: float = 0.0  # when the batch being handled arrived
    heard_at: float = 0.0  # when the client last sent anything
    silent: bool = False  # cut for silence: its session is detached as of heard_at
    dropped_for: str | None = None  # why the server ended it (its disconnect's reason)
    lost: str | None = None  # the transport's error that ended a send
    slot_freed: trio.Event = dataclasses.field(default_factory=trio.Event)

    def send(self, message: p.Message) -> None:
        self.send_frame(p.encode(message))

    def drop(self, why: str) -> None:
        """End the connection from the server's side, for ``why``: nothing more is
        sent on it."""
        self.dropped_for = self.dropped_for or why
        self.alive = False
        self.cancel.cancel()

    def send_frame(self, frame: bytes, *, push: bool = False) -> None:
        """Queue ``frame`` (``push``: written at once if it can be, see Outbox.push)."""
        if not self.alive:
            return
        self.counters.messages_out += 1
        if not (self.outbox.push(frame) if push else self.outbox.put(frame)):
            log.warning("%s is not reading its replies; dropping the connection", self.peer)
            self.drop("its unsent replies passed max_outbox")


Page = tuple[int, list[tuple[str, bool, int, int]], bool]  # Store.scandir's answer


@dataclasses.dataclass(frozen=True, slots=True)
class _Scanned:
    """A listing request and its page, read in a worker thread before its lease."""

    message: p.ScanDir
    page: Page | FscacheError

    @property
    def id(self) -> int:
        return self.message.id


_LeasedRead = p.Read | p.ReadRange | _Scanned
_WriteRequest = (
    p.Write | p.Delete | p.WriteRange | p.Truncate | p.UploadCommit | p.Rename | p.MkDir | p.RmDir
)


@dataclasses.dataclass(eq=False)
class _Pending:
    """A request the lease table is holding (queued read, waiting or applying write).
    A write carries its store call, run in a worker thread once the table applies it."""

    connection: Connection
    request: _LeasedRead | _WriteRequest | p.ScanDir | p.ListDir  # a listing, while read
    apply: Callable[[], int | None] | None = None
    version: int = 0
    not_durable: NotDurable | None = None  # applied, visible, maybe not on disk: an error
    nbytes: int = 0  # the request's data held in memory until it is answered
    arrived: float = 0.0  # when the lease table took it (for the latency histograms)


_NOTHING_TO_CACHE = (p.Delete, p.MkDir, p.RmDir)  # answered Done; the writer's lease goes


def _check_paths(message: p.Extend | p.Relinquish) -> None:
    if len(message.paths) > MAX_PATHS:
        raise ProtocolError(
            f"{message.TYPE} names {len(message.paths)} paths, over the limit MAX_PATHS="
            f"{MAX_PATHS}: send them in several messages"
        )


def _directory(key: str) -> str:
    """The directory whose name set the directory key ``key`` stands for (``docs/``:
    ``docs``; ``/``: the root, ``""``)."""
    return key[:-1]


# ---------------------------------------------------------------- the service
class FileService:
    def __init__(
        self,
        settings: ServerSettings,
        *,
        policy: TermPolicy | None = None,
        blocking_io: BlockingIO = trio.to_thread.run_sync,
        exclusive: bool = False,
    ) -> None:
        self.settings = settings
        self._blocking_io = blocking_io  # how fsyncing writes run: a worker thread
        self.store = Store(  # exclusive: the root's lock, refused while another server runs
            settings.root,
            max_file_size=settings.max_file_size,
            shared=settings.shared,
            exclusive=exclusive,
        )
        self.policy = policy or AdaptiveTermPolicy(
            default=settings.term, hot_writes=settings.hot_writes, window=max(settings.term, 1.0)
        )
        self.epoch = secrets.token_hex(8)
        # The run's clock (trio's own, or a test's MockClock), read directly:
        # trio.current_time() returns the same value through a wrapper that protects
        # it from KeyboardInterrupt, which costs more than reading the clock. A read
        # and an approval read it about twice each, a 10,000-holder fan-out 20,000
        # times.
        self._now = trio.lowlevel.current_clock().current_time
        self.started_at = self._now()
        self.locks = LockService(
            self.store, skew=settings.skew, blocking_io=blocking_io, now=self.started_at
        )
        self.host = settings.host  # the bound address once listening (port 0 works)
        self.port = settings.port
        self.sessions = SessionTable(
            ttl=default_ttl(self.policy.max_term, settings.skew)
            if settings.session_ttl is None
            else settings.session_ttl,
            prefix=self.epoch,
        )
        self.connections: dict[HolderId, Connection] = {}  # by session
        self._open = 0  # connections admitted and not yet closed (in handshake too)
        self._max_leases = settings.max_leases_per_holder
        self._by_identity: Counter[str] = Counter()  # connections past the hello
        self._pending: dict[OpId, _Pending] = {}
        # by session: a write outlives its connection, so a resumed session's new
        # connection shares the budget its waiting writes still take
        self._pending_bytes: Counter[HolderId] = Counter()
        self._pending_bytes_total = 0  # the sum of the above
        # The ids of the requests given to the lease table, 1, 2, ...: counted in C,
        # with no Python frame on each read's path.
        self._new_op: Callable[[], OpId] = map(OpId, itertools.count(1)).__next__
        self._nursery: trio.Nursery | None = None
        self._timer_wake = trio.Event()
        self._timer_at = math.inf
        self.counters = Counters()
        self._tls_refusals = Throttle()  # their log lines: at most one a second
        self._refusals = {limit: Throttle() for limit in _CONNECTION_LIMITS}  # likewise
        self._storage_failures: dict[str, Throttle] = {}  # by cause (errno's name)
        self.latency = Latencies()  # fscache.server.latency
        self.access = None if settings.access_file is None else load_access(settings.access_file)
        self.ephemeral = Ties(self.store)  # files tied to sessions (fscache.ephemeral)
        self._own = Connection(  # the server's own writes: the deletes of ended sessions
            HolderId(f"{self.epoch}.server"), Outbox(Nowhere(), 0), trio.CancelScope(),
            "server", self.counters, alive=False,
        )  # fmt: skip
        # Last, once everything that can refuse the start (the access file, the lock
        # log) has been read: a start refused before this line leaves the record as
        # it found it, and the next start no window it does not need.
        self._found_incarnation = self.store.load_state(INCARNATION_FILE)  # for abandon()
        self.restart_window = begin_incarnation(self.store, self.policy.max_term, settings.skew)
        self.stopped_cleanly = False  # set by shutdown: the next start needs no window
        self.table = LeaseTable(
            self.policy, skew=settings.skew, hold_writes_until=self.started_at + self.restart_window
        )

    # ------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[list[trio.SocketListener]]) -> None:
        """Listen and serve until cancelled. ``task_status.started`` gets the listeners."""
        s = self.settings
        ssl_context = None
        if s.tls_dir is not None:
            from fscache.tls import server_context

            ssl_context = server_context(s.tls_dir)
        try:
            listeners = await trio.open_tcp_listeners(s.port, host=s.host, backlog=LISTEN_BACKLOG)
        except OSError as exc:
            raise FscacheError(f"cannot listen on {shown_address(s.host, s.port)}: {exc}") from None
        except UnicodeError:  # the resolver's, for a name IDNA cannot encode ("a..b")
            raise FscacheError(
                f"cannot listen on {shown_address(s.host, s.port)}: bad host name"
            ) from None
        open_files = _raise_open_files_limit(s.max_connections)
        # One line at start, in the default log too: operators want the limits in force
        # (a warning above it if the open files limit is too low for max_connections).
        log.info(
            "limits: %s, open files %s",
            ", ".join(f"{name} {getattr(s, name)}" for name in LIMITS + TIMEOUTS), open_files,
        )  # fmt: skip
        # A worker thread (fsyncs, listings) keeps the GIL for up to the switch interval
        # while the event loop waits for it: 5 ms by default, 1 ms here. Measured while
        # a 100,000-name directory was listed: another client's p99 round trip went
        # from 4.2 ms to 3.0 ms.
        sys.setswitchinterval(SWITCH_INTERVAL)
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        self.host, self.port = listeners[0].socket.getsockname()[:2]
        if ssl_context is None and not all(_is_loopback(lst) for lst in listeners):
            log.warning(
                "serving plain TCP on %s, beyond this machine: anyone who can reach it"
                " reads and writes as %r; use --tls", shown_address(self.host, self.port),
                ANONYMOUS,
            )  # fmt: skip
        if self.restart_window > 0:
            wall = time.time()
            event(
                "restart_window", "writes held for %.3f s by the restart window",
                self.restart_window, start=wall_time(wall),
                until=wall_time(wall + self.restart_window), seconds=self.restart_window,
            )  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reload_access_on_sighup, s.access_file)
            await nursery.start(self.run_engine)
            nursery.start_soon(self._accept, listeners, ssl_context)
            task_status.started(listeners)

    async def run_engine(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the timer and host write tasks until cancelled, without a listener:
        feed connections with :meth:`serve_stream` (tests use memory streams)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._run_timer)
            await nursery.start(self.locks.run)
            self._delete_tied(self.ephemeral.recover(self._now()))
            nursery.start_soon(self._watch_sends)
            nursery.start_soon(self._watch_silence)
            if self.restart_window > 0:
                nursery.start_soon(self._close_restart_window)
            task_status.started()

    async def _close_restart_window(self) -> None:
        """At the end of the restart window, record that the next start owes only our
        own window (:func:`begin_incarnation`)."""
        await trio.sleep_until(self.table.hold_writes_until)
        close_restart_window(self.store, self.policy.max_term, self.settings.skew)

    async def _accept(
        self, listeners: list[trio.SocketListener], ssl_context: ssl.SSLContext | None
    ) -> None:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_from, listener, nursery, ssl_context)

    async def _accept_from(
        self,
        listener: trio.SocketListener,
        nursery: trio.Nursery,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        """Accept connections on ``listener`` and serve each in a task of ``nursery``.

        trio's ``SocketListener.accept`` passes through the scheduler after each
        connection, so a server busy with a storm of reconnections took one per pass
        while the kernel's queue overflowed. Here each pass accepts everything queued
        (on a duplicate of the listening descriptor, with no pass in between) and
        starts the handshakes of at most HANDSHAKES_PER_TURN of them; the others wait,
        accepted, in arrival order."""
        arrived: deque[socket.socket] = deque()
        accepting = socket.socket(fileno=os.dup(listener.socket.fileno()))
        accepting.setblocking(False)
        failed = 0  # accepts in a row that ran out of room (logged at the first and last)
        try:
            async with listener:
                while True:
                    out_of_room = _accept_queued(accepting, arrived)
                    if out_of_room is not None and not failed:
                        log.error(
                            "accept failed: %s; trying again every %s s", out_of_room, ACCEPT_RETRY
                        )
                    elif out_of_room is None and failed:
                        log.warning("accepting again, after %d failed tries", failed)
                    failed = 0 if out_of_room is None else failed + 1
                    for _ in range(min(len(arrived), HANDSHAKES_PER_TURN)):
                        nursery.start_soon(self._serve_socket, arrived.popleft(), ssl_context)
                    if out_of_room is not None:
                        await trio.sleep(ACCEPT_RETRY)
                    elif arrived:
                        await trio.lowlevel.checkpoint()
                    else:
                        await trio.lowlevel.wait_readable(accepting)
        finally:
            for sock in arrived:
                sock.close()
            accepting.close()

    async def _serve_socket(self, sock: socket.socket, ssl_context: ssl.SSLContext | None) -> None:
        try:
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        except OSError:  # reset before we looked at it
            sock.close()
            return
        try:
            if ssl_context is None:
                await self.serve_stream(stream)
            else:
                await self.serve_stream(trio.SSLStream(stream, ssl_context, server_side=True))
        finally:
            await trio.aclose_forcefully(stream)

    async def _reload_access_on_sighup(self, path: str | None) -> None:
        """Load the access file again on each SIGHUP; a bad file leaves the rules as they
        were. Connections stay; their next request meets the new rules. Without an
        access file a SIGHUP only says so: a server stopped by ``kill -HUP`` (the
        signal's default) would leave its store as after a crash."""
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                if path is None:
                    log.info("SIGHUP: no access file (--access) to reload; serving on")
                    continue
                try:
                    self.access = load_access(path)
                except BadAccessFile as exc:
                    log.error("access rules not reloaded, the old ones stay: %s", exc)

    async def _run_timer(self) -> None:
        while True:
            deadline = self._next_deadline()
            self._timer_at = math.inf if deadline is None else deadline
            with trio.move_on_at(self._timer_at):
                await self._timer_wake.wait()
            self._timer_wake = trio.Event()
            now = self._now()
            for expired in self.sessions.tick(now):
                event(
                    "session_expired", "session %s (%s) expired", expired.session,
                    expired.label, session=expired.session, label=expired.label,
                )  # fmt: skip
                self._delete_tied(self.ephemeral.table.session_ended(expired.session, now))
            self._execute(self.table.tick(now))
            self.store.settle()

    def _next_deadline(self) -> float | None:
        deadlines = (self.table.next_deadline(), self.sessions.next_deadline())
        return min((d for d in deadlines if d is not None), default=None)

    def _deadline_may_have_moved(self) -> None:
        """After a lease table event (a session's expiry moves only on detach)."""
        self._wake_timer_by(self.table.next_deadline())

    def _wake_timer_by(self, deadline: float | None) -> None:
        if deadline is not None and deadline < self._timer_at:
            self._timer_at = deadline
            self._timer_wake.set()

    # ------------------------------------------------------------ one connection
    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one client connection until it closes. Never raises."""
        peer = _peer_name(stream)
        self.counters.connections_total += 1
        decoder = p.FrameDecoder(self.settings.max_frame)
        wire = wire_for(stream)
        # a connection turned away is not counted: while it is told why, the
        # connections open are still the limit's, not one more
        admitted = self._open < self.settings.max_connections
        self._open += admitted
        try:
            try:
                if not admitted:
                    # before a TLS handshake the identity is not known yet
                    identity = None if isinstance(stream, trio.SSLStream) else ANONYMOUS
                    await self._refuse_connection(wire, peer, identity, self._open)
                    return
                hello = await self._handshake(wire, decoder, peer, stream)
                if hello is None:
                    return
                identity = _identity(stream)
                await self._serve_client(wire, decoder, hello, peer, identity)
            finally:
                await wire.aclose()
        # except*: _serve_client's nursery wraps a reset connection in an ExceptionGroup
        except* Unavailable as lost:
            log.debug("%s: %s", peer, lost.exceptions[0])
        except* Exception:  # a bug must cost one connection, never the server
            log.exception("%s: internal error; connection closed", peer)
        finally:
            self._open -= admitted

    async def _refuse_connection(
        self, wire: Wire, peer: str, identity: str | None, count: int
    ) -> None:
        """Tell a connection beyond max_connections why it is closed; the others are
        untouched."""
        limit = "max_connections"
        self._refused(peer, limit, identity, count)
        error = Unavailable(
            f"the server is at its limit {limit}={self.settings.max_connections} "
            f"({count} connections open); try later"
        )
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            await _send_quietly(wire, p.Error(id=None, code=error.code, message=str(error)))

    def _admit(self, identity: str, peer: str) -> None:
        """Refuse a connection of ``identity`` beyond max_connections_per_identity."""
        limit = self.settings.max_connections_per_identity
        count = self._by_identity[identity]
        if count >= limit:
            self._refused(peer, "max_connections_per_identity", identity, count)
            raise Unavailable(
                f"{identity!r} has {count} connections open, the limit "
                f"max_connections_per_identity={limit}; try later"
            )

    def _refused(self, peer: str, limit: str, identity: str | None, count: int) -> None:
        """Count and log a connection turned away at ``limit`` (one of
        :data:`_CONNECTION_LIMITS`) with ``count`` connections open: a warning, at
        most one a second for each limit (clients retrying at the limit cannot flood
        the log), and a ``refused`` event every time."""
        self.counters.connections_refused += 1
        who = "not known before the TLS handshake" if identity is None else repr(identity)
        loud_event(
            self._refusals[limit], self._now(),
            "refused", "%s: refused at the limit %s (%s connections open; identity %s)",
            peer, limit, count, who, peer=peer, limit=limit, identity=identity, open=count,
        )  # fmt: skip

    async def _handshake(
        self, wire: Wire, decoder: p.FrameDecoder, peer: str, stream: trio.abc.Stream
    ) -> p.Hello | None:
        with trio.move_on_after(HANDSHAKE_TIMEOUT), _transport_errors():
            try:
                while (message := decoder.next_message()) is None:
                    data = await wire.receive()
                    if not data:
                        return None
                    decoder.feed(data)
                if not isinstance(message, p.Hello):
                    raise ProtocolError(f"expected hello, got {message.TYPE}")
                if message.version != p.PROTOCOL_VERSION:
                    raise ProtocolError(
                        f"protocol version {message.version} is not supported "
                        f"(this server speaks {p.PROTOCOL_VERSION})"
                    )
                if (problem := identity_problem(message.client_id, "client_id")) is not None:
                    raise ProtocolError(problem)
                if (message.session is None) != (message.secret is None):
                    raise ProtocolError("a resume names both a session and its secret")
                if message.session is not None and len(message.session) > 256:
                    raise ProtocolError("session must be at most 256 characters")
                if message.secret is not None and len(message.secret) > MAX_SECRET:
                    raise ProtocolError(f"secret must be at most {MAX_SECRET} bytes")
                self._admit(_identity(stream), peer)
            except trio.BrokenResourceError as exc:
                refused = exc.__cause__
                if not isinstance(refused, ssl.SSLError):
                    raise
                reason = refused.reason or str(refused)  # e.g. CERTIFICATE_VERIFY_FAILED
                # A client with the wrong bundle, or none, or plain TCP: the operator's to
                # fix, so a warning for every cause (loud_event: the level never depends on
                # the cause or on how many came just before; only the text log is throttled).
                loud_event(
                    self._tls_refusals, self._now(),
                    "tls_refused", "%s: TLS handshake failed: %s", peer, reason,
                    peer=peer, reason=reason,
                )  # fmt: skip
                return None
            except FscacheError as exc:
                self.counters.protocol_errors += not isinstance(exc, Unavailable)
                await _send_quietly(wire, p.Error(id=None, code=exc.code, message=str(exc)))
                return None
            return message
        log.info("%s: no hello within %s s; closed", peer, HANDSHAKE_TIMEOUT)
        return None

    def _attach(self, hello: p.Hello, identity: str) -> tuple[Attached, bytes]:
        """The session ``hello`` opens or resumes (:mod:`fscache.sessions`) and its
        secret; a refused resume raises :class:`Unauthorized`."""
        now = self._now()
        secret = secrets.token_bytes(SECRET_BYTES)
        if hello.session is None or hello.secret is None:
            return self.sessions.open(hello.client_id, identity, secret, now), secret
        attached = self.sessions.resume(
            HolderId(hello.session), hello.secret,
            label=hello.client_id, identity=identity, new_secret=secret, now=now,
        )  # fmt: skip
        if not isinstance(attached, Attached):
            raise Unauthorized(f"resume refused: {attached.reason}")
        if not attached.resumed:  # after a restart, every client's: not worth a line each
            log.debug("client %s: session %s is unknown; a new one", hello.client_id, hello.session)
            return attached, secret
        return attached, hello.secret

    def _welcome(self, attached: Attached, secret: bytes) -> p.Welcome:
        return p.Welcome(
            version=p.PROTOCOL_VERSION,
            epoch=self.epoch,
            term=self.policy.max_term,
            skew=self.settings.skew,
            max_frame=self.settings.max_frame,
            session=attached.session,
            secret=secret,
            resumed=attached.resumed,
        )

    async def _serve_client(
        self, wire: Wire, decoder: p.FrameDecoder, hello: p.Hello, peer: str, identity: str
    ) -> None:
        try:
            attached, secret = self._attach(hello, identity)
        except Unauthorized as exc:
            self.counters.errors += 1
            log.info("%s: client %s: %s", peer, hello.client_id, exc)
            await _send_quietly(wire, p.Error(id=None, code=exc.code, message=str(exc)))
            return
        holder = attached.session
        with trio.CancelScope() as cancel:
            outbox = Outbox(wire, self.settings.max_outbox)
            connection = Connection(holder, outbox, cancel, peer, self.counters)
            connection.identity = identity
            connection.attachment = attached.attachment
            if identity != ANONYMOUS:
                log.info("%s: client %s is %r", peer, hello.client_id, identity)
            previous = self.connections.get(holder)
            if previous is not None:  # the same client resumed: the old link is half-open
                previous.drop("its session resumed on another connection")
            self.connections[holder] = connection
            self._by_identity[identity] += 1
            connection.send(self._welcome(attached, secret))
            event(
                "connect", "%s: client %s connected, session %s", peer, hello.client_id, holder,
                peer=peer, session=holder, label=hello.client_id, identity=identity,
                resumed=attached.resumed,
            )  # fmt: skip
            try:
                self._execute(self.table.connected(holder, self._now()))
                async with trio.open_nursery() as nursery:
                    # the welcome goes out with the first batch's replies: no sender yet
                    outbox.start_sender = partial(nursery.start_soon, self._send_loop, connection)
                    await self._receive_loop(wire, decoder, connection)
                    outbox.close()  # what is queued goes out, then the sender ends
            finally:
                self._by_identity[identity] -= 1
                connection.alive = False
                outbox.start_sender = None  # its nursery is closed
                outbox.close()
                for upload in connection.uploads.values():  # never committed: removed
                    self.store.upload_abort(upload)
                connection.uploads.clear()
                current = self.connections.get(holder) is connection
                self.locks.connection_closed(
                    connection, goodbye=connection.goodbye, current=current
                )
                if current:
                    del self.connections[holder]
                    now = self._now()
                    ended = False
                    if connection.goodbye:
                        ended = self.sessions.end(holder, connection.attachment, now)
                    else:  # lost (as of its last message if cut for silence)
                        lost_at = connection.heard_at if connection.silent else now
                        self.sessions.detach(
                            holder, connection.attachment, lost_at,
                            at_least=self.locks.table.held_until(holder),
                        )  # fmt: skip
                        self._wake_timer_by(self.sessions.next_deadline())
                    self._execute(
                        self.table.disconnected(holder, goodbye=connection.goodbye, now=now)
                    )
                    if ended:
                        self._delete_tied(self.ephemeral.table.session_ended(holder, now))
                reason = _closed_because(connection, sys.exc_info()[1])
                if connection.dropped_for is not None:
                    self.counters.connections_dropped += 1
                event(
                    "disconnect", "%s: client %s disconnected, session %s: %s", peer,
                    hello.client_id, holder, reason, peer=peer, session=holder,
                    label=hello.client_id, goodbye=connection.goodbye, reason=reason,
                )  # fmt: skip

    async def _watch_sends(self) -> None:
        """Drop each connection whose send has not completed within send_timeout and
        whose socket has no room now: its peer stopped reading (room now: it read
        while this server was paused, see :func:`fscache.net.ready_now`). One
        watchdog for the server, looking every quarter of the timeout, rather than a
        cancel scope around every send or a task per connection."""
        timeout = self.settings.send_timeout
        while True:
            await trio.sleep(timeout / 4)
            now = self._now()
            for connection in list(self.connections.values()):
                started = connection.outbox.send_started
                if started is None or now - started < timeout:
                    continue
                if not ready_now(connection.outbox.wire, to_write=True):  # (else it reads)
                    log.warning("%s stopped reading its replies; dropping it", connection.peer)
                    connection.drop(f"a send took over send_timeout ({timeout:g} s)")

    async def _watch_silence(self) -> None:
        """Cut the connection of each session that holds ephemeral files and has sent
        nothing for the session TTL (its client pings every third of it): its session
        is detached as of its last message, so it expires and its files go
        (:meth:`fscache.sessions.SessionTable.is_silent`). A look every quarter TTL,
        at the sessions with files only. A connection with bytes waiting to be read is
        not silent, however long since this server last read it: the server may be the
        one that was paused (:func:`fscache.net.ready_now`)."""
        sessions = self.sessions
        while True:
            await trio.sleep(sessions.ttl / 4)
            now = self._now()
            for holder in self.ephemeral.table.sessions():
                connection = self.connections.get(holder)
                if connection is None or not sessions.is_silent(connection.heard_at, now):
                    continue
                if ready_now(connection.outbox.wire):  # it spoke: we have not read it yet
                    continue
                log.info(
                    "%s: silent for %.1f s holding ephemeral files; its session ends",
                    connection.peer, now - connection.heard_at,
                )  # fmt: skip
                connection.silent = True
                connection.drop("silent for the session TTL, holding ephemeral files")

    async def _send_loop(self, connection: Connection) -> None:
        try:
            with _transport_errors():
                await connection.outbox.run()
        except Unavailable as exc:  # the peer's end broke: the receiving task ends too
            connection.lost = str(exc)
            connection.cancel.cancel()

    async def _receive_loop(
        self, wire: Wire, decoder: p.FrameDecoder, connection: Connection
    ) -> None:
        with _transport_errors():
            await self._receive_batches(wire, decoder, connection)

    async def _receive_batches(
        self, wire: Wire, decoder: p.FrameDecoder, connection: Connection
    ) -> None:
        outbox = connection.outbox
        buffered_first = True  # frames may have come in the hello's packet
        received_at = frame_began = self._now()  # frame_began: the buffered frame's
        connection.heard_at = received_at
        max_in_flight = self.settings.max_in_flight
        frame_timeout = self.settings.frame_timeout
        while not connection.goodbye:
            if not buffered_first:
                begun = decoder.buffered  # receiving does not change it
                if begun:  # a frame has begun: it must arrive whole in time
                    with trio.move_on_at(frame_began + frame_timeout) as late:
                        data = await wire.receive()
                    if late.cancelled_caught:
                        self._close_for(connection, ProtocolError(
                            f"a frame begun {frame_timeout} s ago has not arrived whole"
                            " (the limit frame_timeout)"
                        ))  # fmt: skip
                        return
                else:
                    data = await wire.receive()
                if not data:
                    return
                received_at = connection.heard_at = self._now()
                if not begun:
                    frame_began = received_at
                decoder.feed(data)
            connection.received_at = received_at
            outbox.batching = True
            handled = approvals = 0
            try:
                while (message := decoder.next_message()) is not None:
                    frame_began = received_at  # what is left began in the last receive
                    self._dispatch(connection, message)
                    handled += 1
                    approvals += type(message) is p.Approve
                    if connection.part is not None:
                        await self._write_part(connection)
                        received_at = self._now()  # the socket was not read meanwhile
                    if connection.goodbye:
                        return
                    if connection.in_flight >= max_in_flight:
                        await self._wait_for_a_slot(connection)
                        received_at = self._now()
                    if handled == MAX_REQUESTS_PER_TURN:
                        break
            except (ProtocolError, TooLarge) as exc:
                self._close_for(connection, exc)
                return
            finally:
                outbox.batching = False
            sent = outbox.flush_now()  # the replies first, the bookkeeping after
            if approvals != handled:  # approvals alone move no deadline earlier
                self._deadline_may_have_moved()  # once per batch, for the reads' new leases
            if not sent:
                await outbox.flush()  # backpressure: read no more until the kernel takes it
            self.store.settle()  # close and cache what the batch read, now the replies are out
            buffered_first = handled == MAX_REQUESTS_PER_TURN
            if buffered_first:  # the turn is over: let other connections run first
                await trio.lowlevel.checkpoint()

    def _close_for(self, connection: Connection, exc: FscacheError) -> None:
        """End the connection for ``exc``, a fault of its own, saying why (the error
        is sent, then the receive loop returns and the connection closes)."""
        self.counters.protocol_errors += 1
        log.info("%s: %s; closing", connection.peer, exc)
        connection.dropped_for = str(exc)  # first: a drop while sending keeps this reason
        connection.send(p.Error(id=None, code=exc.code, message=str(exc)))

    async def _wait_for_a_slot(self, connection: Connection) -> None:
        """Backpressure: at max_in_flight the connection's socket is not read until one
        of its held requests is answered. Its replies so far go out first."""
        await connection.outbox.flush()
        while connection.in_flight >= self.settings.max_in_flight:
            await connection.slot_freed.wait()
            connection.slot_freed = trio.Event()
        connection.outbox.batching = True

    def _hold(self, op: OpId, pending: _Pending) -> None:
        """The lease table holds ``pending`` (a queued read, a waiting write) as ``op``."""
        self._pending[op] = pending
        pending.arrived = self._now()
        connection = pending.connection
        connection.in_flight += 1
        if pending.nbytes:
            self._pending_bytes[connection.holder] += pending.nbytes
            self._pending_bytes_total += pending.nbytes

    def _release(self, op: OpId) -> _Pending | None:
        """``op`` is answered or dropped: its connection may send more."""
        pending = self._pending.pop(op, None)
        if pending is not None:
            connection = pending.connection
            connection.in_flight -= 1
            if pending.nbytes:
                holder = connection.holder
                self._pending_bytes[holder] -= pending.nbytes
                self._pending_bytes_total -= pending.nbytes
                if not self._pending_bytes[holder]:
                    del self._pending_bytes[holder]
            connection.slot_freed.set()
        return pending

    # ------------------------------------------------------------ requests
    def _dispatch(self, connection: Connection, message: p.Message) -> None:
        self.counters.messages_in += 1
        handler = self._handlers.get(type(message))
        if handler is None:
            raise ProtocolError(f"{message.TYPE} is not a request a client may send")
        try:
            if self.access is not None:  # before any effect: a denied request changes nothing
                self.access.check_request(connection.identity, message)
            handler(self, connection, message)
        except FscacheError as exc:
            self.counters.errors += 1
            self._storage_failed(exc, message)
            request_id = getattr(message, "id", None)
            if request_id is None:
                raise ProtocolError(str(exc)) from None
            connection.send(p.Error(id=request_id, code=exc.code, message=str(exc)))

    def _delete_tied(self, effects: list[DeleteTied]) -> None:
        """Delete the files of ended sessions, each an ordinary delete by the server
        (readers approve or are waited out; a restart window holds it back)."""
        for effect in effects:
            log.info("deleting %s: its session %s ended", effect.path, effect.session)
            footprint = names.keys_for_delete(effect.path)
            apply = partial(self.store.delete, effect.path)
            self._begin_write(self._own, p.Delete(0, effect.path), footprint, apply, effect)

    def _on_read(self, connection: Connection, message: p.Read) -> None:
        self.counters.reads += 1
        path = normalize(message.path)
        op = self._new_op()
        now = self._now()
        term = self.table.read(op, connection.holder, path, now)
        if term is not None:  # granted at once, the common case
            if term and self.table.leases_held(connection.holder) > self._max_leases:
                term = self._beyond_lease_limit(connection, path)
            self._serve_read(connection, message, path, term)
            self.latency.read.observe(now - connection.received_at)
        else:  # queued behind a write: served by _execute when granted
            self._hold(op, _Pending(connection, message))
        # The lease may sweep earlier than the timer is set for: the receive loop
        # checks once per batch (_deadline_may_have_moved), before any await.

    def _on_read_range(self, connection: Connection, message: p.ReadRange) -> None:
        self.counters.range_reads += 1
        if message.length > self.settings.max_file_size:
            raise TooLarge(
                f"a range of {message.length} bytes is over the limit of "
                f"{self.settings.max_file_size} (one frame)"
            )
        self._read_lease(connection, message, normalize(message.path))

    def _on_scandir(self, connection: Connection, message: p.ScanDir) -> None:
        self.counters.listings += 1
        key = names.dir_key(normalize(message.path, allow_root=True))
        op = self._new_op()
        self._hold(op, _Pending(connection, message))  # in flight while it is read
        assert self._nursery is not None
        self._nursery.start_soon(self._scan, op, connection, message, key)

    async def _scan(self, op: OpId, connection: Connection, message: p.ScanDir, key: str) -> None:
        """Read the page in a worker thread (the names of a large directory take longer
        than the event loop may be held), then take the lease; when it is granted the
        page is served if the directory's version is still the page's."""
        page: Page | FscacheError
        try:
            page = await self._blocking_io(self.store.scandir, _directory(key), message.after)
        except FscacheError as exc:
            page = exc
        finally:
            self._release(op)
        if connection.alive:
            self._read_lease(connection, _Scanned(message, page), key)
            self._deadline_may_have_moved()

    def _read_lease(self, connection: Connection, message: _LeasedRead, key: str) -> None:
        """Take a read lease on ``key`` for ``message`` and answer it when granted."""
        op = self._new_op()
        now = self._now()
        term = self.table.read(op, connection.holder, key, now)
        if term is not None:
            self._serve_granted(connection, message, key, term)
            self.latency.read.observe(now - connection.received_at)
        else:
            self._hold(op, _Pending(connection, message))

    def _on_write(self, connection: Connection, message: p.Write) -> None:
        self.counters.writes += 1
        path = normalize(message.path)
        if len(message.data) > self.settings.max_file_size:
            raise TooLarge(
                f"{len(message.data)} bytes is over the limit of {self.settings.max_file_size}"
            )
        self._begin_write(
            connection, message, self._file_write_keys(path, makes_parents=True),
            partial(self.store.write, path, message.data, message.if_version),
            Rewrite(path, connection.holder if message.ephemeral else None),
        )  # fmt: skip

    def _on_delete(self, connection: Connection, message: p.Delete) -> None:
        self.counters.deletes += 1
        path = normalize(message.path)
        self._begin_write(
            connection, message, names.keys_for_delete(path),
            partial(self.store.delete, path, message.if_version), Rewrite(path),
        )  # fmt: skip

    def _on_change_in_place(
        self, connection: Connection, message: p.WriteRange | p.Truncate
    ) -> None:
        path = normalize(message.path)
        apply: Callable[[], int]
        if isinstance(message, p.WriteRange):
            self.counters.range_writes += 1
            apply = partial(
                self.store.write_range, path, message.offset, message.data, message.if_version
            )
        else:
            self.counters.truncates += 1
            apply = partial(self.store.truncate, path, message.size, message.if_version)
        self._begin_write(connection, message, self._file_write_keys(path), apply, Rewrite(path))

    def _on_rename(self, connection: Connection, message: p.Rename) -> None:
        self.counters.renames += 1
        src, dst = normalize(message.src), normalize(message.dst)
        src_facts = self._facts(src)
        dst_facts = self._facts(dst)
        footprint = names.keys_for_rename(
            src, dst,
            src_is_dir=src_facts is None or src_facts.is_dir,
            dst_exists=dst_facts is not None and dst_facts.exists,
        )  # fmt: skip
        apply = partial(self.store.rename, src, dst)
        self._begin_write(connection, message, footprint, apply, Move(src, dst))

    def _on_mkdir(self, connection: Connection, message: p.MkDir) -> None:
        self.counters.mkdirs += 1
        path = normalize(message.path)
        footprint = names.keys_for_mkdir(path)
        self._begin_write(connection, message, footprint, partial(self.store.mkdir, path))

    def _on_rmdir(self, connection: Connection, message: p.RmDir) -> None:
        self.counters.rmdirs += 1
        path = normalize(message.path)
        footprint = names.keys_for_rmdir(path)
        self._begin_write(connection, message, footprint, partial(self.store.rmdir, path))

    def _begin_write(
        self,
        connection: Connection,
        message: _WriteRequest,
        footprint: Footprint,
        apply: Callable[[], int | None],
        ties: TieChange | DeleteTied | None = None,
    ) -> OpId:
        """Queue ``message`` in the lease table as a new op, returned; ``apply`` runs once
        the table allows it, with its effect ``ties`` on the ephemeral files' ties. Its
        data counts against the session's max_pending_write_bytes, and all sessions'
        max_pending_write_bytes_total, until answered."""
        nbytes = len(message.data) if isinstance(message, p.Write | p.WriteRange) else 0
        if nbytes:
            self._check_pending_bytes(connection.holder, nbytes)
        op = self._new_op()
        if ties is not None:
            apply = self.ephemeral.wrap(op, ties, apply)
        self._hold(op, _Pending(connection, message, apply, nbytes=nbytes))
        delayed = self.table.writes_delayed
        effects = self.table.write(op, connection.holder, footprint, self._now())
        if self.table.writes_delayed != delayed:
            self._log_delayed(op, footprint.keys[0], effects)
        self._execute(effects)
        return op

    def _check_pending_bytes(self, holder: HolderId, nbytes: int) -> None:
        """:class:`TooLarge` if ``nbytes`` more of waiting write data would be over the
        session's limit or the server's."""
        settings = self.settings
        waiting = self._pending_bytes[holder]
        if waiting + nbytes > settings.max_pending_write_bytes:
            raise TooLarge(
                f"{waiting} bytes of this session's writes are waiting; {nbytes} more is"
                f" over the limit max_pending_write_bytes={settings.max_pending_write_bytes}"
            )
        total = self._pending_bytes_total
        if total + nbytes > settings.max_pending_write_bytes_total:
            raise TooLarge(
                f"{total} bytes of writes are waiting on this server; {nbytes} more is over"
                " the limit max_pending_write_bytes_total="
                f"{settings.max_pending_write_bytes_total}"
            )

    def _file_write_keys(self, path: str, *, makes_parents: bool = False) -> Footprint:
        """The footprint of a write of the whole or part of file ``path``; with
        ``makes_parents`` (the store makes missing directories) every ancestor's name
        set too when its directory is not known to exist."""
        footprint = names.keys_for_write(path, creates=self._creates(path))
        if makes_parents and footprint.keys[1:] and not self._is_directory(names.parent(path)):
            ancestors = [names.dir_key(path[:i]) for i, c in enumerate(path) if c == "/"]
            footprint = Footprint((*footprint.keys, *ancestors, names.dir_key("")))
        return footprint

    def _facts(self, path: str) -> Facts | None:
        """What is at ``path``, if that stays true until a write arriving now is applied
        (no write is queued on either of its keys; see the lease table's note on facts);
        None when it may change first or cannot be read: the caller assumes the worst."""
        if self.table.is_blocked(path) or self.table.is_blocked(names.dir_key(path)):
            return None
        try:
            return self.store.facts(path)
        except FscacheError:
            return None

    def _creates(self, path: str) -> bool:
        """Whether writing the file ``path`` may add its name to its directory."""
        facts = self._facts(path)
        return facts is None or not facts.exists

    def _is_directory(self, path: str) -> bool:
        """``path`` is a directory, and stays one until a write arriving now is applied."""
        facts = self._facts(path) if path else Facts(exists=True, is_dir=True)
        return facts is not None and facts.is_dir

    # ------------------------------------------------------------ uploads
    def _on_upload_begin(self, connection: Connection, message: p.UploadBegin) -> None:
        self.counters.uploads += 1
        if message.id in connection.uploads:
            raise ProtocolError(f"upload {message.id} is already open")
        if len(connection.uploads) >= MAX_UPLOADS:
            raise TooLarge(f"{MAX_UPLOADS} uploads are open on this connection, the most allowed")
        upload = self.store.upload_begin(normalize(message.path))
        connection.uploads[message.id] = upload
        connection.send(p.Done(id=message.id))

    def _on_upload_part(self, connection: Connection, message: p.UploadPart) -> None:
        self._upload(connection, message.upload)
        connection.part = message  # written by the receive loop before it reads on

    async def _write_part(self, connection: Connection) -> None:
        """Write the part the receive loop just read, in a worker thread; the connection
        reads nothing more meanwhile, so a part at a time is in memory and parts land
        in order."""
        part, connection.part = connection.part, None
        assert part is not None
        upload = connection.uploads[part.upload]
        await connection.outbox.flush()  # earlier replies need not wait for the disk
        try:
            await self._blocking_io(self.store.upload_part, upload, part.offset, part.data)
        except FscacheError as exc:
            self.counters.errors += 1
            self._storage_failed(exc, part)
            if upload.closed:  # a failed write ends the upload
                connection.uploads.pop(part.upload, None)
            connection.send(p.Error(id=part.id, code=exc.code, message=str(exc)))
        else:
            connection.send(p.Done(id=part.id))
        connection.outbox.batching = True

    def _on_upload_commit(self, connection: Connection, message: p.UploadCommit) -> None:
        upload = connection.uploads.pop(self._upload(connection, message.upload))
        if self.access is not None:  # the rules may have been reloaded since it began
            try:
                self.access.check(connection.identity, Access.READ_WRITE, (upload.path,))
            except Unauthorized:
                self.store.upload_abort(upload)
                raise
        commit = connection.commits[message.upload] = _Commit(upload)
        assert self._nursery is not None
        self._nursery.start_soon(self._commit_upload, connection, message, commit)

    async def _commit_upload(
        self, connection: Connection, message: p.UploadCommit, commit: _Commit
    ) -> None:
        """fsync the upload's data (the slow part, before any reader has to wait), then
        write it under the lease rules like a whole-file ``write``."""
        upload = commit.upload
        try:
            await self._blocking_io(self.store.upload_sync, upload)
        except FscacheError as exc:
            connection.commits.pop(message.upload, None)
            self.counters.errors += 1
            self._storage_failed(exc, message)
            connection.send(p.Error(id=message.id, code=exc.code, message=str(exc)))
            return
        if commit.withdrawn:
            connection.commits.pop(message.upload, None)
            self._withdrawn(connection, message, upload)
            return
        apply = partial(self.store.upload_commit, upload, message.if_version)
        tie = Rewrite(upload.path, connection.holder if message.ephemeral else None)
        footprint = self._file_write_keys(upload.path, makes_parents=True)
        commit.op = self._begin_write(connection, message, footprint, apply, tie)

    def _on_upload_abort(self, connection: Connection, message: p.UploadAbort) -> None:
        """End an upload. One already committed is withdrawn if its write is not yet
        being applied (the lease table's rule); if it is, the abort is refused:
        :class:`Conflict`, and the write goes on."""
        commit = connection.commits.get(message.upload)
        if commit is None:
            upload = connection.uploads.pop(self._upload(connection, message.upload))
            self.store.upload_abort(upload)
        elif commit.op is None:  # its data is being synced: it will not be queued
            commit.withdrawn = True
        else:
            effects = self.table.withdraw(commit.op, self._now())
            if effects is None:
                raise Conflict(
                    f"upload {message.upload} is already being written to "
                    f"{commit.upload.path!r}: too late to withdraw it"
                )
            del connection.commits[message.upload]
            self.ephemeral.withdrawn(commit.op)
            pending = self._release(commit.op)
            assert pending is not None and isinstance(pending.request, p.UploadCommit)
            self._withdrawn(connection, pending.request, commit.upload)
            self._execute(effects)
        connection.send(p.Done(id=message.id))

    def _withdrawn(self, connection: Connection, message: p.UploadCommit, upload: Upload) -> None:
        """Commit ``message`` was withdrawn by its writer: its data goes, and the commit
        is answered (its caller has gone; the reply keeps the exchange whole)."""
        self.store.upload_abort(upload)
        self.counters.writes_withdrawn += 1
        why = f"the write of {upload.path!r} was withdrawn by its writer"
        connection.send(p.Error(id=message.id, code=Conflict.code, message=why))

    @staticmethod
    def _commit_answered(pending: _Pending) -> None:
        """A committed upload's write was answered: it can no longer be withdrawn."""
        if isinstance(pending.request, p.UploadCommit):
            pending.connection.commits.pop(pending.request.upload, None)

    @staticmethod
    def _upload(connection: Connection, upload_id: int) -> int:
        if upload_id not in connection.uploads:
            raise ProtocolError(f"no upload {upload_id} is open on this connection")
        return upload_id

    # ------------------------------------------------------------ names and leases
    def _on_stat(self, connection: Connection, message: p.Stat) -> None:
        version, size, is_dir = self.store.stat(normalize(message.path, allow_root=True))
        connection.send(p.StatResult(id=message.id, version=version, size=size, is_dir=is_dir))

    def _on_listdir(self, connection: Connection, message: p.ListDir) -> None:
        path = normalize(message.path, allow_root=True)
        op = self._new_op()
        self._hold(op, _Pending(connection, message))  # in flight while it is read
        assert self._nursery is not None
        self._nursery.start_soon(self._list, op, connection, message, path)

    async def _list(self, op: OpId, connection: Connection, message: p.ListDir, path: str) -> None:
        """Read the names in a worker thread (a large directory's take longer than the
        event loop may be held) and answer the page after ``after``."""
        try:
            page, more = await self._blocking_io(self.store.list_page, path, message.after)
        except FscacheError as exc:
            self.counters.errors += 1
            self._storage_failed(exc, message)
            connection.send(p.Error(id=message.id, code=exc.code, message=str(exc)))
            return
        finally:
            self._release(op)
        connection.send(p.Listing(id=message.id, names=page, more=more))

    def _on_relinquish(self, connection: Connection, message: p.Relinquish) -> None:
        self.counters.relinquish_requests += 1
        _check_paths(message)
        keys = [normalize_key(key) for key in message.paths]
        self._execute(self.table.relinquish(connection.holder, keys, self._now()))
        connection.send(p.Done(id=message.id))

    def _on_extend(self, connection: Connection, message: p.Extend) -> None:
        if len(message.paths) != len(message.versions):
            raise ProtocolError("extend: paths and versions differ in length")
        _check_paths(message)
        self.counters.extend_requests += 1
        self.counters.extend_paths += len(message.paths)
        items = []
        for key, version in zip(message.paths, message.versions, strict=True):
            key = normalize_key(key)
            items.append((key, self._is_current(key, version)))
        terms = self.table.extend(connection.holder, items, self._now())
        over = self.table.leases_held(connection.holder) - self._max_leases
        if over > 0:  # the last extended paths, beyond the cap, are stale
            beyond = [i for i, term in enumerate(terms) if term][-over:]
            for i in beyond:
                terms[i] = None
            self._beyond_lease_limit(connection, *(items[i][0] for i in beyond))
        self._deadline_may_have_moved()
        connection.send(p.Extended(id=message.id, terms=terms))

    def _is_current(self, key: str, version: int) -> bool:
        """Whether ``version`` is the current one of ``key``: a file's, or for a
        listing's key (``docs/``) its directory's."""
        try:
            if key.endswith("/"):
                current_version, _, is_dir = self.store.stat(_directory(key))
                return is_dir and current_version == version
            return self.store.stat(key)[0] == version
        except FscacheError:
            return False

    def _on_approve(self, connection: Connection, message: p.Approve) -> None:
        self.counters.approvals_received += 1
        key = normalize_key(message.path)
        now = self._now()
        effects = self.table.approve(connection.holder, key, OpId(message.write), now)
        # An approval that applies nothing ends a wait, which moves no deadline earlier,
        # except in the restart window: its write may now wait for the window's end alone.
        if effects:
            self._execute(effects)
        elif now < self.table.hold_writes_until:
            self._deadline_may_have_moved()

    def _on_stats(self, connection: Connection, message: p.GetStats) -> None:
        self.counters.stats_requests += 1
        connection.send(p.StatsResult(id=message.id, counters=self.stats()))

    def _on_ping(self, connection: Connection, message: p.Ping) -> None:
        self.counters.pings += 1
        connection.send(p.Done(id=message.id))

    def _on_goodbye(self, connection: Connection, message: p.Goodbye) -> None:
        connection.goodbye = True

    def _on_lock(self, connection: Connection, message: p.Message) -> None:
        self.locks.handle(connection, message)

    _handlers: ClassVar[dict[type[p.Message], Callable[[Any, Connection, Any], None]]] = {
        p.Read: _on_read,
        p.Write: _on_write,
        p.Delete: _on_delete,
        p.Stat: _on_stat,
        p.ListDir: _on_listdir,
        p.Relinquish: _on_relinquish,
        p.Extend: _on_extend,
        p.Approve: _on_approve,
        p.GetStats: _on_stats,
        p.Ping: _on_ping,
        p.Goodbye: _on_goodbye,
        p.ReadRange: _on_read_range,
        p.ScanDir: _on_scandir,
        p.WriteRange: _on_change_in_place,
        p.Truncate: _on_change_in_place,
        p.Rename: _on_rename,
        p.MkDir: _on_mkdir,
        p.RmDir: _on_rmdir,
        p.UploadBegin: _on_upload_begin,
        p.UploadPart: _on_upload_part,
        p.UploadCommit: _on_upload_commit,
        p.UploadAbort: _on_upload_abort,
        p.Acquire: _on_lock,
        p.Renew: _on_lock,
        p.Release: _on_lock,
        p.LockQuery: _on_lock,
        p.LockWatch: _on_lock,
    }

    # ------------------------------------------------------------ effects
    def _execute(self, effects: list[Effect]) -> None:
        asked: tuple[str, OpId] | None = None  # (key, write) of ``frame``: encoded once
        frame = b""
        for effect in effects:
            if isinstance(effect, SendApprovalRequest):  # first: a write's are many
                connection = self.connections.get(effect.holder)
                if connection is not None:
                    if (effect.path, effect.write) != asked:
                        asked = (effect.path, effect.write)
                        frame = p.encode(p.ApprovalRequest(path=effect.path, write=effect.write))
                    connection.send_frame(frame, push=True)
            elif isinstance(effect, Grant):
                pending = self._release(effect.op)
                assert pending is not None
                request = pending.request
                assert isinstance(request, _LeasedRead)
                self._serve_granted(pending.connection, request, effect.path, effect.term)
                self.latency.read.observe(self._now() - pending.arrived)
            elif isinstance(effect, ApplyWrite):
                delay = self._now() - self._pending[effect.op].arrived
                self.latency.write_delay.observe(delay)
                assert self._nursery is not None
                self._nursery.start_soon(self._apply_write, effect)
            elif isinstance(effect, WriteCommitted):
                self._write_committed(effect)
            elif isinstance(effect, Discarded):
                self._release(effect.op)
        if self.table.waited_out:
            self._log_waited_out()
        self._deadline_may_have_moved()  # even with no effects: a write may now wait

    def _log_delayed(self, op: OpId, path: str, effects: list[Effect]) -> None:
        """Write ``op`` on ``path`` could not be applied on arrival: say what it waits for
        (when events are logged: the list of holders asked is a write's own fan-out)."""
        if not EVENTS.isEnabledFor(logging.INFO):
            return
        asked = [e.holder for e in effects if isinstance(e, SendApprovalRequest) and e.write == op]
        window = self.table.hold_writes_until - self._now()
        # The window holds it at least that long, whatever the holders asked answer.
        cause = "restart window" if window > 0 else "approvals" if asked else "an earlier write"
        event(
            "write_delayed", "write of %s waits for %s", path, cause, path=path, cause=cause,
            asked=sorted(set(asked)), restart_window_s=round(max(window, 0.0), 3),
        )  # fmt: skip

    def _log_waited_out(self) -> None:
        """Log each lease a write waited out: its holder never approved."""
        now = self._now()
        for op, key, holder in self.table.waited_out:
            pending = self._pending.get(op)
            waited = 0.0 if pending is None else now - pending.arrived
            event(
                "lease_expired", "write of %s waited out %s's lease (%.3f s)", key, holder,
                waited, holder=holder, path=key, waited_s=round(waited, 3),
            )  # fmt: skip
        self.table.waited_out.clear()

    def _write_committed(self, effect: WriteCommitted) -> None:
        """Answer an applied write. The writer keeps its lease on the name it wrote only
        when it has a file's contents to cache."""
        pending = self._release(effect.op)
        assert pending is not None
        self._commit_answered(pending)
        self.latency.write.observe(self._now() - pending.arrived)
        request = pending.request
        term = effect.term
        if pending.not_durable is not None:  # the writer knows no version: nothing to cache
            term = 0.0
            self.counters.errors += 1
            exc = pending.not_durable
            pending.connection.send(p.Error(id=request.id, code=exc.code, message=str(exc)))
        elif isinstance(request, _NOTHING_TO_CACHE):
            pending.connection.send(p.Done(id=request.id))
        else:
            if effect.path.endswith("/"):  # a directory renamed: its listing is not sent
                term = 0.0
            pending.connection.send(p.Written(id=request.id, version=pending.version, term=term))
        lost = not pending.connection.alive  # the reply went nowhere: nothing is cached
        if term != effect.term or isinstance(request, _NOTHING_TO_CACHE) or lost:
            self._execute(self.table.relinquish(effect.holder, [effect.path], self._now()))

    def _beyond_lease_limit(self, connection: Connection, *keys: str) -> float:
        """The holder has more than max_leases_per_holder leases with those just granted
        or extended on ``keys``: end those, and answer them with term 0 (a read: not
        cached) or stale (an extension: dropped). Returns the read's term, 0."""
        self.counters.reads_over_lease_limit += len(keys)
        self._execute(self.table.relinquish(connection.holder, keys, self._now()))
        return 0.0

    def _serve_granted(
        self, connection: Connection, request: _LeasedRead, key: str, term: float
    ) -> None:
        if term and self.table.leases_held(connection.holder) > self._max_leases:
            term = self._beyond_lease_limit(connection, key)
        if isinstance(request, p.Read):
            self._serve_read(connection, request, key, term)
        elif isinstance(request, p.ReadRange):
            self._serve_range(connection, request, key, term)
        else:
            self._serve_listing(connection, request, key, term)

    def _serve_read(self, connection: Connection, request: p.Read, path: str, term: float) -> None:
        """Answer a granted read of ``path`` (its lease: ``term``); a file larger than one
        chunk is answered with its first chunk and its size."""
        try:
            version, data = self.store.read(path)
        except TooLarge:  # larger than a frame: its first chunk, as much as a frame holds
            length = min(CHUNK_SIZE, self.settings.max_file_size)
            first = p.ReadRange(request.id, path, offset=0, length=length, have=request.have)
            self._serve_range(connection, first, path, term)
            return
        except FscacheError as exc:
            self._refuse(connection, request, exc, path, term)
            return
        if request.have == version:
            self.counters.reads_not_modified += 1
            connection.send(p.NotModified(id=request.id, version=version, term=term))
        elif len(data) > CHUNK_SIZE:
            chunk = data[:CHUNK_SIZE]
            connection.send(p.Chunk(request.id, version, term, len(data), chunk))
        else:
            connection.send_frame(p.data_frame(request.id, version, term, data))

    def _serve_range(
        self, connection: Connection, request: p.ReadRange, path: str, term: float
    ) -> None:
        try:
            version, size, data = self.store.read_range(path, request.offset, request.length)
        except FscacheError as exc:
            self._refuse(connection, request, exc, path, term)
            return
        if not self._not_modified(connection, request, version, term):
            connection.send(p.Chunk(request.id, version, term, size, data))

    def _serve_listing(
        self, connection: Connection, request: _Scanned, key: str, term: float
    ) -> None:
        """Answer a granted listing with its page if the directory is unchanged since
        the page was read; else (a write on it came first) read the page again, here."""
        scanned = request.page
        if not isinstance(scanned, FscacheError) and not self._is_current(key, scanned[0]):
            try:
                scanned = self.store.scandir(_directory(key), request.message.after)
            except FscacheError as exc:
                scanned = exc
        if isinstance(scanned, FscacheError):
            self._refuse(connection, request, scanned, key, term)
            return
        version, page, more = scanned
        if self._not_modified(connection, request.message, version, term):
            return
        connection.send(
            p.Entries(
                request.id, version, term,
                names=[name for name, _, _, _ in page],
                dirs=[is_dir for _, is_dir, _, _ in page],
                sizes=[size for _, _, size, _ in page],
                versions=[entry_version for _, _, _, entry_version in page],
                more=more,
            )
        )  # fmt: skip

    def _not_modified(
        self, connection: Connection, request: p.ReadRange | p.ScanDir, version: int, term: float
    ) -> bool:
        """Answer ``not_modified`` if the reader has ``version`` already (a read's own
        copy of this, on the hot path, is inline)."""
        if request.have != version:
            return False
        self.counters.reads_not_modified += 1
        connection.send(p.NotModified(id=request.id, version=version, term=term))
        return True

    def _refuse(
        self,
        connection: Connection,
        request: _LeasedRead,
        exc: FscacheError,
        key: str,
        term: float,
    ) -> None:
        """A granted read failed (no such file, ...): the error, and no lease."""
        self.counters.errors += 1
        self._storage_failed(exc, request)
        connection.send(p.Error(id=request.id, code=exc.code, message=str(exc)))
        if term > 0:
            self._execute(self.table.relinquish(connection.holder, [key], self._now()))

    def _storage_failed(self, exc: FscacheError, request: p.Message | _Scanned) -> None:
        """Log ``exc`` if the store failed for a cause of :data:`STORAGE_FAILURES` (the
        client's own mistakes, no such file, a conflict, a bad path, are not logged):
        a ``storage_failed`` warning, at most one per cause per
        STORAGE_WARNING_INTERVAL, counting the ones between. The store's error names
        the operation and the path."""
        cause = _storage_cause(exc)
        if cause is None:
            return
        throttle = self._storage_failures.get(cause)
        if throttle is None:
            throttle = self._storage_failures[cause] = Throttle(STORAGE_WARNING_INTERVAL)
        kind = request.message.TYPE if isinstance(request, _Scanned) else request.TYPE
        rare_event(
            throttle, self._now(),
            "storage_failed", "storage failure (%s) in a %s request: %s", cause, kind, exc,
            cause=cause, request=kind, error=str(exc),
        )  # fmt: skip

    async def _apply_write(self, effect: ApplyWrite) -> None:
        pending = self._pending[effect.op]
        request = pending.request
        assert pending.apply is not None
        ok = False
        self.ephemeral.applying(effect.op)
        try:
            self.locks.check_fence(getattr(request, "fence", None))  # now, as it is applied
            pending.version = await self._blocking_io(pending.apply) or 0
            ok = True
        except NotDurable as exc:  # it took effect: leases on the old value end
            self._storage_failed(exc, request)
            pending.not_durable = exc
            ok = True
        except FscacheError as exc:
            self.counters.errors += 1
            self._storage_failed(exc, request)
            pending.connection.send(p.Error(id=request.id, code=exc.code, message=str(exc)))
        except Exception as exc:
            log.exception("write of %s failed", effect.path)
            pending.connection.send(p.Error(id=request.id, code="error", message=str(exc)))
        finally:
            now = self._now()
            late = self.ephemeral.finished(effect.op, now, self.sessions, ok=ok)
            if ok:
                self.counters.writes_applied += 1
            else:
                self._commit_answered(pending)
                self._release(effect.op)
            self._execute(self.table.write_done(effect.op, now, ok=ok))
            self._delete_tied(late)
            self.store.settle()

    # ------------------------------------------------------------ counters
    def stats(self) -> dict[str, Any]:
        now = self._now()
        table = self.table
        return {
            **dataclasses.asdict(self.counters),
            "leases_granted": table.leases_granted,
            "leases_active": table.live_leases(now),
            "approvals_sent": table.approvals_sent,
            "writes_delayed": table.writes_delayed,
            "writes_pending": table.pending_writes(),
            "content_hits": self.store.content_hits,
            "connections": len(self.connections),
            "uptime_s": round(now - self.started_at, 3),
            "epoch": self.epoch,
            "term": self.policy.max_term,
            "skew": self.settings.skew,
            "restart_window_s": round(max(0.0, table.hold_writes_until - now), 3),
            "sessions": len(self.sessions),
            "sessions_resumed": self.sessions.resumed,
            "sessions_refused": self.sessions.refused,
            "sessions_expired": self.sessions.expired,
            "session_ttl": self.sessions.ttl,
            "locks_held": self.locks.table.held(now),
            "locks_granted": self.locks.table.locks_granted,
            "ephemeral_files": len(self.ephemeral.table),
            "ephemeral_deleted": self.ephemeral.table.deleted,
            **self.store.capacity(),
        }

    def abandon(self) -> None:
        """Called on a start that failed before it served (no TLS context, no
        listener): put the incarnation record back as it was found. Recording ours
        instead could lower the window the next start owes a crashed incarnation
        whose term was longer than ours."""
        if self._found_incarnation is None:
            self.store.remove_state(INCARNATION_FILE)
        else:
            self.store.save_state(INCARNATION_FILE, self._found_incarnation)

    def shutdown(self) -> int:
        """Called on a stop (and by ``fscache serve`` on a start that failed after it
        began to serve): if no lease of ours is live, no request waits and the restart
        window is over (a lease of the incarnation before may still be live while it
        is open), the next start needs no window (:attr:`stopped_cleanly`). Returns how
        many leases are still live."""
        now = self._now()
        live = self.table.live_leases(now)
        if live == 0 and not self._pending and now >= self.table.hold_writes_until:
            end_incarnation_cleanly(self.store, self.policy.max_term, self.settings.skew)
            self.stopped_cleanly = True
        return live


# accept()'s errors: the peer left before we took it (take the next), and the process
# or the system is out of descriptors or memory (wait, then accept again)
_ACCEPT_SKIPPED = frozenset({errno.ECONNABORTED, errno.EPERM, errno.EPROTO})
_ACCEPT_OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def _accept_queued(listening: socket.socket, arrived: deque[socket.socket]) -> OSError | None:
    """Append to ``arrived`` every connection the kernel has queued on ``listening``;
    the error if accept() ran out of descriptors or memory."""
    while True:
        try:
            sock, _ = listening.accept()
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno in _ACCEPT_SKIPPED:
                continue
            if exc.errno in _ACCEPT_OUT_OF:
                return exc
            raise
        arrived.append(sock)


def _raise_open_files_limit(max_connections: int) -> str:
    """Raise the soft limit on open files to the hard limit: each connection is one.
    Warn when it leaves less than ``max_connections`` (and the server's own files):
    connections past it are turned away by accept (EMFILE), not by the server.
    Returns the limit in force, for the log line of limits ("N (raised from M)")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    said = str(soft)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files limit stays %s (hard limit %s: %s)", soft, hard, exc)
        else:
            said = f"{hard} (raised from {soft})"
            soft = hard
    if soft != resource.RLIM_INFINITY and soft < max_connections + OWN_FILES:
        log.warning(
            "open files limit %s is below max_connections %s + %s of the server's own:"
            " raise it (ulimit -n) or lower max_connections", soft, max_connections, OWN_FILES,
        )  # fmt: skip
    return said


def load_access(path: str) -> AccessRules:
    """The access rules in the file at ``path``; :class:`BadAccessFile` says why not."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadAccessFile(f"cannot read access file {path}: {exc}") from None
    rules = parse(text, source=path)
    log.info("access rules from %s: %s", path, describe(rules))
    return rules


def _identity(stream: trio.abc.Stream) -> str:
    """Who the peer is: the name on its TLS certificate, else :data:`ANONYMOUS`."""
    if isinstance(stream, trio.SSLStream):
        from fscache.tls import peer_identity

        return peer_identity(stream.getpeercert()) or ANONYMOUS
    return ANONYMOUS


def _is_loopback(listener: trio.SocketListener) -> bool:
    host = listener.socket.getsockname()[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _peer_name(stream: trio.abc.Stream) -> str:
    inner: Any = stream
    while hasattr(inner, "transport_stream"):
        inner = inner.transport_stream
    try:
        host, port = inner.socket.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError, ValueError):
        return "peer"


def _storage_cause(exc: BaseException) -> str | None:
    """The name (``ENOSPC``, ...) of the errno of :data:`STORAGE_FAILURES` behind
    ``exc``: the store raises its errors while it handles the OSError, which stays
    their context; None if there is none."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: the store's error, a wrapper's, the OSError
        if seen is None:
            return None
        if isinstance(seen, OSError):
            code = seen.errno
            return errno.errorcode[code] if code in STORAGE_FAILURES else None
        seen = seen.__cause__ or seen.__context__
    return None


def _closed_because(connection: Connection, exc: BaseException | None) -> str:
    """Why a connection ended, for its disconnect event."""
    if connection.goodbye:
        return "goodbye"
    if connection.dropped_for is not None:
        return f"dropped by the server: {connection.dropped_for}"
    if connection.lost is not None:
        return connection.lost
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]  # a nursery's wrapping
    if exc is None:
        return "closed by the client"
    if isinstance(exc, trio.Cancelled):  # no drop of its own: the whole server's
        return "the server is stopping"
    return str(exc) or type(exc).__name__


async def _send_quietly(wire: Wire, message: p.Message) -> None:
    with contextlib.suppress(Unavailable), _transport_errors():
        await wire.send_all(p.encode(message))


async def serve(
    settings: ServerSettings,
    *,
    policy: TermPolicy | None = None,
    task_status: trio.TaskStatus[FileService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a server until cancelled; ``await nursery.start(serve, settings)`` returns the
    :class:`FileService`, whose ``host`` and ``port`` are the bound address."""
    service = FileService(settings, policy=policy, exclusive=True)
    try:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(service.run)
            except BaseException:  # it never served: it leaves the record as it found it
                service.abandon()
                raise
            task_status.started(service)
    finally:
        service.store.close()
