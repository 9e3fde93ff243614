"""``fscache bench``: the command line of the paper's workload benchmark.

A coordinator starts one server per run, each in its own process, and drives it
from ``--processes`` long-lived worker processes (:mod:`fscache.bench.driver`) that
hold the clients: real TCP on 127.0.0.1. The clients follow open-loop Poisson
schedules (an operation starts at its time whether or not earlier ones have
finished). Each run starts every lease stream in its stationary state (priming
reads, see :func:`fscache.bench.driver.schedule`), settles briefly, and then
measures a window: server counters and server CPU time are read at the window's
edges, latencies are kept for operations that began inside it, and every read of
the whole run goes through the stale-read checker
(:func:`fscache.bench.checker.check_history`).

Before the sweep a calibration run (:mod:`fscache.bench.calibration`) estimates
``m_proc`` and ``m_prop`` for the model (:mod:`fscache.bench.model`), whose
prediction is printed beside every measured point. The parts: the configuration
(:mod:`~fscache.bench.workload_config`), one run
(:mod:`~fscache.bench.workload_run`, :mod:`~fscache.bench.workload_results`), the
sweep (:mod:`~fscache.bench.sweep`) and its report
(:mod:`~fscache.bench.workload_report`). See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from fscache.bench import missing_extra, run_main
from fscache.bench import workload_config as c
from fscache.bench.workload_config import Config


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
    add("--out", default="bench/out", metavar="DIR",
        help="directory for results.json, table.txt and the PNGs, made if missing"
        " (default bench/out under the current directory)")  # fmt: skip
    add("--quick", action="store_true",
        help="a short run (<60 s on 2 cores): rates x10, terms and skew /10")  # fmt: skip
    add("--clients", type=int, help=f"N, 1..{c.MAX_CLIENTS} (default {d.clients})")
    add("--processes", type=int,
        help=f"worker processes, 1..{c.MAX_PROCESSES}, at most N"
        f" (default {d.processes})")  # fmt: skip
    add("--read-rate", type=float,
        help=f"R per client, reads/s, more than 0, at most {c.MAX_RATE:g}"
        f" (default {d.read_rate})")  # fmt: skip
    add("--write-rate", type=float,
        help=f"W per client, writes/s, 0..{c.MAX_RATE:g} (default {d.write_rate}); all"
        f" clients' reads and writes together at most {c.MAX_LOAD:g}/s")  # fmt: skip
    add("--sharing", type=int, help=f"S, clients sharing each file (default {d.sharing})")
    add("--files", type=int, help=f"file count, at most {c.MAX_FILES} (default {d.files})")
    add("--file-size", type=int,
        help=f"bytes, {c.MIN_FILE_SIZE}..{c.MAX_FILE_SIZE} (default {d.file_size})")  # fmt: skip
    add("--popularity", choices=("uniform", "zipf"), help="file popularity (default uniform)")
    add("--zipf-s", type=float, help=f"Zipf exponent, 0..{c.MAX_ZIPF_S:g} (default {d.zipf_s})")
    add("--duration", type=float,
        help=f"measured seconds per run, more than 0, at most {c.MAX_DURATION:g}"
        f" (default {d.duration})")  # fmt: skip
    add("--terms", type=_floats,
        help=f"server terms, s, each 0..{c.MAX_TERM:g}"
        " (default 0,0.1,0.5,1,2,5,10,20)")  # fmt: skip
    add("--ttl-terms", type=_floats,
        help=f"TTL cache lifetimes, s, each more than 0, at most {c.MAX_TERM:g}"
        " (default 1,10)")  # fmt: skip
    add("--skew", type=float, help=f"skew allowance eps, s, 0..{c.MAX_SKEW:g} (default {d.skew})")
    add("--systems", help="comma list of fscache,ttl,redis (default all)")
    add("--seed", type=int, help=f"0 or more (default {d.seed})")
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
    missing = missing_extra("numpy", "matplotlib")
    if missing is not None:
        print(f"fscache bench: {missing}", file=sys.stderr)
        return 2
    # Imported only now: the run needs numpy, which --help and a bad option do not.
    from fscache.bench.sweep import run_benchmark
    from fscache.bench.workload_report import format_tables

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
    sys.exit(run_main(main, sys.argv[1:]))
