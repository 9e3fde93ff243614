"""Watches (``client/watch.py``) and the service registry built on them and on
ephemeral files.

Test rules: watches of files and directories run under ``autojump_clock`` over
memory streams (``harness.py``), so each change is asserted at its exact virtual
instant: at once when an approval request tells the watcher, later only when a lease
has to run out. The registry test uses real processes on 127.0.0.1 (port 0) and a
real clock: it asserts the order of the changes and lower bounds only.
"""

from __future__ import annotations

import contextlib
import pathlib
import signal
import time
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

import fscache
from fscache import Change
from fscache.client.client import Client
from fscache.client.watch import LOOK_AGAIN
from fscache.server.service import FileService, ServerSettings, serve

from . import test_sessions_service
from .harness import Cluster
from .test_faults import Child, child
from .test_sessions_service import SKEW, TERM, TTL, at

cluster = test_sessions_service.cluster  # the fixture: term 10 s, skew 0.1 s, session TTL 7 s


class Seen:
    """What a watch reported, and when (virtual time)."""

    def __init__(self) -> None:
        self.changes: list[tuple[float, Change]] = []
        self.taken = 0  # changes returned by next()
        self.arrived = trio.Event()

    async def collect(self, client: Client, path: str, initial: bool = False) -> None:
        async for change in client.watch(path, initial=initial):
            self.changes.append((trio.current_time(), change))
            self.arrived.set()

    async def next(self, count: int = 1) -> list[tuple[float, Change]]:
        """The next ``count`` changes not yet taken, once they have come."""
        start = self.taken
        with trio.fail_after(100 * TERM):  # virtual time, under the mock clock
            while len(self.changes) < start + count:
                self.arrived = trio.Event()
                await self.arrived.wait()
        self.taken += count
        return self.changes[start : start + count]


@contextlib.asynccontextmanager
async def watching(
    cluster: Cluster, path: str, initial: bool = False
) -> AsyncIterator[tuple[Client, Seen]]:
    seen = Seen()
    async with cluster.client("watcher") as watcher, trio.open_nursery() as nursery:
        nursery.start_soon(seen.collect, watcher, path, initial)
        await trio.testing.wait_all_tasks_blocked()
        yield watcher, seen
        nursery.cancel_scope.cancel()


def kinds(changes: list[tuple[float, Change]]) -> list[tuple[str, str]]:
    return [(change.kind, change.path) for _, change in changes]


async def test_a_file_watch_reports_each_change_at_once(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("writer") as writer:
        v1 = await writer.write("conf/a", b"1")
        async with watching(cluster, "conf/a", initial=True) as (_, seen):
            assert await seen.next() == [(at(0.0), Change("created", "conf/a", v1))]
            await trio.sleep(1.0)
            v2 = await writer.write("conf/a", b"2")
            assert await seen.next() == [(at(1.0), Change("modified", "conf/a", v2))]
            await writer.delete("conf/a")
            assert await seen.next() == [(at(1.0), Change("deleted", "conf/a", None))]
            await trio.sleep(2.0)
            v3 = await writer.write("conf/a", b"3")  # a missing file: its directory is watched
            assert await seen.next() == [(at(3.0), Change("created", "conf/a", v3))]


async def test_a_watch_renews_its_leases_and_sees_a_change_many_terms_later_at_once(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("writer") as writer:
        await writer.write("conf/a", b"1")
        async with watching(cluster, "conf/a") as (_, seen):
            await trio.sleep(5 * TERM + 3.0)
            assert seen.changes == []  # revalidations reported nothing
            assert cluster.service is not None
            stats = cluster.service.stats()
            # the first read, then one not-modified renewal a term; the other looks: cache
            assert (stats["range_reads"], stats["reads_not_modified"]) == (6, 5)
            v2 = await writer.write("conf/a", b"2")
            assert await seen.next() == [(at(5 * TERM + 3.0), Change("modified", "conf/a", v2))]


async def test_a_directory_watch_sees_names_and_its_files_modifications(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("writer") as writer:
        a1 = await writer.write("svc/a", b"1")
        await writer.mkdir("svc/sub")
        async with watching(cluster, "svc", initial=True) as (_, seen):
            first = await seen.next(2)
            assert kinds(first) == [("created", "svc/a"), ("created", "svc/sub")]
            assert first[0][1].version == a1
            b1 = await writer.write("svc/b", b"1")
            assert await seen.next() == [(at(0.0), Change("created", "svc/b", b1))]
            a2 = await writer.write("svc/a", b"2")  # no name changes: the file's own lease
            assert await seen.next() == [(at(0.0), Change("modified", "svc/a", a2))]
            await writer.rename("svc/b", "svc/c")
            moved = await seen.next(2)
            assert kinds(moved) == [("created", "svc/c"), ("deleted", "svc/b")] or kinds(moved) == [
                ("deleted", "svc/b"),
                ("created", "svc/c"),
            ]
            await writer.write("svc/sub/deep", b"x")  # below a subdirectory: not reported
            await trio.sleep(2 * TERM)
            assert len(seen.changes) == 6


async def test_the_root_is_watched_as_a_directory(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("writer") as writer, watching(cluster, "") as (_, seen):
        version = await writer.write("top", b"1")
        assert await seen.next() == [(at(0.0), Change("created", "top", version))]


async def test_after_a_gap_the_watcher_reports_the_last_state(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """Cut off, the watcher hears no approval request; the writes wait out its leases
    and go on. Back, it reports what changed meanwhile, intermediate versions folded."""
    async with cluster.client("writer") as writer:
        await writer.write("svc/a", b"1")
        await writer.write("svc/b", b"1")
        async with watching(cluster, "svc") as (_, seen):
            cluster.refuse = True
            await cluster.cut("watcher")
            for n in range(3):
                await writer.write("svc/a", b"%d" % (n + 2))
            last = await writer.write("svc/a", b"last")
            await writer.delete("svc/b")
            created = await writer.write("svc/c", b"1")
            assert seen.changes == []
            cluster.refuse = False
            changes = await seen.next(3)
            assert [c for _, c in changes] == [
                Change("modified", "svc/a", last),
                Change("deleted", "svc/b", None),
                Change("created", "svc/c", created),
            ]


async def test_a_registration_comes_back_after_its_session_expired(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The client is cut off past its session's TTL: the server deletes its ephemeral
    file; when the client is back with a new session it writes the file again."""
    async with cluster.client("reg") as reg, watching(cluster, "svc") as (_, seen):
        await reg.write("svc/n1", b"10.0.0.5:8080", ephemeral=True)
        assert kinds(await seen.next()) == [("created", "svc/n1")]
        cluster.refuse = True
        await cluster.cut("reg")
        assert kinds(await seen.next()) == [("deleted", "svc/n1")]
        assert trio.current_time() >= TTL
        cluster.refuse = False
        assert kinds(await seen.next()) == [("created", "svc/n1")]
        assert (root / "svc/n1").read_bytes() == b"10.0.0.5:8080"
        await reg.write("svc/n1", b"durable")  # forgotten: not written again
        assert kinds(await seen.next()) == [("modified", "svc/n1")]
        assert reg._ephemeral == {}


# ---------------------------------------------------------------- the registry, for real
REGISTRANT = """
import sys, trio, fscache

async def main(port, path):
    async with fscache.open_client("127.0.0.1", port) as c:
        await c.write(path, b"127.0.0.1:" + path.encode(), ephemeral=True)
        print("registered", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # until told to go (goodbye)

trio.run(main, int(sys.argv[1]), sys.argv[2])
"""


@contextlib.asynccontextmanager
async def registrant(port: int, path: str) -> AsyncIterator[Child]:
    """A process that registers ``path`` and stays until told to go (a goodbye)."""
    async with child("-c", REGISTRANT, str(port), path) as proc:
        assert await proc.readline() == "registered"
        yield proc


@pytest.mark.slow
async def test_a_service_registry_sees_a_killed_member_go_after_the_ttl(
    nursery: trio.Nursery, root: pathlib.Path
) -> None:
    ttl = 3.0
    settings = ServerSettings(root=str(root), port=0, term=1.0, skew=0.1, session_ttl=ttl)
    server: FileService = await nursery.start(serve, settings)
    async with fscache.open_client("127.0.0.1", server.port) as c:
        await c.mkdir("services")
        await c.mkdir("services/api")
        seen = Seen()
        nursery.start_soon(seen.collect, c, "services/api")
        async with (
            registrant(server.port, "services/api/killed") as killed,
            registrant(server.port, "services/api/leaving") as leaving,
        ):
            with trio.fail_after(30):
                assert sorted(kinds(await seen.next(2))) == [
                    ("created", "services/api/killed"),
                    ("created", "services/api/leaving"),
                ]
            assert await c.listdir("services/api") == ["killed", "leaving"]
            killed.process.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await killed.process.wait()
            await leaving.send_line("go")
            assert await leaving.process.wait() == 0
            with trio.fail_after(30):
                first, second = (change for _, change in await seen.next(2))
            deleted_at = time.monotonic()
        assert first == Change("deleted", "services/api/leaving", None)  # its goodbye: at once
        assert second == Change("deleted", "services/api/killed", None)  # its TTL
        assert deleted_at - killed_at >= ttl
        assert await c.listdir("services/api") == []


async def test_a_write_shared_file_without_leases_is_looked_at_every_second(
    nursery: trio.Nursery, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    shared = Cluster(nursery, root, term=TERM, skew=SKEW, hot_writes=2)
    await shared.start()
    async with shared.client("writer") as writer:
        for n in range(2):
            await writer.write("hot", b"%d" % n)  # written twice in a term: term 0
        async with watching(shared, "hot") as (watcher, seen):
            assert watcher.lease_remaining("hot") == 0.0
            await trio.sleep(0.5)
            version = await writer.write("hot", b"new")
            ((when, change),) = await seen.next()
            assert change == Change("modified", "hot", version)
            assert 0.5 < when <= 0.5 + LOOK_AGAIN


async def test_the_watching_clients_own_writes_are_seen_within_a_second(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The writer is never asked to approve its own write: the watcher finds it when
    it looks again, as for a key it holds no lease on."""
    async with watching(cluster, "svc") as (watcher, seen):
        version = await watcher.write("svc/mine", b"1")
        ((when, change),) = await seen.next()
        assert change == Change("created", "svc/mine", version)
        assert 0.0 < when <= LOOK_AGAIN


async def test_a_registration_overwritten_by_another_session_is_not_written_again(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("reg") as reg, cluster.client("other") as other:
        await reg.write("svc/n1", b"mine", ephemeral=True)
        cluster.refuse = True
        await cluster.cut("reg")
        await other.write("svc/n1", b"theirs")  # untied: it outlives reg's session
        await trio.sleep(TERM + SKEW)  # reg's session has expired
        cluster.refuse = False
        with trio.fail_after(TERM):
            while reg._ephemeral:  # forgotten once its compare-and-set fails
                await trio.sleep(0.1)
        assert (root / "svc/n1").read_bytes() == b"theirs"


async def test_a_watch_ends_with_an_error_when_its_client_closes(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    ended: list[tuple[float, str]] = []

    async def run(client: Client) -> None:
        with pytest.raises(fscache.FscacheError) as error:
            async for _ in client.watch("svc"):
                pass
        ended.append((trio.current_time(), str(error.value)))

    async with trio.open_nursery() as nursery, cluster.client("watcher") as watcher:
        nursery.start_soon(run, watcher)
        await trio.sleep(2.0)
    ((when, error),) = ended
    assert error == "client is closed" and 2.0 <= when <= 2.0 + LOOK_AGAIN


def test_the_blocking_client_registers_and_watches(tmp_path: pathlib.Path) -> None:
    from fscache.bench.harness import fscache_server

    with fscache_server(str(tmp_path), term=TERM) as server:
        address = f"127.0.0.1:{server.port}"
        with fscache.connect(address) as watcher:
            member = fscache.connect(address)
            member.write("services/api/n1", b"10.0.0.5:8080", ephemeral=True)
            changes = watcher.watch("services/api", initial=True)
            assert next(changes) == Change("created", "services/api/n1", member.stat(
                "services/api/n1").version)  # fmt: skip
            member.close()  # a goodbye: its ephemeral file goes at once
            assert next(changes) == Change("deleted", "services/api/n1", None)
            changes.close()
            assert watcher.listdir("services/api") == []


def readme_example(marker: str) -> str:
    """The README's Python block that holds ``marker``."""
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    blocks = [block.split("```", 1)[0] for block in readme.split("```python\n")[1:]]
    (block,) = [block for block in blocks if marker in block]
    return block


async def test_the_readmes_registry_watcher_may_start_before_any_member(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """The README's example as written, but on the test's cluster: its watcher starts
    while ``services/api`` does not exist yet."""
    code = readme_example("async def watcher()")
    clients = iter(["watcher", "member"])
    code = code.replace('fscache.open_client("127.0.0.1", 7710)', "cluster.client(next(clients))")
    printed: list[tuple[float, str]] = []
    scope: dict[str, object] = {
        "cluster": cluster,
        "clients": clients,
        "print": lambda *args: printed.append((trio.current_time(), " ".join(map(str, args)))),
    }
    exec(code, scope)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(scope["watcher"])  # type: ignore[arg-type]
        await trio.sleep(1.0)
        async with trio.open_nursery() as members:
            members.start_soon(scope["member"])  # type: ignore[arg-type]
            await trio.sleep(1.0)
            members.cancel_scope.cancel()  # the member goes: its goodbye deletes it
        await trio.sleep(TERM + 1.0)
        nursery.cancel_scope.cancel()
    (created_at, created), (deleted_at, deleted) = printed
    assert (created_at, created) == (at(1.0), "created services/api/node-1")
    assert deleted == "deleted services/api/node-1" and 2.0 <= deleted_at <= 2.0 + TERM + SKEW
