"""A client's locks and calls around its close, and calls from the wrong trio run
(``docs/design.md``, "Locks and fencing", "Client behaviour").

Test rules: the async tests run under ``autojump_clock`` over memory streams
(``harness.py``). The blocking client and the calls from a second trio run use real
TCP on 127.0.0.1, port 0, with a server in this process; they assert outcomes only,
and their one time limit (10 s) is there to end a call that would hang for ever.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Awaitable, Callable, Iterator

import pytest
import trio
import trio.testing

import fscache
from fscache.client.client import CLOSED
from fscache.server.service import FileService, ServerSettings, serve

from .harness import Cluster
from .test_locks_service import SKEW, TTL

HANG = 10.0  # s: long past any answer here; only a call that hangs reaches it


@pytest.fixture
async def cluster(nursery: trio.Nursery, root: pathlib.Path) -> Cluster:
    cluster = Cluster(nursery, root, skew=SKEW)
    await cluster.start()
    return cluster


@pytest.fixture
async def server(nursery: trio.Nursery, root: pathlib.Path) -> FileService:
    service: FileService = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    return service


@contextlib.contextmanager
def no_cancelled_escapes() -> Iterator[None]:
    """Fail on a ``Cancelled`` that leaves the block: nothing cancels these tests, so
    one is a cancellation that escaped the scope it was meant for (which the test
    runner would otherwise let pass silently)."""
    try:
        yield
    except BaseException as exc:
        group = isinstance(exc, BaseExceptionGroup) and exc.subgroup(trio.Cancelled) is not None
        if isinstance(exc, trio.Cancelled) or group:
            pytest.fail(f"a Cancelled escaped its cancel scope: {exc!r}")
        raise


# ---------------------------------------------------------------- the async client
async def test_a_closed_clients_locks_are_lost_as_its_goodbye_frees_them(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("b") as b:
        async with cluster.client("a") as a:
            lock = await a.acquire("g/l6", TTL)
            assert lock.held and not lock.lost.is_set()
        assert not lock.held and lock.lost.is_set() and lock.ended.is_set()
        with pytest.raises(fscache.LockLost, match="client was closed"):
            lock.raise_if_lost()
        taken = await b.acquire("g/l6", TTL, timeout=0)  # the goodbye released it
        assert taken.token == lock.token + 1
        await lock.release()  # nothing to give back: a no-op
        assert await b.leader("g/l6") == b.client_id


async def test_closing_the_client_in_a_lock_body_raises_lock_lost_not_cancelled(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    ran_on = False
    with no_cancelled_escapes(), pytest.raises(fscache.LockLost, match="client was closed"):
        async with cluster.client("a") as a, a.lock("g/l5", 5) as held:
            await a.aclose()
            assert held.lost.is_set() and not held.held
            await trio.sleep(0.5)  # cancelled: the lock is lost
            ran_on = True
    assert not ran_on
    async with cluster.client("b") as b:
        assert (await b.acquire("g/l5", TTL, timeout=0)).token == 2  # freed by the goodbye


async def test_closing_the_client_cancels_nothing_of_its_caller(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """A close ends the client's own tasks only: the code that closed it runs on, and
    every call from then on says the client is closed."""
    with no_cancelled_escapes():
        await use_then_close(cluster)


async def use_then_close(cluster: Cluster) -> None:
    async with cluster.client("a") as a:
        await a.write("f", b"x")
        await a.aclose()
        await trio.sleep(0.5)  # not cancelled
        with pytest.raises(fscache.FscacheError, match=CLOSED):
            await a.read("f")
        with pytest.raises(fscache.FscacheError, match=CLOSED):
            await a.acquire("l", TTL)
        await a.aclose()  # idempotent


async def test_a_close_ends_waits_in_other_tasks_with_the_client_closed(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """An acquire waiting in line and a leader watch waiting for news, in tasks of the
    client's user, end with the closed client's error once it closes, not hang."""
    errors: dict[str, BaseException] = {}

    async def wait_in_line(client: fscache.Client) -> None:
        try:
            await client.acquire("l", TTL)
        except fscache.FscacheError as exc:
            errors["acquire"] = exc

    async def follow(client: fscache.Client) -> None:
        try:
            async with client.watch_leader("l") as leaders:
                async for _ in leaders:
                    pass
        except fscache.FscacheError as exc:
            errors["watch"] = exc

    with no_cancelled_escapes():
        await close_while_waiting(cluster, wait_in_line, follow)
    assert set(errors) == {"acquire", "watch"}
    for error in errors.values():
        assert type(error) is fscache.FscacheError and str(error) == CLOSED


async def close_while_waiting(
    cluster: Cluster, *waits: Callable[[fscache.Client], Awaitable[None]]
) -> None:
    async with cluster.client("holder") as holder, cluster.client("a") as a:
        await holder.acquire("l", TTL)
        async with trio.open_nursery() as users:
            for wait in waits:
                users.start_soon(wait, a)
            await trio.sleep(1.0)
            await a.aclose()


# ---------------------------------------------------------------- the blocking client
async def test_a_closed_blocking_clients_locks_are_lost(server: FileService) -> None:
    address = f"127.0.0.1:{server.port}"

    def use_it() -> None:
        c = fscache.connect(address)
        lock = c.acquire("g/l6", 30)
        c.close()
        assert (lock.held, lock.lost) == (False, True)
        assert lock.wait_lost(0) is True
        with fscache.connect(address) as other:
            assert other.acquire("g/l6", 30, timeout=0).token == lock.token + 1
            with (
                pytest.raises(fscache.LockLost, match="client was closed"),
                other.lock("g/l7", 30) as inner,
            ):
                other.close()
            assert (inner.held, inner.lost) == (False, True)

    await trio.to_thread.run_sync(use_it)


# ---------------------------------------------------------------- another trio run
async def test_an_async_client_refuses_calls_from_another_trio_run(server: FileService) -> None:
    """Each call that would send a request (or wait on the client's events) from a
    second trio run raises at once, touching nothing; a cache hit, a dict lookup,
    is answered."""
    async with fscache.open_client("127.0.0.1", server.port) as c:
        lock = await c.acquire("t3/l", 30)
        await c.write("t3/cached", b"hit")
        assert await c.read("t3/cached") == b"hit"
        refused: list[str] = []

        async def from_there() -> None:
            calls = {
                "acquire": lambda: c.acquire("t3/m", 5, timeout=0),
                "leader": lambda: c.leader("t3/m"),
                "write": lambda: c.write("t3/f", b"x"),
                "read": lambda: c.read("t3/missing"),
                "release": lock.release,
                "watch_leader": lambda: c.watch_leader("t3/m").__anext__(),
                "aclose": c.aclose,
            }
            with trio.fail_after(HANG):
                for name, call in calls.items():
                    with pytest.raises(fscache.FscacheError, match="belongs to the trio run"):
                        await call()
                    refused.append(name)
                assert await c.read("t3/cached") == b"hit"

        await trio.to_thread.run_sync(trio.run, from_there)
        assert len(refused) == 7
        assert lock.held and not lock.lost.is_set()  # the refused release did nothing
        assert await c.leader("t3/l") == c.client_id
        await lock.release()
        assert await c.leader("t3/l") is None
