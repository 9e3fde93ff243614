"""The lease table against a model of what every holder may have cached.

Hypothesis drives a :class:`LeaseTable` with three holders and two paths through
random reads, writes, approvals, extensions, relinquishes, disconnects (with and
without goodbye), reconnects, the passing of time, and the completion of writes.
Beside it runs a deliberately simple model: per path the committed version; per
holder and path the copy it has cached, of which version, and the expiry the
server recorded for it. A holder drops its copy when it handles an approval
request; the approval reaches the server later, possibly after the holder has
read the path again (a late, stale approval). A holder drops its copies on
relinquish and on goodbye; one cut off without goodbye keeps them until they expire.

The invariants are the consistency guarantee and the rules that give it:

(a) once a write is applied, no copy of the old version is live: every holder
    but the writer has dropped its copy or its lease is past expiry + skew;
(b) no write is applied while another holder's lease is live in the table
    (such a holder would have approved, relinquished, or expired);
(c) no read is granted while a write that arrived before it is unfinished;
(d) writes on one path are applied one at a time, in arrival order;
(e) after any step, ``next_deadline()`` is never in the past, is not None while a
    write waits, and ticking before it does nothing;
(f) the table records a lease for every copy a holder may still trust;
and, when the run ends and time is allowed to pass, every operation completes.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fscache.leases import (
    PURGE_GRANULARITY,
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
    WriteCommitted,
)

HOLDERS = [HolderId("a"), HolderId("b"), HolderId("c")]
PATHS = ["p", "q"]
TIME_STEPS = [0.0, 0.05, 0.1, 0.5, 1.0, 3.0, 9.9, 10.0, 10.1, 20.0]


@dataclasses.dataclass
class Copy:
    version: int
    expiry: float  # as the server recorded it


@dataclasses.dataclass
class PendingOp:
    op: OpId
    holder: HolderId
    path: str
    is_write: bool


class LeaseTableMachine(RuleBasedStateMachine):
    # ------------------------------------------------------------ set-up
    @initialize(
        term=st.sampled_from([1.0, 10.0]),
        hot_writes=st.sampled_from([0, 2]),
        skew=st.sampled_from([0.0, 0.1]),
        restarted=st.booleans(),
    )
    def start(self, term: float, hot_writes: int, skew: float, restarted: bool) -> None:
        self.policy = AdaptiveTermPolicy(default=term, hot_writes=hot_writes, window=term)
        self.skew = skew
        self.now = 0.0
        self.hold = term + skew if restarted else None
        self.table = LeaseTable(self.policy, skew=skew, hold_writes_until=self.hold)
        self.next_op = 1
        self.version = dict.fromkeys(PATHS, 0)
        self.copies: dict[tuple[HolderId, str], Copy] = {}
        self.connected = set(HOLDERS)
        self.queued: dict[OpId, PendingOp] = {}  # arrived, not granted / applied
        self.applying: dict[OpId, PendingOp] = {}  # ApplyWrite handed out
        self.approval_requests: set[tuple[HolderId, str, OpId]] = set()  # not yet handled
        self.approvals_in_flight: list[tuple[HolderId, str, OpId]] = []
        self.granted_order: dict[str, list[OpId]] = {path: [] for path in PATHS}
        self.leases_granted = 0
        self.approvals_sent = 0
        self.writes_delayed = 0

    def new_op(self) -> OpId:
        self.next_op += 1
        return OpId(self.next_op)

    # ------------------------------------------------------------ effects
    def absorb(self, effects: list[Effect], *, resend: bool = False) -> None:
        """Carry out ``effects`` on the model, checking each rule as it happens."""
        for effect in effects:
            if isinstance(effect, Grant):
                self.on_grant(effect)
            elif isinstance(effect, SendApprovalRequest):
                assert effect.holder != self.writer_of(effect.write)
                self.approval_requests.add((effect.holder, effect.path, effect.write))
                if not resend:
                    self.approvals_sent += 1
            elif isinstance(effect, ApplyWrite):
                self.on_apply(effect)
            elif isinstance(effect, WriteCommitted):
                raise AssertionError(f"{effect} outside write_done")
            else:
                assert isinstance(effect, Discarded)
                raise AssertionError(f"{effect} outside disconnected")

    def writer_of(self, write: OpId) -> HolderId:
        pending = self.queued.get(write) or self.applying[write]
        return pending.holder

    def on_grant(self, grant: Grant) -> None:
        read = self.queued.pop(grant.op)
        assert (read.holder, read.path, read.is_write) == (grant.holder, grant.path, False)
        # (c) no read is granted while a write that arrived before it is unfinished
        earlier_writes = [
            w
            for w in [*self.queued.values(), *self.applying.values()]
            if w.path == grant.path and w.is_write and w.op < grant.op
        ]
        assert earlier_writes == [], f"{grant} overtook {earlier_writes}"
        # reads of one path are granted in arrival order
        order = self.granted_order[grant.path]
        assert not order or order[-1] < grant.op
        order.append(grant.op)
        self.take_copy(grant.holder, grant.path, grant.term)

    def take_copy(self, holder: HolderId, path: str, term: float) -> None:
        if term > 0:
            self.copies[(holder, path)] = Copy(self.version[path], self.now + term)
            self.leases_granted += 1
        else:  # the client may not cache: it drops whatever it had
            self.copies.pop((holder, path), None)

    def on_apply(self, apply: ApplyWrite) -> None:
        write = self.queued.pop(apply.op)
        assert (write.holder, write.path, write.is_write) == (apply.holder, apply.path, True)
        # (d) one at a time, in arrival order
        assert not any(w.path == apply.path for w in self.applying.values())
        assert not any(
            w.path == apply.path and w.is_write and w.op < apply.op for w in self.queued.values()
        )
        if self.hold is not None:
            assert self.now >= self.hold
        # (b) no other holder's lease is live and unapproved in the table
        assert set(self.table.holders(apply.path, self.now)) <= {apply.holder}
        # (a) no copy of the old version is live anywhere but at the writer
        for (holder, path), copy in self.copies.items():
            if path == apply.path and holder != apply.holder:
                assert copy.expiry + self.skew <= self.now, (
                    f"{apply} while {holder} may still trust version {copy.version} "
                    f"until {copy.expiry} + {self.skew} (now {self.now})"
                )
        self.applying[apply.op] = write

    # ------------------------------------------------------------ rules
    def connected_holder(self, data: st.DataObject) -> HolderId:
        return data.draw(st.sampled_from(sorted(self.connected)), label="holder")

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), path=st.sampled_from(PATHS))
    def read(self, data: st.DataObject, path: str) -> None:
        holder = self.connected_holder(data)
        op = self.new_op()
        self.queued[op] = PendingOp(op, holder, path, is_write=False)
        busy = any(
            w.path == path and w.is_write for w in [*self.queued.values(), *self.applying.values()]
        )
        term = self.table.read(op, holder, path, self.now)
        if busy:  # (c) it waits for the write
            assert term is None
        else:
            assert term is not None
            self.on_grant(Grant(op, holder, path, term))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), path=st.sampled_from(PATHS))
    def write(self, data: st.DataObject, path: str) -> None:
        holder = self.connected_holder(data)
        op = self.new_op()
        self.queued[op] = PendingOp(op, holder, path, is_write=True)
        effects = self.table.write(op, holder, Footprint((path,)), self.now)
        if ApplyWrite(op, holder, path) not in effects:
            self.writes_delayed += 1
        self.absorb(effects)

    @precondition(lambda self: self.approval_requests)
    @rule(data=st.data())
    def handle_approval_request(self, data: st.DataObject) -> None:
        """The client drops its copy and sends the approval (it arrives later)."""
        request = data.draw(st.sampled_from(sorted(self.approval_requests)))
        self.approval_requests.discard(request)
        holder, path, _ = request
        self.copies.pop((holder, path), None)
        self.approvals_in_flight.append(request)

    @precondition(lambda self: self.approvals_in_flight)
    @rule(data=st.data())
    def deliver_approval(self, data: st.DataObject) -> None:
        """An approval reaches the server, perhaps after its holder has read the path
        again (a read sent before the approval, answered after it)."""
        holder, path, write = self.approvals_in_flight.pop(
            data.draw(st.integers(0, len(self.approvals_in_flight) - 1))
        )
        self.absorb(self.table.approve(holder, path, write, self.now))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), paths=st.sets(st.sampled_from(PATHS), min_size=1))
    def relinquish(self, data: st.DataObject, paths: set[str]) -> None:
        holder = self.connected_holder(data)
        for path in paths:
            self.copies.pop((holder, path), None)
        self.absorb(self.table.relinquish(holder, sorted(paths), self.now))

    def extenders(self) -> list[HolderId]:
        return sorted({h for h, _ in self.copies if h in self.connected})

    @precondition(lambda self: self.extenders())
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        """A client extends every copy it caches, in one batch."""
        holder = data.draw(st.sampled_from(self.extenders()), label="holder")
        named = sorted(p for h, p in self.copies if h == holder)
        batch = [(p, self.copies[(holder, p)].version == self.version[p]) for p in named]
        terms = self.table.extend(holder, batch, self.now)
        assert len(terms) == len(named)
        for (path, is_current), term in zip(batch, terms, strict=True):
            if not is_current:
                assert term is None
            if term is None:
                self.copies.pop((holder, path))
            else:
                self.take_copy(holder, path, term)

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), goodbye=st.booleans())
    def disconnect(self, data: st.DataObject, goodbye: bool) -> None:
        holder = self.connected_holder(data)
        self.connected.discard(holder)
        # what was on the wire is lost; the server resends requests on reconnect
        self.approval_requests = {r for r in self.approval_requests if r[0] != holder}
        self.approvals_in_flight = [r for r in self.approvals_in_flight if r[0] != holder]
        if goodbye:  # the client closes: its cache goes with it
            self.copies = {k: c for k, c in self.copies.items() if k[0] != holder}
        its_reads = {q.op for q in self.queued.values() if q.holder == holder and not q.is_write}
        effects = self.table.disconnected(holder, goodbye=goodbye, now=self.now)
        discarded = [e for e in effects if isinstance(e, Discarded)]
        assert effects[: len(discarded)] == discarded
        assert {d.op for d in discarded} == its_reads
        for d in discarded:
            del self.queued[d.op]
        if not goodbye:
            assert len(discarded) == len(effects)
        self.absorb(effects[len(discarded) :])

    @precondition(lambda self: len(self.connected) < len(HOLDERS))
    @rule(data=st.data())
    def reconnect(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(sorted(set(HOLDERS) - self.connected)))
        self.connected.add(holder)
        self.absorb(self.table.connected(holder, self.now), resend=True)

    @rule(step=st.sampled_from(TIME_STEPS))
    def advance(self, step: float) -> None:
        deadline = self.table.next_deadline()
        self.now += step
        self.tick(deadline)

    @precondition(lambda self: self.table.next_deadline() is not None)
    @rule(exactly=st.booleans())
    def advance_to_deadline(self, exactly: bool) -> None:
        deadline = self.table.next_deadline()
        assert deadline is not None
        self.now = deadline if exactly else max(self.now, math.nextafter(deadline, -math.inf))
        self.tick(deadline)

    def tick(self, deadline: float | None) -> None:
        effects = self.table.tick(self.now)
        if deadline is None or self.now < deadline:
            assert effects == [], "(e) tick before next_deadline() did something"
        self.absorb(effects)

    @precondition(lambda self: self.applying)
    @rule(data=st.data(), ok=st.booleans())
    def complete_write(self, data: st.DataObject, ok: bool) -> None:
        op = data.draw(st.sampled_from(sorted(self.applying)))
        self.complete(op, ok)

    def complete(self, op: OpId, ok: bool) -> None:
        write = self.applying.pop(op)
        effects = self.table.write_done(op, self.now, ok=ok)
        if ok:
            committed = effects.pop(0)
            assert isinstance(committed, WriteCommitted)
            assert (committed.op, committed.holder, committed.path) == (
                op,
                write.holder,
                write.path,
            )
            self.version[write.path] += 1
            self.take_copy(write.holder, write.path, committed.term)
        assert not any(isinstance(e, WriteCommitted) for e in effects)
        self.absorb(effects)

    # ------------------------------------------------------------ invariants
    @invariant()
    def deadline_is_never_in_the_past(self) -> None:
        deadline = self.table.next_deadline()
        assert deadline is None or deadline > self.now
        applying_paths = {w.path for w in self.applying.values()}
        waiting = [w for w in self.queued.values() if w.is_write and w.path not in applying_paths]
        if waiting:  # on approvals, expiries or the restart window, not on the caller
            assert deadline is not None, "(e) a write waits but no deadline is set"
            bound = max(self.hold or 0.0, self.now + self.policy.max_term + self.skew)
            assert deadline <= bound + PURGE_GRANULARITY

    @invariant()
    def table_records_a_lease_for_every_copy_still_trusted(self) -> None:
        for (holder, path), copy in self.copies.items():
            if self.now < copy.expiry + self.skew:
                recorded = self.table.holders(path, self.now).get(holder)
                assert recorded is not None and recorded >= copy.expiry, (
                    f"{holder} trusts {path} v{copy.version} until {copy.expiry} "
                    f"but the table records {recorded} (now {self.now})"
                )

    @invariant()
    def counters_match_the_model(self) -> None:
        assert self.table.leases_granted == self.leases_granted
        assert self.table.approvals_sent == self.approvals_sent
        assert self.table.writes_delayed == self.writes_delayed
        assert self.table.live_leases(self.now) == sum(
            len(self.table.holders(path, self.now)) for path in PATHS
        )
        assert self.table.pending_writes() == sum(
            1 for w in [*self.queued.values(), *self.applying.values()] if w.is_write
        )

    # ------------------------------------------------------------ the end
    def teardown(self) -> None:
        """Let time pass and everyone answer: every operation completes."""
        if not hasattr(self, "table"):
            return
        for _ in range(100):
            if not self.queued and not self.applying:
                break
            for op in sorted(self.applying):
                self.complete(op, ok=True)
            for holder, path, write in sorted(self.approval_requests):
                self.copies.pop((holder, path), None)
                self.approvals_in_flight.append((holder, path, write))
            self.approval_requests.clear()
            while self.approvals_in_flight:
                holder, path, write = self.approvals_in_flight.pop(0)
                self.absorb(self.table.approve(holder, path, write, self.now))
            deadline = self.table.next_deadline()
            if deadline is not None:
                self.now = max(self.now, deadline)
                self.tick(deadline)
        assert not self.queued and not self.applying, "operations never completed"
        assert self.table.pending_writes() == 0
        assert not any(self.table.is_blocked(path) for path in PATHS)


LeaseTableMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestLeaseTable = LeaseTableMachine.TestCase
