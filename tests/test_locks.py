"""The lock rules of :mod:`fscache.locks`, one test or more per rule.

Test rules: the lock table is driven by hand with an explicit ``now``; no event loop,
no clock. Every test asserts the exact effect list and the exact instants. Unless a
test says otherwise the ttl is 5 s and the skew 0.1 s.
"""

from __future__ import annotations

import math

import cbor2
import pytest

from fscache import protocol as p
from fscache.errors import Conflict, ProtocolError
from fscache.leases import HolderId, OpId
from fscache.locks import (
    Busy,
    Changed,
    Dropped,
    Granted,
    Holder,
    LockTable,
    Persist,
    Record,
)
from fscache.settings import MAX_LOCK_TTL, BadSetting

TTL = 5.0
SKEW = 0.1
A, B, C = HolderId("a"), HolderId("b"), HolderId("c")


def just_before(t: float) -> float:
    return math.nextafter(t, -math.inf)


def granted(op: int, session: HolderId, token: int, name: str = "l", ttl: float = TTL) -> list:
    """The effects of a grant: the record first, then the answer, then the notice."""
    return [
        Persist(name),
        Granted(OpId(op), session, name, token, ttl),
        Changed(name, token, str(session)),
    ]


def freed(token: int, name: str = "l") -> list:
    return [Changed(name, token, None), Persist(name)]


def table(**kwargs: object) -> LockTable:
    return LockTable(skew=SKEW, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- grant and queue
def test_a_free_name_is_granted_at_once_with_token_one() -> None:
    locks = table()
    assert locks.acquire(OpId(1), A, "l", TTL, "a", now=2.0) == granted(1, A, 1)
    assert locks.holder("l", 2.0) == Holder(A, "a", 1)
    assert locks.next_deadline() == 2.0 + TTL + SKEW
    assert locks.records() == [Record("l", 1, TTL, held=True, identity="a")]


def test_acquires_of_a_held_name_queue_in_arrival_order() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    assert locks.acquire(OpId(2), B, "l", TTL, "b", now=1.0) == []
    assert locks.acquire(OpId(3), C, "l", TTL, "c", now=2.0) == []
    assert locks.release(A, "l", 1, now=3.0) == freed(1) + granted(2, B, 2)
    assert locks.release(B, "l", 2, now=4.0) == freed(2) + granted(3, C, 3)


def test_a_try_of_a_held_name_is_busy_and_does_not_queue() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    assert locks.acquire(OpId(2), B, "l", TTL, "b", now=1.0, wait=False) == [Busy(OpId(2), "l", 1)]
    assert locks.release(A, "l", 1, now=2.0) == freed(1)


def test_names_are_independent() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "x", TTL, "a", now=0.0)
    assert locks.acquire(OpId(2), B, "y", TTL, "b", now=0.0) == granted(2, B, 1, name="y")


# ---------------------------------------------------------------- expiry and renewal
def test_an_unrenewed_lock_is_granted_on_at_expiry_plus_skew_not_before() -> None:
    """The holder stops trusting at t_send + ttl - skew (before 1.0 + TTL - SKEW); the
    next grant is at t_receive + ttl + skew: 2 * skew later at least."""
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=1.0)
    locks.acquire(OpId(2), B, "l", TTL, "b", now=2.0)
    assert locks.next_deadline() == 1.0 + TTL + SKEW
    assert locks.tick(just_before(1.0 + TTL + SKEW)) == []
    assert locks.holder("l", just_before(1.0 + TTL + SKEW)) == Holder(A, "a", 1)
    assert locks.tick(1.0 + TTL + SKEW) == freed(1) + granted(2, B, 2)
    assert locks.locks_expired == 1
    holder_stops_trusting = 1.0 + TTL - SKEW  # at the latest: it sent before 1.0
    assert (1.0 + TTL + SKEW) - holder_stops_trusting == pytest.approx(2 * SKEW)


def test_an_acquire_after_expiry_but_before_the_tick_is_granted() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    assert locks.acquire(OpId(2), B, "l", TTL, "b", now=TTL + SKEW) == freed(1) + granted(2, B, 2)
    assert locks.locks_expired == 1


def test_renewal_moves_the_expiry_to_now_plus_ttl() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    locks.acquire(OpId(2), B, "l", TTL, "b", now=0.5)
    assert locks.renew(A, "l", 1, now=4.0) == TTL
    assert locks.next_deadline() == 4.0 + TTL + SKEW
    assert locks.tick(just_before(4.0 + TTL + SKEW)) == []
    assert locks.tick(4.0 + TTL + SKEW) == freed(1) + granted(2, B, 2)


def test_held_counts_a_lock_until_expiry_plus_skew_whether_ticked_or_not() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "x", TTL, "a", now=0.0)
    locks.acquire(OpId(2), B, "y", TTL, "b", now=1.0)
    assert locks.renew(A, "x", 1, now=0.0) == TTL  # the same instant filed twice
    assert locks.held(just_before(TTL + SKEW)) == 2
    assert locks.held(TTL + SKEW) == 1  # x expired, not yet ticked
    assert locks.held(1.0 + TTL + SKEW) == 0
    locks.tick(TTL + SKEW)
    assert locks.held(TTL + SKEW) == 1
    locks.release(B, "y", 1, now=2.0 + TTL)  # after its expiry too: no longer held
    assert locks.held(2.0 + TTL) == 0


def test_a_renewal_is_refused_for_another_session_an_old_token_or_a_dead_lock() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    assert locks.renew(B, "l", 1, now=1.0) is None
    assert locks.renew(A, "l", 2, now=1.0) is None
    assert locks.renew(A, "other", 1, now=1.0) is None
    assert locks.renew(A, "l", 1, now=just_before(TTL + SKEW)) == TTL  # still ours
    assert locks.renew(A, "l", 1, now=2 * TTL + 2 * SKEW) is None  # past expiry + skew


# ---------------------------------------------------------------- release
def test_a_release_with_an_old_token_or_by_another_changes_nothing() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    assert locks.release(B, "l", 1, now=1.0) == []
    assert locks.release(A, "l", 7, now=1.0) == []
    assert locks.holder("l", 1.0) == Holder(A, "a", 1)


def test_a_cancelled_acquire_leaves_the_queue() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    locks.acquire(OpId(2), B, "l", TTL, "b", now=0.0)
    assert locks.cancel(B, "l") == [Dropped(OpId(2), "l")]
    assert locks.release(A, "l", 1, now=1.0) == freed(1)


# ---------------------------------------------------------------- sessions
def test_a_goodbye_releases_the_sessions_locks_and_drops_its_acquires() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "x", TTL, "a", now=0.0)
    locks.acquire(OpId(2), B, "x", TTL, "b", now=0.0)
    locks.acquire(OpId(3), B, "y", TTL, "b", now=0.0)
    locks.acquire(OpId(4), A, "y", TTL, "a", now=0.0)
    effects = locks.session_ended(A, now=1.0)
    assert effects == [Dropped(OpId(4), "y"), *freed(1, "x"), *granted(2, B, 2, "x")]


def test_a_lost_connection_keeps_the_locks_and_drops_the_queued_acquires() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    locks.acquire(OpId(2), B, "l", TTL, "b", now=0.0)
    locks.acquire(OpId(3), C, "l", TTL, "c", now=0.0)
    assert locks.disconnected(A) == []
    assert locks.disconnected(B) == [Dropped(OpId(2), "l")]
    assert locks.renew(A, "l", 1, now=1.0) == TTL  # resumed, renewed
    assert locks.tick(1.0 + TTL + SKEW) == freed(1) + granted(3, C, 2)


def test_a_session_holds_its_locks_until_the_last_instant_a_renewal_is_granted() -> None:
    locks = table()
    assert locks.held_until(A) is None
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    locks.acquire(OpId(2), A, "m", 2 * TTL, "a", now=1.0)
    locks.acquire(OpId(3), B, "n", 3 * TTL, "b", now=0.0)
    assert locks.held_until(A) == 1.0 + 2 * TTL + SKEW  # the later of its two locks
    assert locks.renew(A, "m", 1, now=just_before(1.0 + 2 * TTL + SKEW)) == 2 * TTL
    locks.release(A, "m", 1, now=3.0)
    assert locks.held_until(A) == TTL + SKEW
    assert locks.renew(A, "l", 1, now=TTL + SKEW) is None  # held_until itself is too late


def test_expiries_come_in_order_of_instant_and_a_renewed_one_is_not_due_early() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "x", TTL, "a", now=0.0)
    locks.acquire(OpId(2), B, "y", 2 * TTL, "b", now=0.0)
    locks.acquire(OpId(3), C, "z", TTL, "c", now=1.0)
    assert locks.next_deadline() == TTL + SKEW
    locks.renew(A, "x", 1, now=2.0)  # x falls free at 2 + TTL + SKEW now, not TTL + SKEW
    assert locks.next_deadline() == 1.0 + TTL + SKEW  # z's
    assert locks.tick(just_before(1.0 + TTL + SKEW)) == []
    assert locks.tick(2 * TTL + 2 * SKEW) == freed(1, "z") + freed(1, "x") + freed(1, "y")
    assert locks.next_deadline() is None


def test_a_session_that_waits_for_and_holds_names_forgets_each_as_it_ends() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "x", TTL, "a", now=0.0)
    locks.acquire(OpId(2), B, "x", TTL, "b", now=0.0)  # B waits for x
    locks.acquire(OpId(3), B, "y", TTL, "b", now=0.0)  # and holds y
    locks.release(A, "x", 1, now=1.0)  # x passes to B
    assert locks.held_until(A) is None
    assert locks.held_until(B) == 1.0 + TTL + SKEW
    assert locks.disconnected(A) == []  # nothing of A's is left to drop
    assert locks.session_ended(B, now=2.0) == freed(2, "x") + freed(1, "y")  # as asked for
    assert locks.held_until(B) is None


def test_a_lost_connection_drops_only_its_own_sessions_acquires_among_many() -> None:
    locks = table()
    for i in range(1000):
        locks.acquire(OpId(2 * i), HolderId(f"h{i}"), f"l{i}", TTL, "h", now=0.0)
        locks.acquire(OpId(2 * i + 1), HolderId(f"w{i}"), f"l{i}", TTL, "w", now=0.0)
    assert locks.disconnected(HolderId("w7")) == [Dropped(OpId(15), "l7")]
    assert locks.disconnected(HolderId("h7")) == []
    assert locks.held_until(HolderId("h7")) == TTL + SKEW
    assert locks.tick(TTL + SKEW)[:2] == freed(1, "l0")


# ---------------------------------------------------------------- fencing
def test_only_the_newest_token_passes_the_fence() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    locks.check_fence("l", 1)
    locks.release(A, "l", 1, now=1.0)
    locks.check_fence("l", 1)  # released, and no newer token: its holder's last word stands
    locks.acquire(OpId(2), B, "l", TTL, "b", now=2.0)
    with pytest.raises(Conflict, match=r"token 1, but the newest token of 'l' is 2"):
        locks.check_fence("l", 1)
    with pytest.raises(Conflict):
        locks.check_fence("l", 3)
    with pytest.raises(Conflict, match="newest token of 'never' is 0"):
        locks.check_fence("never", 1)


@pytest.mark.parametrize("token", [0, -1])
def test_a_fence_naming_no_grant_is_refused_even_on_a_name_never_locked(token: int) -> None:
    locks = table()
    for now in (0.0, 1.0):  # never locked; then its lock released (newest token 1)
        with pytest.raises(Conflict, match=f"token {token}, but tokens start at 1"):
            locks.check_fence("never", token)
        with pytest.raises(Conflict, match="tokens start at 1"):
            locks.check_fence("l", token)
        if now == 0.0:
            locks.acquire(OpId(1), A, "l", TTL, "a", now=now)
            locks.release(A, "l", 1, now=now)


# ---------------------------------------------------------------- restart
def test_a_restarted_table_holds_a_maybe_held_name_back_for_its_ttl_plus_skew() -> None:
    records = [Record("held", 4, 7.0, held=True), Record("free", 9, TTL, held=False)]
    locks = table(records=records, now=100.0)
    assert locks.next_deadline() == 100.0 + 7.0 + SKEW
    got = locks.acquire(OpId(1), A, "free", 10.0, "a", now=100.0)
    assert got == granted(1, A, 10, "free", ttl=10.0)
    assert locks.acquire(OpId(2), B, "held", TTL, "b", now=100.0, wait=False) == [
        Busy(OpId(2), "held", 0)
    ]
    assert locks.acquire(OpId(3), B, "held", TTL, "b", now=100.0) == []
    assert locks.holder("held", 100.0) is None
    assert locks.tick(just_before(107.1)) == []
    assert locks.tick(100.0 + 7.0 + SKEW) == granted(3, B, 5, "held")


def test_during_a_restart_hold_the_recorded_holder_is_told_and_its_end_is_a_change() -> None:
    locks = table(records=[Record("l", 2, TTL, held=True, identity="old leader")], now=0.0)
    assert locks.holder("l", 1.0) is None  # no session of ours holds it ...
    assert locks.state_of("l", 1.0) == (2, "old leader")  # ... but it may believe it does
    assert locks.records() == [Record("l", 2, TTL, held=True, identity="old leader")]
    assert locks.tick(TTL + SKEW) == [Changed("l", 2, None), Persist("l")]
    assert locks.state_of("l", TTL + SKEW) == (2, None)
    assert locks.state_of("never", 0.0) == (0, None)
    before = table(records=[Record("l", 2, TTL, held=True)], now=0.0)  # written unnamed
    assert before.state_of("l", 1.0) == (2, None)
    assert before.tick(TTL + SKEW) == [Persist("l")]


def test_a_hold_that_ends_with_no_one_waiting_leaves_the_name_free() -> None:
    locks = table(records=[Record("l", 2, TTL, held=True)], now=0.0)
    assert locks.tick(just_before(TTL + SKEW)) == []
    assert locks.tick(TTL + SKEW) == [Persist("l")]  # the record may say free again
    assert locks.records() == [Record("l", 2, TTL, held=False)]
    assert locks.next_deadline() is None
    assert locks.acquire(OpId(1), A, "l", TTL, "a", now=TTL + SKEW) == granted(1, A, 3)


def test_records_say_held_until_released_or_expired() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "l", TTL, "a", now=0.0)
    assert locks.records() == [Record("l", 1, TTL, held=True, identity="a")]
    locks.tick(TTL + SKEW)
    assert locks.records() == [Record("l", 1, TTL, held=False)]


def test_records_of_the_names_persisted_leave_the_others_out() -> None:
    locks = table()
    locks.acquire(OpId(1), A, "a", TTL, "a", now=0.0)
    locks.acquire(OpId(2), A, "b", TTL, "a", now=0.0)
    effects = locks.tick(TTL + SKEW)
    persisted = [e.name for e in effects if isinstance(e, Persist)]
    assert sorted(persisted) == ["a", "b"]
    effects = locks.acquire(OpId(3), B, "b", TTL, "b", now=TTL + SKEW)
    persisted = [e.name for e in effects if isinstance(e, Persist)]
    assert locks.records(persisted) == [Record("b", 2, TTL, held=True, identity="b")]
    assert locks.records(["never"]) == []


# ---------------------------------------------------------------- ttl bounds
@pytest.mark.parametrize("ttl", [0.0, 2 * SKEW, MAX_LOCK_TTL + 1, math.inf, math.nan, -1.0, True])
def test_a_ttl_out_of_bounds_is_refused(ttl: float) -> None:
    with pytest.raises(BadSetting, match="ttl"):
        table().acquire(OpId(1), A, "l", ttl, "a", now=0.0)


def test_the_ttl_bounds_are_inclusive_at_the_maximum_only() -> None:
    locks = table()
    assert locks.acquire(OpId(1), A, "x", MAX_LOCK_TTL, "a", now=0.0)[1] == Granted(
        OpId(1), A, "x", 1, MAX_LOCK_TTL
    )
    assert locks.acquire(OpId(2), A, "y", math.nextafter(2 * SKEW, 1), "a", now=0.0) != []


# ---------------------------------------------------------------- the fence on the wire
def test_a_change_without_a_fence_is_the_frame_it_always_was() -> None:
    plain = {"t": "write", "id": 1, "path": "a", "data": b"x", "if_version": None}
    assert p.encode(p.Write(id=1, path="a", data=b"x"))[4:] == cbor2.dumps(plain)
    fenced = p.encode(p.Write(id=1, path="a", data=b"x", fence=("jobs/leader", 3)))
    assert fenced[4:] == cbor2.dumps({**plain, "fence": ["jobs/leader", 3]})
    assert p.decode_message(fenced[4:]) == p.Write(1, "a", b"x", fence=("jobs/leader", 3))


def test_a_fence_of_another_shape_is_a_protocol_error() -> None:
    for fence in (["l"], ["l", 1, 2], [1, "l"], "l", ["l", 1.5]):
        body = {"t": "mkdir", "id": 1, "path": "d", "fence": fence}
        with pytest.raises(ProtocolError, match=r"mkdir\.fence"):
            p.decode_message(cbor2.dumps(body))
