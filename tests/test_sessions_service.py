"""Sessions in the running service (``docs/design.md``, "Sessions").

Test rules: timing runs under ``autojump_clock`` over memory streams (``harness.py``),
so expiry is asserted at its exact virtual instant; TLS identities and the two client
processes that share a label use real sockets on 127.0.0.1, port 0, and assert
outcomes and order only.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.cli import parse_serving_line
from fscache.client import client as client_module
from fscache.client.client import Client
from fscache.leases import HolderId
from fscache.server.service import FileService, ServerSettings, serve
from fscache.tls import client_context, make_certs

from .harness import Cluster, RawPeer

TERM = 10.0
SKEW = 0.1
TTL = 7.0


def at(value: float) -> object:
    return pytest.approx(value, abs=1e-9)


@pytest.fixture
async def cluster(nursery: trio.Nursery, root: pathlib.Path) -> Cluster:
    cluster = Cluster(nursery, root, term=TERM, skew=SKEW, session_ttl=TTL)
    await cluster.start()
    return cluster


def service_of(cluster: Cluster) -> FileService:
    assert cluster.service is not None
    return cluster.service


@contextlib.asynccontextmanager
async def labelled(cluster: Cluster, link: str, label: str) -> AsyncIterator[Client]:
    """A caching client called ``label`` on its own link ``link``."""
    async with fscache.open_client(
        client_id=label, opener=cluster.opener(link), clock=trio.current_time
    ) as client:
        yield client


async def hello(
    peer: RawPeer, label: str, session: str | None = None, secret: bytes | None = None
) -> p.Message | None:
    await peer.send(p.Hello(p.PROTOCOL_VERSION, label, session=session, secret=secret))
    return await peer.receive()


async def raw(cluster: Cluster, link: str, label: str, **resume: Any) -> tuple[RawPeer, p.Welcome]:
    peer = RawPeer(cluster._connect(link))
    welcome = await hello(peer, label, **resume)
    assert isinstance(welcome, p.Welcome), welcome
    return peer, welcome


async def seed(cluster: Cluster, path: str = "f", data: bytes = b"v1") -> None:
    async with labelled(cluster, "seeder", "seeder") as c:
        await c.write(path, data)


async def next_push(peer: RawPeer) -> p.Message | None:
    """The next frame the server sends ``peer`` after whatever is already queued:
    a ping's answer marks the end."""
    await peer.send(p.Ping(id=999))
    return await peer.receive()


# ---------------------------------------------------------------- labels are labels
async def test_two_clients_with_one_label_work_side_by_side(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with labelled(cluster, "one", "web") as one, labelled(cluster, "two", "web") as two:
        assert one.session_id != two.session_id
        for i in range(5):
            await one.write("a", b"one %d" % i)
            await two.write("b", b"two %d" % i)
            assert await two.read("a") == b"one %d" % i
            assert await one.read("b") == b"two %d" % i
        assert one.stats["reconnects"] == two.stats["reconnects"] == 0
        assert one.stats["unavailable"] == two.stats["unavailable"] == 0
        assert service_of(cluster).stats()["connections"] == 2  # both, side by side
    assert trio.current_time() == at(0.0)  # every approval came at once: no wait


async def test_a_newcomer_with_a_known_label_gets_its_own_session_and_no_approvals(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    """A silent holder called "web" and a newcomer who calls itself "web" too: the
    newcomer is asked for nothing, and its approval (of a write id it guessed) does not
    count: the write waits out the holder's lease to the exact instant."""
    await seed(cluster)
    victim, victims = await raw(cluster, "victim", "web")
    granted_at = trio.current_time()
    assert isinstance(await victim.read("f"), p.Data)
    newcomer, its = await raw(cluster, "newcomer", "web")
    assert its.session != victims.session and not its.resumed

    async with labelled(cluster, "writer", "writer") as writer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.write, "f", b"v2")
            request = await victim.receive()
            assert isinstance(request, p.ApprovalRequest) and request.path == "f"
            await newcomer.send(p.Approve(path="f", write=request.write))
            await newcomer.send(p.Relinquish(id=1, paths=["f"]))
            assert await newcomer.receive() == p.Done(id=1)
        assert trio.current_time() == at(granted_at + TERM + SKEW)
    assert await next_push(newcomer) == p.Done(id=999)  # no approval request came to it


# ---------------------------------------------------------------- resuming
async def test_a_resume_keeps_the_leases_and_gets_the_approval_requests_again(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    await seed(cluster)
    holder, welcome = await raw(cluster, "holder", "h")
    assert isinstance(await holder.read("f"), p.Data)
    await holder.close()  # cut off, no goodbye
    await trio.sleep(1.0)

    async with labelled(cluster, "writer", "writer") as writer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.write, "f", b"v2")
            await trio.sleep(2.0)  # the write waits for the holder's lease
            back, again = await raw(
                cluster, "holder", "h", session=welcome.session, secret=welcome.secret
            )
            assert (again.session, again.secret, again.resumed) == (
                welcome.session, welcome.secret, True,
            )  # fmt: skip
            request = await back.receive()
            assert isinstance(request, p.ApprovalRequest) and request.path == "f"
            approved_at = trio.current_time()
            await back.send(p.Approve(path="f", write=request.write))
        assert trio.current_time() == at(approved_at)  # applied on the approval
    assert approved_at == at(3.0)


async def test_a_resume_closes_the_sessions_old_half_open_connection(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    old, welcome = await raw(cluster, "old", "h")

    new, again = await raw(cluster, "new", "h", session=welcome.session, secret=welcome.secret)

    assert again.resumed and again.session == welcome.session
    assert await old.receive() is None  # closed by the server
    assert await next_push(new) == p.Done(id=999)
    service = service_of(cluster)
    assert service.sessions.is_attached(HolderId(welcome.session))
    assert list(service.connections) == [welcome.session]


async def test_a_wrong_secret_is_refused_and_the_session_is_untouched(
    cluster: Cluster, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await seed(cluster)
    owner, welcome = await raw(cluster, "owner", "h")
    assert isinstance(await owner.read("f"), p.Data)
    wrong = bytes(b ^ 1 for b in welcome.secret)

    thief = RawPeer(cluster._connect("thief"))
    refused = await hello(thief, "h", session=welcome.session, secret=wrong)

    assert isinstance(refused, p.Error) and refused.code == "unauthorized"
    assert "wrong secret" in refused.message
    assert await thief.receive() is None
    async with labelled(cluster, "writer", "writer") as writer, trio.open_nursery() as nursery:
        nursery.start_soon(writer.write, "f", b"v2")
        request = await owner.receive()  # the owner's connection is still the one
        assert isinstance(request, p.ApprovalRequest)
        await owner.send(p.Approve(path="f", write=request.write))
    assert trio.current_time() == at(0.0)
    stats = service_of(cluster).stats()
    for secret in (welcome.secret, wrong):
        for text in (caplog.text, refused.message, repr(stats)):
            assert secret.hex() not in text and repr(secret) not in text


async def test_a_resume_must_name_a_secret_with_its_session(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    _, welcome = await raw(cluster, "owner", "h")
    peer = RawPeer(cluster._connect("half"))

    refused = await hello(peer, "h", session=welcome.session)

    assert isinstance(refused, p.Error) and refused.code == "protocol"


async def test_a_version_1_hello_is_refused_naming_both_versions(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    peer = RawPeer(cluster._connect("old"))
    await peer.send(p.Hello(version=1, client_id="old"))

    refused = await peer.receive()

    assert isinstance(refused, p.Error) and refused.code == "protocol"
    assert "version 1" in refused.message and "speaks 2" in refused.message
    assert await peer.receive() is None


# ---------------------------------------------------------------- expiry
async def test_a_detached_session_expires_at_exactly_detach_plus_ttl(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    service = service_of(cluster)
    peer, welcome = await raw(cluster, "h", "h")
    session = HolderId(welcome.session)
    await trio.sleep(2.0)
    await peer.close()
    await trio.testing.wait_all_tasks_blocked()
    assert service.sessions.expires(session) == at(2.0 + TTL)

    await trio.sleep_until(2.0 + TTL - 0.001)
    assert session in service.sessions
    await trio.sleep_until(2.0 + TTL)
    await trio.testing.wait_all_tasks_blocked()
    assert session not in service.sessions

    _, after = await raw(cluster, "h", "h", session=welcome.session, secret=welcome.secret)
    assert not after.resumed and after.session != welcome.session


async def test_a_goodbye_ends_the_session_at_once(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with labelled(cluster, "c", "c") as client:
        await client.write("f", b"v1")
        session = client.session_id
        assert session is not None and HolderId(session) in service_of(cluster).sessions
    await trio.testing.wait_all_tasks_blocked()
    assert HolderId(session) not in service_of(cluster).sessions


async def test_a_client_resumes_its_session_after_a_cut(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    await seed(cluster)
    async with labelled(cluster, "c", "c") as client:
        session = client.session_id
        assert await client.read("f") == b"v1"
        await cluster.cut("c")
        await trio.sleep(1.0)

        assert await client.read("f") == b"v1"  # the cache, meanwhile
        async with labelled(cluster, "writer", "writer") as writer:
            await writer.write("f", b"v2")  # approved by the resumed session
        assert trio.current_time() < TERM
        assert client.session_id == session and client.stats["reconnects"] == 1
        assert await client.read("f") == b"v2"


async def test_a_client_whose_session_expired_gets_a_new_one_and_keeps_its_cache_to_expiry(
    cluster: Cluster, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut off for longer than the session's TTL: the client comes back in a new
    session; its entry stays trusted to its own expiry and no longer, as after a
    server restart; a writer waits out the old session's lease."""
    # Back within a second of the server's return, so before the entry's expiry (the
    # default cap of 4 s could take it past TERM - SKEW, and the hit would be a miss).
    monkeypatch.setattr(client_module, "BACKOFF_MAX", 1.0)
    await seed(cluster)
    async with labelled(cluster, "c", "c") as client:
        sent = trio.current_time()
        assert await client.read("f") == b"v1"
        old_session = client.session_id
        cluster.refuse = True
        await cluster.cut("c")
        await trio.sleep(TTL + 1.0)
        cluster.refuse = False
        with trio.fail_after(5):
            while not client.connected:
                await trio.sleep(0.1)

        assert client.session_id != old_session
        misses = client.stats["misses"]
        assert await client.read("f") == b"v1" and client.stats["misses"] == misses  # a hit
        await trio.sleep_until(sent + TERM - SKEW)
        assert await client.read("f") == b"v1" and client.stats["misses"] == misses + 1


async def test_a_client_refused_its_session_opens_a_new_one(
    cluster: Cluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with labelled(cluster, "c", "c") as client:
        await client.write("f", b"v1")
        session = client.session_id
        assert session is not None
        client._session = (session, b"not the secret")  # as a client that lost its own
        await cluster.cut("c")

        with trio.fail_after(5):
            while client.session_id in (None, session) or not client.connected:
                await trio.sleep(0.01)

        assert await client.read("f") == b"v1"
        stats = service_of(cluster).stats()
        assert stats["sessions_refused"] == 1 and HolderId(session) in service_of(cluster).sessions


# ---------------------------------------------------------------- mutual TLS
@pytest.fixture
def tls(tmp_path: pathlib.Path) -> pathlib.Path:
    make_certs(tmp_path / "tls", clients=["alice", "bob"])
    return tmp_path / "tls"


async def test_only_the_certificate_that_opened_a_session_can_resume_it(
    nursery: trio.Nursery, root: pathlib.Path, tls: pathlib.Path
) -> None:
    settings = ServerSettings(root=str(root), port=0, tls_dir=str(tls / "server"))
    server: FileService = await nursery.start(serve, settings)

    async def peer(name: str) -> RawPeer:
        ctx = client_context(tls / "clients" / name)
        return RawPeer(
            await trio.open_ssl_over_tcp_stream("127.0.0.1", server.port, ssl_context=ctx)
        )

    alice = await peer("alice")
    welcome = await hello(alice, "a")
    assert isinstance(welcome, p.Welcome)
    await alice.close()

    bob = await peer("bob")
    refused = await hello(bob, "a", session=welcome.session, secret=welcome.secret)
    assert isinstance(refused, p.Error) and refused.code == "unauthorized"
    assert "another identity" in refused.message
    await bob.close()

    alice_again = await peer("alice")
    again = await hello(alice_again, "a", session=welcome.session, secret=welcome.secret)
    assert isinstance(again, p.Welcome) and again.resumed and again.session == welcome.session
    await alice_again.close()


# ---------------------------------------------------------------- two processes, one label
WORKER = """
import sys, trio, fscache

async def main(port, me, other):
    async with fscache.open_client("127.0.0.1", port, client_id="web") as c:
        for i in range(40):
            await c.write(me, b"%d" % i)
            await c.read(other)  # cached, then asked to approve the other's writes
        print(c.session_id, c.stats["reconnects"], c.stats["unavailable"], flush=True)

trio.run(main, int(sys.argv[1]), sys.argv[2], sys.argv[3])
"""


@pytest.mark.slow
async def test_two_processes_started_with_one_label_both_run_to_the_end(
    nursery: trio.Nursery, root: pathlib.Path
) -> None:
    settings = ServerSettings(root=str(root), port=0, term=TERM, skew=SKEW, hot_writes=0)
    server: FileService = await nursery.start(serve, settings)
    for name in ("a", "b"):
        (root / name).write_bytes(b"-")
    outputs: dict[str, str] = {}

    async def worker(me: str, other: str) -> None:
        done = await trio.run_process(
            [sys.executable, "-c", WORKER, str(server.port), me, other],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        outputs[me] = done.stdout.decode()

    with trio.fail_after(60):
        async with trio.open_nursery() as workers:
            workers.start_soon(worker, "a", "b")
            workers.start_soon(worker, "b", "a")

    (session_a, *counts_a), (session_b, *counts_b) = (outputs[n].split() for n in "ab")
    assert session_a != session_b
    assert counts_a == counts_b == ["0", "0"]  # no reconnect, no Unavailable
    assert (root / "a").read_bytes() == (root / "b").read_bytes() == b"39"


def test_serve_takes_a_session_ttl_and_reports_sessions_in_its_stats(root: pathlib.Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0",
         "--session-ttl", "3.5"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        address = parse_serving_line(proc.stdout.readline())
        assert address is not None
        where = f"{address[0]}:{address[1]}"
        with (
            fscache.connect(where, client_id="web") as one,
            fscache.connect(where, client_id="web") as two,
        ):
            one.write("a", b"1")
            assert two.read("a") == b"1"
            stats = one.server_stats()
        assert stats["session_ttl"] == 3.5
        assert stats["sessions"] == 2 and stats["sessions_refused"] == 0
    finally:
        proc.terminate()
        proc.communicate()
