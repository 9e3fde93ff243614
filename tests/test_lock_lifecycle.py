"""A client's calls around its close (``docs/design.md``, "Client behaviour").

Test rules: under ``autojump_clock`` over memory streams (``harness.py``).
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

from .harness import Cluster
from .test_locks_service import SKEW, TTL


@pytest.fixture
async def cluster(nursery: trio.Nursery, root: pathlib.Path) -> Cluster:
    cluster = Cluster(nursery, root, skew=SKEW)
    await cluster.start()
    return cluster


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
