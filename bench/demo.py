"""``fscache demo crash``: kill a lease holder and watch the writer wait out its lease.

Theory of operation
-------------------
The demo runs the real thing: a server process (``fscache serve``), N reader
*processes* (this module's hidden ``worker`` entry point, ``python -m fscache.bench.demo
worker``) and a writer, which is a client in this process. Each reader caches
``demo/shared.txt`` under a lease; reader 0 is then killed with SIGKILL, so it can
never approve anything. The writer writes: the live readers approve at once, and
the server waits for the dead reader until its lease runs out,
``t_grant + term + skew`` (DESIGN.md guarantee 2). Then every survivor reads and
must see the new contents.

Every process stamps its events with ``time.monotonic()``. On Linux that is
CLOCK_MONOTONIC, one clock for the whole machine (the server's trio clock runs on
it too, plus a constant offset), so all events fit on one timeline. The server
grants reader 0's lease between the reader sending its request and receiving the
reply (well under a millisecond apart on localhost); the send time is the lower
bound the expected instant is computed from.

Readers speak JSON lines on stdout (``{"event": ..., "t": ..., ...}``) and take
one-word commands on stdin (``read``, ``quit``; end of input means quit). They
notice approval requests by polling their client's ``approvals`` counter every
millisecond, so an approval's time is at most about a millisecond late.

Every child runs in its own session (a Ctrl-C at the terminal reaches only the
demo), and every path out of :func:`run_crash_demo` stops them and removes the
temporary directory.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any, ClassVar, TextIO

import trio

from fscache.bench.harness import serve_argv
from fscache.cli import parse_serving_line
from fscache.client.client import Client, open_client
from fscache.errors import FscacheError

PATH = "demo/shared.txt"
START_TIMEOUT = 20.0  # a cold Python start of the server or a reader on a busy machine
STEP_TIMEOUT = 5.0  # a read, an approval or an exit that should take milliseconds
PROMPT = 0.5  # "at once": live holders approve, a write with no dead holder returns
EARLY_MARGIN = 0.02  # the write may not land earlier than expected by more than this
LATE_MARGIN = 0.5  # ... nor later (timer wake-up, fsync, reply)
APPROVAL_POLL = 0.001
MIN_TERM = 0.5  # leases must outlive the demo's own steps (start a write, kill a reader)
MAX_CLIENTS = 32
WHO_WIDTH = 9  # "reader 10"


class _Abort(Exception):
    """The demo cannot go on: something it depends on did not happen."""


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _generation(n: int) -> bytes:
    return f"generation {n}\n".encode()


def _describe(data: str) -> str:
    text = data.strip()
    return text if text.startswith("generation ") else repr(data)


# ---------------------------------------------------------------- output
class _Console:
    """The timeline: stamped lines, section titles, and one live status line (TTY)."""

    STYLES: ClassVar[dict[str, str]] = {
        "bold": "1",
        "dim": "2",
        "red": "1;31",
        "green": "1;32",
    }

    def __init__(self, t0: float, out: TextIO) -> None:
        self.t0 = t0
        self.out = out
        self.tty = out.isatty()
        self.colour = self.tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        self._status = ""

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{self.STYLES[style]}m{text}\x1b[0m" if self.colour else text

    def rel(self, t: float) -> str:
        return f"+{t - self.t0:.3f}"

    def _print(self, line: str) -> None:
        status = self._status
        self.clear_status()
        print(line, file=self.out, flush=True)
        if status:
            self.status(status)

    def line(self, text: str = "") -> None:
        self._print(text)

    def section(self, title: str) -> None:
        self._print("")
        self._print(self.paint(title, "bold"))

    def event(self, t: float, who: str, text: str, style: str | None = None) -> None:
        stamp = self.paint(f"{self.rel(t):>9}", "dim")
        body = f"{who:<{WHO_WIDTH}}  {text}"
        self._print(f"{stamp}  {self.paint(body, style) if style else body}")

    def status(self, text: str) -> None:
        """A line redrawn in place; only on a terminal."""
        if not self.tty:
            return
        pad = " " * max(0, len(self._status) - len(text))
        self.out.write(f"\r{text}{pad}")
        self.out.flush()
        self._status = text

    def clear_status(self) -> None:
        if self._status:
            self.out.write("\r" + " " * len(self._status) + "\r")
            self.out.flush()
            self._status = ""


# ---------------------------------------------------------------- child processes
class _Children:
    """The server and reader processes; :meth:`stop_all` ends whatever still runs."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], str]:
        log_path = os.path.join(self.log_dir, f"{name}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # a Ctrl-C at the terminal is ours to handle
            )
        self.procs.append(proc)
        return proc, log_path

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def _stdout_stream(proc: subprocess.Popen[bytes]) -> trio.lowlevel.FdStream:
    """An async stream on a duplicate of the child's stdout. ``proc.stdout`` stays open
    until :meth:`_Children.stop_all`, so a child that prints while it stops after we
    stopped listening (the server's "SIGTERM: shutting down") gets no broken pipe."""
    assert proc.stdout is not None
    return trio.lowlevel.FdStream(os.dup(proc.stdout.fileno()))


async def _lines(stream: trio.abc.ReceiveStream) -> AsyncGenerator[str, None]:
    """The lines of ``stream`` (without newlines) until end of input."""
    buffer = b""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            if buffer:
                yield buffer.decode(errors="replace")
            return
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")


async def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    with trio.move_on_after(timeout):
        while proc.poll() is None:
            await trio.sleep(0.01)
    return proc.poll()


def _tail(path: str, lines: int = 8) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-lines:]
    except OSError:
        return []


@dataclasses.dataclass
class _Read:
    t_send: float
    t: float  # the reply arrived
    data: str
    hit: bool


class _Reader:
    """One reader process and the events it has reported, oldest first."""

    def __init__(self, index: int, proc: subprocess.Popen[bytes], log_path: str) -> None:
        self.index = index
        self.name = f"reader {index}"
        self.proc = proc
        self.log_path = log_path
        self.inbox: list[dict[str, Any]] = []
        self._arrived = trio.Event()
        self.killed_at: float | None = None
        self.last_read: _Read | None = None

    async def pump(self) -> None:
        stream = _stdout_stream(self.proc)
        async with stream:
            async for line in _lines(stream):
                try:
                    event = json.loads(line)
                except ValueError:
                    event = {"event": "error", "t": time.monotonic(), "message": line}
                self._post(event)
        self._post({"event": "exit", "t": time.monotonic()})

    def _post(self, event: dict[str, Any]) -> None:
        self.inbox.append(event)
        self._arrived.set()
        self._arrived = trio.Event()

    async def take(self, kind: str, *, since: float = 0.0, timeout: float = STEP_TIMEOUT) -> Any:
        """The oldest unconsumed ``kind`` event stamped at or after ``since``."""
        with trio.move_on_after(timeout):
            while True:
                for i, event in enumerate(self.inbox):
                    if event["event"] == kind and event["t"] >= since:
                        del self.inbox[i]
                        return event
                    if event["event"] in ("error", "exit") and self.killed_at is None:
                        detail = event.get("message") or "exited unexpectedly"
                        raise _Abort(f"{self.name}: {detail}")
                await self._arrived.wait()
        raise _Abort(f"{self.name} reported no {kind!r} within {timeout:g} s")

    def command(self, word: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(word.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise _Abort(f"{self.name} is not listening ({exc})") from None

    async def take_read(self, *, timeout: float = STEP_TIMEOUT) -> _Read:
        """The answer to a ``read`` command (it becomes :attr:`last_read`)."""
        event = await self.take("read", timeout=timeout)
        self.last_read = _Read(event["t_send"], event["t"], event["data"], event["hit"])
        return self.last_read


# ---------------------------------------------------------------- the demo
@dataclasses.dataclass
class _Check:
    label: str
    detail: str
    ok: bool


class _CrashDemo:
    def __init__(
        self, *, term: float, skew: float, clients: int, console: _Console, children: _Children
    ) -> None:
        self.term = term
        self.skew = skew
        self.clients = clients
        self.c = console
        self.children = children
        self.checks: list[_Check] = []
        self.root = ""
        self.host = "127.0.0.1"
        self.port = 0
        self.server: subprocess.Popen[bytes] | None = None
        self.server_log = ""
        self.server_lines: list[str] = []
        self.readers: list[_Reader] = []
        self._writer: Client | None = None
        self.wait_measured = 0.0
        self.wait_expected = 0.0

    @property
    def writer(self) -> Client:
        assert self._writer is not None
        return self._writer

    def check(self, label: str, detail: str, ok: bool) -> None:
        self.checks.append(_Check(label, detail, ok))

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
        await self.writer.write(PATH, _generation(1))
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
                raise _Interrupted(signum)

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
            raise _Abort(f"the server {why} (exit status {self.server.poll()})")
        self.host, self.port = address
        self.c.event(
            time.monotonic(),
            "server",
            f"listening on {self.host}:{self.port} (pid {self.server.pid})",
        )

    async def _pump_server(self, first: trio.Event) -> None:
        assert self.server is not None
        stream = _stdout_stream(self.server)
        async with stream:
            async for line in _lines(stream):
                self.server_lines.append(line)
                first.set()
        first.set()

    async def _start_readers(self, nursery: trio.Nursery) -> None:
        for i in range(self.clients):
            argv = [
                sys.executable, "-m", "fscache.bench.demo", "worker", "--port", str(self.port),
                "--client-id", f"demo-reader-{i}", "--path", PATH,
            ]  # fmt: skip
            proc, log_path = self.children.start(f"reader-{i}", argv)
            reader = _Reader(i, proc, log_path)
            self.readers.append(reader)
            nursery.start_soon(reader.pump)
        ready = [await r.take("ready", timeout=START_TIMEOUT) for r in self.readers]
        for reader, event in sorted(zip(self.readers, ready, strict=True), key=lambda x: x[1]["t"]):
            self.c.event(event["t"], reader.name, f"connected (pid {reader.proc.pid})")

    async def _stop_readers(self) -> None:
        live = [r for r in self.readers if r.killed_at is None]
        for reader in live:
            reader.command("quit")
        statuses = [await _wait_exit(reader.proc, STEP_TIMEOUT) for reader in live]
        bad = [f"{r.name}: {s}" for r, s in zip(live, statuses, strict=True) if s != 0]
        self.check(
            "readers exit",
            f"exit status {', '.join(bad)}" if bad else f"{len(live)} live readers exited with 0",
            not bad,
        )

    async def _stop_server(self) -> None:
        assert self.server is not None
        self.server.terminate()
        status = await _wait_exit(self.server, STEP_TIMEOUT)
        self.c.event(time.monotonic(), "server", f"stopped by SIGTERM (exit status {status})")
        self.check("server exit", f"exit status {status}", status == 0)

    def _kill(self, reader: _Reader) -> None:
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
    def _client_expiry(self, read: _Read) -> float:
        return read.t_send + self.term - self.skew

    def _server_expiry(self, read: _Read) -> float:
        return read.t_send + self.term + self.skew

    # ------------------------------------------------------------ phases
    async def _read_all(self, readers: list[_Reader], *, generation: int) -> list[_Read]:
        for reader in readers:
            reader.command("read")
        reads = [await reader.take_read() for reader in readers]
        wrong = []
        for reader, read in sorted(zip(readers, reads, strict=True), key=lambda x: x[1].t):
            ok = read.data == _generation(generation).decode() and not read.hit
            source = "its cache" if read.hit else "the server"
            self.c.event(
                read.t,
                reader.name,
                f"read {_describe(read.data)} from {source}; lease granted,"
                f" trusted until {self.c.rel(self._client_expiry(read))}",
                None if ok else "red",
            )
            if not ok:
                wrong.append(f"{reader.name} got {_describe(read.data)} from {source}")
        self.check(
            f"generation {generation} cached",
            "; ".join(wrong) or f"{len(readers)} of {len(readers)} readers read it from the server",
            not wrong,
        )
        return reads

    async def _collect_approvals(self, readers: list[_Reader], since: float) -> list[float]:
        times = []
        for reader in readers:
            try:
                times.append((await reader.take("approval", since=since))["t"])
            except _Abort:
                times.append(float("inf"))
        return times

    async def _write_all_alive(self) -> None:
        c = self.c
        t0 = time.monotonic()
        await self.writer.write(PATH, _generation(2))
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
            took < PROMPT,
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
            await self.writer.write(PATH, _generation(3))
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
            late = [r.name for r, t in zip(live, approvals, strict=True) if t - t0 >= PROMPT]
            self.check(
                "live approvals",
                f"none within {PROMPT:g} s from {', '.join(late)}"
                if late
                else f"{len(live)} of {len(live)}, the slowest"
                f" {(max(approvals) - t0) * 1000:.0f} ms after the write request",
                not late,
            )
            nursery.start_soon(self._countdown, expected, done)
            held = await self._read_during_wait(live[0], t0, expected, done)
            await done.wait()
        t1 = result["t1"]
        c.event(
            t1,
            "writer",
            f"write applied after {t1 - result['t0']:.3f} s: expected at {c.rel(expected)},"
            f" measured {c.rel(t1)} ({_ms(t1 - expected)})",
            "green",
        )
        if held is not None:
            await self._report_held_read(live[0], held, expected)

        self.wait_measured = t1 - result["t0"]
        self.wait_expected = expected - result["t0"]
        self.check(
            "write past the dead reader",
            f"expected {c.rel(expected)} (reader 0's request {c.rel(lease.t_send)}"
            f" + term {self.term:g} + skew {self.skew:g}), measured {c.rel(t1)}"
            f" ({_ms(t1 - expected)})",
            expected - EARLY_MARGIN <= t1 <= expected + LATE_MARGIN,
        )
        trusted = self._client_expiry(lease)
        self.check(
            "no stale read possible",
            f"reader 0 trusted its copy until {c.rel(trusted)};"
            f" the write landed {t1 - trusted:.3f} s later",
            t1 > trusted,
        )

    async def _read_during_wait(
        self, reader: _Reader, t0: float, expected: float, done: trio.Event
    ) -> _Read | None:
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
        return await reader.take_read(timeout=expected - now + LATE_MARGIN + STEP_TIMEOUT)

    async def _report_held_read(self, reader: _Reader, read: _Read, expected: float) -> None:
        fresh = read.data == _generation(3).decode()
        self.c.event(
            read.t,
            reader.name,
            f"its held read returned {_describe(read.data)} after {read.t - read.t_send:.3f} s",
            None if fresh else "red",
        )
        self.check(
            f"{reader.name} read during the wait",
            f"asked at {self.c.rel(read.t_send)}, answered {_describe(read.data)}"
            f" at {self.c.rel(read.t)}, once the write was applied",
            fresh and read.t >= expected - EARLY_MARGIN and not read.hit,
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
            fresh = text == _generation(3).decode()
            source = "its cache (a lease on the new contents)" if hit else "the server"
            c.event(t, who, f"read {_describe(text)} from {source}", None if fresh else "red")
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
            f"{PATH} holds {_describe(text)} after the server stopped",
            on_disk == _generation(3),
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


def _leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside ``exc`` (trio nests them in groups)."""
    while isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if isinstance(inner, KeyboardInterrupt | _Interrupted | _Abort | FscacheError):
                return _leaf(inner)
        exc = exc.exceptions[0]
    return exc


def run_crash_demo(
    *, term: float = 3.0, skew: float = 0.1, clients: int = 3, out: TextIO | None = None
) -> int:
    """Run the crash demonstration; 0 if everything behaved as the lease rules say."""
    if clients < 2:
        raise FscacheError("--clients must be at least 2 (one to kill, one to approve)")
    if clients > MAX_CLIENTS:
        raise FscacheError(f"--clients must be at most {MAX_CLIENTS}")
    if term < MIN_TERM:
        raise FscacheError(f"--term must be at least {MIN_TERM:g} s for the demo")
    if not 0 <= skew < term:
        raise FscacheError("--skew must be at least 0 and less than --term")
    t0 = time.monotonic()
    console = _Console(t0, out or sys.stdout)
    c = console
    c.line(
        c.paint(
            f"fscache crash demo: {clients} reader processes, lease term {term:g} s,"
            f" skew {skew:g} s",
            "bold",
        )
    )
    intro = (
        "Reader 0 is killed with SIGKILL while it holds a lease. The live readers approve the"
        " next write at once; the dead one cannot, so the server waits until its lease runs"
        " out (grant + term + skew). Times are seconds since the start, on the machine's"
        " monotonic clock, which every process shares."
    )
    for line in textwrap.wrap(intro, 88):
        c.line(line)
    c.line()
    with tempfile.TemporaryDirectory(prefix="fscache-demo-") as temp:
        root = os.path.join(temp, "root")
        logs = os.path.join(temp, "logs")
        os.mkdir(root)
        os.mkdir(logs)
        children = _Children(logs)
        demo = _CrashDemo(term=term, skew=skew, clients=clients, console=console, children=children)
        try:
            try:
                trio.run(demo.run, root)
            except BaseException as exc:
                leaf = _leaf(exc)
                if isinstance(leaf, KeyboardInterrupt):
                    c.clear_status()
                    c.line("\ninterrupted: stopping the server and the readers")
                    return 130
                if isinstance(leaf, _Interrupted):
                    c.clear_status()
                    c.line(f"\n{leaf}: stopping the server and the readers")
                    return 128 + leaf.signum
                if not isinstance(leaf, _Abort | FscacheError):
                    raise
                c.clear_status()
                why = str(leaf) if isinstance(leaf, _Abort) else f"{type(leaf).__name__}: {leaf}"
                demo.check("demo stopped", why, False)
        finally:
            children.stop_all()
        if demo.checks:
            demo.summary()
        problems = demo.problems
        c.line()
        if problems:
            for name, path in demo.logs():
                tail = _tail(path)
                if tail:
                    c.line(f"last lines of the {name}'s log:")
                    for line in tail:
                        c.line(f"    {line}")
            c.line(c.paint(f"FAIL: {problems[0]}", "red"))
            for problem in problems[1:]:
                c.line(c.paint(f"      {problem}", "red"))
            return 1
        c.line(
            c.paint(
                f"OK: the writer waited {demo.wait_measured:.2f} s for the dead client's lease"
                f" (expected {demo.wait_expected:.2f} s); live clients approved at once;"
                " no stale read; nothing lost",
                "green",
            )
        )
        return 0


# ---------------------------------------------------------------- the reader process
def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


async def _worker(port: int, client_id: str, path: str) -> None:
    async def read(client: Client) -> None:
        hits = client.stats["hits"]
        t_send = time.monotonic()
        try:
            data = await client.read(path)
        except FscacheError as exc:
            _emit("error", message=f"read failed: {type(exc).__name__}: {exc}")
            return
        hit = client.stats["hits"] > hits
        _emit("read", t_send=t_send, data=data.decode(errors="replace"), hit=hit)

    async def watch_approvals(client: Client) -> None:
        seen = client.stats["approvals"]
        while True:
            await trio.sleep(APPROVAL_POLL)
            count = client.stats["approvals"]
            if count != seen:
                seen = count
                _emit("approval", count=count)

    async with open_client("127.0.0.1", port, client_id=client_id) as client:
        _emit("ready")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_approvals, client)
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            async with stdin, contextlib.aclosing(_lines(stdin)) as commands:
                async for line in commands:
                    if line.strip() == "read":
                        nursery.start_soon(read, client)
                    elif line.strip() == "quit":
                        break
            nursery.cancel_scope.cancel()


def _worker_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fscache.bench.demo worker")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--path", default=PATH)
    args = parser.parse_args(argv)
    try:
        trio.run(_worker, args.port, args.client_id, args.path)
    except FscacheError as exc:
        _emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


def _main(argv: Sequence[str]) -> int:
    if argv[:1] == ["worker"]:
        return _worker_main(argv[1:])
    print("usage: fscache demo crash [--term T] [--skew S] [--clients N]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


__all__ = ["run_crash_demo"]
