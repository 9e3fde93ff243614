"""The crash demo's script: kill a lease holder, write, and check every step against
the lease rules.

A server process, N reader processes (:mod:`fscache.bench.demo_reader`) and a
writer, which is a client in this process. Each reader caches the file under a
lease; reader 0 is then killed with SIGKILL, so it can never approve anything.
The writer writes: the live readers approve at once, and the server waits for
the dead reader until its lease runs out, ``t_grant + term + skew`` (guarantee 2
of ``docs/design.md``). Then every survivor reads and must see the new contents.

Every process stamps its events with ``time.monotonic()``. On Linux that is
CLOCK_MONOTONIC, one clock for the whole machine (the server's trio clock runs on
it too, plus a constant offset), so all events fit on one timeline. The server
grants reader 0's lease between the reader sending its request and receiving the
reply (well under a millisecond apart on localhost); the send time is the lower
bound the expected instant is computed from.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import trio

from fscache.bench import procs
from fscache.bench.demo_console import WHO_WIDTH, Console
from fscache.bench.demo_reader import STEP_TIMEOUT, Abort, Read, Reader
from fscache.bench.harness import serve_argv
from fscache.cli import parse_serving_line
from fscache.client.client import Client, open_client

PATH = "demo/shared.txt"
START_TIMEOUT = 20.0  # a cold Python start of the server or a reader on a busy machine


@dataclasses.dataclass(frozen=True, slots=True)
class Tolerances:
    """How far measured times may stray from what the lease rules predict."""

    prompt: float = 0.5  # "at once": live holders approve, a write with no dead holder returns
    early: float = 0.02  # the write may not land earlier than expected by more than this
    late: float = 0.5  # ... nor later (timer wake-up, fsync, reply)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def generation_bytes(n: int) -> bytes:
    return f"generation {n}\n".encode()


def describe(data: str) -> str:
    text = data.strip()
    return text if text.startswith("generation ") else repr(data)


@dataclasses.dataclass
class Check:
    label: str
    detail: str
    ok: bool


class CrashDemo:
    children_name = "readers"

    def __init__(
        self,
        *,
        term: float,
        skew: float,
        clients: int,
        tolerances: Tolerances,
        console: Console,
        children: procs.Commands,
    ) -> None:
        self.term = term
        self.tolerances = tolerances
        self.skew = skew
        self.clients = clients
        self.c = console
        self.children = children
        self.checks: list[Check] = []
        self.root = ""
        self.host = "127.0.0.1"
        self.port = 0
        self.server: subprocess.Popen[bytes] | None = None
        self.server_log = ""
        self.server_lines: list[str] = []
        self.readers: list[Reader] = []
        self._writer: Client | None = None
        self.wait_measured = 0.0
        self.wait_expected = 0.0

    @property
    def writer(self) -> Client:
        assert self._writer is not None
        return self._writer

    def check(self, label: str, detail: str, ok: bool) -> None:
        self.checks.append(Check(label, detail, ok))

    @property
    def problems(self) -> list[str]:
        return [f"{c.label}: {c.detail}" for c in self.checks if not c.ok]

    def logs(self) -> Iterator[tuple[str, str]]:
        if self.server_log:
            yield "server", self.server_log
        for reader in self.readers:
            yield reader.name, reader.log_path

    # ------------------------------------------------------------ script
    async def run(self, root: str) -> None:
        self.root = root
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_signals)
            await self._start_server(nursery)
            async with open_client(self.host, self.port, client_id="demo-writer") as writer:
                self._writer = writer
                await self._script(nursery)
            await self._stop_readers()
            await self._stop_server()
            nursery.cancel_scope.cancel()
        self._check_disk()

    async def _script(self, nursery: trio.Nursery) -> None:
        c = self.c
        t = time.monotonic()
        await self.writer.write(PATH, generation_bytes(1))
        c.event(t, "writer", f"created {PATH}: generation 1")
        await self._start_readers(nursery)

        c.section("1. Every reader reads the file and caches it under a lease")
        await self._read_all(self.readers, generation=1)

        c.section("2. A write while every reader is alive")
        await self._write_all_alive()

        c.section("3. The readers cache the new contents; then reader 0 crashes")
        await self._read_all(self.readers, generation=2)
        self._kill(self.readers[0])

        c.section("4. The writer writes while the dead reader still holds a lease")
        await self._write_past_the_dead()

        c.section("5. Every surviving client reads")
        await self._final_reads()
        await self._server_counters()

    # ------------------------------------------------------------ processes
    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                raise Interrupted(signum)

    async def _start_server(self, nursery: trio.Nursery) -> None:
        argv = serve_argv(self.root, term=self.term, skew=self.skew)
        self.server, self.server_log = self.children.start("server", argv)
        first = trio.Event()
        nursery.start_soon(self._pump_server, first)
        with trio.move_on_after(START_TIMEOUT):
            await first.wait()
        banner = self.server_lines[0] if self.server_lines else ""
        address = parse_serving_line(banner)
        if address is None:
            why = f"said {banner!r}" if banner else "did not start"
            raise Abort(f"the server {why} (exit status {self.server.poll()})")
        self.host, self.port = address
        self.c.event(
            time.monotonic(),
            "server",
            f"listening on {self.host}:{self.port} (pid {self.server.pid})",
        )

    async def _pump_server(self, first: trio.Event) -> None:
        assert self.server is not None
        stream = procs.stdout_stream(self.server)
        async with stream:
            async for line in procs.lines(stream):
                self.server_lines.append(line)
                first.set()
        first.set()

    async def _start_readers(self, nursery: trio.Nursery) -> None:
        for i in range(self.clients):
            argv = [
                sys.executable, "-m", "fscache.bench.demo_reader", "--port", str(self.port),
                "--client-id", f"demo-reader-{i}", "--path", PATH,
            ]  # fmt: skip
            proc, log_path = self.children.start(f"reader-{i}", argv)
            reader = Reader(i, proc, log_path)
            self.readers.append(reader)
            nursery.start_soon(reader.pump)
        ready = [await r.take("ready", timeout=START_TIMEOUT) for r in self.readers]
        for reader, event in sorted(zip(self.readers, ready, strict=True), key=lambda x: x[1]["t"]):
            self.c.event(event["t"], reader.name, f"connected (pid {reader.proc.pid})")

    async def _stop_readers(self) -> None:
        live = [r for r in self.readers if r.killed_at is None]
        for reader in live:
            reader.command("quit")
        statuses = [await procs.wait_exit(reader.proc, STEP_TIMEOUT) for reader in live]
        bad = [f"{r.name}: {s}" for r, s in zip(live, statuses, strict=True) if s != 0]
        kind = self.children_name if len(live) != 1 else self.children_name.removesuffix("s")
        self.check(
            f"{self.children_name} exit",
            f"exit status {', '.join(bad)}" if bad else f"{len(live)} live {kind} exited with 0",
            not bad,
        )

    async def _stop_server(self) -> None:
        assert self.server is not None
        self.server.terminate()
        status = await procs.wait_exit(self.server, STEP_TIMEOUT)
        self.c.event(time.monotonic(), "server", f"stopped by SIGTERM (exit status {status})")
        self.check("server exit", f"exit status {status}", status == 0)

    def _kill(self, reader: Reader) -> None:
        reader.proc.kill()
        reader.killed_at = time.monotonic()
        read = reader.last_read
        assert read is not None
        self.c.event(
            reader.killed_at,
            reader.name,
            f"KILLED with SIGKILL (pid {reader.proc.pid}); the server counts its lease"
            f" live until {self.c.rel(self._server_expiry(read))}",
            "red",
        )

    # ------------------------------------------------------------ lease arithmetic
    def _client_expiry(self, read: Read) -> float:
        return read.t_send + self.term - self.skew

    def _server_expiry(self, read: Read) -> float:
        return read.t_send + self.term + self.skew

    # ------------------------------------------------------------ phases
    async def _read_all(self, readers: list[Reader], *, generation: int) -> list[Read]:
        for reader in readers:
            reader.command("read")
        reads = [await reader.take_read() for reader in readers]
        wrong = []
        for reader, read in sorted(zip(readers, reads, strict=True), key=lambda x: x[1].t):
            ok = read.data == generation_bytes(generation).decode() and not read.hit
            source = "its cache" if read.hit else "the server"
            self.c.event(
                read.t,
                reader.name,
                f"read {describe(read.data)} from {source}; lease granted,"
                f" trusted until {self.c.rel(self._client_expiry(read))}",
                None if ok else "red",
            )
            if not ok:
                wrong.append(f"{reader.name} got {describe(read.data)} from {source}")
        self.check(
            f"generation {generation} cached",
            "; ".join(wrong) or f"{len(readers)} of {len(readers)} readers read it from the server",
            not wrong,
        )
        return reads

    async def _collect_approvals(self, readers: list[Reader], since: float) -> list[float]:
        times = []
        for reader in readers:
            try:
                times.append((await reader.take("approval", since=since))["t"])
            except Abort:
                times.append(float("inf"))
        return times

    async def _write_all_alive(self) -> None:
        c = self.c
        t0 = time.monotonic()
        await self.writer.write(PATH, generation_bytes(2))
        t1 = time.monotonic()
        approvals = await self._collect_approvals(self.readers, t0)
        c.event(t0, "writer", f"writes generation 2; {self.clients} readers hold leases")
        for reader, t in sorted(zip(self.readers, approvals, strict=True), key=lambda x: x[1]):
            if t != float("inf"):
                c.event(t, reader.name, "approval request: dropped its copy and approved")
        took = t1 - t0
        c.event(
            t1, "writer", f"write applied after {took * 1000:.0f} ms: every holder approved at once"
        )
        missing = [
            r.name for r, t in zip(self.readers, approvals, strict=True) if t == float("inf")
        ]
        self.check(
            "approvals, all alive",
            f"missing from {', '.join(missing)}"
            if missing
            else f"{self.clients} of {self.clients}, the slowest"
            f" {(max(approvals) - t0) * 1000:.0f} ms after the write request",
            not missing,
        )
        self.check(
            "write, all alive",
            f"took {took * 1000:.0f} ms (a live holder approves at once)",
            took < self.tolerances.prompt,
        )

    async def _write_past_the_dead(self) -> None:
        c = self.c
        dead, live = self.readers[0], self.readers[1:]
        lease = dead.last_read
        assert lease is not None
        expected = self._server_expiry(lease)
        done = trio.Event()
        result: dict[str, float] = {}

        async def write() -> None:
            result["t0"] = time.monotonic()
            await self.writer.write(PATH, generation_bytes(3))
            result["t1"] = time.monotonic()
            done.set()

        t0 = time.monotonic()
        c.event(
            t0,
            "writer",
            f"writes generation 3; reader 0 cannot approve, so the server must wait"
            f" until {c.rel(expected)}",
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            approvals = await self._collect_approvals(live, t0)
            for reader, t in sorted(zip(live, approvals, strict=True), key=lambda x: x[1]):
                if t != float("inf"):
                    c.event(
                        t, reader.name, "approval request: dropped its copy and approved at once"
                    )
            late = [
                r.name
                for r, t in zip(live, approvals, strict=True)
                if t - t0 >= self.tolerances.prompt
            ]
            self.check(
                "live approvals",
                f"none within {self.tolerances.prompt:g} s from {', '.join(late)}"
                if late
                else f"{len(live)} of {len(live)}, the slowest"
                f" {(max(approvals) - t0) * 1000:.0f} ms after the write request",
                not late,
            )
            nursery.start_soon(self._countdown, expected, done)
            held = await self._read_during_wait(live[0], t0, expected, done)
            await done.wait()
        t1 = result["t1"]
        if held is not None and held.t < t1:  # the two replies race: print in time order
            self._report_held_read(live[0], held, expected)
        c.event(
            t1,
            "writer",
            f"write applied after {t1 - result['t0']:.3f} s: expected at {c.rel(expected)},"
            f" measured {c.rel(t1)} ({_ms(t1 - expected)})",
            "green",
        )
        if held is not None and held.t >= t1:
            self._report_held_read(live[0], held, expected)

        self.wait_measured = t1 - result["t0"]
        self.wait_expected = expected - result["t0"]
        self.check(
            "write past the dead reader",
            f"expected {c.rel(expected)} (reader 0's request {c.rel(lease.t_send)}"
            f" + term {self.term:g} + skew {self.skew:g}), measured {c.rel(t1)}"
            f" ({_ms(t1 - expected)})",
            expected - self.tolerances.early <= t1 <= expected + self.tolerances.late,
        )
        trusted = self._client_expiry(lease)
        self.check(
            "no stale read possible",
            f"reader 0 trusted its copy until {c.rel(trusted)};"
            f" the write landed {t1 - trusted:.3f} s later",
            t1 > trusted,
        )

    async def _read_during_wait(
        self, reader: Reader, t0: float, expected: float, done: trio.Event
    ) -> Read | None:
        """Halfway through the wait, show the server's view and a read that it holds."""
        with trio.move_on_after((expected - t0) / 2):  # trio's clock is not time.monotonic
            await done.wait()
        if done.is_set():
            return None  # too early: the write check reports it
        stats = await self.writer.server_stats()
        now = time.monotonic()
        self.c.event(
            now,
            "server",
            f"{stats.get('writes_pending')} write pending; approvals sent"
            f" {stats.get('approvals_sent')}, received {stats.get('approvals_received')}"
            " (the missing one is reader 0's)",
        )
        self.check(
            "write held",
            f"{stats.get('writes_pending')} write(s) pending halfway through the wait",
            stats.get("writes_pending") == 1,
        )
        reader.command("read")
        self.c.event(
            time.monotonic(),
            reader.name,
            "reads during the wait: no lease while a write waits; the server holds the read",
        )
        return await reader.take_read(timeout=expected - now + self.tolerances.late + STEP_TIMEOUT)

    def _report_held_read(self, reader: Reader, read: Read, expected: float) -> None:
        fresh = read.data == generation_bytes(3).decode()
        self.c.event(
            read.t,
            reader.name,
            f"its held read returned {describe(read.data)} after {read.t - read.t_send:.3f} s",
            None if fresh else "red",
        )
        self.check(
            f"{reader.name} read during the wait",
            f"asked at {self.c.rel(read.t_send)}, answered {describe(read.data)}"
            f" at {self.c.rel(read.t)}, once the write was applied",
            fresh and read.t >= expected - self.tolerances.early and not read.hit,
        )

    async def _countdown(self, until: float, done: trio.Event) -> None:
        c = self.c
        start = time.monotonic()
        span = max(until - start, 1e-9)
        next_line = int(until - start)  # non-TTY: one line per whole second left
        while not done.is_set():
            now = time.monotonic()
            left = until - now
            if c.tty:
                filled = round(30 * min(1.0, (now - start) / span))
                bar = "#" * filled + "-" * (30 - filled)
                text = f"{left:4.1f} s left" if left > 0 else "lease over: applying the write"
                c.status(f"{'':>9}  {'':<{WHO_WIDTH}}  waiting for reader 0's lease [{bar}] {text}")
            elif 0 < left <= next_line:
                c.event(now, "writer", f"still waiting: reader 0's lease runs out in {left:.1f} s")
                next_line -= 1
            with trio.move_on_after(0.05 if c.tty else 0.1):
                await done.wait()
        c.clear_status()

    async def _final_reads(self) -> None:
        c = self.c
        live = [r for r in self.readers if r.killed_at is None]
        for reader in live:
            reader.command("read")
        events = [await r.take("read") for r in live]
        hits = self.writer.stats["hits"]
        data = (await self.writer.read(PATH)).decode(errors="replace")
        t_writer = time.monotonic()
        rows = [
            (e["t"], r.name, e["data"], e["hit"]) for r, e in zip(live, events, strict=True)
        ] + [(t_writer, "writer", data, self.writer.stats["hits"] > hits)]
        stale = []
        for t, who, text, hit in sorted(rows):
            fresh = text == generation_bytes(3).decode()
            source = "its cache (a lease on the new contents)" if hit else "the server"
            c.event(t, who, f"read {describe(text)} from {source}", None if fresh else "red")
            if not fresh:
                stale.append(who)
        self.check(
            "reads after the write",
            f"stale data at {', '.join(stale)}"
            if stale
            else f"{len(rows)} of {len(rows)} clients saw generation 3",
            not stale,
        )

    async def _server_counters(self) -> None:
        stats = await self.writer.server_stats()
        n = self.clients
        sent, received = stats.get("approvals_sent"), stats.get("approvals_received")
        delayed = stats.get("writes_delayed")
        self.c.event(
            time.monotonic(),
            "server",
            f"counters: approvals sent {sent}, received {received}; writes delayed {delayed};"
            f" leases granted {stats.get('leases_granted')}",
        )
        self.check(
            "server counters",
            f"approvals sent {sent} (expected {2 * n}), received {received} (expected {2 * n - 1}),"
            f" writes delayed {delayed} (expected 2)",
            (sent, received, delayed) == (2 * n, 2 * n - 1, 2),
        )

    def _check_disk(self) -> None:
        try:
            with open(os.path.join(self.root, PATH), "rb") as f:
                on_disk = f.read()
        except OSError as exc:
            on_disk = f"<{exc.strerror}>".encode()
        text = on_disk.decode(errors="replace")
        self.check(
            "on disk",
            f"{PATH} holds {describe(text)} after the server stopped",
            on_disk == generation_bytes(3),
        )

    # ------------------------------------------------------------ summary
    def summary(self) -> None:
        c = self.c
        c.section("Checks")
        width = max(len(check.label) for check in self.checks)
        for check in self.checks:
            mark = c.paint("ok  ", "green") if check.ok else c.paint("FAIL", "red")
            c.line(f"  {mark}  {check.label:<{width}}  {check.detail}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:+.0f} ms"
