"""The worker side of ``fscache bench``: one process drives a share of the clients.

A worker is a long-lived child process (``multiprocessing``, spawn) that serves
one run after another. For each run it is sent a :class:`RunSpec`: it opens its
clients (each its own connection, so each its own cache and lease holder),
builds their open-loop Poisson schedules, answers ``"ready"``, waits for the
start time, issues every operation at its scheduled instant without waiting for
earlier ones, and sends back a :class:`WorkerResult`.

Systems:

``fscache``  the async fscache client (a lease cache; term 0 is "no caching").
``ttl``      the fscache client against a term-0 server, behind a cache that keeps
             each read for ``ttl`` seconds and asks no one: no consistency.
``redis``    redis-py with RESP3 client-side caching (``CLIENT TRACKING``): each
             client a thread with its own connection and cache. Files are keys.

Every operation is stamped with ``time.monotonic()`` (one clock for every process
on Linux) for the stale-read check, and timed with ``time.perf_counter_ns()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fscache.bench.workload_config import ClientPlan

GRACE = 5.0  # seconds an operation may still run after the schedule ends


# ---------------------------------------------------------------- what a run is
@dataclasses.dataclass(frozen=True)
class RunSpec:
    run: int
    system: str
    term: float | None  # the server's term; for ``ttl`` the TTL
    port: int
    clients: tuple[ClientPlan, ...]
    read_rate: float  # per client, per second
    write_rate: float
    file_size: int
    steady_from: float  # offset at which the Poisson arrivals begin
    prime_term: float  # the client term t_C the priming reads prepare for (0: none)
    length: float  # seconds of schedule (priming + settling + window)
    window: tuple[float, float]  # offsets from the start that are measured
    seed: int


@dataclasses.dataclass
class WorkerResult:
    # every completed read and write (for the stale check), parallel arrays
    read_file: np.ndarray
    read_value: np.ndarray
    read_start: np.ndarray
    read_end: np.ndarray
    write_file: np.ndarray
    write_value: np.ndarray
    write_start: np.ndarray
    write_end: np.ndarray  # inf: not acknowledged
    # latencies of operations that began inside the window, nanoseconds
    hit_ns: np.ndarray
    miss_ns: np.ndarray
    write_ns: np.ndarray
    lag_ns: np.ndarray  # how late each operation started (load generator health)
    offered_reads: int = 0  # scheduled inside the window
    offered_writes: int = 0
    errors: int = 0
    error_examples: tuple[str, ...] = ()
    invalidations: int = 0  # redis: invalidation pushes received in the window
    unfinished: int = 0  # operations cut off after the grace period


def path_of(file: int) -> str:
    return f"f/{file:05d}"


def encode_value(value: int, size: int) -> bytes:
    head = b"%d\n" % value
    return head + b"." * max(0, size - len(head))


def decode_value(data: bytes) -> int:
    return int(data[: data.index(b"\n")])


def schedule(spec: RunSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The run's operations for ``spec.clients``, merged and sorted by time: offsets (s),
    client position in ``spec.clients``, kind (0 read, 1 write), file.

    From ``steady_from`` on, each client reads and writes as Poisson processes. Before
    that come the *priming* reads, which start every (client, file) lease stream in its
    stationary state (renewal theory): a stream of rate ``r`` alternates a lease of
    ``t_C`` with a wait for the next read (mean ``1/r``), so at a random instant it is
    inside a lease with probability ``t_C / (t_C + 1/r)``, with the rest of it
    uniformly distributed. Reading at ``steady_from - u``, ``u ~ U(0, t_C + 1/r)``,
    when ``u < t_C`` gives exactly that; otherwise the stream is waiting, and the
    Poisson reads (memoryless) take over. Without this every stream would start in
    step, and with a long term they stay in step for many cycles."""
    times, who, kinds, files = [], [], [], []
    steady, span = spec.steady_from, spec.length - spec.steady_from
    for position, plan in enumerate(spec.clients):
        rng = np.random.default_rng([spec.seed, plan.index])
        for kind, rate, pool, weights in (
            (0, spec.read_rate, plan.files, plan.read_p),
            (1, spec.write_rate, plan.owned, plan.write_p),
        ):
            if rate <= 0 or not pool:
                continue
            count = rng.poisson(rate * span)
            times.append(rng.uniform(steady, spec.length, count))
            who.append(np.full(count, position))
            kinds.append(np.full(count, kind))
            files.append(rng.choice(np.asarray(pool), size=count, p=np.asarray(weights)))
        if spec.prime_term > 0:
            for file, p in zip(plan.files, plan.read_p, strict=True):
                if p <= 0:
                    continue
                u = rng.uniform(0.0, spec.prime_term + 1.0 / (spec.read_rate * p))
                if u < spec.prime_term:
                    times.append(np.array([steady - u]))
                    who.append(np.array([position]))
                    kinds.append(np.array([0]))
                    files.append(np.array([file]))
    if not times:
        empty = np.zeros(0)
        return empty, empty.astype(int), empty.astype(int), empty.astype(int)
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    return (
        t[order],
        np.concatenate(who)[order],
        np.concatenate(kinds)[order],
        np.concatenate(files)[order],
    )


class Recorder:
    """Collects what one worker saw during one run."""

    def __init__(self, window: tuple[float, float]) -> None:
        self.window = window  # absolute monotonic times
        self.reads: list[tuple[int, int, float, float]] = []
        self.writes: list[tuple[int, int, float, float]] = []
        self.hit_ns: list[int] = []
        self.miss_ns: list[int] = []
        self.write_ns: list[int] = []
        self.lag_ns: list[int] = []
        self.errors = 0
        self.error_examples: list[str] = []
        self.invalidations = 0
        self.unfinished = 0
        self.offered_reads = 0
        self.offered_writes = 0

    def offered(self, kind: int, due: float, lag: float) -> None:
        """An operation scheduled at ``due`` starts ``lag`` seconds late."""
        self.lag_ns.append(int(lag * 1e9))
        if self.in_window(due):
            if kind == 0:
                self.offered_reads += 1
            else:
                self.offered_writes += 1

    def in_window(self, t: float) -> bool:
        return self.window[0] <= t < self.window[1]

    def read(self, file: int, data: bytes, start: float, end: float, ns: int, hit: bool) -> None:
        self.reads.append((file, decode_value(data), start, end))
        if self.in_window(start):
            (self.hit_ns if hit else self.miss_ns).append(ns)

    def write(self, file: int, value: int, start: float, end: float, ns: int) -> None:
        self.writes.append((file, value, start, end))
        if math.isfinite(end) and self.in_window(start):
            self.write_ns.append(ns)

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if len(self.error_examples) < 3:
            self.error_examples.append(f"{type(exc).__name__}: {exc}")

    def result(self) -> WorkerResult:
        reads = np.array(self.reads, dtype=float).reshape(-1, 4)
        writes = np.array(self.writes, dtype=float).reshape(-1, 4)
        return WorkerResult(
            read_file=reads[:, 0].astype(np.int64),
            read_value=reads[:, 1].astype(np.int64),
            read_start=reads[:, 2],
            read_end=reads[:, 3],
            write_file=writes[:, 0].astype(np.int64),
            write_value=writes[:, 1].astype(np.int64),
            write_start=writes[:, 2],
            write_end=writes[:, 3],
            hit_ns=np.array(self.hit_ns, dtype=np.int64),
            miss_ns=np.array(self.miss_ns, dtype=np.int64),
            write_ns=np.array(self.write_ns, dtype=np.int64),
            lag_ns=np.array(self.lag_ns, dtype=np.int64),
            offered_reads=self.offered_reads,
            offered_writes=self.offered_writes,
            errors=self.errors,
            error_examples=tuple(self.error_examples),
            invalidations=self.invalidations,
            unfinished=self.unfinished,
        )


# ---------------------------------------------------------------- trio systems
class _TtlCache:
    """Reads kept ``ttl`` seconds (from when the request was sent); nobody is told
    about writes. Wraps an fscache client whose server grants no leases (term 0)."""

    def __init__(self, client: Any, ttl: float) -> None:
        self.client = client
        self.ttl = ttl
        self.entries: dict[str, tuple[bytes, float]] = {}

    def cached(self, path: str) -> bytes | None:
        entry = self.entries.get(path)
        if entry is not None and time.monotonic() < entry[1]:
            return entry[0]
        return None

    async def read(self, path: str) -> bytes:
        sent = time.monotonic()
        data: bytes = await self.client.read(path)
        self.entries[path] = (data, sent + self.ttl)
        return data

    async def write(self, path: str, data: bytes) -> None:
        sent = time.monotonic()
        await self.client.write(path, data)
        self.entries[path] = (data, sent + self.ttl)


async def _run_trio(spec: RunSpec, ready: Callable[[], float]) -> WorkerResult:
    import trio

    import fscache

    async with contextlib.AsyncExitStack() as stack:
        clients = [  # (open_client gives up by itself if it cannot connect)
            await stack.enter_async_context(
                fscache.open_client("127.0.0.1", spec.port, client_id=f"r{spec.run}-c{plan.index}")
            )
            for plan in spec.clients
        ]
        ttl = [_TtlCache(c, spec.term or 0.0) for c in clients] if spec.system == "ttl" else []
        offsets, who, kinds, files = schedule(spec)
        start = await trio.to_thread.run_sync(ready)  # blocks until the coordinator says go
        recorder = Recorder((start + spec.window[0], start + spec.window[1]))
        locks: dict[int, trio.Lock] = {}
        values: dict[int, int] = {}
        size = spec.file_size

        async def read(position: int, file: int) -> None:
            path = path_of(file)
            t0 = time.monotonic()
            try:
                if ttl:
                    cache = ttl[position]
                    p0 = time.perf_counter_ns()
                    data = cache.cached(path)
                    hit = data is not None
                    if data is None:
                        data = await cache.read(path)
                    p1 = time.perf_counter_ns()
                else:
                    client = clients[position]
                    misses = client.stats["misses"]
                    p0 = time.perf_counter_ns()
                    data = await client.read(path)
                    p1 = time.perf_counter_ns()
                    hit = client.stats["misses"] == misses  # a hit never yields
            except fscache.FscacheError as exc:
                recorder.error(exc)
                return
            recorder.read(file, data, t0, time.monotonic(), p1 - p0, hit)

        async def write(position: int, file: int) -> None:
            lock = locks.setdefault(file, trio.Lock())
            async with lock:  # one write per file at a time: values apply in order
                value = values[file] = values.get(file, 0) + 1
                data = encode_value(value, size)
                t0 = time.monotonic()
                p0 = time.perf_counter_ns()
                end = math.inf
                try:
                    if ttl:
                        await ttl[position].write(path_of(file), data)
                    else:
                        await clients[position].write(path_of(file), data)
                    end = time.monotonic()
                except fscache.FscacheError as exc:
                    recorder.error(exc)
                except trio.Cancelled:
                    recorder.unfinished += 1
                    recorder.write(file, value, t0, math.inf, 0)
                    raise
                recorder.write(file, value, t0, end, time.perf_counter_ns() - p0)

        operations: tuple[Callable[[int, int], Awaitable[None]], ...] = (read, write)
        to_trio = trio.current_time() - time.monotonic()
        with trio.move_on_at(start + spec.length + GRACE + to_trio):
            async with trio.open_nursery() as nursery:
                for offset, position, kind, file in zip(
                    offsets.tolist(), who.tolist(), kinds.tolist(), files.tolist(), strict=True
                ):
                    due = start + offset
                    if due > time.monotonic():
                        await trio.sleep_until(due + to_trio)
                    recorder.offered(kind, due, time.monotonic() - due)
                    nursery.start_soon(operations[kind], position, file)
        return recorder.result()


# ---------------------------------------------------------------- redis
_redis_state = threading.local()
_redis_lock = threading.Lock()
_redis_invalidations: list[float] = []


def _patch_redis() -> None:
    """Count cache hits per thread and invalidation pushes, through redis-py's own
    hooks; and let its client-side cache work with Redis 7.0 (see README)."""
    import redis.connection as rc
    from redis.observability.attributes import CSCResult

    if getattr(rc, "_fscache_bench_patched", False):
        return
    rc.CacheProxyConnection.MIN_ALLOWED_VERSION = "7.0.0"  # tracking exists since 6.0
    original_record = getattr(rc, "record_csc_request")  # noqa: B009 (not re-exported)

    def record_csc_request(*args: Any, **kwargs: Any) -> Any:
        _redis_state.hit = kwargs.get("result") == CSCResult.HIT
        return original_record(*args, **kwargs)

    original_invalidation = rc.CacheProxyConnection._on_invalidation_callback

    def on_invalidation(self: Any, data: Any) -> None:
        with _redis_lock:
            _redis_invalidations.append(time.monotonic())
        original_invalidation(self, data)

    # redis.connection looks both up at call time: patch them in place
    setattr(rc, "record_csc_request", record_csc_request)  # noqa: B010
    setattr(rc.CacheProxyConnection, "_on_invalidation_callback", on_invalidation)  # noqa: B010
    setattr(rc, "_fscache_bench_patched", True)  # noqa: B010


def redis_client(port: int) -> Any:
    import redis
    from redis.cache import CacheConfig

    _patch_redis()
    return redis.Redis(
        host="127.0.0.1", port=port, protocol=3, cache_config=CacheConfig(max_size=100_000)
    )


def _run_redis(spec: RunSpec, ready: Callable[[], float]) -> WorkerResult:
    clients = [redis_client(spec.port) for _ in spec.clients]
    try:
        for client in clients:
            client.ping()  # connect now, not inside the timed window
        offsets, who, kinds, files = schedule(spec)
        start = ready()
        recorder = Recorder((start + spec.window[0], start + spec.window[1]))
        lock = threading.Lock()  # the recorder's lists are shared by the threads
        with _redis_lock:
            _redis_invalidations.clear()

        def drive(position: int) -> None:
            client = clients[position]
            mine = who == position
            values: dict[int, int] = {}
            for offset, kind, file in zip(
                offsets[mine].tolist(), kinds[mine].tolist(), files[mine].tolist(), strict=True
            ):
                due = start + offset
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                lag = time.monotonic() - due
                with lock:
                    recorder.offered(kind, due, lag)
                key = path_of(file)
                value = 0
                t0 = time.monotonic()
                try:
                    if kind == 0:
                        _redis_state.hit = False
                        t0 = time.monotonic()
                        p0 = time.perf_counter_ns()
                        data = client.get(key)
                        ns = time.perf_counter_ns() - p0
                        t1 = time.monotonic()
                        with lock:
                            recorder.read(file, data, t0, t1, ns, _redis_state.hit)
                    else:
                        value = values[file] = values.get(file, 0) + 1
                        t0 = time.monotonic()
                        p0 = time.perf_counter_ns()
                        client.set(key, encode_value(value, spec.file_size))
                        ns = time.perf_counter_ns() - p0
                        t1 = time.monotonic()
                        with lock:
                            recorder.write(file, value, t0, t1, ns)
                except Exception as exc:
                    with lock:
                        recorder.error(exc)
                        if kind == 1 and value:  # it may or may not have been applied
                            recorder.write(file, value, t0, math.inf, 0)

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(clients))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with _redis_lock:
            recorder.invalidations = sum(1 for t in _redis_invalidations if recorder.in_window(t))
        return recorder.result()
    finally:
        for client in clients:
            client.close()


# ---------------------------------------------------------------- the process
def worker_main(connection: Any) -> None:
    """Serve runs until told to stop (``None``). Protocol, over a multiprocessing Pipe:
    receive a RunSpec; send ``"ready"``; receive the start time; send a WorkerResult
    (or an error string)."""
    import trio

    def ready() -> float:
        connection.send("ready")
        start: float = connection.recv()
        return start

    try:
        while (spec := connection.recv()) is not None:
            try:
                if spec.system == "redis":
                    result: WorkerResult | str = _run_redis(spec, ready)
                else:
                    result = trio.run(_run_trio, spec, ready)
            except Exception:
                result = traceback.format_exc()
            connection.send(result)
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        connection.close()
