"""Sessions: who holds a lease, as a pure state machine.

Theory of operation
-------------------
A lease, an approval and a relinquish belong to a *session*, not to a connection
and not to the label a client calls itself (its ``client_id``, kept for logs).
The server issues a session in its welcome: an id and an unguessable secret (16
random bytes, drawn by the caller), as ZooKeeper issues a session id and password.
A client that reconnects presents both and carries on as the same holder. The
session id is the lease table's :data:`~fscache.leases.HolderId`; a connection
acts only for its own session, so it can approve, relinquish or extend only that
session's leases.

The table does no I/O and reads no clock: every call takes ``now`` (server-monotonic
seconds), and the caller calls :meth:`SessionTable.tick` at
:meth:`SessionTable.next_deadline`. Each connection that carries a session gets an
*attachment* number; a call about a connection names it, so news of a connection
that has been replaced changes nothing.

Rules:

* Open. A hello without a session opens one: a new id (the table's prefix, unique to
  this server incarnation, and a counter; never reused), the secret the caller drew,
  the client's label and the connection's identity (the name on its certificate, or
  anonymous). Two clients with the same label are two sessions.
* Resume. A hello with a session id and secret of a live session attaches the session
  to the new connection, if the secret matches (compared with
  :func:`hmac.compare_digest`) and the identity is the one that opened it. If the
  session is still attached to another connection, that connection is *displaced*:
  it is the same client back over a half-open link, and the caller closes it.
* Refusal. A wrong secret or another identity is refused, and the session is
  untouched: its connection, its expiry and its leases stay as they were. The
  refusal never states the secret.
* Unknown. A resume naming a session this table does not hold (expired, ended, or
  issued by an earlier incarnation) opens a new session, and says it is not the one
  asked for. The client keeps its cache entries until their own expiry, as after a
  server restart; the lease table waits out whatever the old session held.
* Detach. A connection lost without a goodbye leaves its session alive for ``ttl``
  seconds, and for as long as a lock it holds may still be renewed (the caller
  names that instant, ``at_least``): it expires at ``max(detach + ttl, at_least)``
  unless resumed first. So a lock lives as long as its session may come back to
  renew it, never shorter: a client cut off longer than the TTL but less than its
  lock's ``ttl`` resumes and renews, rather than losing the lock to an expired
  session while the server still holds it for no one.
* End. A goodbye ends the session at once (the caller relinquishes its leases).
* Expiry. At ``now >= detach + ttl`` the session is forgotten (:class:`Expired`).
  Its leases are not relinquished: they run out by themselves (the default ``ttl``
  is the longest lease term plus the skew, so by then they have).
"""

from __future__ import annotations

import dataclasses
import heapq
import hmac

from fscache.leases import HolderId
from fscache.settings import BadSetting, check_duration

__all__ = [
    "MIN_TTL",
    "SHORTEST_TTL",
    "Attached",
    "Expired",
    "Refused",
    "SessionTable",
    "check_session_ttl",
    "default_ttl",
]

MIN_TTL = 5.0  # seconds: even with short terms, a client has this long to come back
SHORTEST_TTL = 1.0  # seconds: the least one may set (a client pings every third of it)


def default_ttl(max_term: float, skew: float) -> float:
    """How long a detached session lives by default: its leases' longest life, at
    least :data:`MIN_TTL`."""
    return max(max_term + skew, MIN_TTL)


def check_session_ttl(ttl: object) -> float:
    """``ttl`` as a float if it may be a session TTL: at least :data:`SHORTEST_TTL`.
    Shorter, a client holding ephemeral files would ping more often than three times
    a second, and the server's silence check would spin (at 0: a session would be
    silent at once, and its files deleted as soon as written)."""
    value = check_duration("session_ttl", ttl)
    if value < SHORTEST_TTL:
        raise BadSetting(
            f"session_ttl must be at least {SHORTEST_TTL:g} s (a client holding ephemeral"
            f" files pings every third of it), not {ttl!r}"
        )
    return value


# ---------------------------------------------------------------- results and effects
@dataclasses.dataclass(frozen=True, slots=True)
class Attached:
    """``session`` now acts through the connection numbered ``attachment``.
    ``resumed``: it is the session the hello named (False: a new one). ``displaced``:
    the attachment of the connection the session left, which the caller closes."""

    session: HolderId
    attachment: int
    resumed: bool
    displaced: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A resume of ``session`` refused; ``reason`` is safe to log and to send."""

    session: HolderId
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Expired:
    """``session`` (labelled ``label``) was detached for its whole TTL: it is gone."""

    session: HolderId
    label: str


@dataclasses.dataclass(slots=True, eq=False)
class _Session:
    label: str
    identity: str
    secret: bytes = dataclasses.field(repr=False)
    attachment: int | None  # the connection it acts through; None while detached
    expires: float | None = None  # while detached: detach + ttl


class SessionTable:
    def __init__(self, *, ttl: float, prefix: str) -> None:
        self.ttl = check_session_ttl(ttl)
        self.prefix = prefix
        self._sessions: dict[HolderId, _Session] = {}
        self._next_session = 0
        self._next_attachment = 0
        self._expiry_heap: list[tuple[float, HolderId]] = []  # (expires, session); lazy
        # counters the server reports
        self.opened = 0
        self.resumed = 0
        self.refused = 0
        self.expired = 0

    # ------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session: object) -> bool:
        return session in self._sessions

    def label(self, session: HolderId) -> str:
        """The label the client gave when it opened ``session``."""
        return self._sessions[session].label

    def is_attached(self, session: HolderId) -> bool:
        return self._sessions[session].attachment is not None

    def expires(self, session: HolderId) -> float | None:
        """When a detached ``session`` expires; None while it is attached."""
        return self._sessions[session].expires

    def is_silent(self, heard_at: float, now: float) -> bool:
        """Whether a connection last heard from at ``heard_at`` counts as lost at
        ``now``: silent for the TTL. The server applies this to the sessions that hold
        ephemeral files (their clients ping more often than that), and detaches such a
        session as of ``heard_at``: a hung client, or one cut off without its
        connection closing, keeps its files no longer than a dead one."""
        return now - heard_at >= self.ttl

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do, or None."""
        heap = self._expiry_heap
        while heap and not self._is_due_entry(*heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # ------------------------------------------------------------ events
    def open(self, label: str, identity: str, secret: bytes, now: float) -> Attached:
        """A hello without a session: a new session, attached to a new connection."""
        self._next_session += 1
        session = HolderId(f"{self.prefix}.{self._next_session}")
        self._sessions[session] = _Session(label, identity, secret, self._attach())
        self.opened += 1
        return Attached(session, self._next_attachment, resumed=False)

    def resume(
        self,
        session: HolderId,
        secret: bytes,
        *,
        label: str,
        identity: str,
        new_secret: bytes,
        now: float,
    ) -> Attached | Refused:
        """A hello naming ``session`` and ``secret``. An unknown session opens a new one
        with ``new_secret`` (and ``label``): see the rules."""
        state = self._sessions.get(session)
        if state is None:
            return self.open(label, identity, new_secret, now)
        if not hmac.compare_digest(state.secret, secret):
            self.refused += 1
            return Refused(session, f"session {session}: wrong secret")
        if state.identity != identity:
            self.refused += 1
            return Refused(session, f"session {session} belongs to another identity")
        displaced = state.attachment
        state.attachment = self._attach()
        state.expires = None
        self.resumed += 1
        return Attached(session, state.attachment, resumed=True, displaced=displaced)

    def detach(
        self, session: HolderId, attachment: int, now: float, *, at_least: float | None = None
    ) -> None:
        """The connection ``attachment`` of ``session`` was lost without a goodbye: the
        session expires at ``now + ttl``, or at ``at_least`` if later, unless resumed.
        A replaced connection's news changes nothing."""
        state = self._sessions.get(session)
        if state is None or state.attachment != attachment:
            return
        state.attachment = None
        state.expires = now + self.ttl if at_least is None else max(now + self.ttl, at_least)
        heapq.heappush(self._expiry_heap, (state.expires, session))

    def end(self, session: HolderId, attachment: int, now: float) -> bool:
        """A goodbye on connection ``attachment``: the session ends now. False if that
        connection no longer carries the session (nothing changes)."""
        state = self._sessions.get(session)
        if state is None or state.attachment != attachment:
            return False
        del self._sessions[session]
        return True

    def tick(self, now: float) -> list[Expired]:
        """Time has reached ``now``: sessions detached for their whole TTL expire."""
        expired: list[Expired] = []
        heap = self._expiry_heap
        while heap and heap[0][0] <= now:
            expires, session = heapq.heappop(heap)
            if self._is_due_entry(expires, session):
                expired.append(Expired(session, self._sessions.pop(session).label))
        self.expired += len(expired)
        return expired

    # ------------------------------------------------------------ internals
    def _attach(self) -> int:
        self._next_attachment += 1
        return self._next_attachment

    def _is_due_entry(self, expires: float, session: HolderId) -> bool:
        """The heap entry is the session's current expiry (not one a resume undid)."""
        state = self._sessions.get(session)
        return state is not None and state.expires == expires
