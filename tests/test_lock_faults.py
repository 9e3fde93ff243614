"""Locks under real faults: holder processes (:mod:`fscache.bench.lock_holder`)
killed with SIGKILL and paused with SIGSTOP, a real server, real TCP; then the
history checker (:mod:`fscache.bench.lock_history`), first on hand-made logs, then
on a short run under a nemesis.

Test rules: localhost only, ports the kernel picks. Every process stamps its
events with ``time.monotonic()``, one clock for the machine, so one process's
instants can be compared with another's. The tests assert order and lower bounds
(the safety rules: no grant before ``last renewal + ttl + skew``); the only upper
bounds are generous ones, there so that a broken hand-over fails rather than hangs.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import fscache
from fscache.bench import procs
from fscache.bench.demo_reader import Reader
from fscache.bench.harness import ServerProcess, fscache_server
from fscache.bench.lock_history import check, run_history

pytestmark = pytest.mark.slow

LOCK = "jobs/leader"
FENCED = "jobs/out.txt"
TTL = 1.0
SKEW = 0.1
START = 20.0  # a cold Python start on a busy machine
GENEROUS = 15.0  # a bound only a broken hand-over exceeds


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    root = tmp_path / "root"
    root.mkdir()
    # term = ttl: a paused holder's read lease on the fenced file (a writer gets one)
    # holds another's write back for no longer than its lock
    with fscache_server(str(root), term=TTL, skew=SKEW) as running:
        yield running


@contextlib.asynccontextmanager
async def holders(port: int, n: int, logs: Path) -> AsyncIterator[list[Reader]]:
    """``n`` lock holder processes, ready for commands."""
    children = procs.Commands(str(logs))
    try:
        async with trio.open_nursery() as nursery:
            started = []
            for i in range(n):
                argv = [
                    sys.executable, "-m", "fscache.bench.lock_holder", "--port", str(port),
                    "--lock", LOCK, "--ttl", repr(TTL), "--identity", f"holder-{i}",
                    "--fenced", FENCED,
                ]  # fmt: skip
                proc, log = children.start(f"holder-{i}", argv)
                holder = Reader(i, proc, log)
                holder.name = f"holder {i}"
                nursery.start_soon(holder.pump)
                started.append(holder)
            for holder in started:
                await holder.take("ready", timeout=START)
            yield started
            nursery.cancel_scope.cancel()
    finally:
        children.stop_all()


async def acquire_and_renew(holder: Reader) -> dict[str, Any]:
    """Take the lock and wait for one renewal; the grant's event."""
    holder.command("acquire")
    granted = await holder.take("acquired", timeout=START)
    await holder.take("renewed", since=granted["t"], timeout=TTL + GENEROUS)
    return dict(granted)


async def kill_the_holder(a: Reader, b: Reader) -> tuple[dict[str, Any], dict[str, Any]]:
    """``a`` takes the lock and renews it, ``b`` asks for it, ``a`` is killed with
    SIGKILL; the events of ``a``'s grant and of ``b``'s."""
    granted = await acquire_and_renew(a)
    b.command("acquire")
    await b.take("acquire")
    a.killed_at = time.monotonic()
    a.proc.send_signal(signal.SIGKILL)
    won = await b.take("acquired", timeout=TTL + SKEW + GENEROUS)
    return granted, dict(won)


def believed_until(holder: Reader, granted: dict[str, Any]) -> float:
    """The last ``valid_until`` the holder reported (its inbox keeps every renewal)."""
    renewals = [e["valid_until"] for e in holder.inbox if e["event"] == "renewed"]
    return max([granted["valid_until"], *renewals])


async def test_a_killed_holders_lock_passes_on_no_sooner_than_last_renewal_plus_ttl_plus_skew(
    server: ServerProcess, tmp_path: Path
) -> None:
    async with holders(server.port, 2, tmp_path) as (a, b):
        granted, won = await kill_the_holder(a, b)

    # valid_until = t_send + ttl - skew; the server holds the lock until t_recv + ttl + skew
    server_end = believed_until(a, granted) + 2 * SKEW
    assert won["t"] >= server_end
    assert won["token"] > granted["token"]
    assert won["t"] > a.killed_at


async def test_a_waiter_granted_after_a_long_wait_may_trust_its_lock(
    server: ServerProcess, tmp_path: Path
) -> None:
    async with holders(server.port, 2, tmp_path) as (a, b):
        _, won = await kill_the_holder(a, b)
        await trio.sleep(TTL / 2)
    assert won["valid_until"] > won["t"]
    assert not [e for e in b.inbox if e["event"] == "lost"]


async def test_a_paused_holder_resumes_to_find_its_fenced_writes_refused(
    server: ServerProcess, tmp_path: Path
) -> None:
    async with holders(server.port, 2, tmp_path) as (a, b):
        granted = await acquire_and_renew(a)
        a.command("write")
        assert (await a.take("write"))["outcome"] == "applied"

        a.proc.send_signal(signal.SIGSTOP)
        try:
            b.command("acquire")
            won = await b.take("acquired", timeout=TTL + SKEW + GENEROUS)
            b.command("write")  # waits out the paused holder's read lease on the file
            assert (await b.take("write", timeout=TTL + SKEW + GENEROUS))["outcome"] == "applied"
        finally:
            a.proc.send_signal(signal.SIGCONT)
        assert won["t"] >= believed_until(a, granted) + 2 * SKEW
        assert won["token"] > granted["token"]

        a.command("write-token")  # fenced with (name, old token), as sent by the paused holder
        assert (await a.take("write"))["outcome"] == "refused"
        a.command("write")  # fenced with the lock object it still has
        assert (await a.take("write"))["outcome"] == "refused"
        lost = await a.take("lost", timeout=GENEROUS)
        assert lost["token"] == granted["token"]

    async with fscache.open_client("127.0.0.1", server.port) as client:
        assert (await client.read(FENCED)).startswith(f"holder-1 token {won['token']} ".encode())


# ---------------------------------------------------------------- the history checker
def acquired(t: float, token: int, until: float) -> dict[str, Any]:
    return {"event": "acquired", "t": t, "token": token, "valid_until": until}


def renewed(t: float, token: int, until: float) -> dict[str, Any]:
    return {"event": "renewed", "t": t, "token": token, "valid_until": until}


def release(t: float, token: int) -> dict[str, Any]:
    return {"event": "release", "t": t, "token": token}


def wrote(t: float, token: int, version: int | None, outcome: str = "applied") -> dict[str, Any]:
    return {"event": "write", "t": t, "t_send": t, "token": token, "outcome": outcome,
            "version": version}  # fmt: skip


def test_the_checker_accepts_a_clean_hand_over() -> None:
    verdict = check(
        {
            "a": [
                acquired(0, 1, 0.9),
                wrote(0.1, 1, 10),
                renewed(0.3, 1, 1.2),
                wrote(1.5, 1, None, "refused"),
            ],
            "b": [acquired(1.4, 2, 2.3), wrote(1.45, 2, 11), release(1.6, 2)],
        }
    )
    assert verdict.problems == []
    assert [w.version for w in verdict.applied] == [10, 11]
    assert verdict.refused == 1


def test_the_checker_finds_two_believers_at_once() -> None:
    verdict = check(
        {"a": [acquired(0, 1, 0.9), renewed(0.3, 1, 1.5)], "b": [acquired(1.4, 2, 2.3)]}
    )
    assert len(verdict.problems) == 1
    assert "believed it held the lock until" in verdict.problems[0]


def test_the_checker_finds_a_long_belief_overlapping_a_later_one() -> None:
    verdict = check(
        {
            "a": [acquired(0, 1, 5.0)],
            "b": [acquired(1, 2, 2), release(1.5, 2)],
            "c": [acquired(3, 3, 4)],
        }
    )
    assert [p.split(" believed")[0] for p in verdict.problems] == [
        "a (token 1)",
        "a (token 1)",
    ]


def test_a_release_ends_belief_when_it_is_sent_not_when_it_is_answered() -> None:
    events = [acquired(0, 1, 0.9), release(0.2, 1), {"event": "released", "t": 0.4, "token": 1}]
    verdict = check({"a": events, "b": [acquired(0.3, 2, 1.2)]})
    assert verdict.problems == []


def test_a_release_ends_belief_before_valid_until() -> None:
    verdict = check({"a": [acquired(0, 1, 0.9), release(0.2, 1)], "b": [acquired(0.3, 2, 1.2)]})
    assert verdict.problems == []


def test_the_checker_finds_tokens_out_of_grant_order_and_a_token_granted_twice() -> None:
    assert (
        "was granted after"
        in check({"a": [acquired(0, 2, 0.9)], "b": [acquired(1, 1, 2)]}).problems[0]
    )
    assert (
        "granted twice" in check({"a": [acquired(0, 1, 0.9)], "b": [acquired(1, 1, 2)]}).problems[0]
    )


def test_the_checker_finds_an_old_token_applied_after_a_newer_one() -> None:
    verdict = check(
        {
            "a": [acquired(0, 1, 0.9), wrote(2.0, 1, 12)],
            "b": [acquired(1.0, 2, 1.9), wrote(1.1, 2, 11)],
        }
    )
    assert verdict.problems == ["a write with token 1 (a) was applied after one with token 2 (b)"]


def test_a_nemesis_of_kills_and_pauses_finds_no_anomaly() -> None:
    verdict, nemesis = run_history(processes=4, duration=15.0, ttl=0.6, skew=SKEW, seed=7)
    assert verdict.problems == []
    assert nemesis.kills + nemesis.pauses >= 5
    assert len({b.token for b in verdict.beliefs}) >= 5
    assert len(verdict.applied) >= 10
