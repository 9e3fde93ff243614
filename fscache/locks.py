"""The lock table: exclusive leases on names, with fencing tokens, as a pure state machine.

Theory of operation
-------------------
A lock is a lease that only one session may hold at a time: Chubby's and
ZooKeeper's coordination primitive, built on the same rules of time as the read
leases of :mod:`fscache.leases`. The table does no I/O and reads no clock: every
call takes ``now`` (server-monotonic seconds) and returns the effects the caller
carries out, in order; the caller calls :meth:`LockTable.tick` at
:meth:`LockTable.next_deadline`.

Lock names follow the path rules but are a namespace of their own: a lock named
``jobs/leader`` is not a file. Rules:

* Grant. An acquire of a free name is granted at once with a fencing token one
  above the newest the name has ever had, and a ``ttl`` of the holder's choosing
  (``2 * skew < ttl <= MAX_LOCK_TTL``, :func:`fscache.settings.check_lock_ttl`).
  The server counts the lock live until ``expiry = now + ttl`` (``now`` being when
  the acquire or renewal was received) and grants the name to no one else before
  ``expiry + skew``. The holder trusts it until ``t_send + ttl - skew`` on its own
  clock, ``t_send`` being when it *sent* the request; since ``t_send`` comes before
  the server's ``now``, the old holder stops believing at least ``2 * skew`` before
  the next grant can be made, with clocks that drift apart by less than ``skew``.
* Queue. An acquire of a held name waits in a FIFO queue per name and is granted
  when the lock is released or has expired (``now >= expiry + skew``). An acquire
  that may not wait (a try) is answered :class:`Busy` instead.
* Renew. The holder renews with its token before its lease runs out: a renewal
  received while the lock is still its own (same session, same token, ``now <
  expiry + skew``) moves ``expiry`` to ``now + ttl``; any other is refused, and
  the holder has lost the lock.
* Release. The holder's release frees the name at once; the next in the queue is
  granted. A release naming an old token changes nothing.
* Tokens are strictly increasing per name and outlive the server: each grant is
  preceded by :class:`Persist` of the name's newest record (its token, the ttl it
  was granted with, whether it is held); the caller makes it durable before it
  sends the :class:`Granted` that follows. Releases and expiries persist too,
  lazily, and so does the end of a restart hold: a record that says held when
  the lock is free costs only a wait. :class:`Persist` names the record that
  changed, so the caller may write only the changed ones (:meth:`LockTable.records`
  of those names).
* Restart. A table built from the records of a previous incarnation at ``now``
  grants no lock on a name whose record says held before ``now + ttl + skew``:
  the lock granted before the restart may still be believed in until then. A
  released record needs no wait.
* Fencing. A change that names a lock and a token is allowed only while the token
  is the newest granted for that name (:meth:`LockTable.check_fence`): a paused
  holder whose lock passed to someone else is refused. Tokens start at 1, so a
  fence naming token 0 (or less) is always refused, never locked or not.
* Sessions. A session ended with a goodbye releases its locks and drops its
  queued acquires. A session whose connection is lost without one keeps its locks
  until they expire (it may resume and renew them: the session lives at least
  until :meth:`LockTable.held_until`, see :mod:`fscache.sessions`); its queued
  acquires are dropped (:class:`Dropped`), since their answer has no connection to
  go to.
* Watchers. Every grant, release and expiry is announced with :class:`Changed`
  (who holds the name now, None while nobody does).

Cost. A server may hold a lock for each of tens of thousands of sessions, each
renewed every few seconds, so no event scans the names: the instants at which names
fall free are kept in a heap (an entry whose name has since been renewed, released
or freed is skipped when it comes up), and the names each session holds or waits
for in an index of its own. A renewal, :meth:`LockTable.next_deadline` and a lost
connection cost the session's own names and a heap step, not a pass over the table.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Iterable

from fscache.errors import Conflict
from fscache.leases import HolderId, OpId
from fscache.settings import DEFAULT_SKEW, MAX_LOCK_TTL, check_duration, check_lock_ttl

__all__ = [
    "Busy",
    "Changed",
    "Dropped",
    "Effect",
    "Granted",
    "Holder",
    "LockTable",
    "Persist",
    "Record",
]


# ---------------------------------------------------------------- records and effects
@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """What survives a restart of one name: its newest token, the ttl that token was
    granted with, and whether its lock may still be held."""

    name: str
    token: int
    ttl: float
    held: bool
    identity: str | None = None  # who held it, when held (told by ``leader`` meanwhile)


@dataclasses.dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a name: its session, the identity it announced, its token."""

    session: HolderId
    identity: str
    token: int


@dataclasses.dataclass(frozen=True, slots=True)
class Persist:
    """Make the record of ``name`` (:meth:`LockTable.records`) durable; a
    :class:`Granted` after it in the same list may be sent only once that is done."""

    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Granted:
    """Acquire ``op`` of ``session`` holds ``name`` with ``token`` for ``ttl`` seconds."""

    op: OpId
    session: HolderId
    name: str
    token: int
    ttl: float


@dataclasses.dataclass(frozen=True, slots=True)
class Busy:
    """Acquire ``op`` may not wait, and ``name`` is held (by ``token``, 0: held back
    after a restart)."""

    op: OpId
    name: str
    token: int


@dataclasses.dataclass(frozen=True, slots=True)
class Dropped:
    """Queued acquire ``op`` of ``name`` is given up: its connection has gone, or its
    session stopped waiting."""

    op: OpId
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Changed:
    """For watchers: ``name`` is now held by ``identity`` with ``token``, or by no one
    (``identity`` None; ``token`` the newest granted)."""

    name: str
    token: int
    identity: str | None


Effect = Persist | Granted | Busy | Dropped | Changed


# ---------------------------------------------------------------- state per name
@dataclasses.dataclass(slots=True, eq=False)
class _Waiter:
    op: OpId
    session: HolderId
    ttl: float
    identity: str


@dataclasses.dataclass(slots=True, eq=False)
class _Name:
    token: int = 0  # the newest granted
    ttl: float = 0.0  # the ttl the newest token was granted with
    holder: Holder | None = None
    expiry: float = -math.inf  # server clock: receipt of the last acquire or renewal + ttl
    free_at: float = -math.inf  # no grant before: expiry + skew, or the restart hold
    queue: deque[_Waiter] = dataclasses.field(default_factory=deque)
    held_back_by: str | None = None  # during a restart hold: who held it before


class LockTable:
    def __init__(
        self,
        *,
        skew: float = DEFAULT_SKEW,
        max_ttl: float = MAX_LOCK_TTL,
        records: Iterable[Record] = (),
        now: float = 0.0,
    ) -> None:
        """``records``: what the previous incarnation persisted; the names they say
        may be held are held back until ``now + ttl + skew``."""
        self.skew = check_duration("skew", skew)
        self.max_ttl = check_duration("max_ttl", max_ttl)
        self._names: dict[str, _Name] = {}
        self._busy: set[str] = set()  # names held, held back or with a queue
        self._free_ats: list[tuple[float, str]] = []  # heap; see "Cost" above
        # names held or waited for, in the order first asked for (a dict: ends in order)
        self._by_session: dict[HolderId, dict[str, None]] = {}
        self._holding = 0  # names with a holder, expired or not (see "Cost" above)
        for record in records:
            state = self._names[record.name] = _Name(record.token, record.ttl)
            if record.held:
                self._free_at(record.name, state, now + record.ttl + self.skew)
                state.held_back_by = record.identity
                self._busy.add(record.name)
        # counters the server reports
        self.locks_granted = 0
        self.locks_expired = 0

    # ------------------------------------------------------------ queries
    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do, or None."""
        free_ats = self._free_ats
        while free_ats and not self._is_due_entry(*free_ats[0]):
            heapq.heappop(free_ats)
        return free_ats[0][0] if free_ats else None

    def holder(self, name: str, now: float) -> Holder | None:
        """Who holds ``name`` (until ``expiry + skew``), or None."""
        state = self._names.get(name)
        if state is None or state.holder is None or now >= state.free_at:
            return None
        return state.holder

    def state_of(self, name: str, now: float) -> tuple[int, str | None]:
        """``(token, identity)`` of who holds ``name``, as a query or a watch is told:
        the holder; during a restart hold, the holder the previous incarnation recorded
        (it may still believe it holds the lock, and no one else is granted it); else
        nobody (None), with the newest token granted."""
        state = self._names.get(name)
        if state is None:
            return 0, None
        holder = self.holder(name, now)
        if holder is not None:
            return holder.token, holder.identity
        if state.holder is None and now < state.free_at:  # held back
            return state.token, state.held_back_by
        return state.token, None

    def newest_token(self, name: str) -> int:
        """The newest token granted for ``name`` (0: never)."""
        state = self._names.get(name)
        return 0 if state is None else state.token

    def check_fence(self, name: str, token: int) -> None:
        """Raise :class:`Conflict` unless ``token`` is the newest granted for ``name``.
        Tokens start at 1: a fence naming 0 (or less) names no grant, and is refused
        even for a name never locked (whose newest token is 0)."""
        if token < 1:
            raise Conflict(
                f"fenced by lock {name!r} with token {token}, but tokens start at 1:"
                " the change is refused"
            )
        newest = self.newest_token(name)
        if token != newest:
            raise Conflict(
                f"fenced by lock {name!r} with token {token}, but the newest token of"
                f" {name!r} is {newest}: the change is refused"
            )

    def records(self, names: Iterable[str] | None = None) -> list[Record]:
        """The record of each of ``names`` (those a :class:`Persist` named), or of
        every name, to persist."""
        chosen = self._names if names is None else names
        return [
            Record(
                name, state.token, state.ttl, held=state.holder is not None or name in self._busy,
                identity=state.holder.identity if state.holder is not None
                else state.held_back_by,
            )
            for name in chosen
            if (state := self._names.get(name)) is not None
        ]  # fmt: skip

    def held(self, now: float) -> int:
        """How many names are held: those with a holder, less those whose lock has
        expired by ``now`` but is not yet ticked, found among the heap's due entries."""
        free_ats, names = self._free_ats, self._names
        expired: set[str] = set()  # a set: a renewal to the same instant files it twice
        below = [0]  # the heap's entries due by now form a subtree at its root
        while below:
            i = below.pop()
            if i < len(free_ats) and free_ats[i][0] <= now:
                when, name = free_ats[i]
                if self._is_due_entry(when, name) and names[name].holder is not None:
                    expired.add(name)
                below += (2 * i + 1, 2 * i + 2)
        return self._holding - len(expired)

    # ------------------------------------------------------------ events
    def acquire(
        self,
        op: OpId,
        session: HolderId,
        name: str,
        ttl: float,
        identity: str,
        now: float,
        *,
        wait: bool = True,
    ) -> list[Effect]:
        """``session`` asks for ``name`` for ``ttl`` seconds, announcing ``identity``:
        granted now, queued (``wait``) or :class:`Busy`."""
        ttl = check_lock_ttl(ttl, self.skew, self.max_ttl)
        state = self._names.get(name)
        if state is None:
            state = self._names[name] = _Name()
        effects: list[Effect] = []
        if state.holder is not None and now >= state.free_at:  # expired, not yet ticked
            self.locks_expired += 1
            effects += self._free(name, state, now)
        if not wait and (state.queue or not self._is_free(state, now)):
            return [*effects, Busy(op, name, state.holder.token if state.holder else 0)]
        state.queue.append(_Waiter(op, session, ttl, identity))
        self._busy.add(name)
        self._by_session.setdefault(session, {})[name] = None
        return effects + self._advance(name, state, now)

    def renew(self, session: HolderId, name: str, token: int, now: float) -> float | None:
        """The holder's renewal: the ttl it runs for from ``now``, or None if the lock
        is no longer ``session``'s with ``token`` (released, expired, passed on)."""
        state = self._names.get(name)
        if state is None or state.holder is None or now >= state.free_at:
            return None
        if state.holder.session != session or state.holder.token != token:
            return None
        state.expiry = now + state.ttl
        self._free_at(name, state, state.expiry + self.skew)
        return state.ttl

    def release(self, session: HolderId, name: str, token: int, now: float) -> list[Effect]:
        """``session`` gives ``name`` up; an old token or another's lock changes nothing."""
        state = self._names.get(name)
        if state is None or state.holder is None:
            return []
        if state.holder.session != session or state.holder.token != token:
            return []
        return self._free(name, state, now)

    def cancel(self, session: HolderId, name: str) -> list[Effect]:
        """``session`` stops waiting for ``name`` (its acquire timed out)."""
        state = self._names.get(name)
        if state is None:
            return []
        effects = self._drop_waiters(name, state, session)
        self._settle(name, state)
        return effects

    def session_ended(self, session: HolderId, now: float) -> list[Effect]:
        """A goodbye: ``session``'s locks are released, its queued acquires dropped."""
        effects = self.disconnected(session)
        for name in [n for n in self._by_session.get(session, ()) if self._holds(session, n)]:
            effects += self._free(name, self._names[name], now)
        return effects

    def held_until(self, session: HolderId) -> float | None:
        """The last instant a renewal of one of ``session``'s locks may be received and
        granted (the latest ``expiry + skew``), or None if it holds none."""
        names = self._by_session.get(session, ())
        ends = [self._names[name].free_at for name in names if self._holds(session, name)]
        return max(ends, default=None)

    def disconnected(self, session: HolderId) -> list[Effect]:
        """``session``'s connection is lost without a goodbye: its queued acquires are
        dropped; its locks stay until they expire."""
        effects: list[Effect] = []
        for name in list(self._by_session.get(session, ())):
            state = self._names[name]
            effects += self._drop_waiters(name, state, session)
            self._settle(name, state)
        return effects

    def tick(self, now: float) -> list[Effect]:
        """Time has reached ``now``: expire locks past ``expiry + skew``, end restart
        holds, and grant the names so freed."""
        effects: list[Effect] = []
        free_ats, due = self._free_ats, []
        while free_ats and free_ats[0][0] <= now:
            due.append(heapq.heappop(free_ats))
        for when, name in due:
            if not self._is_due_entry(when, name):  # renewed or freed since it was filed
                continue
            state = self._names[name]
            if state.holder is not None:
                self.locks_expired += 1
                effects += self._free(name, state, now)
            else:  # a restart hold is over: the record may say free again
                state.free_at = -math.inf
                if state.held_back_by is not None:  # watchers were told who held it
                    state.held_back_by = None
                    effects.append(Changed(name, state.token, None))
                effects += self._advance(name, state, now) or [Persist(name)]
        return effects

    # ------------------------------------------------------------ internals
    def _is_free(self, state: _Name, now: float) -> bool:
        return state.holder is None and now >= state.free_at

    def _holds(self, session: HolderId, name: str) -> bool:
        holder = self._names[name].holder
        return holder is not None and holder.session == session

    def _free_at(self, name: str, state: _Name, when: float) -> None:
        """No grant of ``name`` before ``when``: :meth:`tick` looks at it then."""
        state.free_at = when
        heapq.heappush(self._free_ats, (when, name))

    def _is_due_entry(self, when: float, name: str) -> bool:
        """Whether a heap entry still stands: its name falls free at ``when``."""
        return name in self._busy and self._names[name].free_at == when

    def _unindex(self, session: HolderId, name: str, state: _Name) -> None:
        """``session`` may no longer hold or wait for ``name``: forget it there, if so."""
        if (state.holder is not None and state.holder.session == session) or any(
            waiter.session == session for waiter in state.queue
        ):
            return
        names = self._by_session.get(session)
        if names is not None:
            names.pop(name, None)
            if not names:
                del self._by_session[session]

    def _free(self, name: str, state: _Name, now: float) -> list[Effect]:
        holder, state.holder = state.holder, None
        if holder is not None:
            self._holding -= 1
            self._unindex(holder.session, name, state)
        state.expiry = state.free_at = -math.inf
        effects: list[Effect] = [Changed(name, state.token, None), Persist(name)]
        return effects + self._advance(name, state, now)

    def _advance(self, name: str, state: _Name, now: float) -> list[Effect]:
        """Grant ``name`` to the head of its queue if it is free."""
        effects: list[Effect] = []
        if state.queue and self._is_free(state, now):
            waiter = state.queue.popleft()
            state.token += 1
            state.ttl = waiter.ttl
            state.holder = Holder(waiter.session, waiter.identity, state.token)
            self._holding += 1
            state.expiry = now + waiter.ttl
            self._free_at(name, state, state.expiry + self.skew)
            self.locks_granted += 1
            effects += [
                Persist(name),
                Granted(waiter.op, waiter.session, name, state.token, waiter.ttl),
                Changed(name, state.token, waiter.identity),
            ]
        self._settle(name, state)
        return effects

    def _settle(self, name: str, state: _Name) -> None:
        """Keep ``_busy`` to the names held, held back or waited for."""
        if state.holder is None and not state.queue and state.free_at == -math.inf:
            self._busy.discard(name)

    def _drop_waiters(self, name: str, state: _Name, session: HolderId) -> list[Effect]:
        dropped = [w for w in state.queue if w.session == session]
        for waiter in dropped:
            state.queue.remove(waiter)
        if dropped:
            self._unindex(session, name, state)
        return [Dropped(w.op, name) for w in dropped]
