"""The lock service: the driver of :class:`~fscache.locks.LockTable` in the server.

Theory of operation
-------------------
The file service hands every lock request (acquire, renew, release, query, watch)
to :meth:`LockService.handle` synchronously, on the event loop, with
``trio.current_time()``; the table's effects are carried out at once, in order.
The one await is the durable record: a :class:`~fscache.locks.Persist` marks its
name's record changed, and each :class:`~fscache.locks.Granted` after it waits in
``_unsent`` until a persister task has made the changed records durable in a worker
thread. A grant not sent yet when its acquire is given up (a release with token 0)
is released instead of sent: sent, it would arrive after the release's answer, when
the client has stopped waiting for it. The records are a log in the store's private
state directory: each batch of changed records is appended with one ``write`` and
one ``fdatasync``, so a grant costs one record, however many names there are.
Writes are one at a time and each takes the records as they are when it starts, so
the newest token of every grant it releases is on disk, and a later write never
loses an earlier token. If the write fails, the grants waiting on it are answered
with the error (the table counts those locks held until they expire, which costs
others only a wait), and the next write rewrites the log whole, since this one may
have left part of a batch.

Each record is one line, its CRC32 then its JSON, so a record cut short is seen.
At start the log is read and folded by name (the last record wins). A bad record
with no good one after it is the tail of an append cut short by a crash, whose
grants were never sent: it is ignored. A bad record before a good one is damage,
and the server refuses to start rather than risk a token granted twice. The log is
then compacted (the live records written whole by the store's durable write: temp
file, fsync, rename) and appended to from there, and compacted again whenever it
has grown to :data:`COMPACT_RATIO` times the records of the last compaction. The
records' whole-table form (:data:`TABLE_FILE`), if present, is read first and
removed once its records are in the log.

A timer task sleeps until :meth:`LockTable.next_deadline` and ticks the table.

Watchers are connections: a :class:`~fscache.protocol.LockWatch` subscribes the
connection to one name until it closes or sends the same watch with ``stop`` (its
client's last watch of the name has ended), and every :class:`~fscache.locks.Changed`
of that name is pushed to each. A connection that closes with a goodbye ends its
session's locks; one lost without it only drops its session's queued acquires.

A fenced change is checked by :meth:`LockService.check_fence` when the file service
applies it, on the event loop just before the store's I/O: so a change queued by a
holder that has since lost its lock is refused once a newer token exists.
"""

from __future__ import annotations

import json
import logging
import math
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from fscache import protocol as p
from fscache.errors import FscacheError, LockLost, LockTimeout, ProtocolError
from fscache.leases import HolderId, OpId
from fscache.locks import Busy, Changed, Dropped, Effect, Granted, LockTable, Persist, Record
from fscache.paths import normalize
from fscache.server.store import Store
from fscache.settings import identity_problem

log = logging.getLogger("fscache.server")

LOG_FILE = "locks.log"  # in the store's state directory: the records, one a line
TABLE_FILE = "locks.json"  # the records' whole-table form: folded into the log at start
COMPACT_RATIO = 4  # the log is rewritten once it holds this many times its last rewrite's
COMPACT_MIN = 1024  # records: below this a rewrite (three fsyncs) would cost more than it saves


class Peer(Protocol):
    """What the lock service needs of a connection."""

    holder: HolderId
    alive: bool

    def send(self, message: p.Message) -> None: ...


def load_records(store: Store) -> list[Record]:
    """Every name's record as the last incarnation persisted it: those of
    :data:`TABLE_FILE` if there is one, then the log's, the last of each name winning."""
    folded: dict[str, Record] = {}
    data = store.load_state(TABLE_FILE)
    if data is not None:
        try:
            folded.update((r.name, r) for r in map(_record, json.loads(data)))
        except (ValueError, TypeError, KeyError) as exc:
            raise FscacheError(f"the lock records in {TABLE_FILE} cannot be read: {exc}") from None
    data = store.load_state(LOG_FILE)
    if data is not None:
        folded.update((r.name, r) for r in decode_log(data))
    return list(folded.values())


def encode_records(records: list[Record]) -> bytes:
    """Log lines: each record's CRC32 (8 hex digits), a space, its JSON, a newline."""
    lines = []
    for r in records:
        fields = {"name": r.name, "token": r.token, "ttl": r.ttl, "held": r.held}
        if r.identity is not None:  # (a record without it reads as before)
            fields["identity"] = r.identity
        body = json.dumps(fields, separators=(",", ":")).encode()
        lines.append(b"%08x %s\n" % (zlib.crc32(body), body))
    return b"".join(lines)


def decode_log(data: bytes) -> list[Record]:
    """The records of a log, in order, without a torn tail (bad records with no good
    one after them); a bad record before a good one raises :class:`FscacheError`."""
    records: list[Record] = []
    bad: list[int] = []  # line numbers of the bad records since the last good one
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the log ends with a whole line
        lines.pop()
    for number, line in enumerate(lines, 1):
        record = _decode_line(line)
        if record is None:
            bad.append(number)
            continue
        if bad:
            raise FscacheError(
                f"the lock records in {LOG_FILE} are damaged at line {bad[0]}, before"
                f" good ones: the server does not start rather than grant a token twice"
            )
        records.append(record)
    if bad:
        log.warning(
            "%s: %d torn record(s) at the end are ignored (an append cut short by a"
            " crash; its grants were never sent)", LOG_FILE, len(bad),
        )  # fmt: skip
    return records


def _decode_line(line: bytes) -> Record | None:
    crc, space, body = line.partition(b" ")
    try:
        if not space or len(crc) != 8 or int(crc, 16) != zlib.crc32(body):
            return None
        return _record(json.loads(body))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _record(r: Any) -> Record:
    identity = r.get("identity")
    return Record(
        str(r["name"]), int(r["token"]), float(r["ttl"]), bool(r["held"]),
        None if identity is None else str(identity),
    )  # fmt: skip


_Unsent = tuple[Peer, p.LockGranted, str]  # a grant waiting for its record: to whom, what, name


class LockService:
    def __init__(
        self,
        store: Store,
        *,
        skew: float,
        blocking_io: Callable[..., Awaitable[Any]],
        now: float,
    ) -> None:
        self.store = store
        self.table = LockTable(skew=skew, records=load_records(store), now=now)
        records = self.table.records()
        store.save_state(LOG_FILE, encode_records(records))  # compacted: no torn tail left
        store.remove_state(TABLE_FILE)  # its records are in the log now
        self._log_records = self._compacted = len(records)  # in the log; at its compaction
        self._rewrite = False  # the last write failed: the log may end in part of it
        self._blocking_io = blocking_io
        self._next_op = 0
        self._waiting: dict[OpId, tuple[Peer, int]] = {}  # queued acquires: who, request id
        self._watchers: dict[str, set[Peer]] = {}
        self._watching: dict[Peer, set[str]] = {}
        self._unsent: list[_Unsent] = []  # grants whose record is not on disk
        self._persisting: list[_Unsent] = []  # the grants the write under way will send
        self._changed: set[str] = set()  # names whose record is not on disk
        self._persist_wake = trio.Event()
        self._timer_wake = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Persist records and tick the table until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._persister)
            nursery.start_soon(self._timer)
            task_status.started()

    # ------------------------------------------------------------ requests
    def handle(self, connection: Peer, message: p.Message) -> None:
        """Answer one lock request (the table's deadline may move: the timer wakes)."""
        self._timer_wake.set()
        now = trio.current_time()
        if isinstance(message, p.Acquire):
            name = normalize(message.name)
            problem = identity_problem(message.identity)  # as a client_id is checked
            if problem is not None:
                raise ProtocolError(problem)
            self._next_op += 1
            op = OpId(self._next_op)
            self._waiting[op] = (connection, message.id)
            try:
                effects = self.table.acquire(
                    op, connection.holder, name, message.ttl, message.identity, now,
                    wait=message.wait,
                )  # fmt: skip
            except FscacheError:  # a ttl out of bounds: answered with the error
                del self._waiting[op]
                raise
            self._execute(effects)
        elif isinstance(message, p.Renew):
            ttl = self.table.renew(connection.holder, normalize(message.name), message.token, now)
            if ttl is None:
                raise LockLost(
                    f"lock {message.name!r} with token {message.token} is no longer held:"
                    " released, expired or taken by another"
                )
            connection.send(p.LockGranted(id=message.id, token=message.token, ttl=ttl))
        elif isinstance(message, p.Release):
            name = normalize(message.name)
            if message.token:
                self._execute(self.table.release(connection.holder, name, message.token, now))
            else:
                self._execute(self.table.cancel(connection.holder, name))
                self._withdraw(connection.holder, name, now)
            connection.send(p.Done(id=message.id))
        elif isinstance(message, p.LockQuery | p.LockWatch):
            name = normalize(message.name)
            if isinstance(message, p.LockWatch) and message.stop:
                self._unwatch(connection, name)
            elif isinstance(message, p.LockWatch):
                self._watchers.setdefault(name, set()).add(connection)
                self._watching.setdefault(connection, set()).add(name)
            token, identity = self.table.state_of(name, now)
            connection.send(p.LockState(id=message.id, token=token, identity=identity))
        else:
            raise ProtocolError(f"{message.TYPE} is not a lock request")

    def waiting(self) -> int:
        """Acquires not answered yet: queued, or granted and waiting for the disk."""
        return len(self._waiting) + len(self._unsent)

    def check_fence(self, fence: p.Fence | None) -> None:
        """Raise :class:`~fscache.errors.Conflict` if ``fence`` names a token that is
        not the newest granted for its lock."""
        if fence is not None:
            self.table.check_fence(normalize(fence[0]), fence[1])

    def connection_closed(self, connection: Peer, *, goodbye: bool, current: bool) -> None:
        """``connection`` is gone: its watches end. If it was its session's ``current``
        one (not displaced by a resumed one), with a goodbye the session's locks are
        released, without one its queued acquires are dropped."""
        for name in list(self._watching.get(connection, ())):
            self._unwatch(connection, name)
        if not current:
            return
        self._timer_wake.set()
        now = trio.current_time()
        if goodbye:
            self._execute(self.table.session_ended(connection.holder, now))
        else:
            self._execute(self.table.disconnected(connection.holder))

    def _unwatch(self, connection: Peer, name: str) -> None:
        """``connection`` no longer watches ``name`` (whether it did or not)."""
        names = self._watching.get(connection)
        if names is None or name not in names:
            return
        names.discard(name)
        if not names:
            del self._watching[connection]
        watchers = self._watchers[name]
        watchers.discard(connection)
        if not watchers:
            del self._watchers[name]

    # ------------------------------------------------------------ effects
    def _execute(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Persist):
                self._changed.add(effect.name)
                self._persist_wake.set()
            elif isinstance(effect, Granted):
                connection, request_id = self._waiting.pop(effect.op)
                reply = p.LockGranted(id=request_id, token=effect.token, ttl=effect.ttl)
                self._unsent.append((connection, reply, effect.name))  # once the record is on disk
            elif isinstance(effect, Busy):
                connection, request_id = self._waiting.pop(effect.op)
                error = LockTimeout(f"lock {effect.name!r} is held")
                connection.send(p.Error(id=request_id, code=error.code, message=str(error)))
            elif isinstance(effect, Dropped):  # answered, if its connection is still open
                connection, request_id = self._waiting.pop(effect.op)
                error = LockTimeout(f"lock {effect.name!r}: the acquire was given up")
                connection.send(p.Error(id=request_id, code=error.code, message=str(error)))
            elif isinstance(effect, Changed):
                notice = p.LockChanged(effect.name, effect.token, effect.identity)
                for watcher in self._watchers.get(effect.name, ()):
                    watcher.send(notice)

    async def _persister(self) -> None:
        """Write the changed records, then send the grants waiting on them."""
        while True:
            await self._persist_wake.wait()
            self._persist_wake = trio.Event()
            if not self._changed:
                continue
            names, self._changed = self._changed, set()
            ready = self._persisting = self._unsent  # (a withdrawn grant leaves it)
            self._unsent = []
            try:
                await self._write(names)
            except FscacheError as exc:  # the grants cannot be trusted to outlive us
                log.error("lock records not saved, the grants waiting are refused: %s", exc)
                self._rewrite = True
                for connection, reply, _ in ready:
                    connection.send(p.Error(id=reply.id, code=exc.code, message=str(exc)))
                continue
            finally:
                self._persisting = []
            for connection, reply, _ in ready:
                connection.send(reply)

    def _withdraw(self, session: HolderId, name: str, now: float) -> None:
        """``session`` stopped waiting for ``name`` (a release with token 0): a grant of
        it not sent yet (its record on its way to disk) would arrive after the Done that
        answers the release, when the client no longer takes it up. It is released
        here instead, and never sent."""
        for pending in (self._unsent, self._persisting):
            for entry in [e for e in pending if e[0].holder == session and e[2] == name]:
                pending.remove(entry)
                self._execute(self.table.release(session, name, entry[1].token, now))

    async def _write(self, names: set[str]) -> None:
        """Append the records of ``names`` to the log, or rewrite it whole if it has
        grown to :data:`COMPACT_RATIO` times its last compaction (or must be)."""
        limit = COMPACT_RATIO * max(self._compacted, COMPACT_MIN)
        if self._rewrite or self._log_records + len(names) > limit:
            records = self.table.records()
            await self._blocking_io(self.store.save_state, LOG_FILE, encode_records(records))
            self._log_records = self._compacted = len(records)
            self._rewrite = False
        else:
            records = self.table.records(names)
            await self._blocking_io(self.store.append_state, LOG_FILE, encode_records(records))
            self._log_records += len(records)

    async def _timer(self) -> None:
        while True:
            deadline = self.table.next_deadline()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await self._timer_wake.wait()
            self._timer_wake = trio.Event()
            self._execute(self.table.tick(trio.current_time()))
