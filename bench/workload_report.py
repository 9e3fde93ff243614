"""The workload's report: the targets it checks and the tables it prints."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fscache.bench.harness import CPU_TICK_S
from fscache.bench.plots import runs_of, term0_run
from fscache.bench.workload_config import Config


def check_targets(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The workload's targets, for fscache: within 25% of the model at every term > 0, and
    the largest term at most a quarter of term 0's load. A target the runs cannot decide
    (no fscache term > 0 ran, or no term 0) is None, not False, and ``not_evaluated``
    says why."""
    fs = runs_of(runs, "fscache")
    positive = [r for r in fs if r["term"] > 0 and r["model_error"] is not None]
    worst = max((abs(r["model_error"]) for r in positive), default=None)
    zero = term0_run(runs)
    largest = fs[-1] if fs and fs[-1]["term"] > 0 else None
    not_evaluated: dict[str, str] = {}
    if worst is None:
        not_evaluated["within_25pct_of_model"] = "no fscache term > 0 run"
    reduction = None
    if zero is None:
        not_evaluated["largest_term_at_most_quarter"] = "no fscache term 0 run"
    elif largest is None:
        not_evaluated["largest_term_at_most_quarter"] = "no fscache term > 0 run"
    elif not zero["server_consistency_msgs_per_s"]:
        not_evaluated["largest_term_at_most_quarter"] = "term 0 measured no load"
    else:
        reduction = largest["server_consistency_msgs_per_s"] / zero["server_consistency_msgs_per_s"]
    stale_fs = sum(r["stale_reads"] + r["impossible_reads"] for r in fs)
    return {
        "worst_model_error": worst,
        "within_25pct_of_model": None if worst is None else worst <= 0.25,
        "largest_term_vs_term0": reduction,
        "largest_term_at_most_quarter": None if reduction is None else reduction <= 0.25,
        "not_evaluated": not_evaluated,
        "fscache_stale_reads": stale_fs,
        "fscache_no_stale_reads": stale_fs == 0,
    }


def _verdict(targets: dict[str, Any], name: str, figure: str) -> str:
    """``yes (figure)``, ``NO (figure)``, or ``not evaluated (why)``."""
    met = targets[name]
    if met is None:
        return f"not evaluated ({targets['not_evaluated'][name]})"
    return f"{'yes' if met else 'NO'} ({figure})"


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
    lines += ["", format_targets(results["targets"])]
    for note in results.get("skipped", []):
        lines.append(f"skipped: {note}")
    return "\n".join(lines)


def format_targets(t: dict[str, Any]) -> str:
    """The targets line, from :func:`check_targets`."""
    return (
        "targets: every term > 0 within 25% of the model: "
        + _verdict(t, "within_25pct_of_model", f"worst {_fmt(t['worst_model_error'], '.1%')}")
        + "; largest term <= 1/4 of term 0: "
        + _verdict(t, "largest_term_at_most_quarter", _fmt(t["largest_term_vs_term0"], ".3f"))
        + f"; fscache stale reads: {t['fscache_stale_reads']}"
    )


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
        text += "\n" + describe_calibration(calibration)
    return text


def describe_calibration(calibration: dict[str, float]) -> str:
    """The calibration's figures, with what limits them: ``m_proc`` is server CPU time,
    which the kernel counts in whole ticks; and ``m_prop`` is clamped at 0, when the
    model's round trip no longer equals the measured one."""
    rtt, m_proc, m_prop = (calibration[k] * 1e6 for k in ("rtt_s", "m_proc_s", "m_prop_s"))
    text = f"calibration: round trip {rtt:.0f} µs, m_proc {m_proc:.1f} µs"
    if "server_cpu_s" in calibration:
        ticks = round(calibration["server_cpu_s"] / CPU_TICK_S)
        text += (
            f" ({ticks} ticks of {CPU_TICK_S * 1000:g} ms of server CPU"
            f" over {calibration['messages']:.0f} messages)"
        )
    text += f", m_prop {m_prop:.1f} µs"
    if m_prop == 0 and 4 * m_proc > rtt:
        text += (
            f"\n  (m_prop clamped: 2 m_proc is more than half the round trip, so the model's"
            f" round trip, 4 m_proc = {4 * m_proc:.0f} µs, and with it the term-0 model"
            f" mean read latency, is {4 * m_proc / rtt - 1:.0%} longer than the measured"
            " round trip)"
        )
    return text
