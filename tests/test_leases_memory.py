"""What a lease costs the table: memory per lease, the sweep's work, and the work of a
write that many holders must approve.

Test rules: the table is driven by hand with an explicit ``now``, as in
``test_leases.py``. Work is counted (:attr:`LeaseTable.purge_steps`, entries looked
at), never timed. Memory is counted by ``tracemalloc`` in this process: the
allocations the table makes, not the key strings the caller already holds.
"""

from __future__ import annotations

import tracemalloc

import pytest

from fscache.leases import (
    PURGE_GRANULARITY,
    AdaptiveTermPolicy,
    ApplyWrite,
    Footprint,
    HolderId,
    LeaseTable,
    OpId,
    SendApprovalRequest,
)

TERM = 10.0
SKEW = 0.1
A, B = HolderId("a"), HolderId("b")


def table(term: float = TERM) -> LeaseTable:
    return LeaseTable(AdaptiveTermPolicy(default=term, hot_writes=0), skew=SKEW)


def keys(n: int, prefix: str = "f") -> list[str]:
    return [f"{prefix}{i:07d}" for i in range(n)]


def grant_all(t: LeaseTable, holders: list[HolderId], names: list[str], now: float) -> None:
    for holder in holders:
        for key in names:
            assert t.read(OpId(1), holder, key, now) is not None


# ---------------------------------------------------------------- memory
@pytest.mark.parametrize(("files", "holders"), [(20_000, 1), (2_000, 10)])
def test_a_live_lease_costs_the_table_at_most_100_bytes(files: int, holders: int) -> None:
    names = keys(files)
    who = [HolderId(f"session-{n}") for n in range(holders)]
    t = table()
    tracemalloc.start()
    try:
        grant_all(t, who, names, now=0.0)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert t.live_leases(now=0.0) == files * holders
    assert used / (files * holders) <= 100  # about 60-80: the dict's load varies


def test_renewing_a_lease_files_nothing_more_to_sweep() -> None:
    t = table()
    for n in range(1_000):
        t.read(OpId(n), A, "p", now=n * 0.01)  # renewed a thousand times, last at 9.99

    before = t.purge_steps
    t.tick(10.1 + PURGE_GRANULARITY)  # the first grant's bucket: p is live, filed again
    assert t.purge_steps - before == 1
    assert t.holders("p", now=0.0) == {A: 9.99 + TERM}
    assert t.next_deadline() == 9.99 + TERM + SKEW + PURGE_GRANULARITY
    t.tick(9.99 + TERM + SKEW + PURGE_GRANULARITY)
    assert t.holders("p", now=0.0) == {}
    assert t.purge_steps - before == 2
    assert t.next_deadline() is None


# ---------------------------------------------------------------- the sweep's work
@pytest.mark.parametrize("live", [1_000, 100_000])
def test_the_sweep_looks_only_at_the_leases_that_expired_not_the_live_ones(live: int) -> None:
    t = table()
    grant_all(t, [A], keys(10, "short"), now=0.0)  # dead by 10.1
    grant_all(t, [B], keys(live), now=5.0)  # dead by 15.1

    assert t.next_deadline() == 10.1 + PURGE_GRANULARITY
    before = t.purge_steps
    assert t.tick(10.1 + PURGE_GRANULARITY) == []
    assert t.purge_steps - before == 10  # the same whatever the live count
    assert t.leases_held(A) == 0
    assert t.leases_held(B) == live
    assert t.next_deadline() == 15.1 + PURGE_GRANULARITY


def test_counting_the_live_leases_looks_only_at_the_keys_due_to_be_swept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = table()
    grant_all(t, [A], keys(10, "short"), now=0.0)  # dead by 10.1
    grant_all(t, [B], keys(100_000), now=5.0)  # dead by 15.1
    looked_at: list[str] = []
    leases_on = t._leases_on
    monkeypatch.setattr(t, "_leases_on", lambda key: looked_at.append(key) or leases_on(key))

    assert t.live_leases(now=10.0) == 100_010
    assert looked_at == []
    assert t.live_leases(now=10.1) == 100_000  # dead by now, not swept yet
    assert len(looked_at) == 10


def test_a_tick_before_a_bucket_is_due_sweeps_what_is_dead_and_keeps_the_rest_in_order() -> None:
    t = table()
    for n in range(10):
        t.read(OpId(n), A, f"k{n}", now=n * 0.05)  # dead by 10.1, 10.15, ... 10.55: one bucket

    before = t.purge_steps
    t.tick(10.3)  # due at 11.1; dead by now: k0..k4
    assert t.leases_held(A) == 5
    assert t.purge_steps - before == 10 + 5  # ordered once, then swept from the front
    t.tick(10.4)
    assert t.leases_held(A) == 3
    assert t.purge_steps - before == 10 + 5 + 2
    assert t.next_deadline() == 10.1 + PURGE_GRANULARITY
    t.tick(10.1 + PURGE_GRANULARITY)
    assert t.leases_held(A) == 0
    assert t.purge_steps - before == 10 + 5 + 2 + 3
    assert t.next_deadline() is None


def test_a_key_with_many_holders_is_swept_once_per_bucket() -> None:
    t = table()
    holders = [HolderId(f"h{n}") for n in range(100)]
    grant_all(t, holders, ["p"], now=0.0)  # one key, filed by each of its 100 holders

    before = t.purge_steps
    t.tick(10.1 + PURGE_GRANULARITY)
    assert t.purge_steps - before == 100  # entries looked at; the key itself swept once
    assert t.holders("p", now=0.0) == {}
    assert t.next_deadline() is None


def test_a_goodbye_ends_every_lease_at_once_and_the_sweep_drops_them() -> None:
    t = table()
    grant_all(t, [A], keys(1_000), now=0.0)
    grant_all(t, [B], keys(10), now=0.0)
    t.write(OpId(2), B, Footprint(("f0000005",)), now=1.0)  # waits for A's approval

    before = t.purge_steps
    effects = t.disconnected(A, goodbye=True, now=2.0)
    assert effects == [ApplyWrite(OpId(2), B, "f0000005")]
    assert t.purge_steps == before  # nothing was swept: the leases ended with the holder
    assert t.leases_held(A) == 0
    assert t.live_leases(now=2.0) == 10  # B's
    t.write_done(OpId(2), now=3.0, ok=True)
    t.tick(10.1 + PURGE_GRANULARITY)
    assert t.purge_steps - before == 1_000 + 10  # A's, dropped as they come due, and B's
    assert t.live_leases(now=3.0) == 1  # B's lease on the name it wrote, at 3.0
    assert t.next_deadline() == 13.1 + PURGE_GRANULARITY


# ---------------------------------------------------------------- fan-out
def test_a_write_waits_for_ten_thousand_holders_and_each_approval_is_o1() -> None:
    t = table()
    holders = [HolderId(f"h{n:05d}") for n in range(10_000)]
    for n, holder in enumerate(holders):
        t.read(OpId(n), holder, "p", now=n * 0.0001)  # dead by 10.1 + n * 0.0001

    effects = t.write(OpId(99_999), A, Footprint(("p",)), now=1.0)
    assert effects == [SendApprovalRequest(h, "p", OpId(99_999)) for h in holders]
    assert t.next_deadline() == 10.1  # the first holder's dead-by
    for holder in holders[:-1]:
        assert t.approve(holder, "p", OpId(99_999), now=1.5) == []
    assert t.next_deadline() == 10.1 + 9_999 * 0.0001  # the last one's, found by the heap
    assert t.approve(holders[-1], "p", OpId(99_999), now=1.5) == [ApplyWrite(OpId(99_999), A, "p")]


# ---------------------------------------------------------------- write history
def test_write_history_is_forgotten_oldest_written_first_and_kept_within_the_window() -> None:
    policy = AdaptiveTermPolicy(default=TERM, hot_writes=3, window=10.0)
    for n in range(1_000):
        policy.note_write(f"p{n}", now=n * 0.01)  # last written at 0.00 .. 9.99
    for now in (15.0, 15.1, 15.2):
        policy.note_write("p0", now=now)  # written again: now the last written

    assert policy.is_write_shared("p0", now=15.2)
    policy.forget_before(19.995)  # every path but p0 last written 10 s ago or more
    assert list(policy._recent) == ["p0"]
    assert policy._recent["p0"] == (15.0, 15.1, 15.2)  # the last hot_writes instants
    assert policy.term("p0", now=19.995) == 0.0
    policy.forget_before(25.2)
    assert not policy._recent
