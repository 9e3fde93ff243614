"""One run's row of results: latencies, the stale-read check of every read, and the
model's prediction at the rates the run offered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fscache.bench import model
from fscache.bench.checker import Op, check_history
from fscache.bench.driver import WorkerResult
from fscache.bench.workload_config import Config


def _percentile(values: np.ndarray, q: float, scale: float) -> float | None:
    return float(np.percentile(values, q)) * scale if len(values) else None


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
