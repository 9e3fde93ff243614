"""One (system, term) run of the workload: its server, the workers' schedules, the
measured window, and the server's counters and CPU time at the window's edges."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from fscache.bench import model
from fscache.bench.driver import GRACE, RunSpec, WorkerResult, encode_value, path_of
from fscache.bench.harness import fscache_server, redis_server
from fscache.bench.procs import WorkerPool
from fscache.bench.progress import Progress
from fscache.bench.workload_config import ClientPlan, Config, phases_for
from fscache.bench.workload_results import summarize_run

START_DELAY = 0.3  # seconds between "go" and the first scheduled operation
READY_TIMEOUT = 60.0


def make_root(workdir: str, name: str, cfg: Config) -> str:
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

    root = make_root(workdir, name, cfg)
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
