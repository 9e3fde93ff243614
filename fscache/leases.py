"""The lease table: the server's consistency rules as a pure state machine.

Theory of operation
-------------------
Everything that decides *when* a read may be cached or a write may be applied
lives here, and nothing else does. The table does no I/O and reads no clock:
every call takes ``now`` (server-monotonic seconds) and returns the effects the
caller must carry out, in order. The caller (``fscache.server``) does the I/O and
calls :meth:`LeaseTable.tick` at :meth:`LeaseTable.next_deadline`.

A lease is on a *key*. A file's key is its normal path and stands for its
contents; a directory's key is its path and a ``/`` (``docs/``, the root's is
``/``) and stands for its name set, what a listing returns. No normal path ends
in ``/``, so a file lease and a directory lease never collide, and every key
below directory ``d`` starts with ``d/``. :mod:`fscache.names` says which keys
each operation touches; the table knows nothing of paths beyond that prefix.

Rules (Gray & Cheriton, SOSP 1989; directory leases as NFSv4.1's directory
delegations):

* A read of a key grants the reader a lease of ``policy.term(key)`` seconds,
  recorded as ``expiry = now + term``. The server counts it live until
  ``expiry + skew``. A term of 0 records nothing: the reader may not cache.
  A listing of ``d`` is a read of ``d/``. A ranged read is a read of the file's
  key: the table never sees offsets, every chunk is cached under one lease.
* A write names a :class:`Footprint`: the keys whose values it may change and,
  for a directory rename, the subtrees below which every key may change. It joins
  the FIFO queue of each of its keys at once, on arrival. When it reaches the head
  of a key's queue, every other live holder of that key is sent an approval
  request. It is applied once it is at the head of every queue, each holder asked
  has approved (or relinquished) or ``now >= expiry + skew``, and the restart
  window is over. A holder whose connection is gone is never presumed dead; it
  is waited out.
* Arrival order is the order on every key: two writes that share keys are queued
  on each shared key in the order they arrived. So the oldest write not yet
  applied is at the head of all its queues and is only waiting for holders or
  time: writes over several keys (two crossing renames ``a -> b`` and
  ``b -> a``) cannot deadlock. Writes with no key in common never wait for each
  other.
* While a write is queued on a key, no lease on it is granted or extended:
  reads queue behind the write and are granted after it is applied, in arrival
  order (no writer starvation).
* When a write is applied every lease on its keys ends (each holder approved or
  expired); the writer gets a lease on its first key, the name it wrote (a
  caller with nothing to cache, as after a delete, relinquishes it). If applying
  it failed, the writer keeps its leases: its copies of the old values are current.
* Names. An operation that creates or removes a name in ``d`` (a write that
  creates a file, delete, mkdir, rmdir, a rename into or out of ``d``) is also
  a write on ``d/``: the holders of ``d``'s listing approve or are waited out
  first. Overwriting an existing file, a ranged write or a truncate change no
  name set: they are writes on the file's key alone. mkdir and rmdir are writes
  on the directory's own key and its parent's.
* A rename is a write on both names (as files and as directories: a name may
  change kind while the rename waits), so renaming over an existing file replaces
  it in one step and afterwards no lease on either name's old value is left.
  Within one directory it is a write on one directory key; across directories on
  two (on one if the destination exists: that name set keeps its names).
* Renaming a directory ends every lease below either of its names: its footprint
  names both as subtrees. On arrival the table scans its live keys (leased or
  queued) for the two prefixes and joins their queues; until it is applied, an
  operation on any other key below them first puts the rename at the head of
  that key's queue, so it is ordered after the rename. The scan is linear in the
  live keys (measured: 1 ms for 10,000 live keys, 10 ms for 100,000, plus about
  5 us per leased key beneath); a sorted index would make it logarithmic but
  cost an insertion on every grant, the hot path, to speed up a rare operation.
  A rename of a file scans nothing, and a key's check against the directory
  renames waiting is skipped when there are none.
* Facts. The table cannot know what exists; the caller passes what it knows
  (``creates``, ``dst_exists``, ``src_is_dir``), read on arrival. A fact about a
  name stays true until the write is applied if no write is queued on that name
  (:meth:`LeaseTable.is_blocked` is false): anything that could change it would
  be such a write, queued before. Otherwise the caller passes the cautious value
  (``creates=True``, ``dst_exists=False``, ``src_is_dir=True``): an extra key
  only costs waiting.
* Restart window: a new incarnation may hold writes back until
  ``hold_writes_until`` (``start + max_term + skew``), because leases granted by
  the previous incarnation may still be live. Reads are granted at once.
* Relinquishing a lease counts as approving any write waiting on it; a
  connection closed with a goodbye relinquishes all of its holder's leases.
* A writer may withdraw its write until it is handed out to be applied: it leaves
  every queue as if it had never come (reads behind it are granted, the next write
  starts). Holders that approved it have only dropped their copies.

Memory and cost (a million live leases must fit a small server):

* A lease costs the table one dict entry, one 32-byte value and one reference to
  its key where it is filed to be swept (below). A lease is ``complex(expiry,
  number)``, where ``number`` stands for its holder: a complex is a pair of exact
  doubles in one object, where a tuple of the holder and a float takes 80 bytes.
  A key maps to its lease while it has one holder, and to a dict of its leases by
  holder from the second on, which keeps the second reader's copy of the key's
  name for the filings of every later one (each read brings its own copy). There
  is no index of a holder's keys: it would take a second dict entry per lease.
* A holder has a record (its number and its count of leases) while it has a
  lease. A goodbye ends all its leases at once by retiring the record: a lease
  whose number belongs to no record is ended, for every rule, and is dropped when
  it is swept or another lease replaces it. So a goodbye costs the writes then
  waiting for approvals, not the holder's leases, and the same holder's next
  lease bears a new number.
* Expired leases are swept from *buckets*: a bucket opens at the dead-by instant
  (``expiry + skew``) of the first lease filed in it and takes later ones dead
  within ``PURGE_GRANULARITY`` of that; :meth:`LeaseTable.next_deadline` is due
  that long after it opened, so a lease is swept at most that late, and every
  :meth:`LeaseTable.tick` sweeps all leases dead by then (a bucket only partly
  due is put in dead-by order once and swept from the front). A lease is filed
  when it is granted to a holder that had none on the key, or when a re-grant
  ends earlier than the lease it renews; renewing to a later expiry files
  nothing. A swept key with live leases left is filed again at its earliest live
  dead-by. So a sweep touches only filed entries that are due -- its cost is in
  leases granted, never a scan of the live ones (:attr:`LeaseTable.purge_steps`
  counts it). Counting the live leases (:meth:`LeaseTable.live_leases`, for the
  server's stats) is the holders' counts less the leases dead but not yet swept,
  which are filed in the buckets due: it is no scan of the live ones either.
* A waiting write keeps the dead-by instants it waits on in a heap: waiting out
  expired holders and finding the next deadline cost the holders that expire, and
  an approval is a dict deletion, however many holders the write asked.
* A read queued behind a write is also filed under its holder, so a lost
  connection discards its own queued reads without a pass over the queues (which
  may hold a read of every holder a fan-out asked): each is marked discarded
  where it stands, and skipped when its turn comes.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import NewType, Protocol

from fscache.settings import DEFAULT_SKEW, DEFAULT_TERM, BadSetting, check_duration

__all__ = [
    "DEFAULT_SKEW",
    "DEFAULT_TERM",
    "PURGE_GRANULARITY",
    "AdaptiveTermPolicy",
    "ApplyWrite",
    "Discarded",
    "Effect",
    "Footprint",
    "Grant",
    "HolderId",
    "LeaseTable",
    "OpId",
    "SendApprovalRequest",
    "TermPolicy",
    "UnknownOp",
    "WriteCommitted",
]

HolderId = NewType("HolderId", str)
OpId = NewType("OpId", int)

PURGE_GRANULARITY = 1.0  # expired leases are swept at most this late; they are dead already


# ---------------------------------------------------------------- term policy
class TermPolicy(Protocol):
    """Chooses the lease term for a path. One small object, replaceable."""

    @property
    def max_term(self) -> float: ...

    def term(self, path: str, now: float) -> float: ...

    def note_write(self, path: str, now: float) -> None: ...

    def forget_before(self, now: float) -> None: ...


@dataclasses.dataclass
class AdaptiveTermPolicy:
    """``default`` seconds for every path, except that a path written ``hot_writes``
    times within ``window`` seconds is write-shared and gets term 0 (not cached),
    as the paper advises, until its write rate falls. ``hot_writes=0`` turns the
    rule off (a fixed term, as in the paper's model)."""

    default: float = DEFAULT_TERM
    hot_writes: int = 3
    window: float = DEFAULT_TERM
    # path: the instants of its last writes, oldest first; paths in the order last written
    _recent: OrderedDict[str, tuple[float, ...]] = dataclasses.field(
        default_factory=OrderedDict, repr=False
    )

    def __post_init__(self) -> None:
        self.default = check_duration("term", self.default)
        self.window = check_duration("window", self.window)
        if self.hot_writes < 0:
            raise BadSetting(f"hot_writes must be >= 0, not {self.hot_writes!r}")

    @property
    def max_term(self) -> float:
        return self.default

    def is_write_shared(self, path: str, now: float) -> bool:
        recent = self._recent.get(path)
        return (
            recent is not None and len(recent) == self.hot_writes and now - recent[0] < self.window
        )

    def term(self, path: str, now: float) -> float:
        if self.hot_writes and self.is_write_shared(path, now):
            return 0.0
        return self.default

    def note_write(self, path: str, now: float) -> None:
        if not self.hot_writes:
            return
        recent = self._recent
        recent[path] = (*recent.get(path, ()), now)[-self.hot_writes :]
        recent.move_to_end(path)

    def forget_before(self, now: float) -> None:
        """Drop write history that can no longer make a path write-shared: the paths
        written longest ago, up to the first still within the window (server time
        only moves on), so the cost is in the paths forgotten."""
        recent = self._recent
        while recent:
            path = next(iter(recent))
            if now - recent[path][-1] < self.window:
                break
            del recent[path]


# ---------------------------------------------------------------- what a write touches
@dataclasses.dataclass(frozen=True, slots=True)
class Footprint:
    """The keys a write may change, the first being the name it writes, and the
    subtrees (key prefixes such as ``docs/``) below which every key may change."""

    keys: tuple[str, ...]
    subtrees: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a write's footprint names at least the key it writes")


# ---------------------------------------------------------------- effects
@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """Serve queued read ``op`` now, with a lease of ``term`` seconds on key ``path``
    (0: do not cache)."""

    op: OpId
    holder: HolderId
    path: str
    term: float


@dataclasses.dataclass(frozen=True, slots=True)
class SendApprovalRequest:
    """Ask ``holder`` to drop key ``path`` and approve write ``write``."""

    holder: HolderId
    path: str
    write: OpId


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyWrite:
    """Every holder of every key of write ``op`` has approved or expired: make it
    durable, then call :meth:`LeaseTable.write_done`. ``path`` is its first key."""

    op: OpId
    holder: HolderId
    path: str


@dataclasses.dataclass(frozen=True, slots=True)
class WriteCommitted:
    """Write ``op`` is applied; the writer holds a lease of ``term`` on its first key."""

    op: OpId
    holder: HolderId
    path: str
    term: float


@dataclasses.dataclass(frozen=True, slots=True)
class Discarded:
    """Queued read ``op`` will not be served: its holder has gone."""

    op: OpId


Effect = Grant | SendApprovalRequest | ApplyWrite | WriteCommitted | Discarded


# ---------------------------------------------------------------- queued operations
@dataclasses.dataclass(slots=True, eq=False)
class _Op:
    op: OpId
    holder: HolderId
    keys: dict[str, None]  # in order, the first is the name written; grows by joins
    is_write: bool
    subtrees: tuple[str, ...] = ()
    started: set[str] = dataclasses.field(default_factory=set)  # keys asked to approve
    waiting_on: dict[tuple[str, HolderId], float] = dataclasses.field(
        default_factory=dict
    )  # (key, holder): dead-by
    waits: list[tuple[float, str, HolderId]] = dataclasses.field(
        default_factory=list
    )  # heap of (dead-by, key, holder); entries no longer in waiting_on are skipped
    discarded: bool = False  # a queued read whose connection closed: skipped in turn

    @property
    def first_key(self) -> str:
        return next(iter(self.keys))


class _Holder:
    """A holder while it has leases: the number that stands for it in them, and how
    many it has."""

    __slots__ = ("id", "imaginary", "leases", "number")

    def __init__(self, holder: HolderId, number: float) -> None:
        self.id = holder
        self.number = number
        self.imaginary = complex(0.0, number)  # expiry + imaginary: one of its leases
        self.leases = 0


class _Holders(dict[HolderId, complex]):
    """The leases on a key that more than one holder has had, in the order they came,
    and the copy of the key's name that the filings of its second and later holders
    share (each read brings its own copy)."""

    __slots__ = ("key",)

    def __init__(self, key: str, leases: dict[HolderId, complex]) -> None:
        super().__init__(leases)
        self.key = key


@dataclasses.dataclass(slots=True, eq=False)
class _Bucket:
    """Keys filed to be swept: each has a lease dead by ``opened + PURGE_GRANULARITY``."""

    opened: float  # the dead-by of the first lease filed in it
    keys: list[str]
    swept: int = 0  # keys[:swept] are done
    ordered: bool = False  # keys[swept:] are in dead-by order: swept before all were due

    def __lt__(self, other: _Bucket) -> bool:
        return self.opened < other.opened


class UnknownOp(Exception):
    """``write_done`` for an op the table is not applying: a bug in the caller."""


class LeaseTable:
    def __init__(
        self,
        policy: TermPolicy,
        *,
        skew: float = DEFAULT_SKEW,
        hold_writes_until: float | None = None,
    ) -> None:
        self.policy = policy
        self.skew = check_duration("skew", skew)
        self.hold_writes_until = hold_writes_until if hold_writes_until is not None else -1.0
        # key: its lease, complex(expiry, holder's number), or its leases by holder from
        # the second holder on (see "Memory and cost")
        self._leases: dict[str, complex | _Holders] = {}
        self._holders: dict[HolderId, _Holder] = {}  # those with leases
        self._numbered: dict[float, _Holder] = {}  # the same, by number
        self._last_number = 0.0
        self._queues: dict[str, deque[_Op]] = {}  # only keys with a queued write
        self._queued_reads: dict[HolderId, dict[_Op, None]] = {}  # the same reads, by holder
        self._started: dict[str, _Op] = {}  # key: the write asking its holders to approve
        self._applying: dict[OpId, _Op] = {}  # writes handed out as ApplyWrite
        self._subtree_writes: list[_Op] = []  # queued directory renames, in arrival order
        self._buckets: list[_Bucket] = []  # a heap, by when each opened
        self._open_bucket: _Bucket | None = None  # the one last opened, while unswept
        # counters the server reports
        self.leases_granted = 0
        self.approvals_sent = 0
        self.writes_delayed = 0  # writes that could not be applied on arrival
        self.waited_out: list[tuple[OpId, str, HolderId]] = []  # (write, key, holder) whose
        # lease ran out unapproved; the caller reads and clears it (its log)
        self.purge_steps = 0  # filed entries the sweep has looked at: its whole cost

    # ------------------------------------------------------------ queries
    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do, or None."""
        buckets = self._buckets
        deadline = buckets[0].opened + PURGE_GRANULARITY if buckets else None
        for write in self._waiting_writes() if self._started else ():  # runs after every event
            if len(write.started) < len(write.keys):
                continue  # behind an earlier write on some key: its write_done moves it
            due = _earliest_wait(write) if write.waiting_on else self.hold_writes_until
            if deadline is None or due < deadline:
                deadline = due
        return deadline

    def holders(self, key: str, now: float) -> dict[HolderId, float]:
        """Live holders of ``key`` and their expiry (server clock)."""
        return {h.id: exp for h, exp in self._leases_on(key) if now < exp + self.skew}

    def live_leases(self, now: float) -> int:
        """How many leases are live at ``now``: those the holders have, less those dead
        by ``now`` and not yet swept, which are filed in buckets opened by ``now``. So
        it costs the holders and those buckets, not a pass over the live leases."""
        held = sum(mine.leases for mine in self._holders.values())
        due = dict.fromkeys(
            key for bucket in self._buckets if bucket.opened <= now for key in bucket.keys
        )  # its keys before bucket.swept: swept since, or filed again in a later bucket
        skew = self.skew
        dead = sum(1 for key in due for _, exp in self._leases_on(key) if not now < exp + skew)
        return held - dead

    def leases_held(self, holder: HolderId) -> int:
        """How many keys ``holder`` has a lease on (expired ones until they are purged)."""
        mine = self._holders.get(holder)
        return 0 if mine is None else mine.leases

    def pending_writes(self) -> int:
        return len({id(op) for q in self._queues.values() for op in q if op.is_write})

    def is_blocked(self, key: str) -> bool:
        """A write is queued on ``key`` or on a subtree above it: reads of it wait,
        and facts about it may change before a write arriving now is applied."""
        return key in self._queues or self._subtree_write_above(key) is not None

    # ------------------------------------------------------------ events
    def read(self, op: OpId, holder: HolderId, key: str, now: float) -> float | None:
        """A read (a listing, a ranged read, a not-modified revalidation) of ``key``.
        Returns the term of the lease if it is granted now, or None if it is queued
        behind a write: then a :class:`Grant` effect serves it later. (No effect is
        built for the common case: the server's read path stays allocation-free.)"""
        if self._subtree_writes:
            self._join_subtree_writes(key)
        queue = self._queues.get(key)
        if queue is not None:
            queued = _Op(op, holder, {key: None}, is_write=False)
            queue.append(queued)
            self._queued_reads.setdefault(holder, {})[queued] = None
            return None
        return self._lease(holder, key, now)

    def extend(
        self, holder: HolderId, keys: Iterable[tuple[str, bool]], now: float
    ) -> list[float | None]:
        """Batched extension. For each ``(key, is_current)``: the new term, or None for
        stale (the cached version is old, or a write is waiting on the key)."""
        terms: list[float | None] = []
        for key, is_current in keys:
            if not is_current or self.is_blocked(key):
                terms.append(None)
                continue
            terms.append(self._lease(holder, key, now))
        return terms

    def write(self, op: OpId, holder: HolderId, footprint: Footprint, now: float) -> list[Effect]:
        """A write of ``footprint`` by ``holder`` arrives (see :mod:`fscache.names`)."""
        keys = dict.fromkeys(footprint.keys)
        if footprint.subtrees:
            for key in [*self._leases, *self._queues]:
                if key.startswith(footprint.subtrees):
                    keys[key] = None
        write = _Op(op, holder, {}, is_write=True, subtrees=footprint.subtrees)
        effects: list[Effect] = []
        for key in keys:
            if self._subtree_writes:
                self._join_subtree_writes(key)
            write.keys[key] = None
            self._queues.setdefault(key, deque()).append(write)
        if footprint.subtrees:
            self._subtree_writes.append(write)
        effects += self._advance(keys, now)
        if op not in self._applying:  # not applied on arrival
            self.writes_delayed += 1
        return effects

    def approve(self, holder: HolderId, key: str, write: OpId, now: float) -> list[Effect]:
        """``holder`` dropped ``key`` for write ``write``. Stale approvals are ignored."""
        started = self._started.get(key)
        if started is None or started.op != write:
            return []
        waiting_on = started.waiting_on
        if waiting_on.pop((key, holder), None) is None:
            return []
        self._end_lease(key, holder)
        if waiting_on:  # others have yet to approve
            return []
        return self._try_apply(started, now)

    def relinquish(self, holder: HolderId, keys: Iterable[str], now: float) -> list[Effect]:
        """``holder`` gives up its leases on ``keys`` (eviction, close)."""
        effects: list[Effect] = []
        for key in keys:
            self._end_lease(key, holder)
            started = self._started.get(key)
            if started is not None and started.waiting_on.pop((key, holder), None) is not None:
                effects += self._try_apply(started, now)
        return effects

    def connected(self, holder: HolderId, now: float) -> list[Effect]:
        """``holder`` has (re)connected: resend the approval requests it may have missed
        and that still matter at ``now`` (a lease past expiry + skew needs none)."""
        return [
            SendApprovalRequest(holder, key, write.op)
            for write in self._waiting_writes()
            for key in write.keys  # a few keys, where waiting_on may hold every holder's
            if now < write.waiting_on.get((key, holder), -math.inf)
        ]

    def disconnected(self, holder: HolderId, *, goodbye: bool, now: float) -> list[Effect]:
        """``holder``'s connection closed. Its queued reads are discarded. With a goodbye
        its leases are relinquished; without one they stay until they expire."""
        effects: list[Effect] = []
        for queued in self._queued_reads.pop(holder, ()):
            queued.discarded = True  # left in its queue, skipped when its turn comes
            effects.append(Discarded(queued.op))
        mine = self._holders.get(holder)
        if goodbye and mine is not None:  # its leases end, all at once: see _retire
            self._retire(mine)
            for key, write in list(self._started.items()):
                if write.waiting_on.pop((key, holder), None) is not None:
                    effects += self._try_apply(write, now)
        return effects

    def withdraw(self, op: OpId, now: float) -> list[Effect] | None:
        """Write ``op``'s writer gave up on it. If it is still queued (waiting for
        earlier writes, for approvals, for expiries or for the restart window) it
        leaves every queue and is never applied: the reads queued behind it are
        granted and the next writes start, as if it had never come. Holders that
        approved it have only lost their copies. Returns those effects, or None if it
        is too late: handed out as :class:`ApplyWrite` (or finished, or unknown).

        Finding it scans the queues: a withdrawal is rare, and an index would cost
        every write an entry."""
        if op in self._applying:
            return None
        write = next(
            (queued for queue in self._queues.values() for queued in queue if queued.op == op),
            None,
        )
        if write is None or not write.is_write:
            return None
        for key in write.keys:
            queue = self._queues[key]
            queue.remove(write)
            if not queue:
                del self._queues[key]
            if self._started.get(key) is write:
                del self._started[key]
        if write.subtrees:
            self._subtree_writes.remove(write)
        return self._advance(write.keys, now)

    def write_done(self, op: OpId, now: float, *, ok: bool) -> list[Effect]:
        """The I/O of ``ApplyWrite(op)`` finished (``ok``: it took effect)."""
        applied = self._applying.pop(op, None)
        if applied is None:
            raise UnknownOp(f"write {op} is not being applied")
        if applied.subtrees:
            self._subtree_writes.remove(applied)
        for key in applied.keys:
            head = self._queues[key].popleft()
            assert head is applied
            for mine, _ in self._leases_on(key):
                if ok or mine.id != applied.holder:  # a failed writer still caches the old value
                    self._end_lease(key, mine.id)
        effects: list[Effect] = []
        if ok:
            for key in applied.keys:
                self.policy.note_write(key, now)
            first = applied.first_key
            term = self._lease(applied.holder, first, now)
            effects.append(WriteCommitted(op, applied.holder, first, term))
        return effects + self._advance(applied.keys, now)

    def tick(self, now: float) -> list[Effect]:
        """Time has reached ``now``: apply writes whose unapproved holders have expired,
        release writes held by the restart window, and sweep dead leases."""
        effects: list[Effect] = []
        for write in self._waiting_writes():
            self._wait_out(write, now)
            effects += self._try_apply(write, now)
        self._purge(now)
        self.policy.forget_before(now)
        return effects

    # ------------------------------------------------------------ internals
    def _waiting_writes(self) -> list[_Op]:
        """The started writes not yet applying, each once."""
        return list(dict.fromkeys(self._started.values()))

    def _leases_on(self, key: str) -> list[tuple[_Holder, float]]:
        """``(holder, expiry)`` of each lease on ``key`` that has not ended (an expired
        one until it is swept; not one whose holder said goodbye)."""
        value = self._leases.get(key)
        if value is None:
            return []
        numbered = self._numbered
        return [
            (mine, lease.real)
            for lease in (value.values() if isinstance(value, _Holders) else (value,))
            if (mine := numbered.get(lease.imag)) is not None  # else it said goodbye
        ]

    def _lease(self, holder: HolderId, key: str, now: float) -> float:
        """Record a lease of the policy's term for ``holder`` on ``key``; return the term."""
        term = self.policy.term(key, now)
        if term > 0:
            expiry = now + term
            mine = self._holders.get(holder)
            if mine is None:
                mine = self._new_holder(holder)
            lease = expiry + mine.imaginary  # complex(expiry, mine.number), made faster
            value = self._leases.get(key)
            previous: complex | None = None  # the lease of ``mine`` this one renews
            if isinstance(value, complex):
                number = value.imag
                if number == mine.number:
                    previous = value
                    self._leases[key] = lease
                elif number in self._numbered:  # a second holder
                    first = self._numbered[number].id
                    self._leases[key] = _Holders(key, {first: value, holder: lease})
                else:  # its holder said goodbye
                    self._leases[key] = lease
            elif value is None:
                self._leases[key] = lease
            else:
                previous = value.get(holder)
                value[holder] = lease
                key = value.key  # one copy of the name for all its holders' filings
                if previous is not None and previous.imag != mine.number:
                    previous = None  # the holder's from before a goodbye
            if previous is None:  # a new lease: counted and filed
                mine.leases += 1
                self._file(key, expiry + self.skew)
            elif expiry < previous.real:  # renewed for less: dead before its filing?
                self._file(key, expiry + self.skew)
            self.leases_granted += 1
        return term

    def _new_holder(self, holder: HolderId) -> _Holder:
        self._last_number += 1.0
        mine = _Holder(holder, self._last_number)
        self._holders[holder] = self._numbered[mine.number] = mine
        return mine

    def _retire(self, mine: _Holder) -> None:
        """``mine`` has no lease left, or has said goodbye: each lease that still bears
        its number is ended (dropped when swept or replaced), and a later lease of the
        same holder bears a new number."""
        del self._holders[mine.id], self._numbered[mine.number]

    def _end_lease(self, key: str, holder: HolderId) -> None:
        mine = self._holders.get(holder)
        value = self._leases.get(key)
        if mine is None or value is None:
            return
        if isinstance(value, complex):
            if value.imag != mine.number:
                return
            del self._leases[key]
        else:
            lease = value.get(holder)
            if lease is None or lease.imag != mine.number:
                return
            del value[holder]
            if len(value) == 1:  # one holder's lease left: it stands alone
                self._leases[key] = next(iter(value.values()))
        mine.leases -= 1
        if not mine.leases:  # its last lease: retired (as _retire, inline on this path)
            del self._holders[mine.id], self._numbered[mine.number]

    def _file(self, key: str, dead_by: float) -> None:
        """File ``key`` to be swept once ``dead_by`` has passed."""
        bucket = self._open_bucket
        if bucket is not None and bucket.opened <= dead_by < bucket.opened + PURGE_GRANULARITY:
            bucket.keys.append(key)
        else:
            bucket = self._open_bucket = _Bucket(dead_by, [key])
            heapq.heappush(self._buckets, bucket)

    def _subtree_write_above(self, key: str) -> _Op | None:
        for write in self._subtree_writes:
            if key.startswith(write.subtrees):
                return write
        return None

    def _join_subtree_writes(self, key: str) -> None:
        """Before an operation on ``key`` is queued, each queued directory rename above
        ``key`` that lacks it joins its queue, in arrival order. A key it lacks had no
        lease and no queue when it arrived and was given none since (an operation on it
        would have joined it then), so the first to join heads a new queue and has no
        holder to ask; the others start on it from :meth:`_advance`, in turn."""
        for write in self._subtree_writes:
            if key not in write.keys and key.startswith(write.subtrees):
                write.keys[key] = None
                queue = self._queues.setdefault(key, deque())
                queue.append(write)
                if queue[0] is write:
                    write.started.add(key)
                    if write.op not in self._applying:
                        self._started[key] = write

    def _advance(self, keys: Iterable[str], now: float) -> list[Effect]:
        """Serve the head of each key's queue: grant leading reads, start the next
        write there; then apply each write so started that may now go."""
        effects: list[Effect] = []
        started: dict[_Op, None] = {}
        for key in keys:
            queue = self._queues.get(key)
            while queue and not queue[0].is_write:
                head = queue.popleft()
                if head.discarded:
                    continue
                reads = self._queued_reads[head.holder]
                del reads[head]
                if not reads:
                    del self._queued_reads[head.holder]
                term = self._lease(head.holder, key, now)
                effects.append(Grant(head.op, head.holder, key, term))
            if not queue:
                self._queues.pop(key, None)
                continue
            head = queue[0]
            if key in head.started:
                continue
            head.started.add(key)
            self._started[key] = head
            started[head] = None
            before = len(effects)
            skew, waiting_on, waits = self.skew, head.waiting_on, head.waits
            for mine, expiry in self._leases_on(key):  # its live holders but the writer
                dead_by = expiry + skew
                if now < dead_by and (holder := mine.id) != head.holder:
                    waiting_on[(key, holder)] = dead_by
                    heapq.heappush(waits, (dead_by, key, holder))
                    effects.append(SendApprovalRequest(holder, key, head.op))
            self.approvals_sent += len(effects) - before
        for write in started:
            if len(write.started) == len(write.keys):  # heads every queue: drop whom
                self._wait_out(write, now)  # it asked on the way and who are dead now
            effects += self._try_apply(write, now)
        return effects

    def _wait_out(self, write: _Op, now: float) -> None:
        """End the leases ``write`` waits on whose holders are past expiry + skew."""
        waits, waiting_on = write.waits, write.waiting_on
        while waits and waits[0][0] <= now:
            _, key, holder = heapq.heappop(waits)
            if waiting_on.pop((key, holder), None) is not None:
                self.waited_out.append((write.op, key, holder))
                self._end_lease(key, holder)

    def _try_apply(self, write: _Op, now: float) -> list[Effect]:
        if len(write.started) < len(write.keys) or write.waiting_on:
            return []
        if now < self.hold_writes_until:
            return []
        for key in write.keys:
            del self._started[key]
        self._applying[write.op] = write
        return [ApplyWrite(write.op, write.holder, write.first_key)]

    def _purge(self, now: float) -> None:
        """Sweep every lease dead by ``now``: end it, and file a key that still has
        live leases again. A bucket that is only partly due has its keys put in
        dead-by order once, and is swept from the front as far as ``now``."""
        buckets, again = self._buckets, []
        while buckets and buckets[0].opened <= now:
            bucket = heapq.heappop(buckets)
            if bucket is self._open_bucket:
                self._open_bucket = None  # nothing more is filed in it
            keys = bucket.keys
            if bucket.opened + PURGE_GRANULARITY <= now:  # all due
                self.purge_steps += len(keys) - bucket.swept
                for key in dict.fromkeys(keys[bucket.swept :]):  # filed by several: once
                    self._sweep(key, now)
                continue
            if not bucket.ordered:
                self.purge_steps += len(keys) - bucket.swept
                rest = dict.fromkeys(keys[bucket.swept :])
                keys[bucket.swept :] = sorted(rest, key=self._dead_by)
                bucket.ordered = True
            while bucket.swept < len(keys) and self._dead_by(keys[bucket.swept]) <= now:
                self.purge_steps += 1
                self._sweep(keys[bucket.swept], now)
                bucket.swept += 1
            if bucket.swept < len(keys):
                again.append(bucket)
        for bucket in again:
            heapq.heappush(buckets, bucket)

    def _dead_by(self, key: str) -> float:
        """When the first of ``key``'s leases is dead (-inf: it has none)."""
        leases = self._leases_on(key)
        return min((exp for _, exp in leases), default=-math.inf - self.skew) + self.skew

    def _sweep(self, key: str, now: float) -> None:
        """End the leases on ``key`` dead by ``now``, drop those of holders that said
        goodbye, and file ``key`` again if some are left."""
        value = self._leases.get(key)
        if isinstance(value, _Holders):
            numbered = self._numbered
            for holder in [h for h, lease in value.items() if lease.imag not in numbered]:
                del value[holder]
            if not value:
                del self._leases[key]
            elif len(value) == 1:
                self._leases[key] = next(iter(value.values()))
        elif value is not None and value.imag not in self._numbered:
            del self._leases[key]
        skew, live = self.skew, math.inf
        for mine, expiry in self._leases_on(key):
            dead_by = expiry + skew
            if dead_by <= now:
                self._end_lease(key, mine.id)
            elif dead_by < live:
                live = dead_by
        if live < math.inf:
            self._file(key, live)


def _earliest_wait(write: _Op) -> float:
    """The earliest dead-by among the holders ``write`` still waits on (some)."""
    waits, waiting_on = write.waits, write.waiting_on
    while (waits[0][1], waits[0][2]) not in waiting_on:  # approved or relinquished
        heapq.heappop(waits)
    return waits[0][0]
