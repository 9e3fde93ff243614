"""``fscache bench``: the paper's workload against fscache, term by term, with peers.

A coordinator (this module) starts one server per run, each in its own process,
and drives it from ``--processes`` long-lived worker processes
(:mod:`fscache.bench.driver`) that hold the clients: real TCP on 127.0.0.1. The
clients follow open-loop Poisson schedules (an operation starts at its time
whether or not earlier ones have finished). Each run starts every lease stream in
its stationary state (priming reads, see :func:`fscache.bench.driver.schedule`),
settles briefly, and then measures a window: server counters and server CPU time
are read at the window's edges, latencies are kept for operations that began
inside it, and every read of the whole run goes through the stale-read checker
(:func:`fscache.bench.checker.check_history`).

Before the sweep a calibration run (one client, closed loop, term 0) measures the
round trip and the server's CPU time per message, from which ``m_proc`` and
``m_prop`` are estimated for the model (:mod:`fscache.bench.model`), whose
prediction is printed beside every measured point. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from fscache.bench import model
from fscache.bench.checker import Op, check_history
from fscache.bench.driver import (
    GRACE,
    SYSTEMS,
    ClientPlan,
    RunSpec,
    WorkerResult,
    encode_value,
    path_of,
    worker_main,
)
from fscache.bench.harness import (
    fscache_server,
    redis_server,
    redis_server_binary,
    redis_version,
)
from fscache.bench.plots import runs_of, term0_run

START_DELAY = 0.3  # seconds between "go" and the first scheduled operation
OVERHEAD_GUESS = 2.0  # seconds per run outside its schedule (for the progress bar)
READY_TIMEOUT = 60.0
QUICK_SCALE = 10.0  # --quick: rates x10, terms and skew /10 (R t_C is kept)


# ---------------------------------------------------------------- configuration
@dataclasses.dataclass
class Config:
    clients: int = 40
    processes: int = 2
    read_rate: float = 8.64  # per client: 10 files x 0.864/s, the paper's R per file
    write_rate: float = 0.1  # per client
    sharing: int = 2
    files: int = 200
    file_size: int = 1024
    popularity: str = "uniform"
    zipf_s: float = 1.0
    duration: float = 40.0  # measured seconds per run
    terms: tuple[float, ...] = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
    ttl_terms: tuple[float, ...] = (1.0, 10.0)
    skew: float = 0.1
    systems: tuple[str, ...] = SYSTEMS
    seed: int = 1
    calibration_reads: int = 2000
    quick: bool = False

    @classmethod
    def quick_preset(cls) -> Config:
        """Under a minute on 2 cores: half the clients, half the files per client,
        rates x10 and terms and skew /10, so R t_C -- the shape of the curve -- is kept."""
        q = QUICK_SCALE
        return cls(
            clients=20,
            read_rate=0.864 * 5 * q,
            write_rate=0.05 * q,  # per file as in the full run: 5 files, 2-3 owned
            files=50,
            duration=3.0,
            terms=tuple(t / q for t in (0.0, 0.1, 0.5, 2.0, 10.0)),
            ttl_terms=(2.0 / q, 10.0 / q),
            skew=0.1 / q,
            calibration_reads=500,
            quick=True,
        )

    def validate(self) -> None:
        if self.clients < 1 or self.sharing < 1 or self.clients % self.sharing:
            raise ValueError("--clients must be a positive multiple of --sharing")
        groups = self.clients // self.sharing
        if self.files < groups or self.files % groups:
            raise ValueError(
                f"--files must be a positive multiple of the {groups} groups of "
                f"{self.sharing} sharing clients"
            )
        if self.files // groups < self.sharing and self.write_rate > 0:
            raise ValueError("each group needs at least --sharing files (one writer per file)")
        if self.popularity not in ("uniform", "zipf"):
            raise ValueError("--popularity is uniform or zipf")
        if self.processes < 1 or self.duration <= 0 or self.read_rate <= 0:
            raise ValueError("--processes, --duration and --read-rate must be positive")
        if self.write_rate < 0 or self.skew < 0 or any(t < 0 for t in self.terms):
            raise ValueError("rates, terms and skew must be >= 0")
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise ValueError(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")

    @property
    def files_per_client(self) -> int:
        return self.files // (self.clients // self.sharing)


def popularity(k: int, kind: str, s: float) -> list[float]:
    weights = [1.0] * k if kind == "uniform" else [1.0 / (rank**s) for rank in range(1, k + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def plan_clients(cfg: Config) -> list[ClientPlan]:
    """Clients in groups of ``sharing``; each group reads its own files (so each file is
    shared by exactly ``sharing`` clients); file ``j`` of a group is written by member
    ``j mod sharing`` only."""
    k = cfg.files_per_client
    weights = popularity(k, cfg.popularity, cfg.zipf_s)
    plans = []
    for group in range(cfg.clients // cfg.sharing):
        files = tuple(range(group * k, (group + 1) * k))
        for member in range(cfg.sharing):
            owned = [j for j in range(k) if j % cfg.sharing == member]
            owned_total = sum(weights[j] for j in owned)
            plans.append(
                ClientPlan(
                    index=group * cfg.sharing + member,
                    files=files,
                    read_p=tuple(weights),
                    owned=tuple(files[j] for j in owned),
                    write_p=tuple(weights[j] / owned_total for j in owned),
                )
            )
    return plans


def lease_read_rates(cfg: Config, plans: Sequence[ClientPlan]) -> list[float]:
    """One Poisson read rate per (client, file): the model's lease streams."""
    return [cfg.read_rate * p for plan in plans for p in plan.read_p]


@dataclasses.dataclass(frozen=True)
class Phases:
    """Offsets within one run's schedule, seconds."""

    prime_term: float  # t_C the priming reads prepare for (0: no priming)
    steady_from: float  # the Poisson arrivals begin; every lease stream is stationary
    window: tuple[float, float]  # measured

    @property
    def length(self) -> float:
        return self.window[1]


def phases_for(
    cfg: Config, system: str, term: float, rates: Sequence[float], costs: model.Calibration
) -> Phases:
    """Priming reads for ``t_C`` seconds (see :func:`fscache.bench.driver.schedule`),
    then a short settling time, then the window. Redis has no term: its caches fill
    during three mean gaps between reads of a file."""
    scale = 0.1 if cfg.quick else 1.0
    lead, settle = 0.5 * scale, 1.0 * scale
    if system == "redis":
        prime = 0.0
        settle = max(settle, 3.0 / statistics.median(rates))
    elif system == "ttl":
        prime = term  # a TTL is trusted exactly that long, no skew allowance
    else:
        prime = model.client_term(term, costs.m_prop, costs.m_proc, cfg.skew)
    steady = lead + prime
    return Phases(prime, steady, (steady + settle, steady + settle + cfg.duration))


# ---------------------------------------------------------------- worker processes
class WorkerPool:
    """``n`` driver processes, reused for every run."""

    def __init__(self, n: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes = []
        self.processes = []
        for i in range(n):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=worker_main, args=(theirs,), name=f"bench-worker-{i}", daemon=True
            )
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)

    def send_all(self, items: Sequence[Any]) -> None:
        for pipe, item in zip(self.pipes, items, strict=True):
            pipe.send(item)

    def receive_all(self, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        replies = []
        for pipe, process in zip(self.pipes, self.processes, strict=True):
            while not pipe.poll(0.2):
                if not process.is_alive():
                    raise RuntimeError(f"{process.name} died (exit code {process.exitcode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{process.name} did not answer in {timeout:.0f} s")
            replies.append(pipe.recv())
        return replies

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError, BrokenPipeError):
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
            process.close()
        for pipe in self.pipes:
            pipe.close()


# ---------------------------------------------------------------- progress
class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    WIDTH = 28

    def __init__(self, planned: float, *, enabled: bool = True) -> None:
        self.planned = max(planned, 1e-9)
        self.done = 0.0
        self.started = time.monotonic()
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._last_phase = ""

    def show(self, label: str, phase: str, within: float, detail: str = "") -> None:
        if not self.enabled:
            return
        if not self.tty:
            if phase != self._last_phase:
                print(f"bench: {label}: {phase}", file=sys.stderr, flush=True)
                self._last_phase = phase
            return
        phase = f"{phase} {detail}"
        fraction = min(1.0, (self.done + within) / self.planned)
        filled = int(fraction * self.WIDTH)
        elapsed = time.monotonic() - self.started
        eta = elapsed / fraction - elapsed if fraction > 0.02 else float("nan")
        eta_text = "?" if eta != eta else f"{int(eta) // 60}m{int(eta) % 60:02d}s"
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = f"\r[{bar}] {fraction:4.0%}  {label:<26} {phase:<22} ETA {eta_text}"
        sys.stderr.write(line[:120].ljust(100))
        sys.stderr.flush()

    def finish_run(self, planned: float) -> None:
        self.done += planned
        self._last_phase = ""

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r" + " " * 110 + "\r")
            sys.stderr.flush()


# ---------------------------------------------------------------- calibration
CALIBRATION_MIN_CPU_S = 0.1  # ten clock ticks of server CPU time at the least
CALIBRATION_MAX_S = 10.0


def calibrate(cfg: Config, workdir: str) -> dict[str, float]:
    """One client, closed loop, term 0 (every read a round trip): the round trip's
    median and the server's CPU time per message. ``m_proc`` is the latter;
    ``m_prop`` is what remains of half a round trip, ``rtt/2 - 2 m_proc``."""
    import trio

    import fscache

    root = _make_root(workdir, "calibration", cfg)
    paths = [path_of(f) for f in range(cfg.files)]
    with fscache_server(root, term=0.0, skew=cfg.skew) as server:

        async def run() -> tuple[list[float], float, int]:
            async with fscache.open_client("127.0.0.1", server.port) as client:
                for path in paths[:50]:
                    await client.read(path)  # warm: imports, connection, page cache
                before = await client.server_stats()
                cpu0 = server.cpu_seconds()
                times: list[float] = []
                deadline = time.monotonic() + CALIBRATION_MAX_S
                # Server CPU time comes in clock ticks (10 ms): read on until enough
                # ticks have passed for the per-message figure to mean something.
                while len(times) < cfg.calibration_reads or (
                    server.cpu_seconds() - cpu0 < CALIBRATION_MIN_CPU_S
                    and time.monotonic() < deadline
                ):
                    for _ in range(100):
                        start = time.perf_counter()
                        await client.read(paths[len(times) % len(paths)])
                        times.append(time.perf_counter() - start)
                cpu = server.cpu_seconds() - cpu0
                after = await client.server_stats()
            messages = sum(after[k] - before[k] for k in ("messages_in", "messages_out"))
            return times, cpu, messages - 2 * (after["stats_requests"] - before["stats_requests"])

        times, cpu, messages = trio.run(run)
    rtt = statistics.median(times)
    m_proc = cpu / messages
    m_prop = max(0.0, rtt / 2 - 2 * m_proc)
    return {"rtt_s": rtt, "m_proc_s": m_proc, "m_prop_s": m_prop, "reads": len(times)}


# ---------------------------------------------------------------- one run
def _make_root(workdir: str, name: str, cfg: Config) -> str:
    root = os.path.join(workdir, name)
    os.makedirs(os.path.join(root, "f"))
    initial = encode_value(0, cfg.file_size)
    for f in range(cfg.files):
        with open(os.path.join(root, path_of(f)), "wb") as out:
            out.write(initial)
    return root


@contextlib.contextmanager
def _server_for(
    system: str, term: float, cfg: Config, workdir: str, name: str
) -> Iterator[tuple[Any, Any]]:
    """The run's server and a control connection to read its counters."""
    if system == "redis":
        import redis

        data_dir = os.path.join(workdir, name)
        os.makedirs(data_dir)
        with redis_server(data_dir) as server:
            redis_control = redis.Redis(host="127.0.0.1", port=server.port)
            try:
                pipe = redis_control.pipeline(transaction=False)
                initial = encode_value(0, cfg.file_size)
                for f in range(cfg.files):
                    pipe.set(path_of(f), initial)
                pipe.execute()
                yield server, redis_control
            finally:
                redis_control.close()
        return
    import fscache

    root = _make_root(workdir, name, cfg)
    server_term = term if system == "fscache" else 0.0  # ttl: the server grants no leases
    with (
        fscache_server(root, term=server_term, skew=cfg.skew) as server,
        fscache.connect(server.address) as control,
    ):
        yield server, control


def _snapshot(system: str, server: Any, control: Any) -> dict[str, float]:
    cpu = server.cpu_seconds()
    at = time.monotonic()
    if system == "redis":
        info = control.info("all")
        return {
            "at": at,
            "cpu": cpu,
            "get_calls": info.get("cmdstat_get", {}).get("calls", 0),
            "commands": info["total_commands_processed"],
        }
    counters = control.server_stats()
    return {"at": at, "cpu": cpu, **{k: v for k, v in counters.items() if _is_number(v)}}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _server_load(
    system: str, before: dict[str, float], after: dict[str, float], invalidations: int
) -> tuple[float, float]:
    """(consistency messages, all messages) the server handled between two snapshots.

    fscache: a read that reaches the server and its reply (Data or NotModified), an
    extension and its reply, every approval request and approval, a relinquish and
    its reply. Redis: a GET that reaches the server and its reply, every invalidation
    push. The snapshots' own requests are left out."""

    def d(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    if system == "redis":
        commands = d("commands") - 1  # the first snapshot's INFO
        return 2 * d("get_calls") + invalidations, 2 * commands + invalidations
    consistency = (
        2 * d("reads") + 2 * d("extend_requests") + d("approvals_sent")
        + d("approvals_received") + 2 * d("relinquish_requests")
    )  # fmt: skip
    total = d("messages_in") + d("messages_out") - 2 * d("stats_requests")
    return consistency, total


def _percentile(values: np.ndarray, q: float, scale: float) -> float | None:
    return float(np.percentile(values, q)) * scale if len(values) else None


def execute_run(
    run: int,
    system: str,
    term: float,
    cfg: Config,
    plans: Sequence[ClientPlan],
    pool: WorkerPool,
    workdir: str,
    progress: Progress,
    calibration: model.Calibration,
    rates: Sequence[float],
) -> dict[str, Any]:
    """One (system, term) run; ``rates`` are the files' read rates
    (:func:`lease_read_rates`)."""
    phases = phases_for(cfg, system, term, rates, calibration)
    warmup, length = phases.window[0], phases.length
    label = f"{system} term {term:g} s" if system != "redis" else "redis tracking"
    progress.show(label, "starting server", 0.0)
    name = f"run-{run:02d}-{system}-{term:g}"
    with _server_for(system, term, cfg, workdir, name) as (server, control):
        specs = [
            RunSpec(
                run=run,
                system=system,
                term=term,
                port=server.port,
                clients=tuple(p for p in plans if p.index % cfg.processes == w),
                read_rate=cfg.read_rate,
                write_rate=cfg.write_rate,
                file_size=cfg.file_size,
                steady_from=phases.steady_from,
                prime_term=phases.prime_term,
                length=length,
                window=phases.window,
                seed=cfg.seed * 1000 + run,
            )
            for w in range(cfg.processes)
        ]
        pool.send_all(specs)
        progress.show(label, "connecting clients", 0.0)
        for reply in pool.receive_all(READY_TIMEOUT):
            if reply != "ready":
                raise RuntimeError(f"a worker could not start the run:\n{reply}")
        start = time.monotonic() + START_DELAY
        pool.send_all([start] * cfg.processes)
        window0, window1 = start + warmup, start + length

        def wait_until(t: float, phase: str) -> None:
            while (now := time.monotonic()) < t:
                progress.show(label, phase, now - start, f"{now - start:5.1f}/{length:.1f} s")
                time.sleep(min(0.2, t - now))

        wait_until(window0, "warm-up")
        before = _snapshot(system, server, control)
        wait_until(window1, "measuring")
        after = _snapshot(system, server, control)
        progress.show(label, "finishing", length)
        replies = pool.receive_all(GRACE + 60)
    failures = [r for r in replies if not isinstance(r, WorkerResult)]
    if failures:
        raise RuntimeError(f"a worker failed during {label}:\n{failures[0]}")
    results: list[WorkerResult] = replies
    seconds = after["at"] - before["at"]
    invalidations = sum(r.invalidations for r in results)
    consistency, total = _server_load(system, before, after, invalidations)
    return summarize_run(
        system, term, phases.prime_term, cfg, calibration, rates, results, consistency / seconds,
        total / seconds, after["cpu"] - before["cpu"], seconds, warmup,
    )  # fmt: skip


def check_staleness(cfg: Config, results: Sequence[WorkerResult]) -> dict[str, Any]:
    """Every read and write of the run through the stale-read checker
    (:func:`fscache.bench.checker.check_history`).

    Values count up per file from 0 (the initial contents), one writer per file,
    one write at a time, so "stale" is simply: older than a value whose write was
    acknowledged before the read began. ``impossible_reads`` are the checker's
    phantom and future reads (a value never written, or not yet being written)."""
    ops = [Op("write", str(f), "0", 0.0, 0.0, True) for f in range(cfg.files)]
    for r in results:
        for f, v, s, e in zip(r.write_file, r.write_value, r.write_start, r.write_end, strict=True):
            ops.append(Op("write", str(f), str(v), float(s), float(e), bool(np.isfinite(e))))
        for f, v, s, e in zip(r.read_file, r.read_value, r.read_start, r.read_end, strict=True):
            ops.append(Op("read", str(f), str(v), float(s), float(e), True))
    anomalies = check_history(ops)
    stale = [a for a in anomalies if a.kind.startswith("stale")]
    return {
        "stale_reads": len(stale),
        "impossible_reads": len(anomalies) - len(stale),
        "reads_checked": sum(len(r.read_file) for r in results),
        "stale_examples": [a.describe() for a in anomalies[:3]],
    }


def summarize_run(
    system: str,
    term: float,
    t_c: float,
    cfg: Config,
    calibration: model.Calibration,
    rates: Sequence[float],
    results: Sequence[WorkerResult],
    consistency_per_s: float,
    total_per_s: float,
    cpu_s: float,
    seconds: float,
    warmup: float,
) -> dict[str, Any]:
    """One run's row of results; ``t_c`` is the client term its priming prepared for
    (:func:`phases_for`), which the model's figures use too."""
    cat = np.concatenate
    hits = cat([r.hit_ns for r in results])
    misses = cat([r.miss_ns for r in results])
    reads = cat([hits, misses])
    writes = cat([r.write_ns for r in results])
    lag = cat([r.lag_ns for r in results])
    report = check_staleness(cfg, results)
    run: dict[str, Any] = {
        "system": system,
        "term": term if system != "redis" else None,
        "client_term": None,
        "server_consistency_msgs_per_s": consistency_per_s,
        "model_consistency_msgs_per_s": None,
        "model_nominal_consistency_msgs_per_s": None,
        "model_error": None,
        "server_msgs_per_s": total_per_s,
        "server_cpu_s": cpu_s,
        "server_cpu_fraction": cpu_s / seconds,
        "window_s": seconds,
        "warmup_s": warmup,
        "reads": len(reads),
        "writes": len(writes),
        "hit_ratio": len(hits) / len(reads) if len(reads) else 0.0,
        "model_hit_ratio": None,
        "read_mean_us": float(reads.mean()) / 1e3 if len(reads) else None,
        "read_p50_us": _percentile(reads, 50, 1e-3),
        "read_p99_us": _percentile(reads, 99, 1e-3),
        "read_p999_us": _percentile(reads, 99.9, 1e-3),
        "hit_p50_us": _percentile(hits, 50, 1e-3),
        "hit_p99_us": _percentile(hits, 99, 1e-3),
        "hit_p999_us": _percentile(hits, 99.9, 1e-3),
        "miss_p50_us": _percentile(misses, 50, 1e-3),
        "miss_p99_us": _percentile(misses, 99, 1e-3),
        "miss_p999_us": _percentile(misses, 99.9, 1e-3),
        "model_read_delay_us": None,
        "write_p50_ms": _percentile(writes, 50, 1e-6),
        "write_p99_ms": _percentile(writes, 99, 1e-6),
        "write_max_ms": float(writes.max()) / 1e6 if len(writes) else None,
        "model_write_added_ms": None,
        **report,
        "errors": sum(r.errors for r in results),
        "error_examples": [e for r in results for e in r.error_examples][:3],
        "unfinished_ops": sum(r.unfinished for r in results),
        "generator_lag_p99_ms": _percentile(lag, 99, 1e-6),
        "redis_invalidations_per_s": (
            sum(r.invalidations for r in results) / seconds if system == "redis" else None
        ),
    }
    if system != "redis":
        # the model at the rates offered in the window (the realised Poisson counts), and
        # at the nominal rates
        offered_reads = sum(r.offered_reads for r in results)
        offered_writes = sum(r.offered_writes for r in results)
        nominal_reads = sum(rates) * cfg.duration
        nominal_writes = cfg.clients * cfg.write_rate * cfg.duration
        read_scale = offered_reads / nominal_reads if nominal_reads else 1.0
        write_scale = offered_writes / nominal_writes if nominal_writes else 1.0
        offered = [r * read_scale for r in rates]
        m_prop, m_proc = calibration.m_prop, calibration.m_proc
        if system == "ttl":  # t_c is the TTL itself (phases_for): no skew allowance
            run["model_consistency_msgs_per_s"] = model.ttl_load_for_rates(offered, term)
            run["model_nominal_consistency_msgs_per_s"] = model.ttl_load_for_rates(rates, term)
        else:
            writes_per_s = cfg.clients * cfg.write_rate
            run["model_consistency_msgs_per_s"] = model.consistency_load_for_rates(
                offered, writes_per_s * write_scale, cfg.sharing, term, t_c
            )
            run["model_nominal_consistency_msgs_per_s"] = model.consistency_load_for_rates(
                rates, writes_per_s, cfg.sharing, term, t_c
            )
            added = model.approval_delay(cfg.sharing, m_prop, m_proc) if term > 0 else 0.0
            run["model_write_added_ms"] = added * 1e3
        run["offered_read_rate_factor"] = read_scale
        run["client_term"] = t_c
        run["model_hit_ratio"] = model.hit_ratio_for_rates(offered, t_c)
        run["model_read_delay_us"] = (
            model.mean_read_delay_for_rates(offered, t_c, calibration) * 1e6
        )
        predicted = run["model_consistency_msgs_per_s"]
        run["model_error"] = consistency_per_s / predicted - 1 if predicted else None
    return run


# ---------------------------------------------------------------- the report
def check_targets(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Issue 5's targets, for fscache: within 25% of the model at every term > 0, and
    the largest term at most a quarter of term 0's load."""
    fs = runs_of(runs, "fscache")
    positive = [r for r in fs if r["term"] > 0 and r["model_error"] is not None]
    worst = max((abs(r["model_error"]) for r in positive), default=None)
    zero = term0_run(runs)
    largest = fs[-1] if fs and fs[-1]["term"] > 0 else None
    reduction = (
        largest["server_consistency_msgs_per_s"] / zero["server_consistency_msgs_per_s"]
        if zero and largest and zero["server_consistency_msgs_per_s"]
        else None
    )
    stale_fs = sum(r["stale_reads"] + r["impossible_reads"] for r in fs)
    return {
        "worst_model_error": worst,
        "within_25pct_of_model": worst is not None and worst <= 0.25,
        "largest_term_vs_term0": reduction,
        "largest_term_at_most_quarter": reduction is not None and reduction <= 0.25,
        "fscache_stale_reads": stale_fs,
        "fscache_no_stale_reads": stale_fs == 0,
    }


def _fmt(value: float | None, spec: str) -> str:
    """``format(value, spec)``, or a dash of the same width for a missing value."""
    if value is None:
        width = re.match(r"[+\- ]?(\d*)", spec)
        return "-".rjust(int(width.group(1) or 0) if width else 0)
    return format(value, spec)


def format_tables(results: dict[str, Any]) -> str:
    runs = results["runs"]
    zero = term0_run(runs)
    base = zero["server_consistency_msgs_per_s"] if zero else None
    model_base = zero["model_nominal_consistency_msgs_per_s"] if zero else None
    lines = [
        "Server load (consistency messages/s measured at the server vs the paper's model)",
        f"{'system':8} {'term s':>7} {'t_C s':>7} {'consist/s':>10} {'model/s':>9} "
        f"{'err':>6} {'norm':>6} {'model':>6} {'all msg/s':>9} {'cpu%':>5} "
        f"{'hit':>6} {'model':>6} {'stale':>6}",
    ]
    for r in runs:
        norm = r["server_consistency_msgs_per_s"] / base if base else None
        mnorm = (
            r["model_nominal_consistency_msgs_per_s"] / model_base
            if model_base and r["model_nominal_consistency_msgs_per_s"] is not None
            else None
        )
        lines.append(
            f"{r['system']:8} {_fmt(r['term'], '7.3g')} {_fmt(r['client_term'], '7.3g')} "
            f"{r['server_consistency_msgs_per_s']:10.1f} "
            f"{_fmt(r['model_consistency_msgs_per_s'], '9.1f')} "
            f"{_fmt(r['model_error'], '+6.0%')} {_fmt(norm, '6.3f')} {_fmt(mnorm, '6.3f')} "
            f"{r['server_msgs_per_s']:9.1f} {100 * r['server_cpu_fraction']:5.1f} "
            f"{r['hit_ratio']:6.3f} {_fmt(r['model_hit_ratio'], '6.3f')} {r['stale_reads']:6d}"
        )
    lines += [
        "",
        "Latency (reads in µs, writes in ms; hits and misses split)",
        f"{'system':8} {'term s':>7} {'read p50':>9} {'p99':>8} {'p99.9':>8} {'model mean':>10} "
        f"{'hit p50':>8} {'hit p99':>8} {'miss p50':>9} {'miss p99':>9} "
        f"{'write p50':>9} {'p99':>7} {'max':>7} {'lag p99':>8}",
    ]
    for r in runs:
        lines.append(
            f"{r['system']:8} {_fmt(r['term'], '7.3g')} {_fmt(r['read_p50_us'], '9.1f')} "
            f"{_fmt(r['read_p99_us'], '8.1f')} {_fmt(r['read_p999_us'], '8.1f')} "
            f"{_fmt(r['model_read_delay_us'], '10.1f')} "
            f"{_fmt(r['hit_p50_us'], '8.2f')} {_fmt(r['hit_p99_us'], '8.2f')} "
            f"{_fmt(r['miss_p50_us'], '9.1f')} {_fmt(r['miss_p99_us'], '9.1f')} "
            f"{_fmt(r['write_p50_ms'], '9.2f')} {_fmt(r['write_p99_ms'], '7.2f')} "
            f"{_fmt(r['write_max_ms'], '7.2f')} {_fmt(r['generator_lag_p99_ms'], '8.2f')}"
        )
    t = results["targets"]
    lines += [
        "",
        f"targets: every term > 0 within 25% of the model: "
        f"{'yes' if t['within_25pct_of_model'] else 'NO'} "
        f"(worst {_fmt(t['worst_model_error'], '.1%')}); "
        f"largest term <= 1/4 of term 0: {'yes' if t['largest_term_at_most_quarter'] else 'NO'} "
        f"({_fmt(t['largest_term_vs_term0'], '.3f')}); "
        f"fscache stale reads: {t['fscache_stale_reads']}",
    ]
    for note in results.get("skipped", []):
        lines.append(f"skipped: {note}")
    return "\n".join(lines)


def describe(cfg: Config, calibration: dict[str, float] | None) -> str:
    per_file = cfg.read_rate / cfg.files_per_client
    text = (
        f"N={cfg.clients} clients in {cfg.processes} processes, S={cfg.sharing} per file, "
        f"{cfg.files} files of {cfg.file_size} B ({cfg.files_per_client} per client, "
        f"{cfg.popularity}), R={cfg.read_rate:g}/s per client ({per_file:.3g}/s per file "
        f"if uniform), W={cfg.write_rate:g}/s per client, skew {cfg.skew:g} s, "
        f"{cfg.duration:g} s measured per run"
    )
    if calibration:
        text += (
            f"\ncalibration: round trip {calibration['rtt_s'] * 1e6:.0f} µs, "
            f"m_proc {calibration['m_proc_s'] * 1e6:.1f} µs, "
            f"m_prop {calibration['m_prop_s'] * 1e6:.1f} µs"
        )
    return text


# ---------------------------------------------------------------- the whole benchmark
def plan_runs(cfg: Config, skipped: list[str]) -> list[tuple[str, float]]:
    runs: list[tuple[str, float]] = []
    if "fscache" in cfg.systems:
        runs += [("fscache", t) for t in sorted(set(cfg.terms))]
    if "ttl" in cfg.systems:
        runs += [("ttl", t) for t in sorted(set(cfg.ttl_terms)) if t > 0]
    if "redis" in cfg.systems:
        why = redis_unavailable()
        if why is None:
            runs.append(("redis", 0.0))
        else:
            skipped.append(f"redis: {why}")
    return runs


def redis_unavailable() -> str | None:
    if redis_server_binary() is None:
        return "redis-server is not installed (Debian: apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py is not installed (pip install redis)"
    version = redis_version() or "0"
    if tuple(int(x) for x in version.split(".")[:2]) < (6, 0):
        return f"redis-server {version} has no client tracking (needs 6.0 or later)"
    return None


def run_benchmark(cfg: Config, out_dir: str, *, progress: bool = True) -> dict[str, Any]:
    """Calibrate, run every (system, term), write results.json, table.txt and the plots."""
    cfg.validate()
    os.makedirs(out_dir, exist_ok=True)
    plans = plan_clients(cfg)
    rates = lease_read_rates(cfg, plans)
    skipped: list[str] = []
    runs_planned = plan_runs(cfg, skipped)
    for note in skipped:
        print(f"bench: skipped {note}", file=sys.stderr, flush=True)
    planned = [
        (system, term, phases_for(cfg, system, term, rates, model.Calibration(0, 0)).length
         + OVERHEAD_GUESS)
        for system, term in runs_planned
    ]  # fmt: skip
    bar = Progress(sum(p for *_, p in planned) + 2.0, enabled=progress)
    workdir = tempfile.mkdtemp(prefix="fscache-bench-")
    pool: WorkerPool | None = None
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        pool = WorkerPool(cfg.processes)
        bar.show("calibration", "round trips", 0.0)
        calibration = calibrate(cfg, workdir)
        costs = model.Calibration(calibration["m_prop_s"], calibration["m_proc_s"])
        bar.finish_run(2.0)
        for i, (system, term, planned_s) in enumerate(planned):
            runs.append(execute_run(i, system, term, cfg, plans, pool, workdir, bar, costs, rates))
            bar.finish_run(planned_s)
    finally:
        bar.close()
        if pool is not None:
            pool.close()
        shutil.rmtree(workdir, ignore_errors=True)
    results: dict[str, Any] = {
        "title": " (--quick)" if cfg.quick else "",
        "config": dataclasses.asdict(cfg),
        "description": describe(cfg, calibration),
        "calibration": calibration,
        "environment": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "redis_server": redis_version(),
        },
        "elapsed_s": time.monotonic() - started,
        "skipped": skipped,
        "runs": runs,
    }
    results["targets"] = check_targets(runs)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    table = describe(cfg, calibration) + "\n\n" + format_tables(results)
    with open(os.path.join(out_dir, "table.txt"), "w") as f:
        f.write(table + "\n")
    from fscache.bench.plots import write_plots

    results["plots"] = write_plots(results, out_dir)
    return results


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        message = f"expected numbers separated by commas: {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def build_parser() -> argparse.ArgumentParser:
    d = Config()
    parser = argparse.ArgumentParser(
        prog="fscache bench",
        description="The Gray & Cheriton workload against fscache, term by term, "
        "with peers (term 0, a TTL cache, Redis client tracking). See bench/README.md.",
    )
    add = parser.add_argument
    add("--out", default="bench/out", help="directory for results.json, table.txt, PNGs")
    add("--quick", action="store_true",
        help="a short run (<60 s on 2 cores): rates x10, terms and skew /10")  # fmt: skip
    add("--clients", type=int, help=f"N (default {d.clients})")
    add("--processes", type=int, help=f"worker processes (default {d.processes})")
    add("--read-rate", type=float, help=f"R per client, reads/s (default {d.read_rate})")
    add("--write-rate", type=float, help=f"W per client, writes/s (default {d.write_rate})")
    add("--sharing", type=int, help=f"S, clients sharing each file (default {d.sharing})")
    add("--files", type=int, help=f"file count (default {d.files})")
    add("--file-size", type=int, help=f"bytes (default {d.file_size})")
    add("--popularity", choices=("uniform", "zipf"), help="file popularity (default uniform)")
    add("--zipf-s", type=float, help=f"Zipf exponent (default {d.zipf_s})")
    add("--duration", type=float, help=f"measured seconds per run (default {d.duration})")
    add("--terms", type=_floats, help="server terms, s (default 0,0.1,0.5,1,2,5,10,20)")
    add("--ttl-terms", type=_floats, help="TTL cache lifetimes, s (default 1,10)")
    add("--skew", type=float, help=f"skew allowance eps, s (default {d.skew})")
    add("--systems", help="comma list of fscache,ttl,redis (default all)")
    add("--seed", type=int)
    add("--no-progress", action="store_true", help="no progress bar")
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    cfg = Config.quick_preset() if args.quick else Config()
    for field in dataclasses.fields(Config):
        value = getattr(args, field.name, None)
        if value is None or field.name == "quick":
            continue
        if field.name == "systems":
            value = tuple(s.strip() for s in value.split(",") if s.strip())
        setattr(cfg, field.name, value)
    return cfg


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:  # `fscache bench -- --quick ...`
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"fscache bench: {exc}", file=sys.stderr)
        return 2
    results = run_benchmark(cfg, args.out, progress=not args.no_progress)
    print(results["description"])
    print()
    print(format_tables(results))
    print()
    print(f"wrote {os.path.join(args.out, 'results.json')}, table.txt and:")
    for path in results["plots"]:
        print(f"  {path}")
    print(f"({results['elapsed_s']:.0f} s)")
    t = results["targets"]
    return 0 if t["fscache_no_stale_reads"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
