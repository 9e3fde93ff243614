"""The speed benchmark: fscache's hot paths, each a ratio to a baseline measured in
the same run, with the fscache and baseline passes interleaved.

``python -m fscache.bench.speed [--out speed.json] [--quick]`` prints a table and,
with ``--out``, writes the same figures (and every pass's result) as JSON. Nothing
here is asserted by tests: the numbers belong to the machine they were taken on.

1. **Cache hit** -- ``c.read(path)`` on a blocking and on an async client, against
   a plain function doing a dict lookup and a ``time.monotonic()`` comparison. A
   pass is one tight loop (``timeit``'s method); its figure is seconds per call.
2. **Miss** -- an async client reading files it has never read (each read is a
   round trip that is granted a lease) against one round trip to a bare trio echo
   server that decodes and re-encodes each CBOR frame (:mod:`fscache.bench.echo`).
   A pass reads ``--misses`` files; its figure is the median per read. Also shown,
   to split the cost: the same request sent by the bare frame client to the
   fscache server, and the echo loop on fscache's own socket I/O
   (:class:`fscache.net.SocketWire`) as a second baseline.
3. **Throughput** -- 50 concurrent clients, spread over worker processes, each
   reading its own small file with term 0 (every read reaches the server), against
   the echo server driven by the *same* load generator
   (:class:`fscache.bench.frames.FrameConnection`). A pass counts messages at the
   server (one request in plus one reply out per round trip) over ``--seconds``;
   the server's CPU time per request is read over the same window.

Every server runs in its own process, and all of one section's servers run
together; so do the load generators, which serve every throughput pass. Machine
noise comes in bursts, so no section times all its baseline passes first: each
of ``--rounds`` rounds runs one pass of everything, in order on even rounds and
in reverse on odd ones, so each fscache pass has a baseline pass beside it. A
figure's ratio is the median over the rounds of the per-round ratio, shown with
the smallest and largest of them; the fscache and baseline columns are the
medians of their passes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import trio

from fscache.bench import bounded, run_main
from fscache.bench.frames import FrameConnection
from fscache.bench.harness import ServerProcess, echo_server, fscache_server
from fscache.bench.procs import WorkerPool
from fscache.protocol import read_frame

FILE_SIZE = 64  # bytes: "a small file"
LONG_TERM = 600.0  # leases that outlive the measurement: every warm read is a hit
SERVER_CACHES_AFTER = 2.5  # s: the server caches only files whose ctime is this old
LOAD_START = 0.3  # s from a throughput pass's request to its start: connections open
WORKER_START_TIMEOUT = 60.0  # s for a spawned load generator to import and answer
MAX_SECONDS = 600.0  # a throughput pass's window: longer only delays the table

TARGETS = {
    "hit_blocking": 3.0,  # at most this many baselines
    "hit_async": 4.0,
    "miss": 1.4,  # at most this many echo round trips
    "throughput": 0.75,  # at least this fraction of the echo server's messages/s
}

Passes = dict[str, list[float]]  # a pass's name: its result in each round
T = TypeVar("T")


def interleave(passes: dict[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Run every pass once per round, in the given order on even rounds and in reverse
    on odd ones; each pass's results, round by round."""
    results: dict[str, list[T]] = {name: [] for name in passes}
    for i in range(rounds):
        order = list(passes) if i % 2 == 0 else list(reversed(passes))
        for name in order:
            results[name].append(passes[name]())
    return results


# ---------------------------------------------------------------- cache hits
_entries: dict[str, Any] = {}


def cached_lookup(path: str) -> bytes | None:
    """The baseline: what a cache hit cannot do without (a dict lookup, a clock
    comparison), as a plain function."""
    entry = _entries.get(path)
    if entry is not None and time.monotonic() < entry.expiry:
        return entry.data  # type: ignore[no-any-return]
    return None


def per_call(fn: Callable[[str], object], arg: str, number: int) -> float:
    """Seconds per call of ``fn(arg)`` over one tight loop of ``number`` calls."""
    return timeit.Timer("fn(arg)", globals={"fn": fn, "arg": arg}).timeit(number) / number


async def per_await(fn: Callable[[str], Any], arg: str, number: int) -> float:
    """Seconds per ``await fn(arg)`` over the same kind of loop."""
    start = time.perf_counter()
    for _ in itertools.repeat(None, number):
        await fn(arg)
    return (time.perf_counter() - start) / number


def measure_hits(root: str, *, number: int, rounds: int) -> Passes:
    import fscache
    from fscache.cache import Entry

    _write_files(root, ["hit"])
    _entries["hit"] = Entry(b"x" * FILE_SIZE, 1, time.monotonic() + 1e9)
    with fscache_server(root, term=LONG_TERM) as server, fscache.connect(server.address) as c:
        c.read("hit")  # the miss that takes the lease

        async def async_pass() -> float:
            async with fscache.open_client("127.0.0.1", server.port) as client:
                await client.read("hit")  # the miss that takes the lease
                return await per_await(client.read, "hit", number)

        return interleave(
            {
                "hit_baseline_s": lambda: per_call(cached_lookup, "hit", number),
                "hit_blocking_s": lambda: per_call(c.read, "hit", number),
                "hit_async_s": lambda: trio.run(async_pass),
            },
            rounds,
        )


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


def measure_misses(root: str, *, count: int, rounds: int) -> Passes:
    """Median seconds per miss of each pass, every pass over ``count`` files its client
    has never read. Two kinds of file: *cold*, never read by the server either, and
    *warm*, read through another connection first (the server's content cache holds
    it, as for any file that some client reads). The echo that reads files reads
    files of its own, never read before, as a cold miss's are."""
    names = {kind: [f"{kind}/{i:05d}" for i in range(count * rounds)] for kind in (
        "miss", "frame", "warm", "file")}  # fmt: skip
    _write_files(root, [name for kind in names.values() for name in kind])
    written = time.monotonic()
    unread = {kind: iter(_chunks(paths, count)) for kind, paths in names.items()}
    echoed = names["miss"][:count]  # an echo server reads no file: any names will do

    def median_of(run: Callable[[int, Sequence[str]], Any], port: int, kind: str) -> float:
        paths = echoed if kind == "echo" else next(unread[kind])
        times: list[float] = trio.run(run, port, paths)
        return statistics.median(times)

    with (
        echo_server() as echo,
        echo_server(wire=True) as echo_wire,
        echo_server(root=root) as echo_file,
        fscache_server(root, term=LONG_TERM) as server,
    ):
        time.sleep(max(0.0, written + SERVER_CACHES_AFTER - time.monotonic()))
        trio.run(_frame_round_trips, server.port, names["warm"])  # another client reads them
        return interleave(
            {
                "echo_rtt_s": lambda: median_of(_frame_round_trips, echo.port, "echo"),
                "miss_s": lambda: median_of(_fscache_misses, server.port, "miss"),
                "echo_wire_rtt_s": lambda: median_of(_frame_round_trips, echo_wire.port, "echo"),
                "miss_frame_client_s": lambda: median_of(_frame_round_trips, server.port, "frame"),
                "miss_warm_s": lambda: median_of(_fscache_misses, server.port, "warm"),
                "echo_file_rtt_s": lambda: median_of(_frame_round_trips, echo_file.port, "file"),
            },
            rounds,
        )


def _chunks(names: Sequence[str], count: int) -> list[Sequence[str]]:
    """``names`` cut into passes of ``count``."""
    return [names[i : i + count] for i in range(0, len(names), count)]


# ---------------------------------------------------------------- throughput
def _load_generator(connection: Any) -> None:
    """A load generator process: for each request ``(port, paths, start_at, count_from,
    stop_at)``, a closed loop per path with one request in flight each; replies with
    the number of round trips completed in ``[count_from, stop_at)``."""

    async def run(port: int, paths: list[str], start_at: float, count_from: float,
                  stop_at: float) -> int:  # fmt: skip
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

    while (request := connection.recv()) is not None:
        connection.send(trio.run(run, *request))


def run_load(
    pool: WorkerPool, server: ServerProcess, shares: list[list[str]], seconds: float
) -> tuple[float, float]:
    """Round trips per second that the pool's load generators get from ``server``,
    and the server's CPU seconds per round trip over the same window."""
    start_at = time.monotonic() + LOAD_START
    count_from = start_at + min(1.0, seconds / 4)  # warm-up not counted
    stop_at = count_from + seconds
    pool.send_all([(server.port, share, start_at, count_from, stop_at) for share in shares])
    time.sleep(max(0.0, count_from - time.monotonic()))
    cpu = server.cpu_seconds()
    time.sleep(max(0.0, stop_at - time.monotonic()))
    cpu = server.cpu_seconds() - cpu
    total = sum(pool.receive_all(30.0))
    return total / seconds, cpu / max(total, 1)


def measure_throughput(
    root: str, *, clients: int, processes: int, seconds: float, rounds: int
) -> Passes:
    paths = [f"load/{i:03d}" for i in range(clients)]
    _write_files(root, paths)
    shares = [paths[i::processes] for i in range(processes)]
    with (
        echo_server() as echo,
        fscache_server(root, term=0.0) as server,
        echo_server(wire=True) as echo_wire,
        WorkerPool(_load_generator, processes, name="load-generator") as pool,
    ):
        # An empty round first: a pass's clock starts LOAD_START after its request,
        # and workers still importing would miss all of the first pass's window.
        pool.send_all([(0, [], 0.0, 0.0, 0.0)] * processes)
        pool.receive_all(WORKER_START_TIMEOUT)

        def load_pass(server: ServerProcess) -> Callable[[], tuple[float, float]]:
            return lambda: run_load(pool, server, shares, seconds)

        runs = interleave(
            {
                "echo": load_pass(echo),
                "fscache": load_pass(server),
                "echo_wire": load_pass(echo_wire),
            },
            rounds,
        )
    result: Passes = {}
    for name, per_round in runs.items():  # messages at the server: a request in, a reply out
        result[f"{name}_msgs_per_s"] = [2 * rate for rate, _ in per_round]
        result[f"{name}_cpu_per_request_s"] = [cpu for _, cpu in per_round]
    return result


# ---------------------------------------------------------------- the report
def _write_files(root: str, names: Sequence[str]) -> None:
    for name in names:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(name.encode().ljust(FILE_SIZE, b"."))


def summarize(passes: Passes) -> list[dict[str, Any]]:
    """The rows of the table: figure, fscache, baseline, ratio (the median of the
    per-round ratios, and their smallest and largest), target, met."""

    def row(
        name: str,
        key: str,
        base_key: str,
        unit: str,
        target: float | None = None,
        at_most: bool = True,
    ) -> dict[str, Any]:
        """A figure against its baseline; with no target, a row for context."""
        scale = 1e6 if unit == "us" else 1.0
        ratios = [v / b for v, b in zip(passes[key], passes[base_key], strict=True)]
        ratio = statistics.median(ratios)
        return {
            "figure": name,
            "value": statistics.median(passes[key]) * scale,
            "baseline": statistics.median(passes[base_key]) * scale,
            "unit": unit,
            "ratio": ratio,
            "ratio_spread": [min(ratios), max(ratios)],
            "rounds": len(ratios),
            "target": "(info)" if target is None else f"{'<=' if at_most else '>='} {target:g}",
            "met": None if target is None else ratio <= target if at_most else ratio >= target,
        }

    return [
        row("hit, blocking client", "hit_blocking_s", "hit_baseline_s", "us",
            TARGETS["hit_blocking"]),
        row("hit, async client", "hit_async_s", "hit_baseline_s", "us", TARGETS["hit_async"]),
        row("miss (lease granted), async client", "miss_s", "echo_rtt_s", "us", TARGETS["miss"]),
        row("  same, file warm on the server", "miss_warm_s", "echo_rtt_s", "us",
            TARGETS["miss"]),
        row("  (miss, bare frame client)", "miss_frame_client_s", "echo_rtt_s", "us"),
        row("  (miss vs echo on fscache's socket I/O)", "miss_s", "echo_wire_rtt_s", "us"),
        row("  (miss vs an echo that reads the file)", "miss_s", "echo_file_rtt_s", "us"),
        row("throughput, 50 clients, term 0", "fscache_msgs_per_s", "echo_msgs_per_s", "msg/s",
            TARGETS["throughput"], at_most=False),
        row("  (vs echo on fscache's socket I/O)", "fscache_msgs_per_s", "echo_wire_msgs_per_s",
            "msg/s"),
        row("  (server CPU per request)", "fscache_cpu_per_request_s", "echo_cpu_per_request_s",
            "us"),
    ]  # fmt: skip


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'figure':42} {'fscache':>12} {'baseline':>12} {'ratio [spread]':>19} {'target':>8}  met"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        met = {True: "yes", False: "NO", None: ""}[r["met"]]
        unit = r["unit"]
        value = f"{r['value']:.3f} {unit}" if unit == "us" else f"{r['value']:,.0f} {unit}"
        base = f"{r['baseline']:.3f} {unit}" if unit == "us" else f"{r['baseline']:,.0f} {unit}"
        low, high = r["ratio_spread"]
        ratio = f"{r['ratio']:.2f} [{low:.2f}, {high:.2f}]"
        lines.append(f"{r['figure']:42} {value:>12} {base:>12} {ratio:>19} {r['target']:>8}  {met}")
    return "\n".join(lines)


_FULL = {"rounds": 7, "hit_loops": 1_000_000, "misses": 2000, "seconds": 2.0}
_QUICK = {"rounds": 3, "hit_loops": 20_000, "misses": 200, "seconds": 0.5}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.speed",
        description=(__doc__ or "").replace("``", "").replace("**", ""),  # as plain text
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    whole, seconds = bounded(int, 1), bounded(float, 0.1, MAX_SECONDS)
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument(
        "--rounds", type=whole, help=f"interleaved rounds per section (default {_FULL['rounds']})"
    )
    parser.add_argument(
        "--hit-loops", type=whole, help=f"calls per hit pass (default {_FULL['hit_loops']:,})"
    )
    parser.add_argument(
        "--misses", type=whole, help=f"files read per miss pass (default {_FULL['misses']:,})"
    )
    parser.add_argument(
        "--clients", type=whole, default=50,
        help="clients of the throughput passes (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--processes", type=whole, default=2,
        help="load generator processes (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--seconds",
        type=seconds,
        help=f"throughput pass window, 0.1..{MAX_SECONDS:g} (default {_FULL['seconds']:g})",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="a smoke test: the defaults become " + ", ".join(
            f"--{name.replace('_', '-')} {value:g}" for name, value in _QUICK.items()
        ) + " (flags given still win)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    for name, value in (_QUICK if args.quick else _FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    passes: Passes = {}
    with tempfile.TemporaryDirectory(prefix="fscache-speed-") as tmp:
        measures: list[tuple[str, Callable[[str], Passes]]] = [
            ("hits", lambda r: measure_hits(r, number=args.hit_loops, rounds=args.rounds)),
            ("misses", lambda r: measure_misses(r, count=args.misses, rounds=args.rounds)),
            ("throughput", lambda r: measure_throughput(
                r, clients=args.clients, processes=args.processes, seconds=args.seconds,
                rounds=args.rounds)),
        ]  # fmt: skip
        for name, measure in measures:
            root = os.path.join(tmp, name)
            os.mkdir(root)
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            passes.update(measure(root))
    rows = summarize(passes)
    print(format_table(rows))
    if args.out:
        document = {
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "passes": passes,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
