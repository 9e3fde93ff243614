"""Fault tolerance by time (``docs/design.md``, "Guarantees": one-copy semantics, fault
tolerance by time, durability, the safety margin) under real faults.

Test rules:

* Real processes, real sockets: 127.0.0.1 only, every listener on port 0 (a
  restarted server takes the port its predecessor was given). Crashes are SIGKILL,
  hangs are SIGSTOP or a peer that stops reading, partitions are
  :mod:`tests.faultproxy` between one client and the server.
* Times are ``time.monotonic()`` read around real waits. On Linux it is one clock for
  every process, and the server's ``trio.current_time()`` runs at its rate.
* Safety is asserted exactly: a bound a wait may not undershoot (the server never
  applies a write before ``t_send + term + skew``; no read of a copy after its
  ``t_send + term - skew``) holds however slow the machine is.
* Nothing is asserted that a slow or busy machine could miss. Where a test shows
  that something did *not* wait out a lease, it runs with a term long enough that
  waiting it out would be unmistakable, or checks order (what finished before what).
  Where it shows that a wait ended, the bound is :data:`LATE` past the deadline: only
  a wait that never ends trips it. The exact instants of every timing rule are
  asserted in ``test_leases.py`` and ``test_service_timing.py`` on a mock clock;
  speed is measured in ``bench/``.
* Short terms (1-2 s) so that waiting out a lease is cheap; ``hot_writes=0`` so a
  file written several times keeps its term.
* Every test prints the figures it measured (``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import fscache
from fscache import protocol as p
from fscache.bench.checker import Op, check_history
from fscache.cli import parse_serving_line
from fscache.client.client import DEAD_AFTER, PING_AFTER, Client, open_client
from fscache.server.service import FileService, ServerSettings, serve
from fscache.server.store import TEMP_PREFIX

from .faultproxy import FaultProxy, open_fault_proxy
from .harness import RawPeer

pytestmark = pytest.mark.slow

TERM = 1.5
SKEW = 0.1
LONG_TERM = 10.0  # for tests that show a write did not wait out a lease
LATE = 5.0  # past a deadline: a wait that ended is over by then, however busy the machine
LOCAL = "127.0.0.1"


# ---------------------------------------------------------------- helpers: in-process
@contextlib.asynccontextmanager
async def running_server(
    root: Path, *, term: float = TERM, skew: float = SKEW
) -> AsyncIterator[FileService]:
    """A server in this process on a real socket."""
    root.mkdir(exist_ok=True)
    settings = ServerSettings(root=str(root), port=0, term=term, skew=skew, hot_writes=0)
    async with trio.open_nursery() as nursery:
        service: FileService = await nursery.start(serve, settings)
        try:
            yield service
        finally:
            nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def server_and_proxy(
    root: Path, *, term: float = TERM, skew: float = SKEW
) -> AsyncIterator[tuple[FileService, FaultProxy]]:
    async with (
        running_server(root, term=term, skew=skew) as service,
        open_fault_proxy(LOCAL, service.port) as proxy,
    ):
        yield service, proxy


def client(port: int, name: str, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Client]:
    return open_client(LOCAL, port, client_id=name, **kwargs)


@contextlib.asynccontextmanager
async def writer_and_holder(
    root: Path, holder: str, *, term: float = TERM, skew: float = SKEW, **options: Any
) -> AsyncIterator[tuple[FaultProxy, Client, Client]]:
    """A server; a writer connected to it directly; ``holder`` connected through a
    fault proxy (``options`` go to its client)."""
    async with (
        server_and_proxy(root, term=term, skew=skew) as (service, proxy),
        client(service.port, "writer") as writer,
        client(proxy.port, holder, **options) as held,
    ):
        yield proxy, writer, held


async def take_lease(writer: Client, holder: Client) -> tuple[float, float]:
    """The writer writes f=old and the holder reads it, taking a lease on it: when the
    holder sent that read, and when the answer came (time.monotonic())."""
    await writer.write("f", b"old")
    sent = time.monotonic()
    assert await holder.read("f") == b"old"
    return sent, time.monotonic()


async def read_once_reachable(holder: Client, timeout: float) -> bytes:
    """f as ``holder`` reads it once it reaches the server again (Unavailable until
    then); fails after ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while True:
            with contextlib.suppress(fscache.Unavailable):
                return await holder.read("f")


def skewed_clock(rate: float) -> Callable[[], float]:
    """A monotonic clock that gains ``rate`` seconds per second (loses, if negative)."""
    base = time.monotonic()
    return lambda: base + (time.monotonic() - base) * (1 + rate)


async def timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, float, object]:
    """``(start, end, result or fscache error)`` of one call, on time.monotonic()."""
    start = time.monotonic()
    result: object
    try:
        result = await fn()
    except fscache.FscacheError as exc:
        result = exc
    return start, time.monotonic(), result


@contextlib.asynccontextmanager
async def raw_peer(port: int, name: str) -> AsyncIterator[RawPeer]:
    async with await trio.open_tcp_stream(LOCAL, port) as stream:
        peer = RawPeer(stream)
        await peer.send(p.Hello(version=p.PROTOCOL_VERSION, client_id=name))
        assert isinstance(await peer.receive(), p.Welcome)
        yield peer
        await peer.send(p.Goodbye())  # its leases go now, not at expiry


# ---------------------------------------------------------------- helpers: processes
class Child:
    """A child process with line-oriented stdin and stdout."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = bytearray()

    async def readline(self, timeout: float = 15.0) -> str:
        assert self.process.stdout is not None
        with trio.fail_after(timeout):
            while b"\n" not in self._buffer:
                data = await self.process.stdout.receive_some(65536)
                if not data:
                    raise EOFError(f"child exited ({self.process.returncode}) before a line")
                self._buffer += data
        line, _, rest = self._buffer.partition(b"\n")
        self._buffer = bytearray(rest)
        return line.decode()

    async def send_line(self, text: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(text.encode() + b"\n")

    async def kill(self) -> None:
        self.process.kill()  # works on a stopped process too
        await self.process.wait()


@contextlib.asynccontextmanager
async def child(*args: str) -> AsyncIterator[Child]:
    """``python ARGS`` with pipes; killed (if still running) and reaped on exit."""
    process = await trio.lowlevel.open_process(
        [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        yield Child(process)
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    await stream.aclose()


@dataclasses.dataclass
class ServerChild:
    child: Child
    port: int
    spawned_at: float  # before the process existed
    serving_at: float  # when it said it was listening


@contextlib.asynccontextmanager
async def server_process(
    root: Path, *options: str, port: int = 0, term: float = TERM, skew: float = SKEW
) -> AsyncIterator[ServerChild]:
    """``fscache serve`` in a child process; SIGKILLed on exit unless already dead."""
    root.mkdir(exist_ok=True)
    spawned_at = time.monotonic()
    async with child(
        "-m", "fscache", "serve", "--root", str(root), "--port", str(port),
        "--term", str(term), "--skew", str(skew), "--hot-writes", "0", *options,
    ) as proc:  # fmt: skip
        line = await proc.readline()
        address = parse_serving_line(line)
        assert address is not None and address[0] == "127.0.0.1", line
        yield ServerChild(proc, address[1], spawned_at, time.monotonic())


# A client process that reads PATHS, prints when each read was sent and answered, and
# then (if told "again" on stdin) reads the first path once more and prints it.
HOLDER = """
import json, sys, time
import trio, fscache

async def main(port, paths):
    async with fscache.open_client("127.0.0.1", port, client_id=sys.argv[2]) as c:
        times = {}
        for path in paths:
            sent = time.monotonic()
            await c.read(path)
            times[path] = [sent, time.monotonic()]
        print(json.dumps(times), flush=True)
        while (await trio.to_thread.run_sync(sys.stdin.readline)).strip() == "again":
            print((await c.read(paths[0])).decode(), flush=True)

trio.run(main, int(sys.argv[1]), sys.argv[3:])
"""


def figures(name: str, **values: float) -> None:
    shown = ", ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    print(f"\n[{name}] {shown}")


# ================================================================ client crash
async def test_a_killed_client_delays_each_writer_by_its_remaining_lease_plus_skew(
    tmp_path: Path,
) -> None:
    """A lease holder is SIGKILLed while holding 20 leases. Each write waits out that
    file's lease: it completes no earlier than ``t_send + term + skew`` (the earliest
    the server can have granted it, plus the term and the skew) and no later than
    ``t_answered + term + skew`` (+ LATE), where t_send and t_answered are the
    holder's own monotonic times around its read of that file. No failure detection:
    the server just waits."""
    term = 2.0
    paths = [f"held/{i:02}.txt" for i in range(20)]
    async with (
        server_process(tmp_path / "root", term=term) as server,
        client(server.port, "writer") as writer,
    ):
        for path in paths:
            await writer.write(path, b"before")
        async with child("-c", HOLDER, str(server.port), "doomed", *paths) as holder:
            leases = json.loads(await holder.readline())
            await trio.sleep(0.5)  # let part of every lease run out
            await holder.kill()
        written: dict[str, float] = {}

        async def overwrite(path: str) -> None:
            await writer.write(path, b"after")
            written[path] = time.monotonic()

        began = time.monotonic()
        async with trio.open_nursery() as nursery:
            for path in paths:
                nursery.start_soon(overwrite, path)
        stats = await writer.server_stats()
        for path in paths:
            assert await writer.read(path) == b"after"

    for path in paths:
        sent, answered = leases[path]
        assert sent + term + SKEW <= written[path] <= answered + term + SKEW + LATE, path
    assert stats["writes_delayed"] >= len(paths)
    waits = [written[path] - began for path in paths]
    remaining = [leases[path][1] + term - began for path in paths]
    overshoot = [w - r for w, r in zip(waits, remaining, strict=True)]
    figures(
        "killed client", remaining_lease_max=max(remaining), min_wait=min(waits),
        max_wait=max(waits), overshoot_min=min(overshoot), overshoot_max=max(overshoot),
    )  # fmt: skip


# ================================================================ partitions
async def test_a_partitioned_client_serves_its_cache_until_expiry_then_raises_unavailable(
    tmp_path: Path,
) -> None:
    """The proxy stops forwarding both ways. The cut-off client keeps answering reads
    from its cache until ``t_send + term - skew`` on its clock, never after; then a
    read goes to the (silent) server and fails with Unavailable once the link has been
    silent for DEAD_AFTER. The writer, connected directly, waits out the lease and
    proceeds. When the network heals, the client reconnects and reads the new data."""
    async with writer_and_holder(tmp_path / "root", "island") as (proxy, writer, island):
        sent, answered = await take_lease(writer, island)
        proxy.pause()
        reads: list[tuple[float, float, object]] = []

        async def keep_reading() -> None:
            while True:
                reads.append(await timed(lambda: island.read("f")))
                if isinstance(reads[-1][2], Exception):
                    return
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_reading)
            write_began = time.monotonic()
            await writer.write("f", b"new")
            write_done = time.monotonic()
        proxy.heal()
        healed = time.monotonic()
        final = await read_once_reachable(island, timeout=10)
        reconnected = time.monotonic()

    *served, (failed_at, unavailable_at, error) = reads
    assert isinstance(error, fscache.Unavailable)
    assert served and all(value == b"old" for _, _, value in served)
    assert max(start for start, _, _ in served) < answered + TERM - SKEW  # trusted, no longer
    assert all(start < write_done for start, _, _ in served)  # never stale
    assert served[-1][0] >= sent + (TERM - SKEW) / 2  # the cache went on answering
    assert unavailable_at >= sent + TERM - SKEW + DEAD_AFTER  # expired, then given up
    assert DEAD_AFTER <= unavailable_at - failed_at <= DEAD_AFTER + PING_AFTER + LATE
    assert sent + TERM + SKEW <= write_done <= answered + TERM + SKEW + LATE
    assert final == b"new"
    figures(
        "partition", cached_reads=len(served), last_cached_read=served[-1][0] - sent,
        trusted_until=TERM - SKEW, writer_wait=write_done - write_began,
        expected_wait=sent + TERM + SKEW - write_began,
        unavailable_after=unavailable_at - failed_at, reconnect=reconnected - healed,
    )  # fmt: skip


async def test_a_slow_link_costs_the_writer_one_round_trip_and_never_consistency(
    tmp_path: Path,
) -> None:
    """With 0.2 s of latency each way, the approval request takes 0.2 s to reach the
    holder and the approval 0.2 s to come back: the write waits one round trip, far
    less than the lease. The holder's lease is timed from when it *sent* its read, so
    the latency shortens its trust instead of stretching it. The term is long, so a
    write that waited out the lease instead would be plain to see."""
    delay = 0.2
    async with writer_and_holder(tmp_path / "root", "far", term=LONG_TERM) as (
        proxy,
        writer,
        far,
    ):
        proxy.set_delay(delay)  # the holder's link only: the writer's is direct
        sent, answered = await take_lease(writer, far)
        hits = far.stats["hits"]
        assert await far.read("f") == b"old"
        assert far.stats["hits"] == hits + 1
        began = time.monotonic()
        await writer.write("f", b"new")
        waited = time.monotonic() - began
        assert await far.read("f") == b"new"
        assert far.stats["approvals"] == 1
    assert answered - sent >= 2 * delay
    assert 2 * delay <= waited < LONG_TERM
    figures("slow link", delay_each_way=delay, read_round_trip=answered - sent, write_wait=waited)


async def test_a_client_cut_off_and_back_gets_the_approval_request_it_missed(
    tmp_path: Path,
) -> None:
    """The proxy closes both sides and holds the client's reconnection. A write then
    finds the holder with no connection and waits. When the network heals, the client's
    handshake goes through, the server re-sends the approval request, the client drops
    its entry and approves: the writer goes on after the heal, long before the lease
    (a long term here) could have run out."""
    async with writer_and_holder(tmp_path / "root", "island", term=LONG_TERM) as (
        proxy,
        writer,
        island,
    ):
        sent, _ = await take_lease(writer, island)
        proxy.pause()
        proxy.cut()
        with trio.fail_after(LATE):
            while island.connected:
                await trio.sleep(0.01)
        assert await island.read("f") == b"old"  # disconnected: the lease still holds
        healed = math.inf

        async def heal_later() -> None:
            nonlocal healed
            await trio.sleep(0.4)
            healed = time.monotonic()
            proxy.heal()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(heal_later)
            began = time.monotonic()
            await writer.write("f", b"new")
            done = time.monotonic()
        assert await island.read("f") == b"new"
        assert island.stats["approvals"] == 1 and island.stats["reconnects"] == 1
    assert healed <= done < sent + LONG_TERM
    figures("cut and back", writer_wait=done - began, after_heal=done - healed, term=LONG_TERM)


# ================================================================ hung clients
async def test_a_hung_client_delays_writers_to_its_lease_expiry_and_no_one_else(
    tmp_path: Path,
) -> None:
    """A peer that did the handshake and read a file, then never reads again: the
    approval request sits unread in its socket buffer. The write waits exactly until
    the lease has expired on the server (``t_grant + term + skew``); meanwhile another
    client's reads and writes of other files go through (several finish while the
    write waits), and its read of the blocked file waits for the write and sees the
    new data."""
    async with (
        running_server(tmp_path / "root") as service,
        client(service.port, "writer") as writer,
        client(service.port, "bystander") as bystander,
        raw_peer(service.port, "hung") as hung,
    ):
        await writer.write("blocked", b"old")
        await bystander.write("other/0", b"0")
        sent = time.monotonic()
        await hung.send(p.Read(id=1, path="blocked"))
        reply = await hung.receive()
        answered = time.monotonic()
        assert isinstance(reply, p.Data) and reply.data == b"old"
        # From here on, nobody reads from `hung`.
        others: list[tuple[float, float]] = []  # (start, end) of each bystander round
        blocked_read: tuple[float, float, object] | None = None

        async def go_about_business() -> None:
            for n in range(1, 1000):
                start = time.monotonic()
                await bystander.write(f"other/{n % 5}", b"%d" % n)
                await bystander.relinquish(f"other/{n % 5}")
                assert await bystander.read(f"other/{n % 5}") == b"%d" % n
                others.append((start, time.monotonic()))
                await trio.sleep(0.05)

        async def read_blocked() -> None:
            nonlocal blocked_read
            await trio.sleep(0.3)
            blocked_read = await timed(lambda: bystander.read("blocked"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(go_about_business)
            nursery.start_soon(read_blocked)
            began = time.monotonic()
            await writer.write("blocked", b"new")
            done = time.monotonic()
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert service.stats()["approvals_received"] == 0

    assert sent + TERM + SKEW <= done <= answered + TERM + SKEW + LATE
    assert sum(end < done for _, end in others) >= 3  # other files did not wait
    assert blocked_read is not None
    _, read_end, value = blocked_read
    assert value == b"new" and sent + TERM + SKEW <= read_end <= done + LATE
    figures(
        "hung peer", writer_wait=done - began, expected=answered + TERM + SKEW - began,
        bystander_ops=len(others), bystander_max=max(end - start for start, end in others),
    )  # fmt: skip


async def test_a_stopped_client_delays_writers_to_expiry_and_wakes_up_without_its_stale_entry(
    tmp_path: Path,
) -> None:
    """A client process frozen with SIGSTOP holds a lease it cannot give back: the
    write waits until the lease has expired. Woken with SIGCONT long after, the
    client reads the file again and gets the new data, not its expired entry."""
    async with (
        running_server(tmp_path / "root") as service,
        client(service.port, "writer") as writer,
    ):
        await writer.write("f", b"old")
        async with child("-c", HOLDER, str(service.port), "frozen", "f") as holder:
            [(sent, answered)] = json.loads(await holder.readline()).values()
            holder.process.send_signal(signal.SIGSTOP)
            began = time.monotonic()
            await writer.write("f", b"new")
            done = time.monotonic()
            await writer.write("g", b"unrelated")
            unrelated = time.monotonic() - done
            holder.process.send_signal(signal.SIGCONT)
            await holder.send_line("again")
            assert await holder.readline() == "new"
    assert sent + TERM + SKEW <= done <= answered + TERM + SKEW + LATE
    assert unrelated < LATE
    figures("stopped process", writer_wait=done - began, expected=answered + TERM + SKEW - began)


# ================================================================ clock rate skew
async def partitioned_reads(
    tmp_path: Path, *, term: float, skew: float, rate: float, fault: str
) -> tuple[float, float, float, list[tuple[float, float, object]], bytes]:
    """A client whose clock gains ``rate`` s/s reads f and is partitioned (``fault``
    is ``"drop"`` or ``"pause"``): it will never see the approval request. It keeps
    reading (each read given up after 0.1 s) while another client writes f, and for a
    second after. Then the network heals. Returns (read sent, read answered, write
    done, reads, what the client reads after healing)."""
    async with writer_and_holder(
        tmp_path / "root", "skewed", term=term, skew=skew, clock=skewed_clock(rate)
    ) as (proxy, writer, skewed):
        sent, answered = await take_lease(writer, skewed)
        getattr(proxy, fault)()
        reads: list[tuple[float, float, object]] = []
        done = math.inf

        async def keep_reading() -> None:
            while time.monotonic() < done + 1.0:
                start = time.monotonic()
                value: object = "no answer"
                with trio.move_on_after(0.1), contextlib.suppress(fscache.Unavailable):
                    value = await skewed.read("f")
                reads.append((start, time.monotonic(), value))
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_reading)
            await writer.write("f", b"new")
            done = time.monotonic()
        proxy.heal()
        final = await read_once_reachable(skewed, timeout=8)
    return sent, answered, done, reads, final


@pytest.mark.parametrize("direction", [+1, -1], ids=["fast", "slow"])
async def test_a_client_clock_off_by_the_skew_per_term_never_serves_stale_data(
    tmp_path: Path, direction: int
) -> None:
    """Skew here is a clock *rate* error: over one term the client's monotonic clock
    gains or loses ``skew`` seconds against the server's (rate = skew / term). The
    client trusts an entry until ``t_send + term - skew`` on its clock; the server
    waits until ``t_grant + term + skew`` on its own. A fast clock stops trusting
    earlier. A slow one at this rate trusts for ``(term - skew) / (1 - skew/term)``
    = exactly ``term`` real seconds, still ``skew`` before the server gives up on the
    lease. Either way, no read that starts after the write completed returns the old
    data, even though the client never hears of the write: the proxy drops every byte
    (approval request included) until it heals and the broken connection is replaced."""
    term, skew = 1.5, 0.2
    rate = direction * skew / term
    sent, answered, done, reads, final = await partitioned_reads(
        tmp_path, term=term, skew=skew, rate=rate, fault="drop"
    )
    cached = [start for start, _, value in reads if value == b"old"]
    assert cached, "the partitioned client served nothing from its cache"
    assert max(cached) < done  # no stale read
    trusted = (term - skew) / (1 + rate)  # real seconds from the send
    assert max(cached) < answered + trusted
    assert max(cached) >= sent + trusted / 2  # the cache went on answering
    assert not any(value == b"new" for _, _, value in reads)  # partitioned throughout
    assert final == b"new"  # healed: the lost connection is replaced
    figures(
        f"clock {rate:+.3f} s/s", trusted_real=trusted, last_cached_read=max(cached) - sent,
        write_done=done - sent, safety_margin=done - max(cached),
    )  # fmt: skip


async def test_a_client_clock_slower_than_the_skew_allows_can_serve_stale_data(
    tmp_path: Path,
) -> None:
    """Why the bound matters: a client clock running at a quarter speed (losing
    1.125 s over a 1.5 s term, far beyond a skew of 0.1 s) trusts its entry for
    (1.5 - 0.1) / 0.25 = 5.6 real seconds, while the server waits only 1.6 s before
    applying the write the partitioned client never heard of. Reads that start after
    the write completed return the old data: a stale read, which the checker
    recognises as one."""
    term, skew, rate = 1.5, 0.1, -0.75
    sent, answered, done, reads, _ = await partitioned_reads(
        tmp_path, term=term, skew=skew, rate=rate, fault="pause"
    )
    stale = [(start, end) for start, end, value in reads if value == b"old" and start > done]
    assert stale, "expected the slow client to serve the old data after the write"
    history = [
        Op("write", "f", "old", 0, 0, True),
        Op("write", "f", "new", answered, done, True),
        *(Op("read", "f", "old", start, end, True) for start, end in stale),
    ]
    assert {anomaly.kind for anomaly in check_history(history)} == {"stale"}
    figures(
        "clock -0.75 s/s", write_done=done - sent, stale_reads=len(stale),
        stale_for=max(start for start, _ in stale) - done,
    )  # fmt: skip


# ================================================================ server crash
def payload(path: str, n: int) -> bytes:
    """A value big enough to tear (48 KiB), that says what it is at both ends."""
    head = f"{path}#{n}#".encode()
    return head + bytes(random.Random(head).randbytes(48 * 1024)) + head


async def test_a_server_killed_during_writes_restarts_with_every_acknowledged_write(
    tmp_path: Path,
) -> None:
    """Five writers stream writes to five files; the server is SIGKILLed mid-stream
    and restarted on the same root and port. Each file then holds its last
    acknowledged value or the one that was in flight, complete; no temp file is left
    or listed. The new incarnation (with a longer term, so that its window is plainly
    open while the reads are answered) serves reads at once but holds writes for one
    maximum term plus skew from its start."""
    root = tmp_path / "root"
    paths = [f"stream/{i}" for i in range(5)]
    term, second_term = 1.0, 3.0
    acked: dict[str, int] = {}
    tried: dict[str, int] = {}
    async with server_process(root, term=term) as first:
        port = first.port
        async with client(port, "writer") as writer:

            async def keep_writing(path: str) -> None:
                for n in range(1_000_000):
                    tried[path] = n
                    try:
                        await writer.write(path, payload(path, n))
                    except fscache.Unavailable:
                        return
                    acked[path] = n

            async with trio.open_nursery() as nursery:
                for path in paths:
                    nursery.start_soon(keep_writing, path)
                await trio.sleep(1.0)
                await first.child.kill()
    assert all(acked.get(path, 0) >= 3 for path in paths), acked

    async with server_process(root, port=port, term=second_term) as second:
        window = second_term + SKEW
        assert await second.child.readline() == f"restart window: writes held for {window:g} s"
        async with client(port, "after") as after:
            contents: dict[str, bytes] = {}
            read_times = []
            for path in paths:
                start = time.monotonic()
                contents[path] = await after.read(path)
                read_times.append(time.monotonic() - start)
            listed = await after.listdir("stream")
            window_left = (await after.server_stats())["restart_window_s"]
            began = time.monotonic()
            await after.write("probe", b"x")
            written = time.monotonic()

    for path in paths:
        assert contents[path] in (payload(path, acked[path]), payload(path, tried[path])), path
        assert (root / path).read_bytes() == contents[path]
    assert listed == sorted(path.split("/")[1] for path in paths)
    leftovers = [n for _, _, names in os.walk(root) for n in names if n.startswith(TEMP_PREFIX)]
    assert leftovers == []
    assert window_left > 0  # every read was answered while writes were still held
    assert second.spawned_at + window <= written <= second.serving_at + window + LATE
    figures(
        "server kill", acked_writes=sum(acked.values()) + len(acked),
        in_flight=sum(tried[p] != acked[p] for p in paths), read_max=max(read_times),
        write_wait=written - began, window_after_serving=written - second.serving_at,
    )  # fmt: skip


# ================================================================ races on one connection
async def test_a_grant_is_always_delivered_before_the_approval_request_that_revokes_it(
    tmp_path: Path,
) -> None:
    """Raw frames over a real socket: A sends a Read and does not read its socket;
    once the server has handled it, B writes the file. On A's connection the Data
    (the old contents, with a lease) comes first, then the ApprovalRequest for that
    lease. A approves and B's write completes, long before the lease could end."""
    async with (
        running_server(tmp_path / "root", term=LONG_TERM) as service,
        client(service.port, "b") as b,
        raw_peer(service.port, "a") as a,
    ):
        await b.write("f", b"old")
        reads = service.stats()["reads"]
        sent = time.monotonic()
        await a.send(p.Read(id=7, path="f"))
        while service.stats()["reads"] == reads:  # handled; the reply sits unread
            await trio.sleep(0.001)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.write, "f", b"new")
            first = await a.receive()
            second = await a.receive()
            assert isinstance(first, p.Data) and (first.id, first.data) == (7, b"old")
            assert first.term == LONG_TERM
            assert isinstance(second, p.ApprovalRequest) and second.path == "f"
            await a.send(p.Approve(path="f", write=second.write))
        assert time.monotonic() < sent + LONG_TERM  # released by the approval
        await a.send(p.Read(id=8, path="f"))
        again = await a.receive()
        assert isinstance(again, p.Data) and again.data == b"new"


async def test_a_read_racing_a_write_on_the_wire_never_sees_an_approval_first(
    tmp_path: Path,
) -> None:
    """The same race without the synchronisation, 30 times with random spacing:
    whichever the server handles first, A's connection never carries an approval
    request before the reply to A's read, and an old-data reply is always followed
    by the approval request that revokes it."""
    async with (
        running_server(tmp_path / "root") as service,
        client(service.port, "b") as b,
    ):
        for n in range(30):
            old, new = b"v%d" % (2 * n), b"v%d" % (2 * n + 1)
            await b.write("f", old)
            async with raw_peer(service.port, f"a{n}") as a, trio.open_nursery() as nursery:
                await a.send(p.Read(id=1, path="f"))
                await trio.sleep(random.uniform(0, 0.002))
                nursery.start_soon(b.write, "f", new)
                first = await a.receive()
                assert isinstance(first, p.Data), first
                assert first.data in (old, new)
                if first.data == old:
                    second = await a.receive()
                    assert isinstance(second, p.ApprovalRequest), second
                    await a.send(p.Approve(path="f", write=second.write))


async def test_concurrent_reads_and_writes_on_one_path_from_several_clients_are_never_stale(
    tmp_path: Path,
) -> None:
    """Three clients, each with three tasks, read and write one hot path (and one
    cooler one) for three seconds, so that grants, approval requests, approvals and
    not-modified replies cross on every connection. The history, on one monotonic
    clock, has no stale read (:func:`fscache.bench.checker.check_history`)."""
    ops: list[Op] = []
    rng = random.Random(1989)
    async with (
        running_server(tmp_path / "root", term=1.0) as service,
        contextlib.AsyncExitStack() as stack,
    ):
        clients = [await stack.enter_async_context(client(service.port, f"c{i}")) for i in range(3)]
        for path in ("hot", "cool"):
            start = time.monotonic()
            await clients[0].write(path, b"init-" + path.encode())
            ops.append(Op("write", path, f"init-{path}", start, time.monotonic(), True))
        stop_at = time.monotonic() + 3.0
        counter = 0

        async def work(c: Client, name: str) -> None:
            nonlocal counter
            while time.monotonic() < stop_at:
                path = "hot" if rng.random() < 0.8 else "cool"
                start = time.monotonic()
                if rng.random() < 0.25:
                    counter += 1
                    value = f"{name}-{counter}"
                    await c.write(path, value.encode())
                    ops.append(Op("write", path, value, start, time.monotonic(), True, name))
                else:
                    hits = c.stats["hits"]
                    value = (await c.read(path)).decode()
                    hit = c.stats["hits"] > hits
                    ops.append(Op("read", path, value, start, time.monotonic(), True, name, hit))
                await trio.sleep(rng.uniform(0, 0.005))

        async with trio.open_nursery() as nursery:
            for i, c in enumerate(clients):
                for task in range(3):
                    nursery.start_soon(work, c, f"c{i}.{task}")
        approvals = service.stats()["approvals_received"]

    anomalies = check_history(ops)
    assert anomalies == [], "\n".join(a.describe() for a in anomalies[:5])
    reads = [op for op in ops if op.kind == "read"]
    hits = sum(op.hit for op in reads)
    assert hits > 50 and approvals > 20
    figures("race", reads=len(reads), from_cache=hits, writes=len(ops) - len(reads),
            approvals=approvals)  # fmt: skip


@pytest.mark.parametrize("ack", ["delayed", "lost"])
async def test_a_writer_never_reads_its_old_copy_once_another_client_has_seen_the_new(
    tmp_path: Path, ack: str
) -> None:
    """One-copy semantics for the writer's own cache. A caches f and writes f over a
    slow link (0.2 s each way). The server applies the write on arrival and B reads
    the new data at once, while A's acknowledgement is still on the wire ("delayed")
    or is lost with the connection ("lost": A's write() raises Unavailable). A read
    by A that starts after B's read ended must not return the old data: what B has
    seen cannot be un-seen (the checker calls that read ``stale-observed``)."""
    async with (
        server_and_proxy(tmp_path / "root") as (service, proxy),
        client(service.port, "b") as b,
        client(proxy.port, "a") as a,
    ):
        await a.write("f", b"old")
        assert await a.read("f") == b"old"  # cached, with a lease
        proxy.set_delay(0.2)
        applied = service.stats()["writes_applied"]
        write: list[tuple[float, float, object]] = []

        async def write_new() -> None:
            write.append(await timed(lambda: a.write("f", b"new")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_new)
            while service.stats()["writes_applied"] == applied:
                await trio.sleep(0.001)  # applied; the acknowledgement is on its way
            if ack == "lost":
                proxy.pause()
                proxy.cut()
                while not write:
                    await trio.sleep(0.001)
                assert isinstance(write[0][2], fscache.Unavailable)
                proxy.heal()  # A may reconnect: it is its cache that is on trial
            b_start, b_end, seen_by_b = await timed(lambda: b.read("f"))
            assert seen_by_b == b"new"
            a_start, a_end, seen_by_a = await timed(lambda: a.read("f"))
            proxy.heal()
    [(w_start, w_end, version)] = write
    acked = isinstance(version, int)
    assert isinstance(seen_by_a, bytes), seen_by_a
    history = [
        Op("write", "f", "old", 0, 0, True),
        Op("write", "f", "new", w_start, w_end, acked),
        Op("read", "f", "new", b_start, b_end, True),
        Op("read", "f", seen_by_a.decode(), a_start, a_end, True),
    ]
    assert check_history(history) == [], check_history(history)[0].describe()
    assert seen_by_a == b"new"
    figures(f"ack {ack}", a_read_wait=a_end - a_start, write_wait=w_end - w_start)


# ================================================================ shared misses
async def test_a_read_begun_after_a_write_is_acknowledged_never_takes_an_older_answer(
    tmp_path: Path,
) -> None:
    """Term 0 (no lease): the server has answered a read, and the answer is slow to
    reach the reader, when another client's write is applied and acknowledged; a
    second read of the reader's begins after that. It must not take the first read's
    answer, from before the write (the server asked the reader nothing: it held no
    lease). Held for well under the client's DEAD_AFTER, so the connection stays."""
    async with (
        server_and_proxy(tmp_path / "root", term=0.0) as (service, proxy),
        client(proxy.port, "reader") as reader,
        client(service.port, "writer") as writer,
        trio.open_nursery() as nursery,
    ):
        await writer.write("f", b"old")
        proxy.hold_replies()
        first: list[bytes] = []
        second: list[bytes] = []

        async def read(into: list[bytes]) -> None:
            into.append(await reader.read("f"))

        nursery.start_soon(read, first)
        with trio.fail_after(LATE):
            while service.counters.reads < 1:  # answered "old"; the answer is held
                await trio.sleep(0.01)
        await writer.write("f", b"new")  # no lease to wait for: acknowledged at once
        nursery.start_soon(read, second)  # begun after the acknowledgement
        await trio.sleep(0.2)
        proxy.heal()
    assert first == [b"old"]  # (concurrent with the write: either is right)
    assert second == [b"new"]


# ================================================================ server pause
async def test_a_paused_server_ends_no_session_that_pinged_it_meanwhile(tmp_path: Path) -> None:
    """The server is SIGSTOPped for longer than the session TTL while clients that
    hold ephemeral files go on pinging it. When it resumes their pings are waiting in
    its sockets: none of them is silent, and no file goes. (Their clients give a
    connection up only after DEAD_AFTER without an answer, longer than the pause.)"""
    ttl, pause = 1.0, 2.0
    assert ttl * 1.25 < pause < DEAD_AFTER
    async with (
        server_process(tmp_path / "root", "--session-ttl", str(ttl)) as server,
        contextlib.AsyncExitStack() as stack,
    ):
        clients = [await stack.enter_async_context(open_client(LOCAL, server.port)) for _ in "abc"]
        for i, client in enumerate(clients):
            await client.write(f"reg/m{i}", b"addr", ephemeral=True)
        await trio.sleep(ttl)  # each keep-alive has asked for the TTL and pings
        server.child.process.send_signal(signal.SIGSTOP)
        try:
            await trio.sleep(pause)
        finally:
            server.child.process.send_signal(signal.SIGCONT)
        await trio.sleep(ttl)  # four rounds of the server's silence watch
        stats = await clients[0].server_stats()
        assert await clients[0].listdir("reg") == ["m0", "m1", "m2"]
        assert (stats["connections_dropped"], stats["sessions_expired"]) == (0, 0), stats
