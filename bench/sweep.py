"""The whole workload benchmark: calibrate, run every (system, term) in turn, and
write ``results.json``, ``table.txt`` and the plots."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from fscache.bench import model
from fscache.bench.calibration import calibrate
from fscache.bench.driver import worker_main
from fscache.bench.harness import redis_server_binary, redis_version
from fscache.bench.procs import WorkerPool
from fscache.bench.progress import Progress
from fscache.bench.workload_config import Config, lease_read_rates, phases_for, plan_clients
from fscache.bench.workload_report import check_targets, describe, format_tables
from fscache.bench.workload_run import execute_run

OVERHEAD_GUESS = 2.0  # seconds per run outside its schedule (for the progress bar)


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
    failed = True  # until the last run is done: then the workers finish their round
    try:
        pool = WorkerPool(worker_main, cfg.processes, name="bench-worker")
        bar.show("calibration", "round trips", 0.0)
        calibration = calibrate(cfg, workdir)
        costs = model.Calibration(calibration["m_prop_s"], calibration["m_proc_s"])
        bar.finish_run(2.0)
        for i, (system, term, planned_s) in enumerate(planned):
            runs.append(execute_run(i, system, term, cfg, plans, pool, workdir, bar, costs, rates))
            bar.finish_run(planned_s)
        # Each trio.run leaves its runner, nurseries and tasks in reference cycles. Left
        # to a later collection, perhaps at exit, a Ctrl-C can land in a nursery's
        # __del__: Python prints it as ignored and the process exits 0, not interrupted.
        gc.collect()
        failed = False
    finally:
        bar.close()
        if pool is not None:
            pool.close(at_once=failed)
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
