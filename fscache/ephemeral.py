"""Ephemeral files: files that live as long as the session that wrote them.

Theory of operation
-------------------
A write may be *ephemeral*: the file it leaves is *tied* to the writer's session
(:mod:`fscache.sessions`), as ZooKeeper ties an ephemeral node to its session. When
the session ends (a goodbye, or detached for its whole TTL) each of its files is
deleted. The table here keeps the ties and decides what every committed change does
to them; it does no I/O and reads no clock (``now`` is an argument where time is
recorded). The caller (``fscache.server``) carries out each :class:`DeleteTied` as an
ordinary delete through the lease table, so readers holding a lease on the file or
on its directory's listing approve it or are waited out, and keeps the ties durable.

Rules:

* Tie. A whole-file write (or upload commit) that is ephemeral ties its path to the
  writer's session once it is applied, replacing any earlier tie of that path.
* Untie. Every other applied change of a tied path -- a plain write, a delete, a
  ranged write, a truncate -- unties it: the file now outlives every session. An
  ephemeral write by another session re-ties it to that session.
* Move. A rename carries the ties with the file: ``src``'s tie (and, for a
  directory, the tie of every path below ``src``) becomes ``dst``'s. A file renamed
  over a tied ``dst`` replaces it, and with it ``dst``'s tie: ``dst`` ends tied as
  ``src`` was (or untied). So a file written ephemeral under a temporary name and
  renamed into place stays tied.
* End. When a session ends, each path tied to it gets one :class:`DeleteTied`. The
  delete is conditional: when it is applied, :meth:`EphemeralTable.plan_delete`
  answers None unless the path is still tied to that session, so a file untied or
  re-tied meanwhile (by a write queued before the delete) is never deleted for the
  old session. Directories are never deleted, only the files.
* Late ties. A write queued before its session ended may be applied after; a rename
  may carry the tie of an ended session to a new name. A tie committed for a session
  that is no longer live is ended as it is made (:meth:`EphemeralTable.commit`
  returns its :class:`DeleteTied`), so no file outlives its session's end by more
  than the time the writes before its delete take.
* Restart. Ties are recorded durably by the caller. A new server incarnation knows
  none of the sessions of an earlier one, so every recorded tie is ended at start
  (:meth:`EphemeralTable.recovered`); those deletes wait for the restart window like
  any write.
* Plan, then commit. A change's effect on the ties is computed when the change is
  applied (:meth:`EphemeralTable.plan`: the ties of the paths it touches, before and
  after) and made once it has taken effect (:meth:`EphemeralTable.commit`); a change
  that fails leaves the ties as they were. The lease table applies one write on a
  path at a time, so no other commit changes a path's tie between the two.

Cost. A registry may tie a file to each of tens of thousands of sessions, and every
rename anywhere asks which tied paths lie at or below its two names. The tied paths
are also kept sorted, where the paths below a directory are one run: those that
begin with ``dir + "/"`` sort from ``dir + "/"`` up to ``dir + "0"`` ("0" follows "/"
in every encoding of text), found by bisection. A rename costs the ties it moves.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, insort
from collections.abc import Container, Iterable, Mapping

from fscache.leases import HolderId

__all__ = [
    "NO_CHANGE",
    "DeleteTied",
    "EphemeralTable",
    "Move",
    "Plan",
    "Rewrite",
    "TieChange",
]


# ---------------------------------------------------------------- changes
@dataclasses.dataclass(frozen=True, slots=True)
class Rewrite:
    """A change of the file ``path``: its writer's session if the write is ephemeral,
    else None (a plain write, a delete, a ranged write, a truncate)."""

    path: str
    session: HolderId | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Move:
    """A rename of ``src`` (a file or a directory) to ``dst``."""

    src: str
    dst: str


TieChange = Rewrite | Move


# ---------------------------------------------------------------- effects
@dataclasses.dataclass(frozen=True, slots=True)
class DeleteTied:
    """Delete ``path`` if it is still tied to ``session``, which ended at ``ended``."""

    path: str
    session: HolderId
    ended: float


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What a change does to the ties of the paths it touches: each path's session
    before and after (None: untied). ``after`` keeps only paths whose tie changes."""

    before: Mapping[str, HolderId | None]
    after: Mapping[str, HolderId | None]

    def __bool__(self) -> bool:
        return bool(self.after)


NO_CHANGE = Plan({}, {})


class EphemeralTable:
    def __init__(self) -> None:
        self._ties: dict[str, HolderId] = {}  # path: the session it is tied to
        self._by_session: dict[HolderId, set[str]] = {}  # the same ties, by session
        self._sorted: list[str] = []  # the tied paths, sorted (see "Cost" above)
        self.deleted = 0  # ephemeral files deleted at their session's end (reported)

    # ------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._ties)

    def session_of(self, path: str) -> HolderId | None:
        """The session ``path`` is tied to, or None."""
        return self._ties.get(path)

    def ties(self) -> dict[str, HolderId]:
        """Every tie, path: session (a copy)."""
        return dict(self._ties)

    def sessions(self) -> list[HolderId]:
        """The sessions that have files tied to them."""
        return list(self._by_session)

    def next_deadline(self) -> float | None:
        """The table has no timers: a session's end comes from the session table, and
        its deletes wait in the lease table."""
        return None

    # ------------------------------------------------------------ changes
    def plan(self, change: TieChange) -> Plan:
        """What ``change``, applied now, does to the ties (see the rules)."""
        ties = self._ties
        if isinstance(change, Rewrite):
            tied = ties.get(change.path)
            if tied == change.session:
                return NO_CHANGE
            return Plan({change.path: tied}, {change.path: change.session})
        if not ties:
            return NO_CHANGE
        src, dst = change.src, change.dst
        moved = {p: ties[p] for p in self._at_or_below(src)}
        replaced = {p: ties[p] for p in self._at_or_below(dst)}
        after: dict[str, HolderId | None] = dict.fromkeys(moved)
        after.update(dict.fromkeys(replaced))
        for path, session in moved.items():
            after[dst + path[len(src) :]] = session
        before = {path: ties.get(path) for path in after}
        after = {path: s for path, s in after.items() if before[path] != s}
        return Plan({p: before[p] for p in after}, after) if after else NO_CHANGE

    def plan_delete(self, effect: DeleteTied) -> Plan | None:
        """The plan of ``effect``'s delete, applied now; None when the path is no longer
        tied to the session that ended (the delete is skipped)."""
        if self._ties.get(effect.path) != effect.session:
            return None
        return Plan({effect.path: effect.session}, {effect.path: None})

    def commit(
        self, plan: Plan, now: float, live: Container[HolderId], *, ephemeral_delete: bool = False
    ) -> list[DeleteTied]:
        """The change ``plan`` was made for has taken effect at ``now``; ``live``: the
        sessions that have not ended. A tie made for one that has is ended at once."""
        late = []
        for path, session in plan.after.items():
            self._untie(path)
            if session is not None:
                self._tie(path, session)
                if session not in live:
                    late.append(DeleteTied(path, session, now))
        if ephemeral_delete:
            self.deleted += 1
        return late

    # ------------------------------------------------------------ sessions
    def session_ended(self, session: HolderId, now: float) -> list[DeleteTied]:
        """``session`` ended at ``now``: delete each file tied to it."""
        return [DeleteTied(p, session, now) for p in sorted(self._by_session.get(session, ()))]

    def recovered(self, ties: Iterable[tuple[str, HolderId]], now: float) -> list[DeleteTied]:
        """A new incarnation starts with the ties an earlier one recorded: their sessions
        are gone, so each file is deleted."""
        effects = []
        for path, session in ties:
            self._tie(path, session)
            effects.append(DeleteTied(path, session, now))
        return effects

    # ------------------------------------------------------------ internals
    def _at_or_below(self, path: str) -> list[str]:
        """The tied paths that are ``path`` or lie below it, as a directory."""
        found = [path] if path in self._ties else []
        tied = self._sorted
        return found + tied[bisect_left(tied, path + "/") : bisect_left(tied, path + "0")]

    def _tie(self, path: str, session: HolderId) -> None:
        if path not in self._ties:
            insort(self._sorted, path)
        self._ties[path] = session
        self._by_session.setdefault(session, set()).add(path)

    def _untie(self, path: str) -> None:
        session = self._ties.pop(path, None)
        if session is not None:
            del self._sorted[bisect_left(self._sorted, path)]
            paths = self._by_session[session]
            paths.discard(path)
            if not paths:
                del self._by_session[session]
