"""Locks, fencing and leadership in the running service (``docs/design.md``, "Locks
and fencing").

Test rules: timing runs under ``autojump_clock`` over memory streams (``harness.py``:
the records are written without a worker thread, so no virtual time passes while
they are), and each rule is asserted at its exact virtual instant. The record log
is checked by its bytes on disk, never by time. The end-to-end tests use real TCP
on 127.0.0.1, port 0, a real worker thread for the records and real server
processes (one killed with SIGKILL), and assert outcomes and order only.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.cli import parse_serving_line
from fscache.client.locks import Lock
from fscache.locks import Record
from fscache.paths import RESERVED_PREFIX
from fscache.server import locks as server_locks
from fscache.server.locks import LOG_FILE, TABLE_FILE, encode_records
from fscache.server.service import FileService, ServerSettings, serve
from fscache.settings import BadSetting

from .harness import Cluster

SKEW = 0.1
TTL = 3.0


def at(value: float) -> object:
    return pytest.approx(value, abs=1e-9)


@pytest.fixture
async def cluster(nursery: trio.Nursery, root: pathlib.Path) -> Cluster:
    cluster = Cluster(nursery, root, skew=SKEW)
    await cluster.start()
    return cluster


def service_of(cluster: Cluster) -> FileService:
    assert cluster.service is not None
    return cluster.service


def log_of(root: pathlib.Path) -> pathlib.Path:
    return root / RESERVED_PREFIX / LOG_FILE


async def take_and_free(client: fscache.Client, name: str, times: int = 1) -> int:
    """Acquire and release ``name`` ``times`` times; the last token."""
    token = 0
    for _ in range(times):
        lock = await client.acquire(name, TTL)
        token = lock.token
        await lock.release()
    return token


# ---------------------------------------------------------------- grant, wait, release
async def test_a_lock_is_granted_with_a_token_and_released(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a:
        sent = trio.current_time()
        lock = await a.acquire("jobs/leader", TTL)
        assert (lock.name, lock.token, lock.identity) == ("jobs/leader", 1, "a")
        assert lock.held and lock.valid_until == at(sent + TTL - SKEW)
        assert await a.leader("jobs/leader") == "a"
        await lock.release()
        assert not lock.held and not lock.lost.is_set()
        assert await a.leader("jobs/leader") is None
        again = await a.acquire("jobs/leader", TTL)
        assert again.token == 2
        await again.release()


async def test_a_second_acquire_waits_for_the_release_in_line(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a, cluster.client("b") as b:
        first = await a.acquire("l", TTL)
        got: list[tuple[float, int]] = []

        async def wait_for_it() -> None:
            lock = await b.acquire("l", TTL)
            got.append((trio.current_time(), lock.token))
            await lock.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_it)
            await trio.sleep(20.0)  # renewed all the while: b waits
            assert got == []
            await first.release()
        assert got == [(at(20.0), 2)]


async def test_a_lock_granted_after_waiting_in_line_is_trusted_from_its_renewal(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a, cluster.client("b") as b:
        first = await a.acquire("l", TTL)
        waited: list[Lock] = []

        async def wait_in_line() -> None:
            waited.append(await b.acquire("l", TTL))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_in_line)
            await trio.sleep(20.0)  # far longer than the ttl: the acquire's send is old news
            await first.release()
        (lock,) = waited
        assert trio.current_time() == at(20.0)  # renewed at once, in no virtual time
        assert lock.held and lock.valid_until == at(20.0 + TTL - SKEW)
        await trio.sleep(TTL)  # and kept by the renewer from then on
        assert lock.held and not lock.lost.is_set()
        await lock.release()


async def test_an_acquire_times_out_and_holds_nothing(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a, cluster.client("b") as b:
        first = await a.acquire("l", TTL)
        with pytest.raises(fscache.LockTimeout):
            await b.acquire("l", TTL, timeout=0)
        assert trio.current_time() == at(0.0)
        with pytest.raises(fscache.LockTimeout):
            await b.acquire("l", TTL, timeout=2.5)
        assert trio.current_time() == at(2.5)
        await first.release()
        lock = await a.acquire("l", TTL, timeout=0)  # no one waits in line any more
        assert lock.token == 2


async def test_a_ttl_out_of_bounds_is_refused(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a:
        for ttl in (2 * SKEW, 301.0, -1.0, math.inf):
            with pytest.raises(fscache.FscacheError, match="ttl"):
                await a.acquire("l", ttl)
        raw = await cluster.raw("r")
        await raw.send(p.Acquire(id=1, name="l", ttl=0.1, identity="r", wait=True))
        error = await raw.receive()
        assert isinstance(error, p.Error) and "ttl" in error.message
        assert service_of(cluster).locks.waiting() == 0  # nothing left owed


# ---------------------------------------------------------------- renewal and expiry
async def test_renewal_keeps_the_lock_past_its_ttl(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a:
        async with a.lock("l", ttl=TTL) as lock:
            await trio.sleep(10 * TTL)
            assert lock.held and not lock.lost.is_set()
            assert lock.valid_until > trio.current_time() + TTL / 2
        assert await a.leader("l") is None


async def test_a_silent_holder_loses_at_its_expiry_and_the_next_is_granted_after_skew(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The holder is cut off: its body is cancelled at ``t_send + ttl - skew`` on its
    clock, the ``async with`` raises LockLost; the waiter is granted at
    ``t_receive + ttl + skew``, 2 * skew later."""
    cluster_log: list[tuple[str, float]] = []
    async with cluster.client("a") as a, cluster.client("b") as b:

        async def hold() -> None:
            with pytest.raises(fscache.LockLost):
                async with a.lock("l", ttl=TTL):
                    cluster.refuse = True
                    await cluster.cut("a")
                    try:
                        await trio.sleep_forever()
                    finally:
                        cluster_log.append(("a cancelled", trio.current_time()))
            cluster_log.append(("a after", trio.current_time()))

        async def wait() -> None:
            await trio.sleep(0.5)
            lock = await b.acquire("l", TTL)
            cluster_log.append((f"b granted {lock.token}", trio.current_time()))
            await lock.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            nursery.start_soon(wait)
        assert cluster_log == [
            ("a cancelled", at(TTL - SKEW)),
            ("a after", at(TTL - SKEW)),
            ("b granted 2", at(TTL + SKEW)),
        ]
        cluster.refuse = False


async def test_a_lock_lost_on_a_silent_connection_raises_at_once_and_releases_later(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The connection stays open but nothing comes back: the lock is lost at
    ``valid_until`` and LockLost is raised then, not after its release's wait; the
    release still goes out, in the background, and frees the name."""
    events: list[tuple[str, float]] = []
    async with cluster.client("a") as a, cluster.client("b") as b:
        with pytest.raises(fscache.LockLost):
            async with a.lock("l", ttl=TTL) as lock:
                cluster.hold("a")  # the server's frames to a wait in flight
                try:
                    await trio.sleep_forever()
                finally:
                    events.append(("body cancelled", trio.current_time()))
        events.append(("LockLost", trio.current_time()))
        assert events == [("body cancelled", at(TTL - SKEW)), ("LockLost", at(TTL - SKEW))]
        assert lock.lost.is_set() and not lock.held
        cluster.release("a")  # (the server's sends to a were stuck: so was its reading)
        await trio.sleep(0.1)
        assert await b.leader("l") is None  # released: renewed at TTL / 3, it held to 4.1
        assert (await b.acquire("l", TTL, timeout=0)).token == 2


async def test_watch_leader_reports_each_change(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[tuple[str | None, float]] = []
    async with cluster.client("w") as w, cluster.client("a") as a, cluster.client("b") as b:

        async def watch() -> None:
            async for identity in w.watch_leader("jobs/leader"):
                seen.append((identity, trio.current_time()))
                if len(seen) == 4:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep(1.0)
            async with a.leadership("jobs/leader", identity="w1", ttl=TTL):
                assert await b.leader("jobs/leader") == "w1"
                await trio.sleep(1.0)
            await trio.sleep(1.0)
            async with b.leadership("jobs/leader", identity="w2", ttl=TTL):
                await trio.sleep(1.0)
        assert seen == [(None, at(0.0)), ("w1", at(1.0)), (None, at(2.0)), ("w2", at(3.0))]


def readme_example(marker: str) -> str:
    """The README's Python block that holds ``marker``."""
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    blocks = [block.split("```", 1)[0] for block in readme.split("```python\n")[1:]]
    (block,) = [block for block in blocks if marker in block]
    return block


async def test_the_readmes_elected_worker_rides_out_an_outage_and_a_restart(
    nursery: trio.Nursery, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The README's worker, as written: a 2 s outage (its heartbeat writes fail with
    Unavailable) is ridden out under the same lease; a server restart loses the lease
    (the new incarnation does not know the session) and the worker leads again."""
    code = readme_example("async def worker(c, me)")
    code = code.split("\n\n\nasync ", 1)[0]  # (the leader watch runs elsewhere)
    scope: dict[str, Any] = {"fscache": fscache, "trio": trio}
    exec(code, scope)
    cluster = Cluster(nursery, root, skew=SKEW)
    await cluster.start()
    async with (
        cluster.client("w") as w,
        cluster.client("o") as observer,
        trio.open_nursery() as workers,  # (stopped before its client closes)
    ):
        workers.start_soon(scope["worker"], w, "w1")
        await trio.sleep(1.5)
        assert await observer.read("jobs/heartbeat") == b"w1"
        writes = (await observer.server_stats())["writes"]
        cluster.refuse = True  # an outage of 2 s: the connection is gone, none is made
        await cluster.cut("w")
        await trio.sleep(2.0)
        cluster.refuse = False
        await trio.sleep(1.5)
        assert w.stats["unavailable"] > 0  # its heartbeat failed meanwhile
        assert (await observer.server_stats())["writes"] > writes  # and beats again
        assert await observer.leader("jobs/leader") == "w1"
        assert (await observer.server_stats())["locks_granted"] == 1  # the same lease
        await cluster.start()  # a restart: the lease is lost, and won again once free
        await cluster.cut("w")
        await cluster.cut("o")
        await trio.sleep(5.0 + 2 * SKEW + 1.0)  # the old lease's hold, then a renewal
        assert await observer.leader("jobs/leader") == "w1"
        await trio.sleep(10.0)  # a restarted server holds writes back for a term
        writes = (await observer.server_stats())["writes"]
        await trio.sleep(2.0)
        assert (await observer.server_stats())["writes"] >= writes + 2  # a beat a second
        workers.cancel_scope.cancel()


# ---------------------------------------------------------------- fencing
async def test_a_fenced_write_is_refused_once_a_newer_token_exists(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a, cluster.client("b") as b:
        old = await a.acquire("l", TTL)
        await a.write("out.txt", b"one", fence=old)
        await old.release()
        new = await b.acquire("l", TTL)
        with pytest.raises(fscache.Conflict, match=r"token 1.*newest token of 'l' is 2"):
            await a.write("out.txt", b"stale", fence=("l", old.token))
        for change in (
            a.write("out.txt", b"x", fence=old, offset=0),
            a.truncate("out.txt", 0, fence=old),
            a.delete("out.txt", fence=old),
            a.rename("out.txt", "moved.txt", fence=old),
            a.mkdir("d", fence=old),
            a.write("big.bin", b"x" * (3 << 20), fence=old),  # an upload's commit
        ):
            with pytest.raises(fscache.Conflict):
                await change
        await a.mkdir("d")
        with pytest.raises(fscache.Conflict):
            await a.rmdir("d", fence=old)
        await b.write("out.txt", b"two", fence=new)
        assert await a.read("out.txt") == b"two"


async def test_a_fence_of_token_0_sent_anyway_is_refused_by_the_server(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The client refuses it before sending; a peer that sends it is refused too."""
    raw = await cluster.raw("raw")
    for fence in (("never/locked", 0), ("never/locked", -1)):
        await raw.send(p.Write(id=1, path="out.txt", data=b"x", fence=fence))
        reply = await raw.receive()
        assert isinstance(reply, p.Error) and reply.code == fscache.Conflict.code
        assert "tokens start at 1" in reply.message
    await raw.close()
    async with cluster.client("a") as a:
        with pytest.raises(fscache.NotFound):
            await a.read("out.txt")


async def test_a_fenced_write_queued_before_the_hand_over_is_refused_when_applied(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The write waits for a reader's lease; the lock passes on meanwhile; when the
    write's turn comes its token is no longer the newest."""
    async with cluster.client("r") as r, cluster.client("a") as a, cluster.client("b") as b:
        await a.write("out.txt", b"one")
        assert await r.read("out.txt") == b"one"
        cluster.hold("r")  # r stops answering approval requests: its lease is waited out
        old = await a.acquire("l", TTL)
        results: list[object] = []

        async def stale_write() -> None:
            try:
                await a.write("out.txt", b"stale", fence=old)
            except fscache.Conflict as exc:
                results.append(("refused", trio.current_time(), str(exc)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stale_write)
            await trio.sleep(1.0)
            await old.release()
            new = await b.acquire("l", TTL)
            assert new.token == 2
        cluster.release("r")
        assert len(results) == 1 and results[0][0] == "refused"
        assert await b.read("out.txt") == b"one"


# ---------------------------------------------------------------- connections
async def test_renewal_carries_on_through_a_reconnect(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a, a.lock("l", ttl=TTL) as lock:
        await trio.sleep(1.0)
        await cluster.cut("a")  # the session resumes on the new connection
        await trio.sleep(5 * TTL)
        assert lock.held and a.stats["reconnects"] == 1
        assert await a.leader("l") == "a"


async def test_a_session_cut_off_past_its_ttl_keeps_a_lock_that_may_still_be_renewed(
    nursery: trio.Nursery, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The session TTL (5 s) is shorter than the lock's ttl (30 s): a holder cut off for
    7 s comes back to its own session and renews, rather than to a new session that
    may not renew a lock the server still holds for no one."""
    cluster = Cluster(nursery, root, skew=SKEW, session_ttl=5.0)
    await cluster.start()
    async with cluster.client("a") as a, cluster.client("b") as b, a.lock("l", ttl=30.0) as lock:
        token = lock.token
        cluster.refuse = True
        await cluster.cut("a")
        await trio.sleep(7.0)
        assert await b.leader("l") == "a"
        cluster.refuse = False
        await trio.sleep(40.0)  # reconnected, and renewing since
        assert lock.held and lock.token == token
        assert await b.leader("l") == "a"
        assert service_of(cluster).sessions.expired == 0


async def test_a_waiter_cut_off_waits_again_after_its_reconnect_behind_the_others(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a, cluster.client("b") as b, cluster.client("c") as c:
        first = await a.acquire("l", TTL)
        granted: list[tuple[str, int]] = []

        async def wait(client: fscache.Client, name: str) -> None:
            lock = await client.acquire("l", TTL)
            granted.append((name, lock.token))
            await trio.sleep(1.0)
            await lock.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, b, "b")
            await trio.sleep(0.5)
            nursery.start_soon(wait, c, "c")
            await trio.sleep(0.5)
            await cluster.cut("b")  # b's place in line goes with its connection ...
            await trio.sleep(2.0)  # ... and it asks again once reconnected
            await first.release()
        assert granted == [("c", 2), ("b", 3)]
        assert b.stats["reconnects"] == 1


async def test_a_grant_lost_with_its_connection_is_taken_up_after_the_reconnect(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The server grants a waiter its lock just as the waiter's connection goes: the
    grant is lost, the session (resumed) holds the lock. The waiter takes it up with a
    renewal rather than waiting behind itself until it expires."""
    async with cluster.client("a") as a, cluster.client("b") as b, cluster.client("c") as c:
        first = await a.acquire("l", TTL)
        async with trio.open_nursery() as nursery:
            b_lock: list[object] = []

            async def wait_b() -> None:
                b_lock.append(await b.acquire("l", TTL))

            nursery.start_soon(wait_b)
            await trio.sleep(0.5)
            cluster.reset("b")  # the grant is sent, and arrives as a reset connection
            await first.release()
        (lock,) = b_lock
        assert isinstance(lock, Lock) and lock.token == 2 and lock.held
        assert b.stats["reconnects"] == 1
        with pytest.raises(fscache.LockTimeout):
            await c.acquire("l", TTL, timeout=0)  # b holds it, and knows it
        await trio.sleep(3 * TTL)
        assert lock.held  # renewed from then on
        await lock.release()
        assert (await c.acquire("l", TTL, timeout=0)).token == 3


async def test_an_acquire_cancelled_as_its_grant_comes_in_holds_nothing(
    cluster: Cluster, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster.client("a") as a, cluster.client("b") as b:
        with trio.CancelScope() as scope:
            finish = b._finish

            async def cancelled_at_the_finish(*args: object) -> None:
                scope.cancel()  # the grant is in; the cancellation comes at the checkpoint
                await finish(*args)  # type: ignore[arg-type]

            monkeypatch.setattr(b, "_finish", cancelled_at_the_finish)
            await b.acquire("l", TTL)
        assert scope.cancelled_caught
        monkeypatch.undo()
        lock = await a.acquire("l", TTL, timeout=0)  # b gave its grant back at once
        assert lock.token == 2


async def test_a_release_cut_off_with_its_connection_is_sent_again_after_the_reconnect(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a, cluster.client("c") as c:
        lock = await a.acquire("l", TTL)
        await cluster.cut("a")  # the release goes out on a connection already gone
        await lock.release()
        with trio.fail_after(TTL / 2):  # long before the lock would run out
            while await c.leader("l") is not None:
                await trio.sleep(0.05)
        assert (await c.acquire("l", TTL, timeout=0)).token == 2
        assert a.stats["reconnects"] == 1


async def test_a_grant_given_up_before_its_record_is_on_disk_is_released_not_sent(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The grant waits for its record to be durable; the waiter gives its acquire up
    meanwhile (a release with token 0, answered at once): the grant would arrive after
    that answer, unheeded, and hold the lock for its ttl. The server releases it."""
    locks = service_of(cluster).locks
    gate = trio.Event()

    async def slow_disk(fn: Any, *args: Any) -> Any:
        await gate.wait()
        return fn(*args)

    async with cluster.client("a") as a, cluster.client("c") as c:
        first = await a.acquire("l", TTL)
        waiter = await cluster.raw("b")
        await waiter.send(p.Acquire(id=1, name="l", ttl=TTL, identity="b", wait=True))
        await trio.sleep(0.1)  # queued
        locks._blocking_io = slow_disk
        await first.release()  # granted to b; its record is on its way to disk ...
        await waiter.send(p.Release(id=2, name="l", token=0))  # ... when b gives up
        assert await waiter.receive() == p.Done(id=2)
        gate.set()
        await waiter.send(p.Ping(id=3))
        assert await waiter.receive() == p.Done(id=3)  # no grant came between
        assert await a.leader("l") is None
        assert (await c.acquire("l", TTL, timeout=0)).token == 3


@pytest.mark.parametrize(
    ("identity", "why"),
    [
        ("", "identity must be 1..256 characters"),
        ("x" * 257, "identity must be 1..256 characters"),
        ("evil\nnobody holds 'l'", "identity must be printable on one line"),
        ("\x1b[31mred", "identity must be printable on one line"),
    ],
)
async def test_an_identity_sent_empty_too_long_or_unprintable_is_refused_by_the_server(
    cluster: Cluster, autojump_clock: trio.testing.MockClock, identity: str, why: str
) -> None:
    """The clients refuse it before sending (an empty one would read as "nobody
    leads", a line break or an escape would forge or colour ``fscache leader``'s one
    line); a peer that sends it anyway is answered with a protocol error."""
    raw = await cluster.raw("raw")
    await raw.send(p.Acquire(id=1, name="l", ttl=TTL, identity=identity, wait=False))
    reply = await raw.receive()
    assert isinstance(reply, p.Error) and reply.code == fscache.ProtocolError.code
    assert why in reply.message
    await raw.close()
    async with cluster.client("a") as a:
        assert await a.leader("l") is None
        assert (await a.acquire("l", TTL, identity="x" * 256)).token == 1


@pytest.mark.parametrize("timeout", [-1.0, math.nan, -math.inf, "1", True])
async def test_a_bad_timeout_is_refused_before_anything_is_sent(
    cluster: Cluster, autojump_clock: trio.testing.MockClock, timeout: object
) -> None:
    async with cluster.client("a") as a:
        with pytest.raises(BadSetting, match=r"timeout must be .* >= 0, or inf \(no timeout\)"):
            await a.acquire("l", TTL, timeout=timeout)  # type: ignore[arg-type]
        assert (await a.acquire("l", TTL, timeout=math.inf)).token == 1  # none used up


async def test_a_renewal_refused_after_a_server_restart_loses_the_lock_at_once(
    nursery: trio.Nursery, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery, root, skew=SKEW)
    await cluster.start()
    async with cluster.client("a") as a:
        with pytest.raises(fscache.LockLost):
            async with a.lock("l", ttl=TTL) as lock:
                await cluster.start()  # a new incarnation; its session is unknown there
                await cluster.cut("a")
                await trio.sleep_forever()
        assert trio.current_time() == at(TTL / 3 - SKEW)  # the first renewal, refused
        assert lock.lost.is_set() and lock.valid_until == at(TTL - SKEW)


async def test_a_leader_watch_stopped_stops_the_servers_notices_once_the_last_one_ends(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    watchers = service_of(cluster).locks._watchers
    async with cluster.client("w") as w, cluster.client("a") as a:
        other = w.watch_leader("l")
        assert await other.__anext__() is None
        async with w.watch_leader("l") as leaders:
            async for leader in leaders:
                assert leader is None
                break
        await trio.sleep(0.1)
        assert set(watchers) == {"l"}  # the other watch of "l" goes on
        async with a.lock("l", ttl=TTL, identity="one"):
            assert await other.__anext__() == "one"
        await other.aclose()
        await other.aclose()  # idempotent
        with pytest.raises(StopAsyncIteration):
            await other.__anext__()
        await trio.sleep(0.1)
        assert watchers == {}  # no more notices of "l" for w's connection
        async with w.watch_leader("l") as again:  # and a new watch subscribes anew
            assert await again.__anext__() is None
            assert set(watchers) == {"l"}
            async with a.lock("l", ttl=TTL, identity="two"):
                assert await again.__anext__() == "two"
        await trio.sleep(0.1)
        assert watchers == {}


async def test_a_leader_watch_closed_while_it_waits_ends_its_iteration(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("w") as w:
        watch = w.watch_leader("l")
        seen: list[str | None] = []

        async def follow() -> None:
            async for leader in watch:
                seen.append(leader)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.sleep(1.0)
            await watch.aclose()
        assert seen == [None] and trio.current_time() == at(1.0)


async def test_watch_leader_after_a_reconnect_reports_who_leads_now(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[str | None] = []
    async with cluster.client("w") as w, cluster.client("a") as a:
        watch = w.watch_leader("l")
        seen.append(await watch.__anext__())
        cluster.refuse = True
        await cluster.cut("w")
        lock = await a.acquire("l", TTL, identity="leader-1")
        cluster.refuse = False
        seen.append(await watch.__anext__())
        await lock.release()
        seen.append(await watch.__anext__())
        assert seen == [None, "leader-1", None]
        assert w.stats["reconnects"] == 1


async def test_server_stats_count_locks(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("a") as a:
        lock = await a.acquire("l", TTL)
        stats = await a.server_stats()
        assert (stats["locks_held"], stats["locks_granted"]) == (1, 1)
        await lock.release()
        assert (await a.server_stats())["locks_held"] == 0


# ---------------------------------------------------------------- restart
async def test_tokens_survive_a_restart_and_a_maybe_held_lock_is_held_back(
    nursery: trio.Nursery, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The holder of ``held`` is cut off with no goodbye as the server restarts: the
    new incarnation grants ``held`` only at ``start + ttl + skew``, a released name
    at once, each with the next token."""
    first = Cluster(nursery, root, skew=SKEW)
    await first.start()
    async with first.client("a") as a:
        lock = await a.acquire("held", 5.0)
        freed = await a.acquire("freed", TTL)
        await freed.release()
        assert (lock.token, freed.token) == (1, 1)
        first.refuse = True
        await first.cut("a")  # a comes back to no one: the old server is gone

        await trio.sleep(1.0)
        second = Cluster(nursery, root, skew=SKEW)
        await second.start()
        started = trio.current_time()
        async with second.client("b") as b:
            again = await b.acquire("freed", TTL)
            assert again.token == 2 and trio.current_time() == at(started)
            assert await b.leader("held") == "a"  # held back: a may believe it holds it
            taken = await b.acquire("held", TTL)
            assert taken.token == 2 and trio.current_time() == at(started + 5.0 + SKEW)
            assert await b.leader("held") == "b"
            assert lock.lost.is_set()  # a gave up at 5.0 - SKEW, before b was granted


# ---------------------------------------------------------------- the record log
async def test_each_grant_and_release_appends_its_record_alone_however_many_names(
    cluster: Cluster, autojump_clock: trio.testing.MockClock, root: pathlib.Path
) -> None:
    async with cluster.client("a") as a:
        for number in range(300):
            await take_and_free(a, f"n/{number}")
        before = log_of(root).stat().st_size
        lock = await a.acquire("n/7", TTL)
        assert lock.token == 2
        assert log_of(root).stat().st_size - before == len(
            encode_records([Record("n/7", 2, TTL, held=True, identity="a")])
        )
        await lock.release()
        assert (
            log_of(root)
            .read_bytes()
            .endswith(
                encode_records(
                    [
                        Record("n/7", 2, TTL, held=True, identity="a"),
                        Record("n/7", 2, TTL, held=False),
                    ]
                )
            )
        )


async def test_a_torn_last_record_is_ignored_at_start_and_compacted_away(
    cluster: Cluster,
    nursery: trio.Nursery,
    root: pathlib.Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with cluster.client("a") as a:
        assert await take_and_free(a, "l", 3) == 3
    whole = log_of(root).read_bytes()
    torn = encode_records([Record("l", 4, TTL, held=True)])[:-5]  # a crash mid-append
    with log_of(root).open("ab") as f:
        f.write(torn)
    second = Cluster(nursery, root, skew=SKEW)
    await second.start()
    assert "locks.log: 1 torn record(s) at the end are ignored" in caplog.text
    assert log_of(root).read_bytes() == encode_records([Record("l", 3, TTL, held=False)])
    assert whole.endswith(log_of(root).read_bytes())
    async with second.client("b") as b:
        started = trio.current_time()
        lock = await b.acquire("l", TTL)
        assert lock.token == 4 and trio.current_time() == at(started)  # not held back


async def test_a_damaged_record_before_good_ones_refuses_the_start(
    cluster: Cluster,
    nursery: trio.Nursery,
    root: pathlib.Path,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster.client("a") as a:
        await take_and_free(a, "one")
        await take_and_free(a, "two")
    lines = log_of(root).read_bytes().split(b"\n")
    lines[0] = lines[0].replace(b'"token":1', b'"token":9')  # the CRC no longer matches
    log_of(root).write_bytes(b"\n".join(lines))
    with pytest.raises(fscache.FscacheError, match=r"locks\.log are damaged at line 1"):
        await Cluster(nursery, root, skew=SKEW).start()


async def test_compaction_keeps_every_names_newest_token(
    cluster: Cluster,
    nursery: trio.Nursery,
    root: pathlib.Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(server_locks, "COMPACT_MIN", 4)  # rewritten past 2 * 4 records
    monkeypatch.setattr(server_locks, "COMPACT_RATIO", 2)
    sizes: list[int] = []
    async with cluster.client("a") as a:
        for round_ in range(1, 6):
            for name in ("x", "y", "z"):
                assert await take_and_free(a, name) == round_
                sizes.append(len(log_of(root).read_bytes().splitlines()))
    assert max(sizes) <= 2 * 4 and sizes != sorted(sizes)  # it shrank, more than once
    second = Cluster(nursery, root, skew=SKEW)
    await second.start()
    assert "torn" not in caplog.text  # a whole log has no tail to ignore
    async with second.client("b") as b:
        assert [await take_and_free(b, name) for name in ("x", "y", "z")] == [6, 6, 6]


async def test_a_failed_append_refuses_its_grant_and_the_log_is_rewritten_next(
    cluster: Cluster,
    autojump_clock: trio.testing.MockClock,
    root: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = service_of(cluster).store
    async with cluster.client("a") as a:
        assert await take_and_free(a, "l") == 1

        def fail(name: str, data: bytes) -> None:
            with log_of(root).open("ab") as f:
                f.write(data[:-3])  # part of the batch reached the file
            raise fscache.Unavailable("the disk is gone")

        monkeypatch.setattr(store, "append_state", fail)
        with pytest.raises(fscache.Unavailable, match="the disk is gone"):
            await a.acquire("l", TTL)
        monkeypatch.undo()
        lock = await a.acquire("m", TTL)  # a rewrite: the torn batch is gone
        assert lock.token == 1
        assert log_of(root).read_bytes() == encode_records(
            [
                Record("l", 2, TTL, held=True, identity="a"),
                Record("m", 1, TTL, held=True, identity="a"),
            ]
        )


async def test_the_records_whole_table_form_is_folded_into_the_log(
    nursery: trio.Nursery, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    table = [
        {"name": "held", "token": 4, "ttl": 5.0, "held": True},
        {"name": "free", "token": 9, "ttl": TTL, "held": False},
    ]
    (root / RESERVED_PREFIX).mkdir(mode=0o700, exist_ok=True)
    (root / RESERVED_PREFIX / TABLE_FILE).write_text(json.dumps(table))
    cluster = Cluster(nursery, root, skew=SKEW)
    await cluster.start()
    started = trio.current_time()
    assert not (root / RESERVED_PREFIX / TABLE_FILE).exists()
    assert log_of(root).read_bytes() == encode_records(
        [Record("held", 4, 5.0, held=True), Record("free", 9, TTL, held=False)]
    )
    async with cluster.client("a") as a:
        assert await take_and_free(a, "free") == 10
        lock = await a.acquire("held", TTL)
        assert lock.token == 5 and trio.current_time() == at(started + 5.0 + SKEW)


# ---------------------------------------------------------------- real TCP
async def test_locks_over_real_tcp(nursery: trio.Nursery, root: pathlib.Path) -> None:
    service = await nursery.start(serve, ServerSettings(root=str(root), port=0, skew=SKEW))
    async with (
        fscache.open_client(service.host, service.port, client_id="a") as a,
        fscache.open_client(service.host, service.port, client_id="b") as b,
    ):
        order: list[str] = []
        async with a.lock("jobs/leader", ttl=1.0) as lock:
            await a.write("out.txt", b"a", fence=lock)

            async def second() -> None:
                async with b.lock("jobs/leader", ttl=1.0) as later:
                    order.append(f"b {later.token}")
                    await b.write("out.txt", b"b", fence=later)

            nursery.start_soon(second)
            await trio.sleep(0.2)
            order.append(f"a {lock.token}")
        with trio.fail_after(10):
            while len(order) < 2 or await a.read("out.txt") != b"b":
                await trio.sleep(0.05)
        assert order == ["a 1", "b 2"]
        with pytest.raises(fscache.Conflict):
            await a.write("out.txt", b"late", fence=lock)


def start_server(root: pathlib.Path, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """``fscache serve`` on ``root`` in its own process, and its address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    address = parse_serving_line(proc.stdout.readline())
    if address is None:
        stop_server(proc, signal.SIGKILL)
        pytest.fail("the server process did not say where it serves")
    return proc, f"{address[0]}:{address[1]}"


def stop_server(proc: subprocess.Popen[str], how: signal.Signals = signal.SIGTERM) -> None:
    proc.send_signal(how)
    proc.wait(timeout=10)
    assert proc.stdout is not None
    proc.stdout.close()


def test_the_blocking_client_locks_against_a_server_process(root: pathlib.Path) -> None:
    proc, where = start_server(root)
    try:
        with (
            fscache.connect(where, client_id="a") as a,
            fscache.connect(where, client_id="b") as b,
        ):
            with a.lock("jobs/leader", 2.0, identity="w1") as lock:
                assert lock.held and lock.token == 1
                assert b.leader("jobs/leader") == "w1"
                with pytest.raises(fscache.LockTimeout):
                    b.acquire("jobs/leader", 2.0, timeout=0)
                a.write("out.txt", b"a", fence=lock)
            later = b.acquire("jobs/leader", 2.0, timeout=0)
            assert later.token == 2 and a.leader("jobs/leader") == "b"
            with pytest.raises(fscache.Conflict, match="newest token"):
                a.write("out.txt", b"late", fence=lock)
            b.release(later)
            assert b.leader("jobs/leader") is None and b.read("out.txt") == b"a"
    finally:
        stop_server(proc)


def test_a_blocking_lock_is_released_by_its_own_release_and_says_when_it_is_lost(
    root: pathlib.Path,
) -> None:
    proc, where = start_server(root)
    try:
        with (
            fscache.connect(where, client_id="a") as a,
            fscache.connect(where, client_id="b") as b,
        ):
            lock = a.acquire("l", 2.0)
            assert isinstance(lock, fscache.BlockingLock) and lock.fence == ("l", 1)
            assert (lock.name, lock.identity, lock.ttl) == ("l", "a", 2.0)
            assert lock.held and lock.lost is False and lock.valid_until > time.monotonic()
            lock.release()  # blocking: done when it returns
            assert not lock.held and lock.lost is False and b.leader("l") is None
            lock.release()  # idempotent
            with b.acquire("l", 2.0) as again:  # a context manager too
                assert again.token == 2 and a.leader("l") == "b"
                a.write("out.txt", b"x", fence=again)  # either client takes it as a fence
                assert not again.wait_lost(0.1)
            assert a.leader("l") is None and not again.wait_lost()  # released: at once
            # lost: the server restarts, its new incarnation refuses the renewal
            port = int(where.rsplit(":", 1)[1])
            with pytest.raises(fscache.LockLost), a.lock("l", 2.0) as held:
                stop_server(proc, signal.SIGKILL)
                proc, _ = start_server(root, port)
                assert held.wait_lost(timeout=10)
                assert held.lost is True and not held.held
                with pytest.raises(fscache.LockLost):
                    held.raise_if_lost()
    finally:
        stop_server(proc)


def test_the_blocking_client_leads_and_watches_the_leader(root: pathlib.Path) -> None:
    proc, where = start_server(root)
    try:
        with fscache.connect(where, client_id="a") as a, fscache.connect(where) as b:
            leaders = b.watch_leader("jobs/leader")
            assert next(leaders) is None
            with a.leadership("jobs/leader", identity="w1", ttl=2.0) as lease:
                assert isinstance(lease, fscache.BlockingLock) and lease.held
                assert next(leaders) == "w1" and b.leader("jobs/leader") == "w1"
                a.write("out.txt", b"w1", fence=lease)
            assert next(leaders) is None
            leaders.close()  # leaving the loop stops the watch, and the server's notices
            with (
                pytest.raises(BadSetting, match=r"identity must be 1\.\.256"),
                a.leadership("jobs/leader", identity=""),
            ):
                pass
            assert b.leader("jobs/leader") is None
    finally:
        stop_server(proc)


def test_tokens_increase_after_the_server_is_killed_right_after_its_grants(
    root: pathlib.Path,
) -> None:
    """SIGKILL as soon as the grants are received: each was durable before it was
    sent, so the next server grants each name a newer token (a lock held at the
    kill only after its ttl and skew)."""

    first, where = start_server(root)
    try:
        with fscache.connect(where, client_id="a") as a:
            freed = [a.acquire(f"free/{n}", 1.0, timeout=0) for n in range(20)]
            for lock in freed:
                a.release(lock)
            again = a.acquire("free/0", 1.0, timeout=0)
            held = a.acquire("held", 1.0, timeout=0)
            os.kill(first.pid, signal.SIGKILL)  # right after the grants: no goodbye
            tokens = {"free/0": again.token, "held": held.token}
            assert tokens == {"free/0": 2, "held": 1}
    finally:
        stop_server(first, signal.SIGKILL)
    restarted = time.monotonic()  # the second server starts after this
    second, where = start_server(root)
    try:
        with fscache.connect(where, client_id="b") as b:
            assert b.acquire("free/19", 1.0, timeout=0).token == 2
            granted: dict[str, Lock] = {}
            for name in ("held", "free/0"):  # held back: they may still be believed in
                try:
                    granted[name] = b.acquire(name, 1.0, timeout=0)
                except fscache.LockTimeout:
                    continue
                # Granted at once: only once the window (start + ttl + skew) is over,
                # which a slow machine may reach before this attempt.
                assert time.monotonic() - restarted > 1.0, f"{name} granted inside the window"
            for name in ("held", "free/0"):
                if name not in granted:
                    granted[name] = b.acquire(name, 1.0, timeout=30)
            assert granted["held"].token == 2
            assert granted["free/0"].token == 3
    finally:
        stop_server(second)
