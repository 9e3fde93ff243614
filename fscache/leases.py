"""The lease table: the server's consistency rules as a pure state machine.

Theory of operation
-------------------
Everything that decides *when* a read may be cached or a write may be applied
lives here, and nothing else does. The table does no I/O and reads no clock:
every call takes ``now`` (server-monotonic seconds) and returns the effects the
caller must carry out, in order. The caller (``fscache.server``) does the I/O and
calls :meth:`LeaseTable.tick` at :meth:`LeaseTable.next_deadline`.

Rules (Gray & Cheriton, SOSP 1989, and DESIGN.md section 2):

* A read of ``path`` grants the reader a lease of ``policy.term(path)`` seconds,
  recorded as ``expiry = now + term``. The server counts it live until
  ``expiry + skew``. A term of 0 records nothing: the reader may not cache.
* Operations on one path form a FIFO queue. Reads at the head are granted at
  once; a write at the head *starts*: every other live holder is sent an
  approval request, and the write is applied once each has approved
  (or relinquished) or ``now >= expiry + skew`` for each that has not. A holder
  whose connection is gone is never presumed dead; it is waited out.
* While a write is queued on a path, no lease on it is granted: reads queue
  behind the write and are granted after it is applied, in arrival order
  (no writer starvation). Writes to one path are applied in arrival order;
  different paths never wait for each other.
* When a write is applied every lease on the path ends (each holder approved
  or expired); the writer gets a lease on the new contents. If applying it
  failed, the writer keeps its lease: its copy of the old contents is current.
* Restart window: a new incarnation may hold writes back until
  ``hold_writes_until`` (``start + max_term + skew``), because leases granted by
  the previous incarnation may still be live. Reads are granted at once.
* Relinquishing a lease counts as approving any write waiting on it; a
  connection closed with a goodbye relinquishes all of its holder's leases.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Iterable
from typing import NewType, Protocol

HolderId = NewType("HolderId", str)
OpId = NewType("OpId", int)

DEFAULT_TERM = 10.0  # the knee of the paper's curve (its section 3)
DEFAULT_SKEW = 0.1
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
    _recent: dict[str, deque[float]] = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.default >= 0 or self.default == float("inf"):
            raise ValueError(f"term must be a finite number >= 0, not {self.default!r}")
        if self.hot_writes < 0 or not self.window >= 0:
            raise ValueError("hot_writes and window must be >= 0")

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
        recent = self._recent.get(path)
        if recent is None:
            recent = self._recent[path] = deque(maxlen=self.hot_writes)
        recent.append(now)

    def forget_before(self, now: float) -> None:
        """Drop write history that can no longer make a path write-shared."""
        stale = [p for p, r in self._recent.items() if now - r[-1] >= self.window]
        for path in stale:
            del self._recent[path]


# ---------------------------------------------------------------- effects
@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """Serve read ``op`` now, with a lease of ``term`` seconds (0: do not cache)."""

    op: OpId
    holder: HolderId
    path: str
    term: float


@dataclasses.dataclass(frozen=True, slots=True)
class SendApprovalRequest:
    """Ask ``holder`` to drop ``path`` and approve write ``write``."""

    holder: HolderId
    path: str
    write: OpId


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyWrite:
    """Every holder has approved or expired: make write ``op`` durable, then call
    :meth:`LeaseTable.write_done`."""

    op: OpId
    holder: HolderId
    path: str


@dataclasses.dataclass(frozen=True, slots=True)
class WriteCommitted:
    """Write ``op`` is applied; the writer holds a lease of ``term`` on the new contents."""

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
@dataclasses.dataclass(slots=True)
class _Op:
    op: OpId
    holder: HolderId
    path: str
    is_write: bool
    arrived: float
    started: bool = False  # write: approval requests sent
    waiting_on: dict[HolderId, float] = dataclasses.field(default_factory=dict)  # holder: dead-by


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
        if not skew >= 0:
            raise ValueError(f"skew must be >= 0, not {skew!r}")
        self.policy = policy
        self.skew = skew
        self.hold_writes_until = hold_writes_until if hold_writes_until is not None else -1.0
        self._leases: dict[str, dict[HolderId, float]] = {}  # path: holder: expiry
        self._held: dict[HolderId, set[str]] = {}  # holder: paths it has leases on
        self._queues: dict[str, deque[_Op]] = {}  # only paths with a queued write
        self._started: dict[str, _Op] = {}  # path: its started, not yet applying write
        self._applying: dict[OpId, str] = {}  # write handed out as ApplyWrite: its path
        self._purge_heap: list[tuple[float, str, HolderId]] = []  # (dead-by, path, holder)
        # counters the server reports
        self.leases_granted = 0
        self.approvals_sent = 0
        self.writes_delayed = 0  # writes that could not be applied on arrival

    # ------------------------------------------------------------ queries
    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do, or None."""
        heap = self._purge_heap
        deadline = heap[0][0] + PURGE_GRANULARITY if heap else None
        for op in self._started.values():  # usually none: this runs after every event
            due = min(op.waiting_on.values()) if op.waiting_on else self.hold_writes_until
            if deadline is None or due < deadline:
                deadline = due
        return deadline

    def holders(self, path: str, now: float) -> dict[HolderId, float]:
        """Live holders of ``path`` and their expiry (server clock)."""
        return {h: exp for h, exp in self._leases.get(path, {}).items() if now < exp + self.skew}

    def live_leases(self, now: float) -> int:
        return sum(
            1 for held in self._leases.values() for exp in held.values() if now < exp + self.skew
        )

    def pending_writes(self) -> int:
        return sum(1 for q in self._queues.values() for op in q if op.is_write)

    def is_blocked(self, path: str) -> bool:
        """A write is queued on ``path``: reads of it wait."""
        return path in self._queues

    # ------------------------------------------------------------ events
    def read(self, op: OpId, holder: HolderId, path: str, now: float) -> list[Effect]:
        """A read (or a not-modified revalidation) of ``path`` by ``holder``."""
        term = self.read_at_once(op, holder, path, now)
        return [] if term is None else [Grant(op, holder, path, term)]

    def read_at_once(self, op: OpId, holder: HolderId, path: str, now: float) -> float | None:
        """:meth:`read` without building its effect, for the server's hot path: the
        term of the lease if the read is granted now (what ``[Grant(...)]`` says), or
        None if it is queued behind a write (a :class:`Grant` effect comes later)."""
        queue = self._queues.get(path)
        if queue is not None:
            queue.append(_Op(op, holder, path, is_write=False, arrived=now))
            return None
        return self._lease(holder, path, now)

    def extend(
        self, holder: HolderId, paths: Iterable[tuple[str, bool]], now: float
    ) -> list[float | None]:
        """Batched extension. For each ``(path, is_current)``: the new term, or None for
        stale (the cached version is old, or a write is waiting on the path)."""
        terms: list[float | None] = []
        for path, is_current in paths:
            if not is_current or path in self._queues:
                terms.append(None)
                continue
            terms.append(self._lease(holder, path, now))
        return terms

    def write(self, op: OpId, holder: HolderId, path: str, now: float) -> list[Effect]:
        """A write (or delete) of ``path`` by ``holder`` arrives."""
        queue = self._queues.setdefault(path, deque())
        queue.append(_Op(op, holder, path, is_write=True, arrived=now))
        effects = self._advance(path, now)
        if not any(isinstance(e, ApplyWrite) and e.op == op for e in effects):
            self.writes_delayed += 1
        return effects

    def approve(self, holder: HolderId, path: str, write: OpId, now: float) -> list[Effect]:
        """``holder`` dropped ``path`` for write ``write``. Stale approvals are ignored."""
        started = self._started.get(path)
        if started is None or started.op != write or holder not in started.waiting_on:
            return []
        self._end_lease(path, holder)
        del started.waiting_on[holder]
        return self._try_apply(started, now)

    def relinquish(self, holder: HolderId, paths: Iterable[str], now: float) -> list[Effect]:
        """``holder`` gives up its leases on ``paths`` (eviction, close)."""
        effects: list[Effect] = []
        for path in paths:
            self._end_lease(path, holder)
            started = self._started.get(path)
            if started is not None and started.waiting_on.pop(holder, None) is not None:
                effects += self._try_apply(started, now)
        return effects

    def connected(self, holder: HolderId, now: float) -> list[Effect]:
        """``holder`` has (re)connected: resend the approval requests it may have missed."""
        return [
            SendApprovalRequest(holder, path, op.op)
            for path, op in self._started.items()
            if holder in op.waiting_on
        ]

    def disconnected(self, holder: HolderId, *, goodbye: bool, now: float) -> list[Effect]:
        """``holder``'s connection closed. Its queued reads are discarded. With a goodbye
        its leases are relinquished; without one they stay until they expire."""
        effects: list[Effect] = []
        for queue in self._queues.values():
            for queued in [q for q in queue if q.holder == holder and not q.is_write]:
                queue.remove(queued)
                effects.append(Discarded(queued.op))
        if goodbye:
            effects += self.relinquish(holder, list(self._held.get(holder, ())), now)
        return effects

    def write_done(self, op: OpId, now: float, *, ok: bool) -> list[Effect]:
        """The I/O of ``ApplyWrite(op)`` finished (``ok``: it took effect)."""
        path = self._applying.pop(op, None)
        if path is None:
            raise UnknownOp(f"write {op} is not being applied")
        applied = self._queues[path].popleft()
        for holder in list(self._leases.get(path, ())):
            if ok or holder != applied.holder:  # a failed writer still caches the old contents
                self._end_lease(path, holder)
        effects: list[Effect] = []
        if ok:
            self.policy.note_write(path, now)
            grant = self._grant(op, applied.holder, path, now)
            effects.append(WriteCommitted(op, applied.holder, path, grant.term))
        return effects + self._advance(path, now)

    def tick(self, now: float) -> list[Effect]:
        """Time has reached ``now``: apply writes whose unapproved holders have expired,
        release writes held by the restart window, and sweep dead leases."""
        effects: list[Effect] = []
        for started in list(self._started.values()):
            for holder, dead_by in list(started.waiting_on.items()):
                if now >= dead_by:
                    del started.waiting_on[holder]
                    self._end_lease(started.path, holder)
            effects += self._try_apply(started, now)
        self._purge(now)
        self.policy.forget_before(now)
        return effects

    # ------------------------------------------------------------ internals
    def _grant(self, op: OpId, holder: HolderId, path: str, now: float) -> Grant:
        return Grant(op, holder, path, self._lease(holder, path, now))

    def _lease(self, holder: HolderId, path: str, now: float) -> float:
        """Record a lease of the policy's term for ``holder`` on ``path``; return the term."""
        term = self.policy.term(path, now)
        if term > 0:
            holders = self._leases.get(path)
            if holders is None:
                holders = self._leases[path] = {}
            holders[holder] = now + term
            held = self._held.get(holder)
            if held is None:
                held = self._held[holder] = set()
            held.add(path)
            heapq.heappush(self._purge_heap, (now + term + self.skew, path, holder))
            self.leases_granted += 1
        return term

    def _end_lease(self, path: str, holder: HolderId) -> None:
        held = self._leases.get(path)
        if held is None or held.pop(holder, None) is None:
            return
        if not held:
            del self._leases[path]
        paths = self._held.get(holder)
        if paths is not None:
            paths.discard(path)
            if not paths:
                del self._held[holder]

    def _advance(self, path: str, now: float) -> list[Effect]:
        """Serve the head of ``path``'s queue: grant leading reads, start the next write."""
        queue = self._queues.get(path)
        effects: list[Effect] = []
        while queue and not queue[0].is_write:
            head = queue.popleft()
            effects.append(self._grant(head.op, head.holder, head.path, now))
        if not queue:
            self._queues.pop(path, None)
            return effects
        head = queue[0]
        if head.started:
            return effects
        head.started = True
        self._started[path] = head
        for holder, expiry in self.holders(path, now).items():
            if holder != head.holder:
                head.waiting_on[holder] = expiry + self.skew
                effects.append(SendApprovalRequest(holder, path, head.op))
                self.approvals_sent += 1
        return effects + self._try_apply(head, now)

    def _try_apply(self, write: _Op, now: float) -> list[Effect]:
        if write.waiting_on or now < self.hold_writes_until:
            return []
        del self._started[write.path]
        self._applying[write.op] = write.path
        return [ApplyWrite(write.op, write.holder, write.path)]

    def _purge(self, now: float) -> None:
        heap = self._purge_heap
        while heap and heap[0][0] <= now:
            _, path, holder = heapq.heappop(heap)
            expiry = self._leases.get(path, {}).get(holder)
            if expiry is not None and expiry + self.skew <= now:
                self._end_lease(path, holder)
