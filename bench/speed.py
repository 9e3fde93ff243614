"""Issue 3's speed figures, each a ratio to a baseline measured in the same run.

``python -m fscache.bench.speed [--out speed.json]`` prints a table and, with
``--out``, writes the same figures as JSON. Nothing here is asserted by tests:
the numbers belong to the machine they were taken on.

1. **Cache hit** -- ``c.read(path)`` on a blocking and on an async client, against
   a plain function doing a dict lookup and a ``time.monotonic()`` comparison.
   Tight loops, best of several repeats (``timeit``'s method).
2. **Miss** -- an async client reading files it has never read (each read is a
   round trip that is granted a lease) against one round trip to a bare trio echo
   server that decodes and re-encodes each CBOR frame. Median of per-read times.
   Also shown, to split the cost: the same request sent by the bare frame client
   to the fscache server.
3. **Throughput** -- 50 concurrent clients, spread over worker processes, each
   reading its own small file with term 0 (every read reaches the server), against
   the echo server driven by the *same* load generator
   (:class:`fscache.bench.frames.FrameConnection`). Messages are counted at the
   server: one request in plus one reply out per round trip.

Every server runs in its own process; so does every load generator.

The fscache server drives plain TCP sockets with :class:`fscache.net.SocketWire`
rather than trio's ``SocketStream`` (one pass through the scheduler per message
instead of two). The issue's baseline is the plain trio echo server; rows marked
"(vs echo on fscache's socket I/O)" also compare with the same echo loop on
``SocketWire``, to show what is the I/O layer and what is fscache's own work.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from queue import Empty
from typing import Any

import trio

from fscache.bench.frames import FrameConnection
from fscache.bench.harness import ServerProcess, echo_server, fscache_server
from fscache.protocol import read_frame

FILE_SIZE = 64  # bytes: "a small file"
LONG_TERM = 600.0  # leases that outlive the measurement: every warm read is a hit
SERVER_CACHES_AFTER = 2.5  # s: the server caches only files whose ctime is this old

TARGETS = {  # issue 3
    "hit_blocking": 3.0,  # at most this many baselines
    "hit_async": 4.0,
    "miss": 1.4,  # at most this many echo round trips
    "throughput": 0.75,  # at least this fraction of the echo server's messages/s
}


# ---------------------------------------------------------------- cache hits
_entries: dict[str, Any] = {}


def cached_lookup(path: str) -> bytes | None:
    """The baseline: what a cache hit cannot do without (a dict lookup, a clock
    comparison), as a plain function."""
    entry = _entries.get(path)
    if entry is not None and time.monotonic() < entry.expiry:
        return entry.data  # type: ignore[no-any-return]
    return None


def best_per_call(fn: Callable[[str], object], arg: str, *, number: int, repeat: int) -> float:
    """Seconds per call of ``fn(arg)``: timeit's tight loop, best of ``repeat``."""
    timer = timeit.Timer("fn(arg)", globals={"fn": fn, "arg": arg})
    return min(timer.repeat(repeat=repeat, number=number)) / number


async def best_per_await(fn: Callable[[str], Any], arg: str, *, number: int, repeat: int) -> float:
    """Seconds per ``await fn(arg)`` in the same kind of loop, best of ``repeat``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in itertools.repeat(None, number):
            await fn(arg)
        best = min(best, time.perf_counter() - start)
    return best / number


def measure_hits(root: str, *, number: int, repeat: int) -> dict[str, float]:
    import fscache
    from fscache.cache import Entry

    _write_files(root, ["hit"])
    _entries["hit"] = Entry(b"x" * FILE_SIZE, 1, time.monotonic() + 1e9)
    result = {"hit_baseline_s": best_per_call(cached_lookup, "hit", number=number, repeat=repeat)}
    with fscache_server(root, term=LONG_TERM) as server:
        with fscache.connect(server.address) as blocking:
            blocking.read("hit")  # the miss that takes the lease
            result["hit_blocking_s"] = best_per_call(
                blocking.read, "hit", number=number, repeat=repeat
            )

        async def run_async() -> float:
            async with fscache.open_client("127.0.0.1", server.port) as client:
                await client.read("hit")
                return await best_per_await(client.read, "hit", number=number, repeat=repeat)

        result["hit_async_s"] = trio.run(run_async)
    return result


# ---------------------------------------------------------------- misses
async def _fscache_misses(port: int, paths: Sequence[str]) -> list[float]:
    import fscache

    times = []
    async with fscache.open_client("127.0.0.1", port) as client:
        await client.server_stats()  # connection warm
        for path in paths:
            start = time.perf_counter()
            await client.read(path)
            times.append(time.perf_counter() - start)
        assert client.stats["hits"] == 0, "a miss benchmark read hit the cache"
    return times


async def _frame_round_trips(port: int, paths: Sequence[str]) -> list[float]:
    times = []
    connection = await FrameConnection.open("127.0.0.1", port)
    try:
        for i, path in enumerate(paths, 1):
            frame = read_frame(i, path)
            start = time.perf_counter()
            reply = await connection.call(frame)
            times.append(time.perf_counter() - start)
            if reply.get("t") == "error":
                raise RuntimeError(f"read of {path} failed: {reply}")
    finally:
        await connection.aclose()
    return times


def measure_misses(root: str, *, count: int, repeat: int) -> dict[str, float]:
    """Median seconds per miss (best of ``repeat`` passes, each over ``count`` files the
    client has never read). Two kinds of file: *cold*, never read by the server
    either, and *warm*, read through another connection first (the server's
    content cache holds it, as for any file that some client reads)."""
    cold = [f"miss/{i:05d}" for i in range(count * repeat)]
    warm = [f"warm/{i:05d}" for i in range(count * repeat)]
    _write_files(root, cold + warm)
    written = time.monotonic()
    result: dict[str, float] = {}
    for key, wire in (("echo_rtt_s", False), ("echo_wire_rtt_s", True)):
        with echo_server(wire=wire) as echo:
            result[key] = min(
                statistics.median(trio.run(_frame_round_trips, echo.port, paths))
                for paths in _passes(cold, count, repeat)
            )
    time.sleep(max(0.0, written + SERVER_CACHES_AFTER - time.monotonic()))
    with fscache_server(root, term=LONG_TERM) as server:
        result["miss_s"] = min(
            statistics.median(trio.run(_fscache_misses, server.port, paths))
            for paths in _passes(cold[: count * repeat // 2], count // 2, repeat)
        )
        result["miss_frame_client_s"] = min(
            statistics.median(trio.run(_frame_round_trips, server.port, paths))
            for paths in _passes(cold[count * repeat // 2 :], count // 2, repeat)
        )
        trio.run(_frame_round_trips, server.port, warm)  # another client reads them first
        result["miss_warm_s"] = min(
            statistics.median(trio.run(_fscache_misses, server.port, paths))
            for paths in _passes(warm, count, repeat)
        )
    return result


def _passes(names: Sequence[str], count: int, repeat: int) -> list[Sequence[str]]:
    return [names[i * count : (i + 1) * count] for i in range(repeat)]


# ---------------------------------------------------------------- throughput
def _load_generator(
    port: int, paths: list[str], start_at: float, count_from: float, stop_at: float, out: Any
) -> None:
    """One worker process: a closed loop per path, one request in flight each.
    Puts the number of round trips completed in ``[count_from, stop_at)``."""

    async def run() -> int:
        connections = [await FrameConnection.open("127.0.0.1", port) for _ in paths]
        counted = 0

        async def loop(connection: FrameConnection, path: str) -> None:
            nonlocal counted
            for request_id in itertools.count(1):
                now = time.monotonic()
                if now >= stop_at:
                    return
                await connection.call(read_frame(request_id, path))
                if count_from <= now and time.monotonic() < stop_at:
                    counted += 1

        try:
            await trio.sleep(max(0.0, start_at - time.monotonic()))
            async with trio.open_nursery() as nursery:
                for connection, path in zip(connections, paths, strict=True):
                    nursery.start_soon(loop, connection, path)
        finally:
            for connection in connections:
                await connection.aclose()
        return counted

    out.put(trio.run(run))


def run_load(
    server: ServerProcess, paths: list[str], *, processes: int, seconds: float
) -> tuple[float, float]:
    """Round trips per second that ``processes`` load generators get from ``server``,
    and the server's CPU seconds per round trip over the same window."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.monotonic() + 2.0  # every worker connected and waiting by then
    count_from = start_at + min(1.0, seconds / 4)  # warm-up not counted
    stop_at = count_from + seconds
    shares = [paths[i::processes] for i in range(processes)]
    workers = [
        context.Process(
            target=_load_generator,
            args=(server.port, share, start_at, count_from, stop_at, queue),
        )
        for share in shares
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(max(0.0, count_from - time.monotonic()))
        cpu = server.cpu_seconds()
        time.sleep(max(0.0, stop_at - time.monotonic()))
        cpu = server.cpu_seconds() - cpu
        total = 0
        for _ in workers:
            while True:
                try:
                    total += queue.get(timeout=1.0)
                    break
                except Empty:
                    if time.monotonic() > stop_at + 30 or all(
                        w.exitcode not in (None, 0) for w in workers
                    ):
                        raise RuntimeError("a load generator failed; see its traceback") from None
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
            worker.close()
        queue.close()
        queue.join_thread()
    return total / seconds, cpu / max(total, 1)


def measure_throughput(
    root: str, *, clients: int, processes: int, seconds: float
) -> dict[str, float]:
    paths = [f"load/{i:03d}" for i in range(clients)]
    _write_files(root, paths)
    with echo_server() as echo:
        echo_rate, echo_cpu = run_load(echo, paths, processes=processes, seconds=seconds)
    with fscache_server(root, term=0.0) as server:
        fscache_rate, fscache_cpu = run_load(server, paths, processes=processes, seconds=seconds)
    with echo_server(wire=True) as echo:
        wire_rate, wire_cpu = run_load(echo, paths, processes=processes, seconds=seconds)
    return {  # messages at the server: a request in and a reply out per round trip
        "echo_msgs_per_s": 2 * echo_rate,
        "fscache_msgs_per_s": 2 * fscache_rate,
        "echo_wire_msgs_per_s": 2 * wire_rate,
        "echo_cpu_per_request_s": echo_cpu,
        "fscache_cpu_per_request_s": fscache_cpu,
        "echo_wire_cpu_per_request_s": wire_cpu,
    }


# ---------------------------------------------------------------- the report
def _write_files(root: str, names: Sequence[str]) -> None:
    for name in names:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(name.encode().ljust(FILE_SIZE, b"."))


def summarize(raw: dict[str, float]) -> list[dict[str, Any]]:
    """The rows of the table: figure, baseline, ratio, target, met."""

    def row(
        name: str,
        value: float,
        base: float,
        unit: str,
        target: float | None = None,
        at_most: bool = True,
    ) -> dict[str, Any]:
        """A figure against its baseline; with no target, a row for context."""
        ratio = value / base
        return {
            "figure": name,
            "value": value,
            "baseline": base,
            "unit": unit,
            "ratio": ratio,
            "target": "(info)" if target is None else f"{'<=' if at_most else '>='} {target:g}",
            "met": None if target is None else ratio <= target if at_most else ratio >= target,
        }

    us = 1e6
    rows = [
        row("hit, blocking client", raw["hit_blocking_s"] * us, raw["hit_baseline_s"] * us,
            "us", TARGETS["hit_blocking"], True),
        row("hit, async client", raw["hit_async_s"] * us, raw["hit_baseline_s"] * us,
            "us", TARGETS["hit_async"], True),
        row("miss (lease granted), async client", raw["miss_s"] * us, raw["echo_rtt_s"] * us,
            "us", TARGETS["miss"], True),
        row("  same, file warm on the server", raw["miss_warm_s"] * us, raw["echo_rtt_s"] * us,
            "us", TARGETS["miss"], True),
        row("throughput, 50 clients, term 0", raw["fscache_msgs_per_s"],
            raw["echo_msgs_per_s"], "msg/s", TARGETS["throughput"], False),
    ]  # fmt: skip
    info_rows = [  # (position in the table, row): context, no target
        (4, row("  (miss, bare frame client)", raw["miss_frame_client_s"] * us,
                raw["echo_rtt_s"] * us, "us")),
        (5, row("  (miss vs echo on fscache's socket I/O)", raw["miss_s"] * us,
                raw["echo_wire_rtt_s"] * us, "us")),
        (7, row("  (vs echo on fscache's socket I/O)", raw["fscache_msgs_per_s"],
                raw["echo_wire_msgs_per_s"], "msg/s")),
        (8, row("  (server CPU per request)", raw["fscache_cpu_per_request_s"] * us,
                raw["echo_cpu_per_request_s"] * us, "us")),
    ]  # fmt: skip
    for position, info in info_rows:
        rows.insert(position, info)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'figure':42} {'fscache':>12} {'baseline':>12} {'ratio':>7} {'target':>8}  met"
    lines = [header, "-" * len(header)]
    for r in rows:
        met = {True: "yes", False: "NO", None: ""}[r["met"]]
        unit = r["unit"]
        value = f"{r['value']:.3f} {unit}" if unit == "us" else f"{r['value']:,.0f} {unit}"
        base = f"{r['baseline']:.3f} {unit}" if unit == "us" else f"{r['baseline']:,.0f} {unit}"
        lines.append(
            f"{r['figure']:42} {value:>12} {base:>12} {r['ratio']:>7.2f} {r['target']:>8}  {met}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fscache.bench.speed", description=__doc__)
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument("--hit-loops", type=int, default=1_000_000, help="calls per repeat")
    parser.add_argument("--repeat", type=int, default=7, help="repeats (the best is kept)")
    parser.add_argument("--misses", type=int, default=2000, help="files read per miss pass")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--processes", type=int, default=2, help="load generator processes")
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput window")
    parser.add_argument("--quick", action="store_true", help="fewer loops (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.hit_loops, args.repeat, args.misses, args.seconds = 20_000, 2, 200, 1.0
    raw: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fscache-speed-") as tmp:
        measures: list[tuple[str, Callable[[str], dict[str, float]]]] = [
            ("hits", lambda r: measure_hits(r, number=args.hit_loops, repeat=args.repeat)),
            ("misses", lambda r: measure_misses(r, count=args.misses, repeat=3)),
            ("throughput", lambda r: measure_throughput(
                r, clients=args.clients, processes=args.processes, seconds=args.seconds)),
        ]  # fmt: skip
        for name, measure in measures:
            root = os.path.join(tmp, name)
            os.mkdir(root)
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            raw.update(measure(root))
    rows = summarize(raw)
    print(format_table(rows))
    if args.out:
        document = {
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "raw": raw,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
