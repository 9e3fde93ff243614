"""The ephemeral table driven with the lease table, as the service drives them,
against a model of the files and their ties.

Hypothesis runs two writing sessions (each replaced by a new one when it ends) and a
reader over the files ``f``, ``g`` and ``d/f``: ephemeral and plain writes, deletes,
renames, reads that take leases, approvals (the reader's, and live sessions'), the
end of a session (with a goodbye, which relinquishes its leases, or a crash, which
leaves them to run out), the passing of time, and the completion of writes. Each
change goes through the lease table with its footprint from :mod:`fscache.names`;
its plan is made when the table applies it and committed when it completes, as
``fscache.server.ephemeral`` does. A session's end asks for a conditional delete
per tied file, a write like any other.

Invariants:

(a) the table's ties are the model's (a tie follows the simple rules: an ephemeral
    write ties, any other change of the path unties, a rename moves it), and every
    tied file exists;
(b) no ephemeral file outlives its session's end by more than the time its delete
    waits in the lease table: while a file is tied to a session that has ended, a
    delete for it is queued or being applied;
(c) a file re-tied or untied is never deleted for the old session: a delete that
    goes ahead finds the file tied to the session it was asked for;
and when the run ends and time passes, every file of an ended session is gone.
"""

from __future__ import annotations

import dataclasses

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fscache import names
from fscache.ephemeral import DeleteTied, EphemeralTable, Move, Plan, Rewrite, TieChange
from fscache.leases import (
    AdaptiveTermPolicy,
    ApplyWrite,
    Effect,
    Footprint,
    HolderId,
    LeaseTable,
    OpId,
    SendApprovalRequest,
    WriteCommitted,
)

FILES = ["f", "g", "d/f"]
READER = HolderId("reader")
SERVER = HolderId("server")
TERM = 10.0
SKEW = 0.1
TIME_STEPS = [0.05, 1.0, 5.0, 10.1, 30.0]


@dataclasses.dataclass
class Op:
    holder: HolderId
    change: TieChange | DeleteTied
    deletes: bool = False  # a Rewrite that deletes the file (else it writes it)
    plan: Plan | None = None  # made when the lease table applies it


class EphemeralMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.now = 0.0
        self.lease_table = LeaseTable(AdaptiveTermPolicy(default=TERM, hot_writes=0), skew=SKEW)
        self.ties = EphemeralTable()
        self.files: dict[str, int] = {}  # path: contents
        self.model_ties: dict[str, HolderId] = {}
        self.sessions = [HolderId("s1"), HolderId("s2")]  # live
        self.ended: set[HolderId] = set()
        self.next_session = 3
        self.next_op = 0
        self.queued: dict[OpId, Op] = {}  # arrived, not yet applied
        self.applying: dict[OpId, Op] = {}
        self.requests: set[tuple[HolderId, str, OpId]] = set()
        self.contents = 0

    # ------------------------------------------------------------ driving
    def absorb(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, ApplyWrite):
                op = self.queued.pop(effect.op)
                if isinstance(op.change, DeleteTied):
                    op.plan = self.ties.plan_delete(op.change)
                else:
                    op.plan = self.ties.plan(op.change)
                self.applying[effect.op] = op
            elif isinstance(effect, SendApprovalRequest):
                self.requests.add((effect.holder, effect.path, effect.write))
            elif isinstance(effect, WriteCommitted):  # the writer keeps nothing cached
                self.absorb(self.lease_table.relinquish(effect.holder, [effect.path], self.now))

    def write(
        self,
        holder: HolderId,
        footprint: Footprint,
        change: TieChange | DeleteTied,
        *,
        deletes: bool = False,
    ) -> None:
        self.next_op += 1
        op = OpId(self.next_op)
        self.queued[op] = Op(holder, change, deletes)
        self.absorb(self.lease_table.write(op, holder, footprint, self.now))

    def end(self, session: HolderId, *, goodbye: bool) -> None:
        self.sessions.remove(session)
        self.ended.add(session)
        self.sessions.append(HolderId(f"s{self.next_session}"))
        self.next_session += 1
        self.absorb(self.lease_table.disconnected(session, goodbye=goodbye, now=self.now))
        for delete in self.ties.session_ended(session, self.now):
            self.write(SERVER, names.keys_for_delete(delete.path), delete)

    # ------------------------------------------------------------ rules
    @rule(who=st.integers(0, 1), path=st.sampled_from(FILES), ephemeral=st.booleans())
    def write_file(self, who: int, path: str, ephemeral: bool) -> None:
        session = self.sessions[who]
        change = Rewrite(path, session if ephemeral else None)
        self.write(session, names.keys_for_write(path, creates=True), change)

    @rule(who=st.integers(0, 1), path=st.sampled_from(FILES))
    def delete_file(self, who: int, path: str) -> None:
        self.write(self.sessions[who], names.keys_for_delete(path), Rewrite(path), deletes=True)

    @rule(who=st.integers(0, 1), src=st.sampled_from(FILES), dst=st.sampled_from(FILES))
    def rename_file(self, who: int, src: str, dst: str) -> None:
        if src == dst:
            return
        footprint = names.keys_for_rename(src, dst, src_is_dir=False, dst_exists=False)
        self.write(self.sessions[who], footprint, Move(src, dst))

    @rule(who=st.sampled_from([0, 1, 2]), path=st.sampled_from(FILES))
    def read(self, who: int, path: str) -> None:
        holder = READER if who == 2 else self.sessions[who]
        self.next_op += 1
        self.lease_table.read(OpId(self.next_op), holder, path, self.now)  # queued: dropped

    @rule(data=st.data())
    def approve(self, data: st.DataObject) -> None:
        live = sorted(r for r in self.requests if r[0] not in self.ended)
        if not live:
            return
        request = data.draw(st.sampled_from(live))
        self.requests.discard(request)
        holder, key, write = request
        self.absorb(self.lease_table.approve(holder, key, write, self.now))

    @rule(who=st.integers(0, 1), goodbye=st.booleans())
    def end_session(self, who: int, goodbye: bool) -> None:
        self.end(self.sessions[who], goodbye=goodbye)

    @rule(step=st.sampled_from(TIME_STEPS))
    def time_passes(self, step: float) -> None:
        self.now += step
        self.absorb(self.lease_table.tick(self.now))

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        if not self.applying:
            return
        op_id = data.draw(st.sampled_from(sorted(self.applying)))
        self.complete(op_id)

    def complete(self, op_id: OpId) -> None:
        op = self.applying.pop(op_id)
        change, plan = op.change, op.plan
        ok = True
        if isinstance(change, DeleteTied):
            if plan is None:  # skipped: untied or re-tied meanwhile
                assert self.model_ties.get(change.path) != change.session
            else:  # (c)
                assert self.model_ties.get(change.path) == change.session
                del self.files[change.path]
                del self.model_ties[change.path]
        elif isinstance(change, Move):
            ok = change.src in self.files
            if ok:
                self.files[change.dst] = self.files.pop(change.src)
                tie = self.model_ties.pop(change.src, None)
                self.model_ties.pop(change.dst, None)
                if tie is not None:
                    self.model_ties[change.dst] = tie
        elif op.deletes:
            ok = self.files.pop(change.path, None) is not None
            self.model_ties.pop(change.path, None)
        else:
            self.contents += 1
            self.files[change.path] = self.contents
            if change.session is None:
                self.model_ties.pop(change.path, None)
            else:
                self.model_ties[change.path] = change.session
        late = self.ties.commit(plan, self.now, set(self.sessions)) if ok and plan else []
        self.absorb(self.lease_table.write_done(op_id, self.now, ok=ok))
        for delete in late:
            self.write(SERVER, names.keys_for_delete(delete.path), delete)

    # ------------------------------------------------------------ invariants
    @invariant()
    def ties_follow_the_rules(self) -> None:  # (a)
        assert self.ties.ties() == self.model_ties
        assert self.ties._sorted == sorted(self.model_ties), "(a) the sorted index"
        assert self.model_ties.keys() <= self.files.keys()
        for session in {*self.sessions, *self.ended}:
            tied = sorted(p for p, s in self.model_ties.items() if s == session)
            assert [d.path for d in self.ties.session_ended(session, self.now)] == tied

    @invariant()
    def every_file_of_an_ended_session_has_its_delete_waiting(self) -> None:  # (b)
        waiting = {
            (op.change.path, op.change.session)
            for op in [*self.queued.values(), *self.applying.values()]
            if isinstance(op.change, DeleteTied)
        }
        for path, session in self.model_ties.items():
            if session in self.ended:
                assert (path, session) in waiting

    def teardown(self) -> None:
        if not hasattr(self, "ties"):
            return
        for _ in range(100):  # time passes, every write completes
            if not self.queued and not self.applying:
                break
            while self.applying:
                self.complete(min(self.applying))
            self.now += TERM + SKEW
            self.absorb(self.lease_table.tick(self.now))
        assert not self.queued and not self.applying
        assert not [p for p, s in self.model_ties.items() if s in self.ended]


EphemeralMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestEphemeral = EphemeralMachine.TestCase
