"""Timing rules of the running service, at exact virtual instants.

Every test runs under ``autojump_clock`` over memory streams (see harness.py), so
``trio.current_time()`` after an await is the exact instant the service decided.
Terms are the defaults (10 s, skew 0.1 s) unless a test says otherwise.
"""

from __future__ import annotations

import dataclasses
import socket

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.errors import FscacheError
from fscache.server.service import INCARNATION_FILE, Counters, ServerSettings, serve
from fscache.settings import MAX_TERM

from .harness import Cluster

TERM = 10.0
SKEW = 0.1


def at(value: float) -> object:
    return pytest.approx(value, abs=1e-9)


@pytest.fixture
async def cluster(nursery, root):
    cluster = Cluster(nursery, root, term=TERM, skew=SKEW)
    await cluster.start()
    return cluster


async def seed(cluster: Cluster, path: str = "f", data: bytes = b"v1") -> None:
    async with cluster.client("seeder") as c:
        await c.write(path, data)


async def test_a_write_against_a_silent_holder_completes_at_grant_plus_term_plus_skew(
    cluster, autojump_clock
):
    await seed(cluster)
    silent = await cluster.raw("silent")
    await trio.sleep(1.0)
    granted_at = trio.current_time()
    reply = await silent.read("f")
    assert isinstance(reply, p.Data) and reply.term == TERM
    await trio.sleep(2.0)
    async with cluster.client("writer") as writer:
        await writer.write("f", b"v2")
        assert trio.current_time() == at(granted_at + TERM + SKEW)
    await silent.close()


async def test_a_write_against_a_responsive_holder_waits_for_no_time(cluster, autojump_clock):
    await seed(cluster)
    async with cluster.client("reader") as reader, cluster.client("writer") as writer:
        assert await reader.read("f") == b"v1"
        await trio.sleep(3.0)
        start = trio.current_time()
        await writer.write("f", b"v2")
        assert trio.current_time() == at(start)
        assert reader.stats["approvals"] == 1
        assert "f" not in reader._cache  # dropped before approving
        assert await reader.read("f") == b"v2"


async def test_a_holder_that_vanished_without_goodbye_is_waited_out(cluster, autojump_clock):
    await seed(cluster)
    crashed = await cluster.raw("crashed")
    granted_at = trio.current_time()
    await crashed.read("f")
    await crashed.close()  # no goodbye: its lease must still be honoured
    await trio.sleep(0.5)
    async with cluster.client("writer") as writer:
        await writer.write("f", b"v2")
        assert trio.current_time() == at(granted_at + TERM + SKEW)


async def test_a_holder_that_said_goodbye_has_relinquished(cluster, autojump_clock):
    await seed(cluster)
    async with cluster.client("leaving") as leaving:
        await leaving.read("f")
    start = trio.current_time()
    async with cluster.client("writer") as writer:
        await writer.write("f", b"v2")
    assert trio.current_time() == at(start)


async def test_reads_wait_for_a_waiting_write_and_then_see_its_data(cluster, autojump_clock):
    await seed(cluster)
    silent = await cluster.raw("silent")
    granted_at = trio.current_time()
    await silent.read("f")
    seen: list[tuple[float, bytes]] = []
    async with cluster.client("writer") as writer, cluster.client("reader") as reader:

        async def read_later() -> None:
            await trio.sleep(1.0)  # the write is already waiting by now
            data = await reader.read("f")
            seen.append((trio.current_time(), data))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.write, "f", b"v2")
            nursery.start_soon(read_later)
    assert seen == [(at(granted_at + TERM + SKEW), b"v2")]
    await silent.close()


async def test_writes_to_other_paths_do_not_wait(cluster, autojump_clock):
    await seed(cluster, "blocked")
    await seed(cluster, "free")
    silent = await cluster.raw("silent")
    await silent.read("blocked")
    finished: dict[str, float] = {}
    async with cluster.client("w1") as w1, cluster.client("w2") as w2:

        async def write(client: fscache.Client, path: str) -> None:
            await client.write(path, b"new")
            finished[path] = trio.current_time()

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, w1, "blocked")
            nursery.start_soon(write, w2, "free")
    assert finished == {"free": at(start), "blocked": at(start + TERM + SKEW)}
    await silent.close()


async def test_writes_to_one_path_are_applied_in_arrival_order(cluster, autojump_clock):
    await seed(cluster)
    silent = await cluster.raw("silent")
    await silent.read("f")
    versions: list[tuple[bytes, int]] = []
    async with cluster.client("w1") as w1, cluster.client("w2") as w2:

        async def write(client: fscache.Client, data: bytes, delay: float) -> None:
            await trio.sleep(delay)
            versions.append((data, await client.write("f", data)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, w1, b"first", 0.0)
            nursery.start_soon(write, w2, b"second", 0.5)
        assert [data for data, _ in versions] == [b"first", b"second"]
        assert versions[0][1] < versions[1][1]
        assert await w1.read("f") == b"second"
    await silent.close()


async def test_a_cached_read_is_trusted_until_send_plus_term_minus_skew(cluster, autojump_clock):
    await seed(cluster)
    async with cluster.client("reader") as reader:
        sent_at = trio.current_time()
        await reader.read("f")
        stats = await reader.server_stats()
        await trio.sleep(TERM - SKEW - 0.001)
        await reader.read("f")
        assert reader.stats["hits"] == 1
        assert (await reader.server_stats())["reads"] == stats["reads"]
        await trio.sleep(0.001)
        assert trio.current_time() == at(sent_at + TERM - SKEW)
        assert await reader.read("f") == b"v1"  # revalidated: not modified, no data
        assert reader.stats["not_modified"] == 1
        assert (await reader.server_stats())["reads_not_modified"] == 1


async def test_concurrent_misses_on_one_path_share_one_request(cluster, autojump_clock):
    await seed(cluster)
    async with cluster.client("reader") as reader:
        before = (await reader.server_stats())["reads"]
        results = []

        async def read() -> None:
            results.append(await reader.read("f"))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(read)
        assert results == [b"v1"] * 5
        assert (await reader.server_stats())["reads"] == before + 1
        assert reader.stats["reads_shared"] == 4


async def test_cached_entries_outlive_the_server_until_expiry_then_unavailable(
    cluster, autojump_clock
):
    await seed(cluster)
    async with cluster.client("reader") as reader:
        sent_at = trio.current_time()
        await reader.read("f")
        cluster.refuse = True
        await cluster.cut("reader")
        await trio.sleep(TERM - SKEW - 0.01)
        assert await reader.read("f") == b"v1"  # still trusted, server unreachable
        await trio.sleep(0.01)
        assert trio.current_time() == at(sent_at + TERM - SKEW)
        with pytest.raises(fscache.Unavailable):
            await reader.read("f")
        cluster.refuse = False  # the server is back: the client reconnects by itself
        await trio.sleep(5)
        assert await reader.read("f") == b"v1"
        assert reader.stats["reconnects"] >= 1


async def test_the_server_resends_approval_requests_after_a_reconnect(cluster, autojump_clock):
    await seed(cluster)
    async with cluster.client("reader") as reader, cluster.client("writer") as writer:
        await reader.read("f")
        cluster.refuse = True
        await cluster.cut("reader")
        finished: list[float] = []

        async def write() -> None:
            await writer.write("f", b"v2")
            finished.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await trio.sleep(2.0)
            cluster.refuse = False  # reconnects within the backoff, then approves
        assert finished and finished[0] < TERM  # well before the lease ran out
        assert reader.stats["approvals"] == 1
        assert await reader.read("f") == b"v2"


async def test_a_write_shared_file_gets_term_zero_and_is_not_cached(nursery, root, autojump_clock):
    cluster = Cluster(nursery, root, term=TERM, skew=SKEW, hot_writes=3)
    await cluster.start()
    async with cluster.client("writer") as writer, cluster.client("reader") as reader:
        for i in range(3):
            await writer.write("hot", b"%d" % i)
        await reader.read("hot")
        await reader.read("hot")
        assert reader.stats["hits"] == 0  # term 0: every read goes to the server
        await trio.sleep(TERM)  # the write rate falls off: cached again
        await reader.read("hot")
        await reader.read("hot")
        assert reader.stats["hits"] == 1


async def test_a_restarted_server_holds_writes_but_not_reads_for_term_plus_skew(
    nursery, root, autojump_clock
):
    first = Cluster(nursery, root, term=TERM, skew=SKEW)
    await first.start()
    await seed(first)
    # the first incarnation "crashes": no clean shutdown is recorded
    second = Cluster(nursery, root, term=TERM, skew=SKEW)
    start = trio.current_time()
    service = await second.start()
    assert service.restart_window == at(TERM + SKEW)
    async with second.client("c") as c:
        assert await c.read("f") == b"v1"
        assert trio.current_time() == at(start)
        await c.write("f", b"v2")
        assert trio.current_time() == at(start + TERM + SKEW)


async def test_a_write_approved_inside_the_restart_window_is_applied_at_its_end(
    nursery, root, autojump_clock
):
    first = Cluster(nursery, root, term=TERM, skew=SKEW)
    await first.start()
    await seed(first)
    second = Cluster(nursery, root, term=TERM, skew=SKEW)  # after a crash: a window
    start = trio.current_time()
    await second.start()
    reader, writer = await second.raw("reader"), await second.raw("writer")
    await trio.sleep(2.0)
    assert isinstance(await reader.read("f"), p.Data)  # a lease that outlives the window
    await writer.send(p.Write(id=1, path="f", data=b"v2"))
    request = await reader.receive()
    assert isinstance(request, p.ApprovalRequest)
    await reader.send(p.Approve(path=request.path, write=request.write))  # nothing else is sent
    assert isinstance(await writer.receive(), p.Written)
    assert trio.current_time() == at(start + TERM + SKEW)


async def test_a_cleanly_stopped_server_needs_no_restart_window(nursery, root, autojump_clock):
    first = Cluster(nursery, root, term=TERM, skew=SKEW)
    service = await first.start()
    await seed(first)
    service.shutdown()  # no live leases: records a clean shutdown
    second = Cluster(nursery, root, term=TERM, skew=SKEW)
    assert (await second.start()).restart_window == 0


async def test_a_server_stopped_with_live_leases_leaves_a_restart_window(
    nursery, root, autojump_clock
):
    first = Cluster(nursery, root, term=TERM, skew=SKEW)
    service = await first.start()
    await seed(first)
    silent = await first.raw("silent")
    await silent.read("f")
    assert service.shutdown() == 1  # a live lease: nothing clean recorded
    second = Cluster(nursery, root, term=TERM, skew=SKEW)
    assert (await second.start()).restart_window == at(TERM + SKEW)


async def test_a_clean_stop_inside_the_restart_window_leaves_the_window_to_the_next_start(
    nursery, root, autojump_clock
):
    first = Cluster(nursery, root, term=TERM, skew=SKEW)
    await first.start()  # then it "crashes": the leases it granted may be live
    second = Cluster(nursery, root, term=TERM, skew=SKEW)
    service = await second.start()
    await trio.sleep(TERM / 2)
    assert service.shutdown() == 0 and not service.stopped_cleanly  # the window is open
    third = Cluster(nursery, root, term=TERM, skew=SKEW)
    assert (await third.start()).restart_window == at(TERM + SKEW)
    await trio.sleep(TERM + SKEW)
    third.service.shutdown()  # type: ignore[union-attr]
    assert third.service.stopped_cleanly  # type: ignore[union-attr]
    fourth = Cluster(nursery, root, term=TERM, skew=SKEW)
    assert (await fourth.start()).restart_window == 0


async def test_a_restart_inside_a_longer_terms_window_passes_that_window_on(
    nursery, root, autojump_clock
):
    """A server with a 30 s term crashes; the next, with a 1 s term, owes its window
    30.1 s and crashes inside it; the third still owes the first one's leases their
    time, whatever the second one's term. Once a window is over, only the term of the
    server that crashed counts."""
    long_term, short_term = 30.0, 1.0
    await Cluster(nursery, root, term=long_term, skew=SKEW).start()  # then "crashes"
    second = await Cluster(nursery, root, term=short_term, skew=SKEW).start()
    assert second.restart_window == at(long_term + SKEW)
    await trio.sleep(short_term)  # then the second crashes, inside its window
    third = await Cluster(nursery, root, term=short_term, skew=SKEW).start()
    assert third.restart_window == at(long_term + SKEW)
    await trio.sleep(long_term + SKEW)  # the third outlives its window, then crashes
    fourth = await Cluster(nursery, root, term=short_term, skew=SKEW).start()
    assert fourth.restart_window == at(short_term + SKEW)


@pytest.mark.parametrize(
    "record",
    [
        b'{"max_term": "x", "skew": 0.1, "clean": false}',
        b'{"max_term": null, "skew": 0.1, "clean": false}',
        b'{"max_term": Infinity, "skew": 0.1, "clean": false}',
        b'{"max_term": -5, "skew": true, "clean": false}',
        b'{"max_term": 1e12, "skew": 0.1, "clean": false}',
        b"[1, 2]",
    ],
)
async def test_a_damaged_incarnation_record_counts_as_a_crash_with_a_bounded_window(
    nursery, root, autojump_clock, record
):
    """A field that is not a number of seconds counts as our own; one past the
    longest term a server takes counts as that (a window past the calendar kept the
    root from ever being served again)."""
    (await Cluster(nursery, root, term=TERM, skew=SKEW).start()).store.save_state(
        INCARNATION_FILE, record
    )
    window = (await Cluster(nursery, root, term=2.0, skew=SKEW).start()).restart_window
    assert window == at(MAX_TERM + SKEW if b"1e12" in record else 2.0 + SKEW)


async def test_a_start_that_fails_leaves_the_record_as_it_found_it(root, autojump_clock):
    settings = ServerSettings(root=str(root), port=0, term=TERM, skew=SKEW)
    async with trio.open_nursery() as nursery:
        service = await nursery.start(serve, settings)
        service.shutdown()  # a clean stop: the next start needs no window
        nursery.cancel_scope.cancel()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = ServerSettings(root=str(root), port=taken.getsockname()[1], term=TERM, skew=SKEW)
        with pytest.raises(BaseExceptionGroup) as failed:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve, busy)
        assert failed.group_contains(FscacheError, match="cannot listen", depth=None)
    async with trio.open_nursery() as nursery:
        service = await nursery.start(serve, settings)
        assert service.restart_window == 0
        nursery.cancel_scope.cancel()


async def test_an_unreadable_incarnation_record_counts_as_a_crash(nursery, root, autojump_clock):
    first = Cluster(nursery, root, term=TERM, skew=SKEW)
    (await first.start()).store.save_state(INCARNATION_FILE, b"{not json")
    second = Cluster(nursery, root, term=2.0, skew=SKEW)
    assert (await second.start()).restart_window == at(2.0 + SKEW)


async def test_the_counters_are_typed_fields_reported_under_their_names(cluster, autojump_clock):
    service = cluster.service
    with pytest.raises(AttributeError):
        service.counters.raeds = 1  # a misspelt counter is an error, not a new key
    await seed(cluster)
    async with cluster.client("reader") as reader:
        await reader.read("f")
        stats = await reader.server_stats()
    assert set(stats) >= {f.name for f in dataclasses.fields(Counters)} | {
        "leases_granted", "leases_active", "approvals_sent", "writes_delayed", "uptime_s",
    }  # fmt: skip
    assert (stats["reads"], stats["writes"], stats["leases_granted"]) == (1, 1, 2)
    assert stats["content_hits"] == service.store.content_hits


async def test_extension_is_batched_with_a_term_or_stale_per_path(cluster, autojump_clock):
    for name in ("a", "b", "c"):
        await seed(cluster, name)
    async with cluster.client("reader") as reader, cluster.client("writer") as writer:
        for name in ("a", "b", "c"):
            await reader.read(name)
        await writer.write("b", b"changed")
        await reader.read("b")  # cached again with the new version
        await writer.relinquish("b")
        cluster.service.store.write("c", b"changed on disk")  # behind the lease's back
        before = (await reader.server_stats())["extend_requests"]
        assert await reader.extend("a", "b", "c") == {"a": True, "b": True, "c": False}
        assert (await reader.server_stats())["extend_requests"] == before + 1
        assert "c" not in reader._cache


async def test_a_reply_to_a_read_sent_before_a_relinquish_is_not_cached(cluster, autojump_clock):
    """The server drops the lease on Relinquish; a grant it made just before must not
    turn into a cache entry the server no longer protects."""
    await seed(cluster)
    async with cluster.client("reader") as reader, cluster.client("writer") as writer:
        cluster.hold("reader")  # the server's replies to reader queue up
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.read, "f")  # granted v1 ... (reply held)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(reader.relinquish, "f")  # ... then relinquished
            await trio.testing.wait_all_tasks_blocked()
            await writer.write("f", b"v2")  # no holder left: applied at once
            cluster.release("reader")
        assert await reader.read("f") == b"v2"


async def test_a_deleted_file_is_gone_from_every_cache_including_the_deleters(
    cluster, autojump_clock
):
    await seed(cluster)
    async with cluster.client("deleter") as deleter, cluster.client("reader") as reader:
        assert await deleter.read("f") == await reader.read("f") == b"v1"
        start = trio.current_time()
        await deleter.delete("f")
        assert trio.current_time() == at(start)  # the reader approved at once
        for client in (deleter, reader):
            with pytest.raises(fscache.NotFound):
                await client.read("f")
        assert cluster.service.table.holders("f", trio.current_time()) == {}


async def test_a_connection_reset_costs_a_reconnect_not_the_client(cluster, autojump_clock):
    """The reader's error may arrive bare or grouped by its nursery: either way the
    client reconnects, re-approves what it missed, and carries on."""
    await seed(cluster)
    async with cluster.client("reader") as reader, cluster.client("writer") as writer:
        assert await reader.read("f") == b"v1"
        cluster.reset("reader")
        await writer.write("f", b"v2")  # its approval request meets the reset
        assert await reader.read("f") == b"v2"
        assert reader.stats["reconnects"] == 1


async def test_a_cancelled_reader_does_not_take_the_readers_sharing_its_miss_down(
    cluster, autojump_clock
):
    """Concurrent misses share one request; if the task that sent it is cancelled, the
    others ask again for themselves rather than receive its Cancelled."""
    await seed(cluster)
    async with cluster.client("reader") as reader:
        cluster.hold("reader")  # the reply stays in flight
        results: list[bytes] = []

        async def impatient() -> None:
            with trio.move_on_after(1.0):
                await reader.read("f")

        async def patient() -> None:
            results.append(await reader.read("f"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(impatient)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(patient)  # joins the impatient reader's request
            await trio.sleep(2.0)  # the impatient one has given up by now
            cluster.release("reader")
        assert results == [b"v1"]
