"""Lease scale, measured with a real server process and real clients: what a million
live leases cost the server's memory, and how long a write waits when thousands of
clients hold the file it writes.

Both measurements start a server in its own process (:func:`scale_server`: the
``fscache serve`` code with its connection caps raised, since one identity opens
thousands of connections here) and client processes (:class:`WorkerPool` workers,
each running many :func:`fscache.open_client` clients under one trio loop).

* :func:`measure_leases` -- for each shape ``(files, holders)``, a fresh server
  over a tree of empty files, and clients that read until every file is leased by
  ``holders`` sessions. A session holds at most ``PER_SESSION`` leases (below the
  server's per-session limit), so a shape takes ``holders * ceil(files /
  PER_SESSION)`` sessions, one connection each: the protocol has one session per
  connection. The row is the server's resident set size once every lease is
  granted (``/proc/PID/status``, ``VmRSS``), against its size before the first
  client: ``bytes_per_lease`` is the growth over the leases, file names and the
  server's own per-file state (its content cache) included.
* :func:`measure_fanout` -- ``holders`` clients read one file, then one more client
  writes it: each holder is sent an approval request, approves at once, and the
  write is applied. ``apply_s`` is the writer's time from the write's request to
  its reply, over a few repetitions (the holders read the file again between them);
  ``server_cpu`` and ``holders_cpu`` the CPU time the server and the holders'
  processes used meanwhile. The holders' processes run at ``FANOUT_HOLDERS_NICE``
  (``--holders-nice``), so that they take only the CPU the server leaves, as clients
  on machines of their own would.

``python -m fscache.bench.scale_leases leases|fanout`` runs one of them alone (see
``--help``); ``leases --trace DIR`` also writes, for each shape, where the server's
memory went (``tracemalloc``, grouped by source line) to ``DIR/FILESxHOLDERS.txt``.
A traced server is slower and its RSS includes the tracer's own records: its RSS row
is not comparable with an untraced one.

Nothing here is asserted by tests: the figures belong to the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from typing import Any

import trio

import fscache
from fscache.bench import bounded, run_main
from fscache.bench.harness import ServerProcess, process_cpu_seconds, rss_bytes, spawn
from fscache.bench.procs import WorkerPool
from fscache.cli import parse_serving_line
from fscache.client.client import PING_AFTER
from fscache.server.service import GC_YOUNG_THRESHOLD

PER_SESSION = 50_000  # leases one session takes; the server's default limit is 65,536
FILES_PER_DIR = 1_000
CONNECT_AT_ONCE = 16  # handshakes a worker has under way at a time
CONNECT_ATTEMPTS = 20  # a busy machine can miss the client's handshake or liveness timeouts
RETRY_AFTER = 1.0  # seconds between attempts: the client reconnects by itself meanwhile
READS_AT_ONCE = 32  # reads one client has in flight
READS_PER_WORKER = 128  # reads a worker's clients have in flight together: a read waiting
# longer than 3 s for its reply makes the client give its link up
FANOUT_TARGET = 0  # the file every fan-out holder reads: file_name(0)
TERM = 3600.0  # no lease expires while it is measured
FANOUT_TERM = 60.0  # a holder that cannot approve (its link lost) delays a write this long
# Seconds between the holders' reads and the write: long enough for their clients to be
# idle, as holders of a lease mostly are (each read arms the client's liveness timer,
# which runs out PING_AFTER / 2 later and is then kept no more), so that the write's
# time is the fan-out's, not the expiry of ten thousand timers the reads left.
FANOUT_SETTLE = PING_AFTER
# The holders stand for clients on machines of their own, which take no CPU from the
# server. Here they share its two cores, and at the same priority four busy holder
# processes leave the server two fifths of them while it sends and receives the
# fan-out: the write would measure the kernel's fair share, not the server. At this
# nice value they get every cycle the server leaves, and only those.
FANOUT_HOLDERS_NICE = 10
TRACE_LINES = 30  # source lines a memory report names, the largest first
TRACE_TIMEOUT = 600.0  # seconds a traced server may take to write its report


# ---------------------------------------------------------------- the tree
def file_name(i: int) -> str:
    return f"d{i // FILES_PER_DIR:04d}/f{i:07d}"


def make_tree(root: str, files: int) -> None:
    """``files`` empty files (no data blocks: only names and inodes) under ``root``."""
    for i in range(0, files, FILES_PER_DIR):
        os.makedirs(os.path.join(root, os.path.dirname(file_name(i))), exist_ok=True)
    for i in range(files):
        os.close(os.open(os.path.join(root, file_name(i)), os.O_WRONLY | os.O_CREAT, 0o600))


# ---------------------------------------------------------------- the server
def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextlib.contextmanager
def scale_server(
    root: str, *, term: float = TERM, trace: str | None = None
) -> Iterator[ServerProcess]:
    """A server process on a free port, with room for tens of thousands of
    connections from one identity (the defaults cap them at 1024, 256 per identity).
    With ``trace`` (a file name) it traces its allocations and writes where its memory
    is to that file on SIGUSR1 (:func:`memory_report`)."""
    argv = [sys.executable, "-m", "fscache.bench.scale_leases", "serve", root, repr(term)]
    if trace is not None:
        argv.append(trace)
    server = spawn("fscache", argv, parse_serving_line)
    try:
        yield server
    finally:
        server.stop()


def memory_report(snapshot: tracemalloc.Snapshot, rss: int) -> str:
    """The traced memory of ``snapshot`` by source line, largest first, and ``rss``."""
    stats = snapshot.statistics("lineno")
    total = sum(stat.size for stat in stats)
    lines = [f"rss {rss / 1e6:.1f} MB (tracing included), traced {total / 1e6:.1f} MB"]
    for stat in stats[:TRACE_LINES]:
        where = stat.traceback[0]
        size = f"{stat.size / 1e6:8.1f} MB {stat.count:10,d}"
        lines.append(f"{size}  {where.filename}:{where.lineno}")
    return "\n".join(lines) + "\n"


def _write_report(path: str) -> None:
    report = memory_report(tracemalloc.take_snapshot(), rss_bytes(os.getpid()))
    with open(path + ".part", "w") as f:
        f.write(report)
    os.replace(path + ".part", path)


def _serve(root: str, term: float, trace: str | None = None) -> None:
    from fscache.server.service import ServerSettings, serve

    if trace is not None:
        tracemalloc.start()
    _raise_open_files()
    connections = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 64
    settings = ServerSettings(
        root=root, port=0, term=term, hot_writes=0,
        max_connections=connections, max_connections_per_identity=connections,
    )  # fmt: skip

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            service = await nursery.start(serve, settings)
            print(f"fscache serving {root} on {service.host}:{service.port} (term {term:g} s)")
            sys.stdout.flush()
            with trio.open_signal_receiver(
                signal.SIGINT, signal.SIGTERM, signal.SIGUSR1
            ) as signals:
                async for signum in signals:
                    if signum != signal.SIGUSR1:
                        break
                    if trace is not None:
                        _write_report(trace)
            nursery.cancel_scope.cancel()

    trio.run(run)


# ---------------------------------------------------------------- the clients
class _Round:
    """Clients of one worker in step: each reads its files once per round."""

    def __init__(self, clients: int) -> None:
        self.clients = clients
        self.done = 0
        self.all_done = trio.Event()
        self.go = trio.Event()
        self.stop = False
        self.failed: BaseException | None = None
        self.reading = trio.Semaphore(READS_PER_WORKER)

    def start(self, *, stop: bool = False) -> None:
        self.done, self.all_done, self.stop = 0, trio.Event(), stop
        go, self.go = self.go, trio.Event()
        go.set()

    def finished_one(self) -> None:
        self.done += 1
        if self.done == self.clients:
            self.all_done.set()


async def _hold(
    address: tuple[str, int],
    files: range,
    round_: _Round,
    go: trio.Event,
    connecting: trio.Semaphore,
) -> None:
    """One client: read ``files`` on each round (the first starts with ``go``), and
    keep the leases between rounds."""
    async with connecting:
        for attempt in range(CONNECT_ATTEMPTS):
            client_cm = fscache.open_client(*address)
            try:
                client = await client_cm.__aenter__()
                break
            except fscache.Unavailable:
                if attempt == CONNECT_ATTEMPTS - 1:
                    raise
                await trio.sleep(RETRY_AFTER)
    try:
        while True:
            await go.wait()
            if round_.stop:
                return
            go = round_.go
            async with trio.open_nursery() as nursery:
                for start in range(READS_AT_ONCE):
                    share = files[start::READS_AT_ONCE]
                    nursery.start_soon(_read_each, client, share, round_.reading)
            round_.finished_one()
    except BaseException as exc:
        round_.failed = exc
        round_.all_done.set()
        raise
    finally:
        await client_cm.__aexit__(None, None, None)


async def _read_each(client: Any, files: range, reading: trio.Semaphore) -> None:
    for i in files:
        for attempt in range(CONNECT_ATTEMPTS):  # the client gives up a link silent for 3 s
            try:
                async with reading:
                    await client.read(file_name(i))
                break
            except fscache.Unavailable:
                if attempt == CONNECT_ATTEMPTS - 1:
                    raise
                await trio.sleep(RETRY_AFTER)


async def _worker_main(pipe: Any) -> None:
    request = await trio.to_thread.run_sync(pipe.recv)
    address, specs = request
    round_ = _Round(len(specs))
    connecting = trio.Semaphore(CONNECT_AT_ONCE)
    async with trio.open_nursery() as nursery:
        for first, stop in specs:
            files = range(first, stop)
            nursery.start_soon(_hold, address, files, round_, round_.go, connecting)
        command: Any = "read"
        while command is not None:
            started = time.monotonic()
            round_.start()
            await round_.all_done.wait()
            if round_.failed is not None:
                raise round_.failed
            pipe.send(time.monotonic() - started)
            command = await trio.to_thread.run_sync(pipe.recv)
        round_.start(stop=True)


def _worker(pipe: Any) -> None:
    _raise_open_files()
    # Thousands of clients in one process stand for as many processes on machines of
    # their own, each with a small heap. Packed together, every young collection here
    # walks objects of thousands of clients, a cost no real client pays (a sixth of
    # the holders' CPU during a write to 10,000 holders): set the collector as the
    # server sets its own, for the same reason.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    trio.run(_worker_main, pipe)


class Holders:
    """Client processes whose clients read their files on each :meth:`read_all`."""

    def __init__(self, address: tuple[str, int], specs: Sequence[tuple[int, int]], processes: int):
        self.processes = max(1, min(processes, len(specs)))
        self.pool = WorkerPool(_worker, self.processes, name="holders")
        share = [list(specs[n :: self.processes]) for n in range(self.processes)]
        try:
            self.pool.send_all([(address, s) for s in share])
            self.pool.receive_all(timeout=3600)
        except BaseException:  # interrupted while they connect: stop them at once
            self.pool.close(at_once=True)
            raise

    def read_all(self) -> None:
        self.pool.send_all(["read"] * self.processes)
        self.pool.receive_all(timeout=3600)

    def __enter__(self) -> Holders:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.pool.close(at_once=kind is not None)  # a failed or interrupted run: at once


# ---------------------------------------------------------------- measurements
def measure_leases(
    shapes: Sequence[tuple[int, int]] = ((100_000, 10), (1_000_000, 1)),
    *,
    processes: int = 4,
    trace_dir: str | None = None,
) -> list[dict[str, float]]:
    """Server RSS with ``files * holders`` live leases, for each ``(files, holders)``.
    With ``trace_dir``, each shape's :func:`memory_report` is written there."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="fscache-scale-") as root:
        make_tree(root, max(files for files, _ in shapes))
        for files, holders in shapes:
            groups = math.ceil(files / PER_SESSION)
            specs = [
                (g * PER_SESSION, min(files, (g + 1) * PER_SESSION))
                for _ in range(holders)
                for g in range(groups)
            ]
            trace = None
            if trace_dir is not None:
                trace = os.path.join(os.path.abspath(trace_dir), f"{files}x{holders}.txt")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(trace)
            with scale_server(root, trace=trace) as server:
                baseline = rss_bytes(server.pid)
                with Holders(("127.0.0.1", server.port), specs, processes):
                    leases = trio.run(_live_leases, server.port)
                    rss = rss_bytes(server.pid)
                    if trace is not None:
                        _await_report(server, trace)
            rows.append(
                {
                    "files": files,
                    "holders": holders,
                    "sessions": len(specs),
                    "leases": leases,
                    "server_rss_bytes": rss,
                    "baseline_rss_bytes": baseline,
                    "bytes_per_lease": (rss - baseline) / max(1, leases),
                }
            )
    return rows


def _await_report(server: ServerProcess, path: str) -> None:
    os.kill(server.pid, signal.SIGUSR1)
    deadline = time.monotonic() + TRACE_TIMEOUT
    while not os.path.exists(path):
        if time.monotonic() > deadline or server.popen.poll() is not None:
            raise RuntimeError(f"the traced server wrote no memory report to {path}")
        time.sleep(0.5)


async def _live_leases(port: int) -> int:
    async with fscache.open_client("127.0.0.1", port) as client:
        stats = await client.server_stats()
    return int(stats["leases_active"])


def measure_fanout(
    holders: Sequence[int] = (100, 1_000, 10_000),
    *,
    repetitions: int = 5,
    processes: int = 4,
    holders_nice: int = FANOUT_HOLDERS_NICE,
) -> list[dict[str, float]]:
    """Seconds from a write's request to its reply when ``n`` clients hold the file
    and each approves at once, for each ``n`` in ``holders``; and the CPU time the
    server and the holders' processes used meanwhile (median over the writes: on a
    machine that runs other work, how much of the wait was this work). The holders'
    processes run at ``holders_nice`` (0: the server's priority)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="fscache-fanout-") as root:
        make_tree(root, FANOUT_TARGET + 1)
        with scale_server(root, term=FANOUT_TERM) as server:
            for n in holders:
                spec = (FANOUT_TARGET, FANOUT_TARGET + 1)
                holding = Holders(("127.0.0.1", server.port), [spec] * n, processes)
                pids = [process.pid for process in holding.pool.processes]
                nice = holding.pool.renice(holders_nice)
                with holding:
                    times, server_cpu, holders_cpu = [], [], []
                    for rep in range(repetitions):
                        if rep:
                            holding.read_all()
                        time.sleep(FANOUT_SETTLE)
                        before = server.cpu_seconds(), _cpu_of(pids)
                        times.append(trio.run(_timed_write, server.port))
                        server_cpu.append(server.cpu_seconds() - before[0])
                        holders_cpu.append(_cpu_of(pids) - before[1])
                print(f"fan-out to {n} holders: {_progress(times)}", file=sys.stderr, flush=True)
                rows.append(
                    {
                        "holders": n,
                        "holders_nice": nice,  # as the kernel has it
                        "repetitions": repetitions,
                        "apply_p50_s": statistics.median(times),
                        "apply_max_s": max(times),
                        "server_cpu_p50_s": statistics.median(server_cpu),
                        "holders_cpu_p50_s": statistics.median(holders_cpu),
                    }
                )
    return rows


def _progress(times: list[float]) -> str:
    """A progress line's figures: the writes' times in milliseconds, rounded, and
    their median (the raw floats are in the results)."""
    shown = ", ".join(f"{t * 1000:.1f}" for t in times)
    return f"write applied in {shown} ms (median {statistics.median(times) * 1000:.1f} ms)"


def _cpu_of(pids: Sequence[int | None]) -> float:
    return sum(process_cpu_seconds(pid) for pid in pids if pid is not None)


async def _timed_write(port: int) -> float:
    async with fscache.open_client("127.0.0.1", port) as client:
        started = time.perf_counter()
        await client.write(file_name(FANOUT_TARGET), b"x")
        return time.perf_counter() - started


def _shape(text: str) -> tuple[int, int]:
    files, _, holders = text.partition("x")
    try:
        shape = int(files), int(holders)
    except ValueError:
        shape = (0, 0)
    if min(shape) < 1:
        message = f"a shape is FILESxHOLDERS, each 1 or more, not {text!r}"
        raise argparse.ArgumentTypeError(message)
    return shape


def _main(argv: Sequence[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) in (3, 4):  # the server process of scale_server
        _serve(argv[1], float(argv[2]), *argv[3:])
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.scale_leases",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    leases = commands.add_parser("leases", help="server RSS against live leases")
    leases.add_argument(
        "--shape", type=_shape, action="append", metavar="FILESxHOLDERS",
        help="files and holders of each file (repeatable; default 100000x10 and 1000000x1)",
    )  # fmt: skip
    leases.add_argument("--trace", metavar="DIR", help="write memory reports here")
    fanout = commands.add_parser("fanout", help="a write to a file many clients hold")
    fanout.add_argument(
        "--holders", type=bounded(int, 1), action="append", metavar="N",
        help="clients holding the file, 1 or more (repeatable; default 100, 1000 and 10000)",
    )  # fmt: skip
    fanout.add_argument(
        "--repetitions", type=bounded(int, 1), default=5, metavar="N",
        help="writes timed for each count of holders (default %(default)s)",
    )  # fmt: skip
    fanout.add_argument(
        "--holders-nice", type=int, choices=range(20), default=FANOUT_HOLDERS_NICE, metavar="N",
        help=f"the holders' processes' nice value, 0-19 (default {FANOUT_HOLDERS_NICE}; 0: the"
        " server's)",
    )  # fmt: skip
    for command in (leases, fanout):
        command.add_argument(
            "--processes", type=bounded(int, 1), default=4, metavar="N",
            help="client processes (default %(default)s)",
        )  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "leases":
        shapes = args.shape or [(100_000, 10), (1_000_000, 1)]
        rows = measure_leases(shapes, processes=args.processes, trace_dir=args.trace)
    else:
        holders = args.holders or [100, 1_000, 10_000]
        rows = measure_fanout(
            holders, repetitions=args.repetitions, processes=args.processes,
            holders_nice=args.holders_nice,
        )  # fmt: skip
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(_main, sys.argv[1:]))


__all__ = [
    "file_name",
    "make_tree",
    "measure_fanout",
    "measure_leases",
    "memory_report",
    "scale_server",
]
