"""The calibration run: one client, closed loop, term 0, which measures the round
trip and the server's CPU time per message for the model's ``m_proc`` and ``m_prop``."""

from __future__ import annotations

import statistics
import time

from fscache.bench.driver import path_of
from fscache.bench.harness import fscache_server
from fscache.bench.workload_config import Config
from fscache.bench.workload_run import make_root

CALIBRATION_MIN_CPU_S = 0.1  # ten clock ticks of server CPU time at the least
CALIBRATION_MAX_S = 10.0


def calibrate(cfg: Config, workdir: str) -> dict[str, float]:
    """One client, closed loop, term 0 (every read a round trip): the round trip's
    median and the server's CPU time per message. ``m_proc`` is the latter;
    ``m_prop`` is what remains of half a round trip, ``rtt/2 - 2 m_proc``, or 0 when
    ``2 m_proc`` alone is more than half of it (the model's round trip, ``4 m_proc``,
    is then longer than the measured one; :func:`describe` says so)."""
    import trio

    import fscache

    root = make_root(workdir, "calibration", cfg)
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
    return {
        "rtt_s": rtt,
        "m_proc_s": m_proc,
        "m_prop_s": m_prop,
        "reads": len(times),
        "server_cpu_s": cpu,  # a whole number of CPU_TICK_S: m_proc's resolution
        "messages": messages,
    }
