"""The lock table against a model of what every holder believes.

Hypothesis drives a :class:`LockTable` with three sessions over two names through
random acquires (waiting or not, of several ttls, sent a little before they arrive),
renewals (with the token a session believes in, or a wrong one), releases,
cancelled acquires, goodbyes, lost connections, server restarts (a new table from
the records, the sessions and their beliefs unchanged) and the passing of time.
Beside it runs the model: per session and name, the token it believes it holds and
until when (``t_send + ttl - skew``, its own clock, the send being the request's);
a session stops believing at that instant, or when it releases, or when it is
refused a renewal.

The invariants are the rules of :mod:`fscache.locks`:

(a) at most one holder of a name at any instant, and only one whose lock the table
    may count live;
(b) tokens of a name are strictly increasing, across restarts too;
(c) no grant while another session may still believe it holds the name: a belief
    that ran out by time ended ``2 * skew`` before the grant or earlier (one its
    holder gave up, by release or goodbye, needs no margin);
(d) every live belief passes the fence (its token is the newest of its name), and
    token 0 never does;
(e) ``next_deadline()`` is always ahead (time passes only by ticks), and ticking
    before it does nothing;
(g) a session that holds a name in the table is held (``held_until``, how long its
    detached session must live) past every belief of its own in a name, so it may
    come back and renew before its belief runs out;
(h) the table's indexes agree with a scan of its names: ``next_deadline()`` is the
    earliest instant a held, held-back or waited-for name falls free, and each
    session's names are exactly those it holds or waits for, and ``held(t)`` counts
    the names ``holder`` says are held at ``t``, now and after the next deadline;
and, when the run ends and time is allowed to pass, every queued acquire is granted.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fscache.errors import Conflict
from fscache.leases import HolderId, OpId
from fscache.locks import Busy, Changed, Dropped, Effect, Granted, LockTable, Persist

SESSIONS = [HolderId("a"), HolderId("b"), HolderId("c")]
NAMES = ["x", "jobs/leader"]
TTLS = [0.3, 1.0, 3.0]
SKEW = 0.1
TIME_STEPS = [0.0, 0.05, 0.1, 0.2, 0.7, 1.0, 2.9, 3.0, 3.1, 5.0]
SEND_DELAYS = [0.0, 0.05, 0.1]  # a request is sent this long before it arrives


@dataclasses.dataclass
class Belief:
    token: int
    until: float  # the session's own clock: t_send + ttl - skew


@dataclasses.dataclass
class Waiting:
    session: HolderId
    name: str
    sent: float


class LockTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.table = LockTable(skew=SKEW)
        self.next_op = 0
        self.waiting: dict[OpId, Waiting] = {}
        self.beliefs: dict[tuple[HolderId, str], Belief] = {}
        self.newest: dict[str, int] = {}
        self.renewable: dict[tuple[HolderId, str], int] = {}  # what each was last granted
        self.ran_out: dict[str, float] = {}  # name: when the last belief in it ran out

    # ------------------------------------------------------------ effects
    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Granted):
                asked = self.waiting.pop(effect.op)
                assert (asked.session, asked.name) == (effect.session, effect.name)
                assert effect.token > self.newest.get(effect.name, 0), "(b) token not newer"
                for (session, name), belief in self.beliefs.items():
                    if name == effect.name:
                        raise AssertionError(f"(c) granted while {session} believes {belief}")
                ran_out = self.ran_out.get(effect.name, -math.inf)
                assert ran_out + 2 * SKEW <= self.now + 1e-9, "(c) granted within 2 * skew"
                self.newest[effect.name] = effect.token
                until = asked.sent + effect.ttl - SKEW
                self.beliefs[(effect.session, effect.name)] = Belief(effect.token, until)
                self.renewable[(effect.session, effect.name)] = effect.token
            elif isinstance(effect, Busy | Dropped):
                del self.waiting[effect.op]
            else:
                assert isinstance(effect, Changed | Persist)

    def apply_released(self, effects: list[Effect]) -> None:
        """Effects of a release by the holder itself: it believes no more, so the names
        it freed need no margin before the next grant."""
        for effect in effects:
            if isinstance(effect, Changed) and effect.identity is None:
                self.ran_out.pop(effect.name, None)
        self.apply(effects)

    def forget_ended_beliefs(self) -> None:
        """Beliefs whose time has run out end (and are remembered until when)."""
        for key in [k for k, b in self.beliefs.items() if b.until <= self.now]:
            name = key[1]
            self.ran_out[name] = max(self.ran_out.get(name, -math.inf), self.beliefs.pop(key).until)

    # ------------------------------------------------------------ rules
    @rule(
        session=st.sampled_from(SESSIONS),
        name=st.sampled_from(NAMES),
        ttl=st.sampled_from(TTLS),
        wait=st.booleans(),
        delay=st.sampled_from(SEND_DELAYS),
    )
    def acquire(self, session: HolderId, name: str, ttl: float, wait: bool, delay: float) -> None:
        self.next_op += 1
        op = OpId(self.next_op)
        self.waiting[op] = Waiting(session, name, self.now - delay)
        self.apply(self.table.acquire(op, session, name, ttl, str(session), self.now, wait=wait))

    @rule(
        session=st.sampled_from(SESSIONS),
        name=st.sampled_from(NAMES),
        right_token=st.booleans(),
        delay=st.sampled_from(SEND_DELAYS),
    )
    def renew(self, session: HolderId, name: str, right_token: bool, delay: float) -> None:
        belief = self.beliefs.get((session, name))
        if belief is None:  # a renewal sent while it believed, arriving now
            token = self.renewable.get((session, name), 1)
        else:
            token = belief.token if right_token else belief.token + 1
        ttl = self.table.renew(session, name, token, self.now)
        if ttl is None:
            self.beliefs.pop((session, name), None)  # refused: it believes no more
        elif belief is not None and belief.token == token:
            belief.until = max(belief.until, self.now - delay + ttl - SKEW)

    @rule(session=st.sampled_from(SESSIONS), name=st.sampled_from(NAMES))
    def release(self, session: HolderId, name: str) -> None:
        belief = self.beliefs.pop((session, name), None)
        token = belief.token if belief is not None else self.renewable.get((session, name), 1)
        self.apply_released(self.table.release(session, name, token, self.now))

    @rule(session=st.sampled_from(SESSIONS), name=st.sampled_from(NAMES))
    def cancel(self, session: HolderId, name: str) -> None:
        self.apply(self.table.cancel(session, name))

    @rule(session=st.sampled_from(SESSIONS))
    def goodbye(self, session: HolderId) -> None:
        for key in [k for k in self.beliefs if k[0] == session]:
            del self.beliefs[key]  # a client says goodbye after its locks' bodies end
        self.apply_released(self.table.session_ended(session, self.now))

    @rule(session=st.sampled_from(SESSIONS))
    def connection_lost(self, session: HolderId) -> None:
        self.apply(self.table.disconnected(session))

    @rule()
    def restart(self) -> None:
        """The server restarts from its records; queued acquires lose their connection."""
        self.waiting.clear()
        self.renewable.clear()  # a new incarnation knows none of the old sessions' locks
        self.table = LockTable(skew=SKEW, records=self.table.records(), now=self.now)

    @rule(step=st.sampled_from(TIME_STEPS))
    def pass_time(self, step: float) -> None:
        self.now += step
        self.forget_ended_beliefs()
        self.apply(self.table.tick(self.now))

    @precondition(lambda self: self.table.next_deadline() is not None)
    @rule()
    def tick_at_the_deadline(self) -> None:
        deadline = self.table.next_deadline()
        assert deadline is not None
        self.now = max(self.now, deadline)
        self.forget_ended_beliefs()
        self.apply(self.table.tick(self.now))

    # ------------------------------------------------------------ invariants
    @invariant()
    def at_most_one_holder(self) -> None:
        for name in NAMES:
            live = [s for (s, n), b in self.beliefs.items() if n == name and b.until > self.now]
            assert len(live) <= 1, f"(a) {live} all believe they hold {name}"
            holder = self.table.holder(name, self.now)
            if live and holder is not None:
                assert holder.session == live[0], "(a) the table's holder is not the believer"

    @invariant()
    def live_beliefs_pass_the_fence(self) -> None:
        for (_, name), belief in self.beliefs.items():
            if belief.until > self.now:
                try:
                    self.table.check_fence(name, belief.token)
                except Conflict as exc:
                    raise AssertionError(f"(d) {exc}") from None
        for name in NAMES:  # token 0 names no grant: never a pass, locked or not
            try:
                self.table.check_fence(name, 0)
            except Conflict:
                continue
            raise AssertionError(f"(d) token 0 passed the fence of {name}")

    @invariant()
    def a_query_names_whoever_may_believe_it_holds(self) -> None:
        """``leader`` and ``watch_leader`` name each live believer, with its token,
        restart holds included (the record keeps who held the name)."""
        for (session, name), belief in self.beliefs.items():
            if belief.until > self.now:
                found = self.table.state_of(name, self.now)
                assert found == (belief.token, str(session)), f"(f) {name}: {found}"

    @invariant()
    def a_holder_lives_past_its_beliefs(self) -> None:
        for (session, name), belief in self.beliefs.items():
            holder = self.table.holder(name, self.now)
            if belief.until > self.now and holder is not None and holder.session == session:
                held_until = self.table.held_until(session)
                assert held_until is not None and held_until > belief.until, "(g)"

    @invariant()
    def deadline_is_honest(self) -> None:
        deadline = self.table.next_deadline()
        if deadline is not None:
            assert deadline > self.now, "(e) the deadline is past"
            assert self.table.tick(self.now) == [], "(e) a tick before the deadline acted"

    @invariant()
    def indexes_agree_with_a_scan(self) -> None:
        names = self.table._names
        busy = [state for name, state in names.items() if name in self.table._busy]
        scanned = min((state.free_at for state in busy), default=None)
        assert self.table.next_deadline() == scanned, "(h) the deadline heap"
        involved: dict[HolderId, set[str]] = {}
        for name, state in names.items():
            sessions = [waiter.session for waiter in state.queue]
            if state.holder is not None:
                sessions.append(state.holder.session)
            for session in sessions:
                involved.setdefault(session, set()).add(name)
        indexed = {session: set(names) for session, names in self.table._by_session.items()}
        assert indexed == involved, "(h) the names of each session"
        deadline = self.table.next_deadline()
        later = [] if deadline is None else [deadline, deadline + self.table.max_ttl]
        for when in [self.now, *later]:  # later: locks expired and not yet ticked
            held = sum(1 for name in names if self.table.holder(name, when) is not None)
            assert self.table.held(when) == held, "(h) the count of names held"

    def teardown(self) -> None:
        """Let time pass: every acquire still queued is granted in the end."""
        for _ in range(100):
            if not self.waiting:
                break
            deadline = self.table.next_deadline()
            assert deadline is not None, "acquires wait and nothing is due"
            self.now = max(self.now, deadline)
            self.forget_ended_beliefs()
            before = dict(self.waiting)
            self.apply(self.table.tick(self.now))
            for session, name in {(w.session, w.name) for w in before.values()}:
                held = self.beliefs.pop((session, name), None)
                if held is not None:  # granted: give it back so the next may have it
                    self.apply_released(self.table.release(session, name, held.token, self.now))
        assert not self.waiting, "acquires never granted"


LockTableMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestLockTable = LockTableMachine.TestCase
