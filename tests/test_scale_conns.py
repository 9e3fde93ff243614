"""Many connections: what an idle one keeps, reconnect backoff, restart storms, and
one client's turn while another floods.

Test rules: localhost only, port 0 (the restart storm reuses the port the killed
server had). The in-process tests run the service over memory streams and assert
counts and order; the storm and the flood use real processes, real TCP and
SIGKILL, and assert what every client saw (all came back, none read old data),
never how fast.
"""

from __future__ import annotations

import math
import resource
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

import fscache
from fscache import protocol as p
from fscache.bench.scale_conns import (
    measure_connections,
    measure_fairness,
    measure_restart_storm,
)
from fscache.cli import parse_serving_line
from fscache.client import client as client_mod
from fscache.client.client import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    CONNECT_TIMEOUT,
    backoff_delay,
    open_tcp,
)
from fscache.net import SocketWire
from fscache.server.service import (
    HANDSHAKES_PER_TURN,
    MAX_REQUESTS_PER_TURN,
    ServerSettings,
    _accept_queued,
    serve,
)
from tests.harness import Cluster, RawPeer


@pytest.fixture
async def cluster(nursery, root):
    (root / "f").write_bytes(b"x")
    cluster = Cluster(nursery, root)
    await cluster.start()
    return cluster


def _all_tasks() -> int:
    """Every task in this trio run."""
    count = 0
    nurseries = list(trio.lowlevel.current_root_task().child_nurseries)
    while nurseries:
        nursery = nurseries.pop()
        for task in nursery.child_tasks:
            count += 1
            nurseries.extend(task.child_nurseries)
    return count


# ---------------------------------------------------------------- an idle connection
async def test_an_idle_connection_holding_a_lease_keeps_one_task(cluster):
    before = _all_tasks()
    peers = [await cluster.raw(f"idle-{i}") for i in range(10)]
    for peer in peers:
        reply = await peer.read("f")
        assert isinstance(reply, p.Data) and reply.term > 0  # it holds a lease
    await trio.testing.wait_all_tasks_blocked()
    assert _all_tasks() - before == 10  # its reader; no sender, no watchdog
    for peer in peers:
        await peer.close()


async def test_a_connection_still_gets_replies_queued_outside_its_turn(cluster):
    """A frame queued while no batch is read (an approval request) starts a sender,
    which ends once the queue is empty."""
    holder = await cluster.raw("holder")
    assert isinstance(await holder.read("f"), p.Data)
    before = _all_tasks()
    async with cluster.client("writer") as writer, trio.open_nursery() as nursery:
        nursery.start_soon(writer.write, "f", b"y")
        request = await holder.receive()
        assert isinstance(request, p.ApprovalRequest) and request.path == "f"
        await holder.send(p.Approve(path="f", write=request.write))
    await trio.testing.wait_all_tasks_blocked()
    assert _all_tasks() == before  # the writer is gone; the holder's sender ended
    await holder.close()


async def test_socket_wires_of_one_run_share_one_receive_buffer():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with listeners[0]:
        streams = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        wires = [SocketWire(stream) for stream in streams]
        assert wires[0]._buffer is wires[1]._buffer
        for wire in wires:
            await wire.aclose()


# ---------------------------------------------------------------- accepting
def test_the_accept_loop_takes_every_queued_connection_at_once():
    """What the kernel has queued on the listening socket is taken in one go, without
    a pass through the scheduler between two connections."""
    with socket.create_server(("127.0.0.1", 0), backlog=256) as listening:
        listening.setblocking(False)
        peers = [socket.create_connection(listening.getsockname()) for _ in range(100)]
        arrived: deque[socket.socket] = deque()
        try:
            assert _accept_queued(listening, arrived) is None  # not out of descriptors
            assert len(arrived) == 100
            assert _accept_queued(listening, arrived) is None and len(arrived) == 100  # none left
        finally:
            for sock in [*arrived, *peers]:
                sock.close()


def test_out_of_descriptors_is_said_once_at_start_and_once_in_the_accept_loop(tmp_path):
    """A server whose open-files limit is below max_connections warns at start; when
    accept() runs out of descriptors it says so once (not at every retry), and once
    more when it accepts again."""

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    server = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=low_limit,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stderr is not None
        address = parse_serving_line(server.stdout.readline())
        assert address is not None
        peers = [socket.create_connection(address) for _ in range(80)]  # past 64
        time.sleep(2.0)  # some twenty retries of accept
        for peer in peers:
            peer.close()
        with fscache.connect(f"127.0.0.1:{address[1]}") as client:  # served again
            client.write("f", b"x")
    finally:
        server.terminate()
        _, errors = server.communicate(timeout=30)
    assert "open files limit 64 is below max_connections 1024" in errors
    assert errors.count("accept failed: [Errno 24] Too many open files") == 1
    assert errors.count("accepting again, after") == 1


async def test_a_burst_of_connections_beyond_one_turn_is_served_in_full(nursery, root):
    """Three turns' worth of connections arrive at once: each is welcomed."""
    server = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    count = 3 * HANDSHAKES_PER_TURN
    streams = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(count)]
    peers = [RawPeer(stream) for stream in streams]
    for i, peer in enumerate(peers):
        await peer.send(p.Hello(version=p.PROTOCOL_VERSION, client_id=f"burst-{i}"))
    welcomes = [await peer.receive() for peer in peers]
    assert all(isinstance(welcome, p.Welcome) for welcome in welcomes)
    assert server.counters.connections_total == count
    for peer in peers:
        await peer.close()


# ---------------------------------------------------------------- fairness
async def test_a_pipelining_client_leaves_the_others_a_turn(cluster):
    """A backlog of reads on one connection is handled MAX_REQUESTS_PER_TURN at a
    time: another client's read is answered before the backlog is done."""
    backlog = 20 * MAX_REQUESTS_PER_TURN
    flooder = await cluster.raw("flooder")
    prober = await cluster.raw("prober")
    counters = cluster.service.counters
    await flooder.send_bytes(b"".join(p.encode(p.Read(id=i + 1, path="f")) for i in range(backlog)))
    while counters.reads == 0:  # the flooder's connection has begun its backlog
        await trio.lowlevel.checkpoint()
    assert counters.reads <= MAX_REQUESTS_PER_TURN
    reply = await prober.read("f")
    assert isinstance(reply, p.Data)
    assert counters.reads < backlog  # answered while the backlog was still being read
    for i in range(backlog):
        reply = await flooder.receive()
        assert isinstance(reply, p.Data) and reply.id == i + 1  # all of it, in order


def test_a_client_is_served_while_another_floods_the_server():
    """Real processes: a prober's reads all complete while a flooder pipelines reads."""
    result = measure_fairness(seconds=0.5)
    assert set(result) == {
        "idle_median_s", "idle_p99_s", "loaded_median_s", "loaded_p99_s", "ratio",
    }  # fmt: skip
    assert all(math.isfinite(value) and value > 0 for value in result.values())


# ---------------------------------------------------------------- reconnecting
class _Restarts:
    """A server the test plays by hand, one connection per attempt: ``script(n, peer)``
    serves the n-th (0 first); the time of each attempt is kept."""

    def __init__(self, nursery, script):
        self.nursery = nursery
        self.script = script
        self.attempts: list[float] = []

    async def open(self) -> trio.abc.Stream:
        self.attempts.append(trio.current_time())
        client_side, server_side = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.script, len(self.attempts) - 1, RawPeer(server_side))
        return client_side


def _welcome(session: str) -> p.Welcome:
    return p.Welcome(
        version=p.PROTOCOL_VERSION, epoch=session, term=10.0, skew=0.1,
        max_frame=p.DEFAULT_MAX_FRAME, session=session, secret=b"k", resumed=False,
    )  # fmt: skip


def _gone_after_the_first_welcome(
    lost: trio.Event, second_welcome_after: float = 0.0
) -> Callable[[int, RawPeer], Awaitable[None]]:
    """A server script: welcome the first connection, then close it (``lost`` is set);
    welcome the next after ``second_welcome_after`` seconds and keep it open."""

    async def script(n: int, peer: RawPeer) -> None:
        assert isinstance(await peer.receive(), p.Hello)
        if n == 1:
            await trio.sleep(second_welcome_after)
        await peer.send(_welcome(f"s{n}"))
        if n == 0:
            await peer.close()  # the server goes away
            lost.set()
        else:
            await trio.sleep_forever()

    return script


async def test_the_first_attempt_after_a_lost_connection_is_jittered_too(nursery, autojump_clock):
    """Clients that lose one server together do not all try again at the same instant:
    the first attempt waits up to BACKOFF_FIRST, like every later one its bound."""
    lost = trio.Event()
    server = _Restarts(nursery, _gone_after_the_first_welcome(lost))
    async with fscache.open_client(opener=server.open, clock=trio.current_time) as client:
        await lost.wait()
        gone = trio.current_time()
        while client.stats["reconnects"] == 0:
            await trio.sleep(0.01)
        assert 0 < server.attempts[1] - gone <= BACKOFF_FIRST


async def test_a_request_waiting_for_the_connection_cuts_the_backoff_short(
    nursery, autojump_clock, monkeypatch
):
    """After a long outage the backoff's bound is BACKOFF_MAX: a request made just as
    the server is back would fail for want of an attempt. It asks for one at once
    (still jittered, as a first attempt is) and is answered."""
    monkeypatch.setattr(client_mod._jitter, "uniform", lambda low, high: high)  # the bounds
    lost = trio.Event()
    down = True

    async def script(n: int, peer: RawPeer) -> None:
        assert isinstance(await peer.receive(), p.Hello)
        await peer.send(_welcome(f"s{n}"))
        if n == 0:
            await peer.close()  # the server goes away ...
            lost.set()
            return
        while (message := await peer.receive()) is not None:
            if isinstance(message, p.GetStats):
                await peer.send(p.StatsResult(id=message.id, counters={"up": 1}))

    server = _Restarts(nursery, script)

    async def open_stream() -> trio.abc.Stream:
        if down and server.attempts:
            server.attempts.append(trio.current_time())
            raise OSError(111, "connection refused")  # ... for a while
        return await server.open()

    async with fscache.open_client(opener=open_stream, clock=trio.current_time) as client:
        await lost.wait()
        back = trio.current_time() + 20.0
        await trio.sleep_until(back)  # attempts at 0.25, 0.75, 1.75, 3.75, 7.75, ... 19.75
        down = False
        await trio.sleep(0.1)
        asked = trio.current_time()
        assert await client.server_stats() == {"up": 1}  # the next attempt was not at 23.75
        assert trio.current_time() - asked <= BACKOFF_FIRST
        assert client.stats["reconnects"] == 1


async def test_a_reconnecting_client_waits_its_turn_for_the_welcome(nursery, autojump_clock):
    """A server busy with a storm answers a reconnect's hello after more than
    CONNECT_TIMEOUT: the client keeps its place instead of starting over."""
    lost = trio.Event()
    # the second welcome comes late: the others' handshakes first
    server = _Restarts(nursery, _gone_after_the_first_welcome(lost, 3 * CONNECT_TIMEOUT))
    async with fscache.open_client(opener=server.open, clock=trio.current_time) as client:
        await lost.wait()
        while client.stats["reconnects"] == 0:
            await trio.sleep(0.1)
        assert len(server.attempts) == 2  # one attempt, answered late
        assert client.epoch == "s1"


async def test_an_address_is_connected_to_directly_and_a_name_through_resolution():
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            stream = await open_tcp(host, port)
            assert stream.socket.getpeername() == ("127.0.0.1", port)
            await stream.aclose()
            listening.accept()[0].close()
    with pytest.raises(OSError):  # nobody listens there any more
        await open_tcp("127.0.0.1", port)


def test_backoff_waits_are_fully_jittered_under_a_doubling_bound():
    for failures in range(12):
        bound = min(BACKOFF_MAX, BACKOFF_FIRST * 2**failures)
        waits = [backoff_delay(failures) for _ in range(200)]
        assert all(0 <= wait <= bound for wait in waits)
        assert len(set(waits)) == len(waits)  # distinct: no two clients in lockstep
        assert min(waits) < bound / 4 and max(waits) > 3 * bound / 4  # spread over it
    assert backoff_delay(10_000) <= BACKOFF_MAX


def test_every_client_comes_back_after_a_sigkill_and_reads_the_new_data():
    """200 clients in 1 process hold a lease; the server is SIGKILLed and restarted on
    its port. Each reconnects by itself; a file written after the restart reads new
    for every one of them."""
    result = measure_restart_storm(200)
    assert result["clients"] == 200
    assert math.isfinite(result["all_back_s"])  # every client came back
    assert 0 <= result["median_back_s"] <= result["all_back_s"]
    assert result["stale_reads"] == 0


def test_measure_connections_reports_one_row_per_count():
    rows = measure_connections([5, 20])
    assert [row["clients"] for row in rows] == [5, 20]
    for row in rows:
        assert set(row) == {
            "clients", "server_rss_bytes", "baseline_rss_bytes", "per_client_bytes",
        }  # fmt: skip
        assert row["server_rss_bytes"] > 0 and row["baseline_rss_bytes"] > 0
