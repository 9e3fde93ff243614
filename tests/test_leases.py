"""The lease rules of :mod:`fscache.leases`, one test or more per rule.

Test rules: the lease table is driven by hand with an explicit ``now``; no event loop,
no clock. Every test asserts the exact effect list and the exact deadline. Unless a
test says otherwise the term is 10 s, the skew 0.1 s, and the write-shared rule is
off, so that each test sees one rule at a time.
"""

from __future__ import annotations

import math

import pytest

from fscache import names
from fscache.leases import (
    DEFAULT_SKEW,
    DEFAULT_TERM,
    PURGE_GRANULARITY,
    AdaptiveTermPolicy,
    ApplyWrite,
    Discarded,
    Footprint,
    Grant,
    HolderId,
    LeaseTable,
    OpId,
    SendApprovalRequest,
    UnknownOp,
    WriteCommitted,
)
from fscache.settings import BadSetting

TERM = 10.0
SKEW = 0.1
A, B, C, D = HolderId("a"), HolderId("b"), HolderId("c"), HolderId("d")


def op(n: int) -> OpId:
    return OpId(n)


def just_before(t: float) -> float:
    """The last instant before ``t``: the tightest test of a deadline."""
    return math.nextafter(t, -math.inf)


def only(key: str) -> Footprint:
    """A write of one key: an overwrite of an existing file."""
    return Footprint((key,))


def table(*, term: float = TERM, hold_writes_until: float | None = None) -> LeaseTable:
    return LeaseTable(
        AdaptiveTermPolicy(default=term, hot_writes=0),
        skew=SKEW,
        hold_writes_until=hold_writes_until,
    )


# ---------------------------------------------------------------- read leases
def test_read_grants_the_default_term_of_10_s_and_records_expiry_now_plus_term() -> None:
    t = LeaseTable(AdaptiveTermPolicy())

    assert t.read(op(1), A, "p", now=3.0) == 10.0
    assert t.holders("p", now=3.0) == {A: 13.0}
    assert (DEFAULT_TERM, DEFAULT_SKEW, t.skew) == (10.0, 0.1, 0.1)


def test_a_second_read_renews_the_lease_from_its_own_now() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)

    assert t.read(op(2), A, "p", now=4.0) == TERM
    assert t.holders("p", now=4.0) == {A: 14.0}


def test_term_zero_grants_the_read_but_records_no_lease() -> None:
    t = table(term=0.0)

    assert t.read(op(1), A, "p", now=1.0) == 0.0
    assert t.holders("p", now=1.0) == {}
    assert t.live_leases(now=1.0) == 0
    assert t.leases_granted == 0
    assert t.next_deadline() is None
    assert t.write(op(2), B, only("p"), now=1.0) == [ApplyWrite(op(2), B, "p")]


def test_read_leases_are_shared_by_many_holders() -> None:
    t = table()

    assert t.read(op(1), A, "p", now=0.0) == TERM
    assert t.read(op(2), B, "p", now=1.0) == TERM
    assert t.holders("p", now=1.0) == {A: 10.0, B: 11.0}
    assert t.live_leases(now=1.0) == 2


# ---------------------------------------------------------------- writes and approvals
def test_write_with_no_other_holder_is_applied_in_the_same_call() -> None:
    t = table()

    assert t.write(op(1), A, only("p"), now=0.0) == [ApplyWrite(op(1), A, "p")]
    assert t.writes_delayed == 0
    assert t.next_deadline() is None


def test_the_writers_own_lease_needs_no_approval() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)

    assert t.write(op(2), A, only("p"), now=1.0) == [ApplyWrite(op(2), A, "p")]
    assert t.approvals_sent == 0


def test_write_against_live_holders_sends_one_approval_request_per_holder_and_waits() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), B, "p", now=0.5)

    assert t.write(op(3), C, only("p"), now=1.0) == [
        SendApprovalRequest(A, "p", op(3)),
        SendApprovalRequest(B, "p", op(3)),
    ]
    assert t.pending_writes() == 1
    assert t.is_blocked("p")
    assert t.next_deadline() == 10.1  # A's lease: granted at 0, + term + skew


def test_write_is_applied_as_soon_as_every_other_holder_has_approved() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), B, "p", now=0.5)
    t.write(op(3), C, only("p"), now=1.0)

    assert t.approve(A, "p", op(3), now=1.2) == []
    assert t.approve(B, "p", op(3), now=1.3) == [ApplyWrite(op(3), C, "p")]
    assert t.holders("p", now=1.3) == {}


def test_approval_for_another_write_path_or_from_a_holder_not_asked_is_ignored() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), A, "q", now=0.0)
    t.write(op(3), B, only("p"), now=1.0)

    assert t.approve(A, "p", op(99), now=1.1) == []  # wrong write id
    assert t.approve(C, "p", op(3), now=1.2) == []  # C was never asked
    assert t.approve(A, "q", op(3), now=1.3) == []  # no write waits on q
    assert t.holders("p", now=1.3) == {A: 10.0}
    assert t.holders("q", now=1.3) == {A: 10.0}
    assert t.approve(A, "p", op(3), now=1.4) == [ApplyWrite(op(3), B, "p")]
    assert t.approve(A, "p", op(3), now=1.5) == []  # a repeated approval is stale


def test_silent_holder_is_waited_out_until_grant_plus_term_plus_skew_exactly() -> None:
    t = table()
    t.read(op(1), A, "p", now=2.0)
    assert t.write(op(2), B, only("p"), now=3.0) == [SendApprovalRequest(A, "p", op(2))]

    assert t.next_deadline() == 12.1
    assert t.tick(just_before(12.1)) == []
    assert t.tick(12.1) == [ApplyWrite(op(2), B, "p")]
    assert t.holders("p", now=2.0) == {}  # the lease is gone, not merely expired


def test_one_holder_approves_the_silent_one_is_waited_out() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), B, "p", now=0.5)
    t.write(op(3), C, only("p"), now=1.0)

    assert t.approve(A, "p", op(3), now=2.0) == []
    assert t.next_deadline() == 10.6  # B's lease: granted at 0.5, + term + skew
    assert t.tick(just_before(10.6)) == []
    assert t.tick(10.6) == [ApplyWrite(op(3), C, "p")]


def test_a_lease_past_expiry_plus_skew_does_not_delay_a_write() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)

    assert t.write(op(2), B, only("p"), now=10.1) == [ApplyWrite(op(2), B, "p")]
    assert t.approvals_sent == 0


def test_a_lease_inside_the_skew_margin_still_delays_a_write() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)

    assert t.write(op(2), B, only("p"), now=10.05) == [SendApprovalRequest(A, "p", op(2))]
    assert t.next_deadline() == 10.1


def test_write_done_commits_with_a_lease_for_the_writer_on_the_new_contents() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.approve(A, "p", op(2), now=1.5)

    assert t.write_done(op(2), now=2.0, ok=True) == [WriteCommitted(op(2), B, "p", TERM)]
    assert t.holders("p", now=2.0) == {B: 12.0}
    assert not t.is_blocked("p")
    assert t.pending_writes() == 0


# ---------------------------------------------------------------- reads wait for writes
def test_reads_arriving_while_a_write_waits_are_queued_not_granted() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)

    assert t.read(op(3), C, "p", now=2.0) is None
    assert t.read(op(4), A, "p", now=3.0) is None  # not even a renewal for a holder
    assert t.holders("p", now=3.0) == {A: 10.0}
    assert t.leases_granted == 1


def test_queued_reads_are_granted_in_arrival_order_right_after_write_done() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.read(op(3), C, "p", now=2.0)
    t.read(op(4), A, "p", now=3.0)
    assert t.approve(A, "p", op(2), now=4.0) == [ApplyWrite(op(2), B, "p")]

    assert t.write_done(op(2), now=5.0, ok=True) == [
        WriteCommitted(op(2), B, "p", TERM),
        Grant(op(3), C, "p", TERM),
        Grant(op(4), A, "p", TERM),
    ]
    assert t.holders("p", now=5.0) == {B: 15.0, C: 15.0, A: 15.0}


def test_reads_arriving_while_a_write_is_being_applied_also_wait() -> None:
    t = table()
    assert t.write(op(1), A, only("p"), now=0.0) == [ApplyWrite(op(1), A, "p")]

    assert t.read(op(2), B, "p", now=0.5) is None
    assert t.write_done(op(1), now=1.0, ok=True) == [
        WriteCommitted(op(1), A, "p", TERM),
        Grant(op(2), B, "p", TERM),
    ]


def test_reads_queued_before_a_second_write_are_granted_before_it_starts() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.read(op(3), C, "p", now=2.0)  # arrives before the second write
    t.write(op(4), A, only("p"), now=3.0)
    t.read(op(5), D, "p", now=3.5)  # arrives after it
    t.approve(A, "p", op(2), now=4.0)

    assert t.write_done(op(2), now=5.0, ok=True) == [
        WriteCommitted(op(2), B, "p", TERM),
        Grant(op(3), C, "p", TERM),
        SendApprovalRequest(B, "p", op(4)),
        SendApprovalRequest(C, "p", op(4)),
    ]
    assert t.approve(B, "p", op(4), now=6.0) == []
    assert t.approve(C, "p", op(4), now=6.0) == [ApplyWrite(op(4), A, "p")]
    assert t.write_done(op(4), now=7.0, ok=True) == [
        WriteCommitted(op(4), A, "p", TERM),
        Grant(op(5), D, "p", TERM),
    ]


def test_extend_is_stale_while_a_write_is_queued_on_the_path() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), B, "p", now=0.0)
    t.write(op(3), C, only("p"), now=1.0)

    assert t.extend(A, [("p", True)], now=2.0) == [None]
    assert t.holders("p", now=2.0) == {A: 10.0, B: 10.0}


# ---------------------------------------------------------------- write order
def test_writes_on_one_path_are_applied_in_arrival_order() -> None:
    t = table()
    assert t.write(op(1), A, only("p"), now=0.0) == [ApplyWrite(op(1), A, "p")]
    assert t.write(op(2), B, only("p"), now=0.1) == []
    assert t.write(op(3), C, only("p"), now=0.2) == []
    assert t.pending_writes() == 3

    # the second write starts only now, and needs the first writer's approval:
    # the first writer holds a lease on what it wrote
    assert t.write_done(op(1), now=1.0, ok=True) == [
        WriteCommitted(op(1), A, "p", TERM),
        SendApprovalRequest(A, "p", op(2)),
    ]
    assert t.approve(A, "p", op(2), now=1.5) == [ApplyWrite(op(2), B, "p")]
    assert t.write_done(op(2), now=2.0, ok=True) == [
        WriteCommitted(op(2), B, "p", TERM),
        SendApprovalRequest(B, "p", op(3)),
    ]
    assert t.approve(B, "p", op(3), now=2.5) == [ApplyWrite(op(3), C, "p")]
    assert t.writes_delayed == 2


def test_next_write_waits_out_a_silent_first_writer_from_its_write_done() -> None:
    t = table()
    t.write(op(1), A, only("p"), now=0.0)
    t.write(op(2), B, only("p"), now=0.5)
    t.write_done(op(1), now=1.0, ok=True)

    assert t.next_deadline() == 11.1  # A's new lease: 1.0 + term + skew
    assert t.tick(just_before(11.1)) == []
    assert t.tick(11.1) == [ApplyWrite(op(2), B, "p")]


def test_writes_to_different_paths_do_not_wait_for_each_other() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    assert t.write(op(2), B, only("p"), now=1.0) == [SendApprovalRequest(A, "p", op(2))]

    assert t.write(op(3), C, only("q"), now=2.0) == [ApplyWrite(op(3), C, "q")]
    assert t.read(op(4), D, "q", now=2.5) is None  # q is busy with its own write
    assert t.write_done(op(3), now=3.0, ok=True) == [
        WriteCommitted(op(3), C, "q", TERM),
        Grant(op(4), D, "q", TERM),
    ]
    assert t.is_blocked("p")
    assert t.approve(A, "p", op(2), now=4.0) == [ApplyWrite(op(2), B, "p")]


# ---------------------------------------------------------------- relinquish and disconnect
def test_relinquish_ends_the_lease() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)

    assert t.relinquish(A, ["p", "not-held"], now=1.0) == []
    assert t.holders("p", now=1.0) == {}
    assert t.write(op(2), B, only("p"), now=2.0) == [ApplyWrite(op(2), B, "p")]


def test_relinquish_counts_as_approval() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), B, "p", now=0.0)
    t.write(op(3), C, only("p"), now=1.0)

    assert t.relinquish(A, ["p"], now=2.0) == []
    assert t.relinquish(B, ["p"], now=3.0) == [ApplyWrite(op(3), C, "p")]


def test_goodbye_relinquishes_all_leases_and_applies_the_write_waiting_on_them() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.read(op(3), A, "p", now=1.5)  # A's own queued read goes too

    assert t.disconnected(A, goodbye=True, now=2.0) == [
        Discarded(op(3)),
        ApplyWrite(op(2), B, "p"),
    ]
    assert t.holders("p", now=2.0) == {}


def test_goodbye_releases_writes_on_every_path_the_holder_held() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), A, "q", now=0.0)
    t.read(op(3), A, "r", now=0.0)
    t.write(op(4), B, only("p"), now=1.0)
    t.write(op(5), C, only("q"), now=1.0)

    effects = t.disconnected(A, goodbye=True, now=2.0)

    # each path's effects are independent of the others': compare without order
    assert sorted(effects, key=repr) == [
        ApplyWrite(op(4), B, "p"),
        ApplyWrite(op(5), C, "q"),
    ]
    assert t.live_leases(now=2.0) == 0


def test_a_holder_back_after_its_goodbye_starts_with_no_lease() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), A, "q", now=0.0)
    t.read(op(3), B, "q", now=0.0)
    t.disconnected(A, goodbye=True, now=1.0)
    assert t.leases_held(A) == 0
    assert t.holders("q", now=1.0) == {B: 10.0}

    assert t.read(op(4), A, "p", now=2.0) == TERM  # the same session, connected again
    assert t.leases_held(A) == 1
    assert t.holders("p", now=2.0) == {A: 12.0}
    assert t.holders("q", now=2.0) == {B: 10.0}  # its old lease on q did not come back
    t.tick(10.1 + PURGE_GRANULARITY)
    assert t.holders("p", now=11.1) == {A: 12.0}
    assert t.live_leases(now=11.1) == 1
    assert t.next_deadline() == 12.1 + PURGE_GRANULARITY
    t.tick(12.1 + PURGE_GRANULARITY)
    assert t.live_leases(now=12.1) == 0
    assert t.next_deadline() is None


def test_disconnect_without_goodbye_keeps_leases_until_expiry_plus_skew() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)

    assert t.disconnected(A, goodbye=False, now=2.0) == []
    assert t.holders("p", now=2.0) == {A: 10.0}
    assert t.next_deadline() == 10.1
    assert t.tick(just_before(10.1)) == []
    assert t.tick(10.1) == [ApplyWrite(op(2), B, "p")]


def test_disconnect_discards_the_holders_queued_reads_only() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.read(op(3), C, "p", now=2.0)
    t.read(op(4), D, "p", now=2.5)
    t.read(op(5), C, "p", now=3.0)

    assert t.disconnected(C, goodbye=False, now=4.0) == [Discarded(op(3)), Discarded(op(5))]
    t.approve(A, "p", op(2), now=5.0)
    assert t.write_done(op(2), now=6.0, ok=True) == [
        WriteCommitted(op(2), B, "p", TERM),
        Grant(op(4), D, "p", TERM),
    ]


def test_reconnect_resends_the_approval_requests_still_waiting_on_the_holder() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), B, "p", now=0.0)
    t.read(op(3), A, "q", now=0.0)
    t.write(op(4), C, only("p"), now=1.0)
    t.write(op(5), D, only("q"), now=1.0)
    t.approve(B, "p", op(4), now=1.5)
    t.disconnected(A, goodbye=False, now=2.0)

    assert t.connected(A, now=3.0) == [
        SendApprovalRequest(A, "p", op(4)),
        SendApprovalRequest(A, "q", op(5)),
    ]
    assert t.connected(B, now=3.0) == []  # B has approved already
    assert t.approve(A, "q", op(5), now=3.5) == [ApplyWrite(op(5), D, "q")]
    assert t.connected(A, now=4.0) == [SendApprovalRequest(A, "p", op(4))]


# ---------------------------------------------------------------- extension
def test_extend_renews_each_current_lease_and_reports_stale_ones_as_none() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), A, "q", now=0.0)

    assert t.extend(A, [("p", True), ("q", False)], now=5.0) == [TERM, None]
    assert t.holders("p", now=5.0) == {A: 15.0}
    assert t.holders("q", now=5.0) == {A: 10.0}  # stale: not renewed


def test_extend_of_a_current_copy_whose_lease_has_lapsed_grants_a_new_lease() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)

    assert t.extend(A, [("p", True)], now=20.0) == [TERM]
    assert t.holders("p", now=20.0) == {A: 30.0}


# ---------------------------------------------------------------- write_done
def test_failed_write_gives_no_commit_ends_approved_leases_and_lets_queued_reads_go() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.read(op(3), C, "p", now=2.0)
    t.approve(A, "p", op(2), now=3.0)

    assert t.write_done(op(2), now=4.0, ok=False) == [Grant(op(3), C, "p", TERM)]
    assert t.holders("p", now=4.0) == {C: 14.0}
    assert not t.is_blocked("p")


def test_failed_write_keeps_the_writers_own_lease_on_the_unchanged_contents() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), A, only("p"), now=1.0)  # e.g. a compare-and-set that will lose

    assert t.write_done(op(2), now=2.0, ok=False) == []
    assert t.holders("p", now=2.0) == {A: 10.0}  # A still caches the old contents
    assert t.write(op(3), B, only("p"), now=3.0) == [SendApprovalRequest(A, "p", op(3))]


def test_write_done_for_an_op_not_being_applied_raises_unknown_op() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)  # waiting, not yet applying

    with pytest.raises(UnknownOp):
        t.write_done(op(2), now=2.0, ok=True)
    with pytest.raises(UnknownOp):
        t.write_done(op(99), now=2.0, ok=True)
    t.approve(A, "p", op(2), now=3.0)
    t.write_done(op(2), now=4.0, ok=True)
    with pytest.raises(UnknownOp):
        t.write_done(op(2), now=5.0, ok=True)  # twice


# ---------------------------------------------------------------- withdrawn writes
def test_a_withdrawn_write_is_never_applied_and_the_reads_behind_it_go_at_once() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.read(op(3), C, "p", now=2.0)

    assert t.withdraw(op(2), now=3.0) == [Grant(op(3), C, "p", TERM)]
    assert not t.is_blocked("p") and t.pending_writes() == 0
    assert t.holders("p", now=3.0) == {A: 10.0, C: 13.0}  # A was asked, did not approve
    assert t.next_deadline() == 10.1 + PURGE_GRANULARITY  # A's sweep: no write waits
    assert t.tick(10.1) == [] and t.approve(A, "p", op(2), now=10.2) == []


def test_withdrawing_a_write_starts_the_next_one_which_asks_only_the_live_holders() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), C, "p", now=0.0)
    t.write(op(3), B, only("p"), now=1.0)
    assert t.approve(A, "p", op(3), now=1.5) == []  # A dropped its copy for op 3
    t.write(op(4), D, only("p"), now=2.0)

    assert t.withdraw(op(3), now=3.0) == [SendApprovalRequest(C, "p", op(4))]
    assert t.approve(C, "p", op(4), now=3.5) == [ApplyWrite(op(4), D, "p")]


def test_a_write_waiting_behind_another_is_withdrawn_from_every_queue() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.write(op(2), B, only("p"), now=1.0)
    t.write(op(3), C, Footprint(("p", "q")), now=2.0)  # heads q's queue, waits on p
    t.read(op(4), D, "q", now=2.5)

    assert t.withdraw(op(3), now=3.0) == [Grant(op(4), D, "q", TERM)]
    assert t.approve(A, "p", op(2), now=4.0) == [ApplyWrite(op(2), B, "p")]
    assert t.write_done(op(2), now=4.5, ok=True) == [WriteCommitted(op(2), B, "p", TERM)]


def test_a_write_held_by_the_restart_window_can_be_withdrawn() -> None:
    t = table(hold_writes_until=HOLD)
    t.write(op(1), A, only("p"), now=START + 1.0)
    t.read(op(2), B, "p", now=START + 2.0)

    assert t.withdraw(op(1), now=START + 3.0) == [Grant(op(2), B, "p", TERM)]
    assert t.next_deadline() == START + 3.0 + TERM + SKEW + PURGE_GRANULARITY  # B's sweep
    assert t.tick(HOLD) == []


def test_a_withdrawn_directory_rename_no_longer_holds_the_names_beneath_it() -> None:
    t = table()
    t.read(op(1), A, "d/x", now=0.0)
    t.write(op(2), B, names.keys_for_rename("d", "e", src_is_dir=True, dst_exists=False), now=1.0)
    assert t.read(op(3), C, "d/new", now=2.0) is None

    assert t.withdraw(op(2), now=3.0) == [Grant(op(3), C, "d/new", TERM)]
    assert not t.is_blocked("d/anything")
    assert t.write(op(4), D, only("d/x"), now=4.0) == [SendApprovalRequest(A, "d/x", op(4))]


def test_a_write_being_applied_or_done_cannot_be_withdrawn() -> None:
    t = table()
    assert t.write(op(1), A, only("p"), now=0.0) == [ApplyWrite(op(1), A, "p")]
    t.read(op(2), B, "p", now=0.5)

    assert t.withdraw(op(1), now=1.0) is None  # too late: it is being applied
    assert t.is_blocked("p")
    t.write_done(op(1), now=1.5, ok=True)
    assert t.withdraw(op(1), now=2.0) is None  # done
    assert t.withdraw(op(2), now=2.0) is None  # a read, not a write
    assert t.withdraw(op(99), now=2.0) is None  # never seen


# ---------------------------------------------------------------- restart window
START = 100.0
HOLD = START + TERM + SKEW  # start + max_term + skew


def test_restart_window_serves_reads_at_once() -> None:
    t = table(hold_writes_until=HOLD)

    assert t.read(op(1), A, "p", now=START) == TERM


def test_restart_window_holds_a_write_with_no_holders_until_its_end_exactly() -> None:
    t = table(hold_writes_until=HOLD)

    assert t.write(op(1), A, only("p"), now=START + 1.0) == []
    assert t.writes_delayed == 1
    assert t.next_deadline() == HOLD == 110.1
    assert t.tick(just_before(HOLD)) == []
    assert t.tick(HOLD) == [ApplyWrite(op(1), A, "p")]


def test_restart_window_holds_a_write_whose_holders_approved_until_its_end() -> None:
    t = table(hold_writes_until=HOLD)
    t.read(op(1), A, "p", now=START)
    assert t.write(op(2), B, only("p"), now=START + 1.0) == [SendApprovalRequest(A, "p", op(2))]

    assert t.approve(A, "p", op(2), now=START + 2.0) == []
    assert t.next_deadline() == HOLD
    assert t.tick(HOLD) == [ApplyWrite(op(2), B, "p")]


def test_writes_after_the_restart_window_are_applied_at_once() -> None:
    t = table(hold_writes_until=HOLD)

    assert t.write(op(1), A, only("p"), now=HOLD) == [ApplyWrite(op(1), A, "p")]


# ---------------------------------------------------------------- counters
def test_counters_count_leases_granted_approvals_sent_and_writes_delayed() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)  # lease 1
    t.read(op(2), B, "p", now=0.0)  # lease 2
    t.write(op(3), C, only("q"), now=0.0)  # applied at once
    t.write_done(op(3), now=0.5, ok=True)  # lease 3 (the writer's)
    t.write(op(4), C, only("p"), now=1.0)  # 2 approval requests, delayed
    t.extend(A, [("q", True)], now=1.0)  # lease 4
    t.connected(A, now=1.5)  # a resend is not a new request

    assert (t.leases_granted, t.approvals_sent, t.writes_delayed) == (4, 2, 1)


# ---------------------------------------------------------------- liveness of leases
def test_holders_and_live_leases_count_a_lease_until_expiry_plus_skew_only() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), B, "p", now=1.0)

    assert t.holders("p", now=just_before(10.1)) == {A: 10.0, B: 11.0}
    assert t.live_leases(now=just_before(10.1)) == 2
    assert t.holders("p", now=10.1) == {B: 11.0}
    assert t.live_leases(now=10.1) == 1
    assert t.live_leases(now=11.1) == 0


def test_expired_leases_are_purged_by_tick() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)

    assert t.next_deadline() == 10.1 + PURGE_GRANULARITY
    assert t.tick(10.1 + PURGE_GRANULARITY) == []
    assert t.holders("p", now=0.0) == {}  # gone from the table, not just expired
    assert t.next_deadline() is None


def test_purge_keeps_a_lease_that_was_renewed() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), A, "p", now=5.0)

    assert t.tick(10.1 + PURGE_GRANULARITY) == []
    assert t.holders("p", now=0.0) == {A: 15.0}
    assert t.next_deadline() == 15.1 + PURGE_GRANULARITY


# ---------------------------------------------------------------- term policy
def test_write_shared_rule_a_path_written_hot_writes_times_within_window_gets_term_0() -> None:
    t = LeaseTable(AdaptiveTermPolicy(default=TERM, hot_writes=3, window=10.0), skew=SKEW)
    for n, now in enumerate([0.0, 1.0], start=1):
        t.write(op(n), A, only("p"), now=now)
        assert t.write_done(op(n), now=now, ok=True) == [WriteCommitted(op(n), A, "p", TERM)]
    t.write(op(3), A, only("p"), now=2.0)

    assert t.write_done(op(3), now=2.0, ok=True) == [WriteCommitted(op(3), A, "p", 0.0)]
    assert t.read(op(4), B, "p", now=3.0) == 0.0
    assert t.holders("p", now=3.0) == {}  # not cached anywhere
    assert t.read(op(5), B, "q", now=3.0) == TERM  # other paths: not


def test_write_shared_rule_returns_to_the_default_term_once_the_window_has_passed() -> None:
    policy = AdaptiveTermPolicy(default=TERM, hot_writes=3, window=10.0)
    for now in [0.0, 1.0, 2.0]:
        policy.note_write("p", now)

    assert policy.term("p", just_before(10.0)) == 0.0
    assert policy.term("p", 10.0) == TERM  # the write at 0 has left the window
    policy.note_write("p", 10.5)  # writes at 1, 2, 10.5: hot again
    assert policy.term("p", 10.5) == 0.0


def test_write_shared_rule_needs_hot_writes_writes_within_the_window() -> None:
    policy = AdaptiveTermPolicy(default=TERM, hot_writes=3, window=10.0)
    for now in [0.0, 1.0, 10.0]:  # three writes, but never three within 10 s
        policy.note_write("p", now)

    assert policy.term("p", 10.0) == TERM


def test_write_shared_rule_is_off_when_hot_writes_is_0() -> None:
    policy = AdaptiveTermPolicy(default=TERM, hot_writes=0, window=10.0)
    for n in range(100):
        policy.note_write("p", n * 0.01)

    assert policy.term("p", 1.0) == TERM


@pytest.mark.parametrize(
    "kwargs",
    [
        {"default": -1.0},
        {"default": math.inf},
        {"default": math.nan},
        {"hot_writes": -1},
        {"window": -1.0},
    ],
)
def test_term_policy_refuses_nonsense_settings(kwargs: dict[str, float]) -> None:
    (name,) = kwargs
    with pytest.raises(BadSetting, match={"default": "term"}.get(name, name)):
        AdaptiveTermPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("skew", [-0.1, math.nan])
def test_lease_table_refuses_a_negative_skew(skew: float) -> None:
    with pytest.raises(BadSetting, match="skew"):
        LeaseTable(AdaptiveTermPolicy(), skew=skew)


# ---------------------------------------------------------------- writes over several keys
def test_a_rename_against_a_silent_holder_of_the_destination_is_applied_at_grant_term_skew() -> (
    None
):
    t = table()
    t.read(op(1), A, "d/b", now=2.0)
    rename = names.keys_for_rename("d/a", "d/b", src_is_dir=False, dst_exists=True)

    assert t.write(op(2), B, rename, now=3.0) == [SendApprovalRequest(A, "d/b", op(2))]
    assert t.next_deadline() == 12.1
    assert t.tick(just_before(12.1)) == []
    assert t.tick(12.1) == [ApplyWrite(op(2), B, "d/b")]


def test_a_rename_asks_the_holders_of_both_names_and_leaves_no_lease_on_either() -> None:
    t = table()
    t.read(op(1), A, "d/a", now=0.0)
    t.read(op(2), C, "d/b", now=0.0)
    t.read(op(3), B, "d/a", now=0.0)  # the renaming client's own copy needs no approval
    rename = names.keys_for_rename("d/a", "d/b", src_is_dir=False, dst_exists=True)

    assert t.write(op(4), B, rename, now=1.0) == [
        SendApprovalRequest(C, "d/b", op(4)),
        SendApprovalRequest(A, "d/a", op(4)),
    ]
    assert t.approve(C, "d/b", op(4), now=1.5) == []
    assert t.approve(A, "d/a", op(4), now=2.0) == [ApplyWrite(op(4), B, "d/b")]
    assert t.write_done(op(4), now=2.5, ok=True) == [WriteCommitted(op(4), B, "d/b", TERM)]
    assert t.holders("d/a", now=2.5) == {}  # the writer's copy of the old name is gone too
    assert t.holders("d/b", now=2.5) == {B: 12.5}  # what it renamed, under the new name


def test_a_write_over_several_keys_waits_for_the_last_holder_of_any_of_them() -> None:
    t = table()
    t.read(op(1), A, "x", now=0.0)
    t.read(op(2), C, "y", now=4.0)

    assert t.write(op(3), B, Footprint(("x", "y")), now=5.0) == [
        SendApprovalRequest(A, "x", op(3)),
        SendApprovalRequest(C, "y", op(3)),
    ]
    assert t.next_deadline() == 10.1  # A's lease: it expires first
    assert t.tick(10.1) == []  # but C's lease on y still holds the write
    assert t.next_deadline() == 14.1
    assert t.tick(just_before(14.1)) == []
    assert t.tick(14.1) == [ApplyWrite(op(3), B, "x")]


def test_two_crossing_renames_queue_in_arrival_order_without_deadlock() -> None:
    t = table()
    t.read(op(1), A, "a", now=0.0)
    t.read(op(2), C, "b", now=0.0)
    a_to_b = names.keys_for_rename("a", "b", src_is_dir=False, dst_exists=True)
    b_to_a = names.keys_for_rename("b", "a", src_is_dir=False, dst_exists=True)

    assert t.write(op(3), B, a_to_b, now=1.0) == [
        SendApprovalRequest(C, "b", op(3)),
        SendApprovalRequest(A, "a", op(3)),
    ]
    assert t.write(op(4), D, b_to_a, now=1.0) == []  # behind a -> b on both names
    assert t.approve(C, "b", op(3), now=2.0) == []
    assert t.approve(A, "a", op(3), now=3.0) == [ApplyWrite(op(3), B, "b")]
    # the second rename starts on every key the moment the first is done, and its
    # only holder is the first renamer, on the name it renamed to
    assert t.write_done(op(3), now=4.0, ok=True) == [
        WriteCommitted(op(3), B, "b", TERM),
        SendApprovalRequest(B, "b", op(4)),
    ]
    assert t.approve(B, "b", op(4), now=5.0) == [ApplyWrite(op(4), D, "a")]
    assert t.write_done(op(4), now=6.0, ok=True) == [WriteCommitted(op(4), D, "a", TERM)]
    assert t.pending_writes() == 0


def test_two_crossing_renames_against_silent_holders_finish_one_after_the_other() -> None:
    t = table()
    t.read(op(1), A, "a", now=0.0)
    t.read(op(2), C, "b", now=1.0)
    t.write(op(3), B, Footprint(("b", "a")), now=2.0)
    t.write(op(4), D, Footprint(("a", "b")), now=2.0)

    assert t.next_deadline() == 10.1  # only the first rename waits on time
    assert t.tick(10.1) == []
    assert t.tick(11.1) == [ApplyWrite(op(3), B, "b")]
    assert t.write_done(op(3), now=12.0, ok=True) == [
        WriteCommitted(op(3), B, "b", TERM),
        SendApprovalRequest(B, "b", op(4)),
    ]
    assert t.next_deadline() == 22.1  # B's new lease, from its write_done
    assert t.tick(just_before(22.1)) == []
    assert t.tick(22.1) == [ApplyWrite(op(4), D, "a")]


def test_a_read_between_two_multi_key_writes_is_granted_between_them() -> None:
    t = table()
    t.write(op(1), A, Footprint(("a", "b")), now=0.0)
    assert t.read(op(2), C, "b", now=1.0) is None
    t.write(op(3), B, Footprint(("b", "c")), now=2.0)
    assert t.read(op(4), D, "b", now=3.0) is None

    assert t.write_done(op(1), now=4.0, ok=True) == [
        WriteCommitted(op(1), A, "a", TERM),
        Grant(op(2), C, "b", TERM),
        SendApprovalRequest(C, "b", op(3)),
    ]
    assert t.approve(C, "b", op(3), now=5.0) == [ApplyWrite(op(3), B, "b")]
    assert t.write_done(op(3), now=6.0, ok=True) == [
        WriteCommitted(op(3), B, "b", TERM),
        Grant(op(4), D, "b", TERM),
    ]


def test_writes_over_several_keys_with_none_in_common_do_not_wait_for_each_other() -> None:
    t = table()
    t.read(op(1), A, "a", now=0.0)
    assert t.write(op(2), B, Footprint(("a", "b")), now=1.0) == [SendApprovalRequest(A, "a", op(2))]

    assert t.write(op(3), C, Footprint(("c", "d")), now=2.0) == [ApplyWrite(op(3), C, "c")]


def test_the_restart_window_holds_a_write_over_several_keys_until_its_end() -> None:
    t = table(hold_writes_until=HOLD)

    assert t.write(op(1), A, Footprint(("a", "b")), now=START) == []
    assert t.next_deadline() == HOLD
    assert t.tick(HOLD) == [ApplyWrite(op(1), A, "a")]


def test_a_failed_write_over_several_keys_keeps_the_writers_leases_on_all_of_them() -> None:
    t = table()
    t.read(op(1), A, "a", now=0.0)
    t.read(op(2), A, "b", now=0.0)
    t.read(op(3), B, "b", now=0.0)
    t.write(op(4), A, Footprint(("a", "b")), now=1.0)
    t.approve(B, "b", op(4), now=2.0)

    assert t.write_done(op(4), now=3.0, ok=False) == []
    assert (t.holders("a", now=3.0), t.holders("b", now=3.0)) == ({A: 10.0}, {A: 10.0})


# ---------------------------------------------------------------- directory leases
def test_a_listing_leases_the_directorys_name_set_under_its_own_key() -> None:
    t = table()

    assert t.read(op(1), A, names.dir_key("d"), now=0.0) == TERM
    assert t.holders("d/", now=0.0) == {A: 10.0}
    assert t.holders("d", now=0.0) == {}  # a file named d is another key


def test_a_create_in_a_directory_is_applied_only_after_the_listing_holders_approve() -> None:
    t = table()
    t.read(op(1), A, names.dir_key("d"), now=0.0)
    t.read(op(2), C, names.dir_key("d"), now=0.5)

    assert t.write(op(3), B, names.keys_for_write("d/new", creates=True), now=1.0) == [
        SendApprovalRequest(A, "d/", op(3)),
        SendApprovalRequest(C, "d/", op(3)),
    ]
    assert t.read(op(4), D, names.dir_key("d"), now=1.5) is None  # listings wait for it
    assert t.approve(A, "d/", op(3), now=2.0) == []
    assert t.approve(C, "d/", op(3), now=2.5) == [ApplyWrite(op(3), B, "d/new")]
    assert t.write_done(op(3), now=3.0, ok=True) == [
        WriteCommitted(op(3), B, "d/new", TERM),
        Grant(op(4), D, "d/", TERM),
    ]


def test_a_create_against_a_silent_listing_holder_waits_until_grant_term_skew() -> None:
    t = table()
    t.read(op(1), A, names.dir_key(""), now=1.0)  # a listing of the root

    assert t.write(op(2), B, names.keys_for_write("new", creates=True), now=2.0) == [
        SendApprovalRequest(A, "/", op(2))
    ]
    assert t.tick(just_before(11.1)) == []
    assert t.tick(11.1) == [ApplyWrite(op(2), B, "new")]


def test_an_overwrite_a_ranged_write_or_a_truncate_does_not_disturb_a_listing() -> None:
    t = table()
    t.read(op(1), A, names.dir_key("d"), now=0.0)

    assert t.write(op(2), B, names.keys_for_write("d/x", creates=False), now=1.0) == [
        ApplyWrite(op(2), B, "d/x")
    ]
    assert t.holders("d/", now=1.0) == {A: 10.0}


def test_a_file_lease_and_a_directory_lease_of_one_name_never_collide() -> None:
    t = table()
    t.read(op(1), A, "d", now=0.0)  # the file d
    t.read(op(2), C, names.dir_key("d"), now=0.0)  # the directory d's names

    assert t.write(op(3), B, Footprint(("d",)), now=1.0) == [SendApprovalRequest(A, "d", op(3))]
    assert t.holders("d/", now=1.0) == {C: 10.0}


def test_delete_asks_the_holders_of_the_file_and_of_its_directorys_listing() -> None:
    t = table()
    t.read(op(1), A, "d/x", now=0.0)
    t.read(op(2), C, names.dir_key("d"), now=0.0)

    assert t.write(op(3), B, names.keys_for_delete("d/x"), now=1.0) == [
        SendApprovalRequest(A, "d/x", op(3)),
        SendApprovalRequest(C, "d/", op(3)),
    ]


def test_mkdir_is_a_write_on_the_parents_listing_and_leaves_the_writer_the_new_one() -> None:
    t = table()
    t.read(op(1), A, names.dir_key("d"), now=0.0)

    assert t.write(op(2), B, names.keys_for_mkdir("d/s"), now=1.0) == [
        SendApprovalRequest(A, "d/", op(2))
    ]
    assert t.tick(10.1) == [ApplyWrite(op(2), B, "d/s/")]
    assert t.write_done(op(2), now=10.5, ok=True) == [WriteCommitted(op(2), B, "d/s/", TERM)]
    assert t.holders("d/", now=10.5) == {}


def test_rmdir_is_a_write_on_the_directorys_own_listing_and_its_parents() -> None:
    t = table()
    t.read(op(1), A, names.dir_key("d/s"), now=0.0)
    t.read(op(2), C, names.dir_key("d"), now=1.0)

    assert t.write(op(3), B, names.keys_for_rmdir("d/s"), now=2.0) == [
        SendApprovalRequest(A, "d/s/", op(3)),
        SendApprovalRequest(C, "d/", op(3)),
    ]
    assert t.approve(C, "d/", op(3), now=3.0) == []
    assert t.next_deadline() == 10.1  # A, silent
    assert t.tick(10.1) == [ApplyWrite(op(3), B, "d/s/")]


def test_a_rename_across_directories_asks_both_listings_inside_one_only_that_one() -> None:
    t = table()
    t.read(op(1), A, names.dir_key("d"), now=0.0)
    t.read(op(2), C, names.dir_key("e"), now=0.0)
    inside = names.keys_for_rename("d/a", "d/b", src_is_dir=False, dst_exists=False)
    across = names.keys_for_rename("d/b", "e/b", src_is_dir=False, dst_exists=False)

    assert t.write(op(3), B, inside, now=1.0) == [SendApprovalRequest(A, "d/", op(3))]
    t.approve(A, "d/", op(3), now=1.5)
    t.write_done(op(3), now=2.0, ok=True)
    t.read(op(4), A, names.dir_key("d"), now=3.0)
    assert t.write(op(5), B, across, now=4.0) == [
        SendApprovalRequest(A, "d/", op(5)),
        SendApprovalRequest(C, "e/", op(5)),
    ]


# ---------------------------------------------------------------- directory renames
def test_a_directory_rename_ends_every_lease_on_names_beneath_it() -> None:
    t = table()
    t.read(op(1), A, "d/x", now=0.0)
    t.read(op(2), A, "d/s/y", now=0.0)
    t.read(op(3), C, names.dir_key("d/s"), now=0.0)
    t.read(op(4), C, "dx", now=1.0)  # a sibling whose name starts alike: not beneath d
    rename = names.keys_for_rename("d", "e", src_is_dir=True, dst_exists=False)

    assert t.write(op(5), B, rename, now=1.0) == [
        SendApprovalRequest(A, "d/x", op(5)),
        SendApprovalRequest(A, "d/s/y", op(5)),
        SendApprovalRequest(C, "d/s/", op(5)),
    ]
    assert t.relinquish(A, ["d/x", "d/s/y"], now=2.0) == []
    assert t.next_deadline() == 10.1  # C, silent
    assert t.tick(10.1) == [ApplyWrite(op(5), B, "e/")]
    assert t.write_done(op(5), now=10.5, ok=True) == [WriteCommitted(op(5), B, "e/", TERM)]
    assert t.live_leases(now=10.5) == 2  # B's on e/ and C's on dx
    assert t.holders("dx", now=10.5) == {C: 11.0}


def test_operations_beneath_a_waiting_directory_rename_queue_behind_it() -> None:
    t = table()
    t.read(op(1), A, "d/x", now=0.0)
    t.write(op(2), B, names.keys_for_rename("d", "e", src_is_dir=True, dst_exists=False), now=1.0)

    assert t.read(op(3), C, "d/new", now=2.0) is None  # no lease or queue when it arrived
    assert t.read(op(4), C, "e/x", now=2.5) is None  # beneath the destination too
    assert t.write(op(5), D, names.keys_for_write("d/s/z", creates=True), now=3.0) == []
    assert t.extend(A, [("d/y", True)], now=3.5) == [None]
    assert t.is_blocked("d/anything") and not t.is_blocked("dx")
    assert t.tick(10.1) == [ApplyWrite(op(2), B, "e/")]
    assert t.write_done(op(2), now=11.0, ok=True) == [
        WriteCommitted(op(2), B, "e/", TERM),
        Grant(op(3), C, "d/new", TERM),
        Grant(op(4), C, "e/x", TERM),
        ApplyWrite(op(5), D, "d/s/z"),
    ]


def test_a_directory_rename_waits_for_a_write_beneath_it_that_arrived_first() -> None:
    t = table()
    assert t.write(op(1), A, only("d/x"), now=0.0) == [ApplyWrite(op(1), A, "d/x")]
    rename = names.keys_for_rename("d", "e", src_is_dir=True, dst_exists=False)

    assert t.write(op(2), B, rename, now=1.0) == []
    # the first writer's new lease is on a name the rename ends: it is asked
    assert t.write_done(op(1), now=2.0, ok=True) == [
        WriteCommitted(op(1), A, "d/x", TERM),
        SendApprovalRequest(A, "d/x", op(2)),
    ]
    assert t.approve(A, "d/x", op(2), now=3.0) == [ApplyWrite(op(2), B, "e/")]


def test_a_second_directory_rename_beneath_the_first_is_ordered_after_it_on_every_key() -> None:
    t = table()
    t.read(op(1), A, "d/s/x", now=0.0)
    t.write(op(2), B, names.keys_for_rename("d", "e", src_is_dir=True, dst_exists=False), now=1.0)
    t.write(op(3), C, names.keys_for_rename("d/s", "f", src_is_dir=True, dst_exists=False), now=2.0)
    assert t.read(op(4), D, "d/s/new", now=3.0) is None  # joins both, in arrival order

    assert t.approve(A, "d/s/x", op(2), now=4.0) == [ApplyWrite(op(2), B, "e/")]
    assert t.write_done(op(2), now=5.0, ok=False) == [ApplyWrite(op(3), C, "f/")]
    assert t.write_done(op(3), now=6.0, ok=True) == [
        WriteCommitted(op(3), C, "f/", TERM),
        Grant(op(4), D, "d/s/new", TERM),
    ]


# ---------------------------------------------------------------- ranged reads
def test_ranged_reads_are_reads_of_the_files_key_under_one_lease() -> None:
    t = table()
    assert t.read(op(1), A, "big", now=0.0) == TERM  # bytes 0..4095
    assert t.read(op(2), A, "big", now=1.0) == TERM  # bytes 4096..8191: renews the one lease

    assert t.holders("big", now=1.0) == {A: 11.0}
    assert t.write(op(3), B, names.keys_for_write("big", creates=False), now=2.0) == [
        SendApprovalRequest(A, "big", op(3))
    ]
    assert t.tick(11.1) == [ApplyWrite(op(3), B, "big")]


def test_a_truncate_that_creates_its_file_asks_the_listing_holders() -> None:
    t = table()
    t.read(op(1), A, names.dir_key("d"), now=0.0)

    assert t.write(op(2), B, names.keys_for_write("d/empty", creates=True), now=1.0) == [
        SendApprovalRequest(A, "d/", op(2))
    ]


# ---------------------------------------------------------------- reconnect
def test_reconnect_resends_no_request_for_a_lease_already_past_expiry_plus_skew() -> None:
    t = table()
    t.read(op(1), A, "p", now=0.0)
    t.read(op(2), A, "q", now=5.0)
    t.write(op(3), B, Footprint(("p", "q")), now=6.0)
    t.disconnected(A, goodbye=False, now=7.0)

    assert t.connected(A, now=just_before(10.1)) == [
        SendApprovalRequest(A, "p", op(3)),
        SendApprovalRequest(A, "q", op(3)),
    ]
    assert t.connected(A, now=10.1) == [SendApprovalRequest(A, "q", op(3))]
