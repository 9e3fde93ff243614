"""The server's side of ephemeral files: the ties made durable, and each change's
effect on them carried out around the change itself.

Theory of operation
-------------------
The rules are :mod:`fscache.ephemeral`'s; this module does their I/O. Each tie is
one small file in the store's private state directory (``ephemeral-<digest>``,
holding the path and the session), written with the store's durable-write helper.
One file per tie means two changes of different paths never write the same file,
and the lease table applies one write on a path at a time, so no two threads ever
touch one tie's file.

The service wraps the store call of every change of a file (:meth:`Ties.wrap`).
When the lease table applies it, :meth:`Ties.applying` plans its effect on the
ties on the event loop; the wrapped call, in the worker thread, then records new
ties *before* the change (a crash in between leaves a tie whose file is missing or
old, deleted at the next start) and removes old ones *after* it (a crash in between
deletes, at the next start, a file that was just untied: the cautious side for a
registration, and a window of one fsync). A change that fails puts the ties it
recorded back. :meth:`Ties.finished` commits the plan once the change has taken
effect. A :class:`~fscache.ephemeral.DeleteTied` whose path was untied or re-tied
before it was applied deletes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Container

from fscache.ephemeral import NO_CHANGE, DeleteTied, EphemeralTable, Plan, TieChange
from fscache.errors import FscacheError, NotDurable, NotFound
from fscache.leases import HolderId, OpId
from fscache.server.store import Store

log = logging.getLogger("fscache.server")

TIE_PREFIX = "ephemeral-"  # a tie's file in the state directory: this, then a digest

Apply = Callable[[], int | None]


def _tie_name(path: str) -> str:
    return TIE_PREFIX + hashlib.sha256(path.encode()).hexdigest()[:32]


class Nowhere:
    """The wire of the server's own connection (its ephemeral deletes): nothing is
    sent, nothing arrives."""

    async def receive(self) -> bytes:
        return b""

    async def send_all(self, data: bytes) -> None:
        return None

    async def aclose(self) -> None:
        return None


class Ties:
    """The ephemeral table, made durable in ``store``, driven by the service."""

    def __init__(self, store: Store) -> None:
        self.table = EphemeralTable()
        self._store = store
        self._changes: dict[OpId, TieChange | DeleteTied] = {}  # wrapped, not yet applying
        self._plans: dict[OpId, Plan | None] = {}  # applying; None: a delete to skip
        self._deletes: set[OpId] = set()  # applying, each a DeleteTied

    def recover(self, now: float) -> list[DeleteTied]:
        """The ties an earlier incarnation recorded, each ended (its session is gone)."""
        ties = []
        for name in self._store.state_names(TIE_PREFIX):
            data = self._store.load_state(name)
            try:
                record = json.loads(data or b"")
                ties.append((str(record["path"]), HolderId(str(record["session"]))))
            except (ValueError, KeyError, TypeError):
                log.warning("unreadable tie %s in the state directory; removed", name)
                self._store.remove_state(name)
        return self.table.recovered(ties, now)

    def wrap(self, op: OpId, change: TieChange | DeleteTied, apply: Apply) -> Apply:
        """``apply`` (the store call of write ``op``), with its effect on the ties."""
        self._changes[op] = change

        def run() -> int | None:
            plan = self._plans[op]
            if plan is None:
                return None  # untied or re-tied since the session ended
            if not plan:
                return apply()
            try:
                for path, session in plan.after.items():  # new ties first ...
                    if session is not None:
                        self._set(path, session)
            except FscacheError as exc:  # NotDurable too: the change itself is not made
                self._restore(plan)
                raise FscacheError(f"the ephemeral tie could not be recorded: {exc}") from exc
            try:
                version = self._apply(change, apply)
            except NotDurable:  # it took effect
                self._remove_untied(plan)
                raise
            except BaseException:  # it did not: the ties on disk as they were
                self._restore(plan)
                raise
            self._remove_untied(plan)  # ... old ones after
            return version

        return run

    def withdrawn(self, op: OpId) -> None:
        """Write ``op`` was withdrawn before it was applied: it changes no tie."""
        self._changes.pop(op, None)

    def applying(self, op: OpId) -> None:
        """The lease table applies ``op`` now: plan its effect on the ties."""
        change = self._changes.pop(op, None)
        if change is None:
            return
        if isinstance(change, DeleteTied):
            self._plans[op] = self.table.plan_delete(change)
            self._deletes.add(op)
        else:
            self._plans[op] = self.table.plan(change)

    def finished(
        self, op: OpId, now: float, live: Container[HolderId], *, ok: bool
    ) -> list[DeleteTied]:
        """Write ``op`` is done (``ok``: it took effect): commit its plan. Returns the
        deletes of ties it made for sessions no longer ``live``."""
        plan = self._plans.pop(op, NO_CHANGE)
        deletes = op in self._deletes
        self._deletes.discard(op)
        if not ok or not plan:
            return []
        return self.table.commit(plan, now, live, ephemeral_delete=deletes)

    @staticmethod
    def _apply(change: TieChange | DeleteTied, apply: Apply) -> int | None:
        if not isinstance(change, DeleteTied):
            return apply()
        try:
            return apply()
        except NotFound:  # tied before a write that never happened (a crash between)
            return None

    def _restore(self, plan: Plan) -> None:
        """Put back on disk the ties ``plan`` recorded ahead of a change not made."""
        for path, session in plan.after.items():
            if session is not None:
                with contextlib.suppress(FscacheError):
                    self._set(path, plan.before[path])

    def _remove_untied(self, plan: Plan) -> None:
        for path, session in plan.after.items():
            if session is None:
                try:
                    self._set(path, None)
                except FscacheError as exc:  # the change stands; the next start deletes it
                    log.warning("tie of %s not removed: %s", path, exc)

    def _set(self, path: str, session: HolderId | None) -> None:
        """Record on disk that ``path`` is tied to ``session`` (None: untied)."""
        if session is None:
            self._store.remove_state(_tie_name(path))
        else:
            record = json.dumps({"path": path, "session": session}).encode()
            self._store.save_state(_tie_name(path), record)
