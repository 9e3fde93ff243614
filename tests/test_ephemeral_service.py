"""Ephemeral files in the running service (``docs/design.md``, "Ephemeral files and
watches").

Test rules: the service runs under ``autojump_clock`` over memory streams
(``harness.py``, writes applied without a worker thread), so every delete is
asserted at its exact virtual instant; raw peers stand for holders that crash or
hold leases.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import time

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.server.ephemeral import TIE_PREFIX
from fscache.server.service import FileService
from fscache.settings import CHUNK_SIZE

from . import test_sessions_service
from .harness import Cluster, RawPeer, run_inline
from .test_faults import server_process
from .test_sessions_service import SKEW, TERM, TTL, at

cluster = test_sessions_service.cluster  # the fixture: term 10 s, skew 0.1 s, session TTL 7 s


def ties_on_disk(root: pathlib.Path) -> list[str]:
    return [n.name for n in (root / ".fscache").iterdir() if n.name.startswith(TIE_PREFIX)]


async def deleted_at(file: pathlib.Path, instant: float) -> None:
    """``file`` is there until ``instant`` (virtual time) and gone just after."""
    await trio.sleep_until(instant - 0.001)
    assert file.exists()
    await trio.sleep(0.002)
    assert not file.exists()


async def register(peer: RawPeer, path: str, data: bytes = b"addr", request_id: int = 1) -> None:
    await peer.send(p.Write(id=request_id, path=path, data=data, ephemeral=True))
    assert isinstance(await peer.receive(), p.Written)


async def wait_for_approval(peer: RawPeer, path: str) -> p.ApprovalRequest:
    request = await peer.receive()
    assert isinstance(request, p.ApprovalRequest) and request.path == path, request
    return request


async def test_a_goodbye_deletes_the_sessions_files_at_once(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("reg") as reg:
        await reg.write("svc/n1", b"10.0.0.5:8080", ephemeral=True)
        await reg.write("svc/plain", b"stays")
        assert (root / "svc/n1").read_bytes() == b"10.0.0.5:8080"
        assert len(ties_on_disk(root)) == 1
    await trio.sleep(0)  # the server sees the goodbye
    await trio.testing.wait_all_tasks_blocked()
    assert not (root / "svc/n1").exists()
    assert (root / "svc/plain").exists() and (root / "svc").is_dir()  # only the files go
    assert ties_on_disk(root) == []
    assert cluster.service is not None
    stats = cluster.service.stats()
    assert (stats["ephemeral_files"], stats["ephemeral_deleted"]) == (0, 1)
    assert trio.current_time() == at(0.0)


async def test_a_detached_session_loses_its_files_at_its_ttl_after_readers_approve(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    owner = await cluster.raw("owner")
    await register(owner, "svc/n1")
    await owner.send(p.Relinquish(id=2, paths=["svc/n1"]))  # else its own lease is waited out
    assert await owner.receive() == p.Done(id=2)
    reader = await cluster.raw("reader")
    assert isinstance(await reader.read("svc/n1"), p.Data)
    await reader.send(p.ScanDir(id=2, path="svc"))
    assert isinstance(await reader.receive(), p.Entries)
    await owner.close()  # crashed: no goodbye
    cut_at = trio.current_time()

    request = await wait_for_approval(reader, "svc/n1")
    assert trio.current_time() == at(cut_at + TTL)
    assert (root / "svc/n1").exists()  # asked first, then deleted
    await reader.send(p.Approve(path="svc/n1", write=request.write))
    listing = await wait_for_approval(reader, "svc/")
    await reader.send(p.Approve(path="svc/", write=listing.write))
    await trio.testing.wait_all_tasks_blocked()
    assert not (root / "svc/n1").exists()
    assert trio.current_time() == at(cut_at + TTL)


async def test_a_silent_holder_loses_its_files_a_ttl_after_its_last_message(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A client hung, or cut off without its connection closing: connected, silent.
    The server cuts it once silent for the TTL (a look every quarter TTL) and detaches
    its session as of its last message: its files go as a dead client's would."""
    owner = await cluster.raw("owner")
    await register(owner, "svc/n1")
    await owner.send(p.Relinquish(id=2, paths=["svc/n1"]))  # else its own lease is waited out
    assert await owner.receive() == p.Done(id=2)
    last = trio.current_time()  # from here on it sends nothing, and stays connected

    await trio.sleep_until(last + TTL - 0.001)
    assert (root / "svc/n1").exists()
    with trio.fail_after(3 * TTL):
        while (root / "svc/n1").exists():
            await trio.sleep(0.01)
    assert last + TTL <= trio.current_time() <= last + TTL + TTL / 4 + 0.01
    assert await owner.receive() is None  # it was cut


async def test_a_live_client_keeps_its_files_however_long_it_is_idle(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Its keep-alive pings every third of the session TTL while it holds ephemeral
    files; a client that holds none sends nothing while idle."""
    assert cluster.service is not None
    async with cluster.client("reg") as reg, cluster.client("idle") as idle:
        await idle.write("plain", b"x")
        await reg.write("svc/n1", b"addr", ephemeral=True)
        await trio.sleep(10 * TTL)
        assert (root / "svc/n1").exists()
        assert reg.stats["reconnects"] == 0
        pings = cluster.service.stats()["pings"]
        assert 3 * 10 - 2 <= pings <= 3 * 10 + 2  # the registrar's, every TTL / 3
        await reg.delete("svc/n1")  # none held any more: the pings stop
        await trio.sleep(10 * TTL)
        assert cluster.service.stats()["pings"] <= pings + 1


async def test_a_crashed_writers_own_lease_is_waited_out_too(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A session that expires keeps its leases until they run out (it may be alive
    behind a partition): its files go at the later of its expiry and its lease's end."""
    owner = await cluster.raw("owner")
    await register(owner, "svc/n1")
    await owner.close()
    await deleted_at(root / "svc/n1", TERM + SKEW)


async def test_a_silent_reader_is_waited_out_before_the_delete(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    owner = await cluster.raw("owner")
    await register(owner, "svc/n1")
    reader = await cluster.raw("reader")
    await trio.sleep(TTL - 1.0)
    assert isinstance(await reader.read("svc/n1"), p.Data)
    granted_at = trio.current_time()
    await owner.send(p.Goodbye())
    await wait_for_approval(reader, "svc/n1")  # and never answered
    await deleted_at(root / "svc/n1", granted_at + TERM + SKEW)


@pytest.mark.parametrize("how", ["truncate", "range", "delete-then-plain"])
async def test_a_truncate_ranged_write_or_delete_by_the_same_session_unties(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock, how: str
) -> None:
    async with cluster.client("reg") as reg:
        await reg.write("f", b"abc", ephemeral=True)
        if how == "truncate":
            await reg.truncate("f", 1)
        elif how == "range":
            await reg.write("f", b"Z", offset=1)
        else:
            await reg.delete("f")
            await reg.write("f", b"new")
    await trio.testing.wait_all_tasks_blocked()
    assert (root / "f").exists()
    assert ties_on_disk(root) == []


@pytest.mark.parametrize("ephemeral", [False, True])
async def test_a_write_by_another_session_unties_or_reties_the_file(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock, ephemeral: bool
) -> None:
    async with cluster.client("other") as other:
        async with cluster.client("reg") as reg:
            await reg.write("leader", b"reg", ephemeral=True)
            await other.write("leader", b"other", ephemeral=ephemeral)
        await trio.testing.wait_all_tasks_blocked()
        assert (root / "leader").read_bytes() == b"other"  # reg's end deleted nothing
        assert len(ties_on_disk(root)) == ephemeral
    await trio.testing.wait_all_tasks_blocked()
    assert (root / "leader").exists() != ephemeral  # re-tied: gone with the other's session


async def test_a_rename_moves_the_tie_with_the_file(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("reg") as reg:
        await reg.write("tmp/n1", b"addr", ephemeral=True)
        await reg.mkdir("svc")
        await reg.rename("tmp/n1", "svc/n1")
        await reg.rename("tmp", "old")  # nothing tied below: nothing moves
        assert service_ties(cluster) == {"svc/n1": reg.session_id}
        assert reg._ephemeral == {"svc/n1": b"addr"}  # what it would write again
    await trio.testing.wait_all_tasks_blocked()
    assert not (root / "svc/n1").exists() and (root / "svc").is_dir()
    assert ties_on_disk(root) == []


async def test_a_delete_queued_behind_an_untying_write_deletes_nothing(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The untying write arrives first (it waits for a reader), the session then
    ends: the delete, queued behind it, finds the file untied and leaves it."""
    owner = await cluster.raw("owner")
    await register(owner, "f")
    reader = await cluster.raw("reader")
    assert isinstance(await reader.read("f"), p.Data)
    async with cluster.client("writer") as writer, trio.open_nursery() as nursery:
        nursery.start_soon(writer.write, "f", b"durable")
        request = await wait_for_approval(reader, "f")
        await owner.send(p.Goodbye())
        await trio.testing.wait_all_tasks_blocked()
        await reader.send(p.Approve(path="f", write=request.write))
    await trio.testing.wait_all_tasks_blocked()
    assert (root / "f").read_bytes() == b"durable"
    assert ties_on_disk(root) == []


async def test_a_restart_deletes_the_earlier_incarnations_files_after_its_window(
    nursery: trio.Nursery, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    first = Cluster(nursery, root, term=TERM, skew=SKEW, session_ttl=TTL)
    await first.start()
    owner = await first.raw("owner")
    await register(owner, "svc/n1")
    assert len(ties_on_disk(root)) == 1

    # a new incarnation on the same root, the first never stopped cleanly
    second = FileService(first.settings, blocking_io=run_inline)
    started = trio.current_time()
    await nursery.start(second.run_engine)
    assert second.restart_window == at(TERM + SKEW)
    await deleted_at(root / "svc/n1", started + TERM + SKEW)
    assert ties_on_disk(root) == []


def service_ties(cluster: Cluster) -> dict[str, str]:
    assert cluster.service is not None
    return dict(cluster.service.ephemeral.table.ties())


async def test_an_ephemeral_write_applied_after_its_session_ended_is_deleted_then(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("seed") as seed:
        await seed.write("svc/n1", b"old")
    reader = await cluster.raw("reader")
    assert isinstance(await reader.read("svc/n1"), p.Data)
    owner = await cluster.raw("owner")
    await owner.send(p.Write(id=1, path="svc/n1", data=b"new", ephemeral=True))
    request = await wait_for_approval(reader, "svc/n1")
    await owner.send(p.Goodbye())  # the write still waits for the reader
    await trio.sleep(1.0)
    assert (root / "svc/n1").read_bytes() == b"old"
    await reader.send(p.Approve(path="svc/n1", write=request.write))
    await trio.testing.wait_all_tasks_blocked()
    assert not (root / "svc/n1").exists()  # written, tied to an ended session: deleted
    assert ties_on_disk(root) == []
    assert trio.current_time() == at(1.0)


# ---------------------------------------------------------------- a real restart
@pytest.mark.slow
async def test_a_server_killed_and_restarted_deletes_the_files_of_sessions_it_cannot_know(
    root: pathlib.Path,
) -> None:
    """Real processes and a real clock: order and lower bounds only. One client
    stays through the restart and writes its registration again in its new session;
    the other is gone, and its file goes once the restart window is over."""
    term = skew = 0.5
    async with (
        server_process(root, term=term, skew=skew) as first,
        fscache.open_client("127.0.0.1", first.port) as staying,
    ):
        await staying.write("svc/staying", b"a", ephemeral=True)
        old_session = staying.session_id
        async with fscache.open_client("127.0.0.1", first.port) as gone:
            await gone.write("svc/gone", b"b", ephemeral=True)
            await first.child.kill()  # SIGKILL, with both sessions open
        async with server_process(root, port=first.port, term=term, skew=skew) as second:
            with trio.fail_after(30):
                while (root / "svc/gone").exists():
                    await trio.sleep(0.05)
            assert time.monotonic() - second.spawned_at >= term + skew  # the restart window
            with trio.fail_after(30):  # written again, tied to the client's new session
                while tie_sessions(root) != {"svc/staying": staying.session_id}:
                    await trio.sleep(0.05)
            assert staying.session_id != old_session
            assert await staying.read("svc/staying") == b"a"


def tie_sessions(root: pathlib.Path) -> dict[str, str]:
    ties = {}
    for name in ties_on_disk(root):
        with contextlib.suppress(FileNotFoundError, ValueError):
            record = json.loads((root / ".fscache" / name).read_bytes())
            ties[record["path"]] = record["session"]
    return ties


async def test_a_streamed_ephemeral_write_is_tied_like_a_whole_one(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    big = b"x" * (CHUNK_SIZE + 1)
    async with cluster.client("reg") as reg:
        await reg.mkdir("svc")  # an upload's directory must exist
        await reg.write("svc/big", big, ephemeral=True)  # an upload, committed ephemeral
        assert service_ties(cluster) == {"svc/big": reg.session_id}
        await reg.write("svc/big", io.BytesIO(big), ephemeral=True)  # a file: the same
        assert service_ties(cluster) == {"svc/big": reg.session_id}
    await trio.testing.wait_all_tasks_blocked()
    assert not (root / "svc/big").exists()


async def test_a_change_that_fails_leaves_the_ties_as_they_were(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("reg") as reg:
        with pytest.raises(fscache.Conflict):
            await reg.write("f", b"x", ephemeral=True, if_version=12345)
        assert ties_on_disk(root) == [] and service_ties(cluster) == {}
        version = await reg.write("g", b"x", ephemeral=True)
        with pytest.raises(fscache.Conflict):
            await reg.write("g", b"plain", if_version=version + 1)  # would untie
        with pytest.raises(fscache.NotFound):
            await reg.rename("missing", "g")  # would replace it and its tie
        assert tie_sessions(root) == service_ties(cluster) == {"g": reg.session_id}
        assert reg._ephemeral == {"g": b"x"}
