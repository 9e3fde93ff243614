"""The PNG figures of ``fscache bench`` (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

CONSISTENCY_PNG = "consistency_vs_term.png"
READ_LATENCY_PNG = "read_latency_vs_term.png"
WRITE_DELAY_PNG = "write_delay_vs_term.png"


def runs_of(runs: Sequence[dict[str, Any]], system: str) -> list[dict[str, Any]]:
    """The runs of one system in results.json, by term."""
    return sorted((r for r in runs if r["system"] == system), key=lambda r: r["term"])


def term0_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """fscache's run at term 0, which the normalised figures divide by (if it ran)."""
    return next((r for r in runs if r["system"] == "fscache" and r["term"] == 0), None)


def _x_axis(ax: Any, terms: Sequence[float]) -> None:
    positive = [t for t in terms if t > 0]
    if positive:  # linear up to the shortest term (so 0 shows), logarithmic above
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.5)
        ax.set_xlim(0, max(positive) * 1.5)
    ax.set_xlabel("lease term t_S (s)")
    ax.grid(True, which="both", alpha=0.3)


def write_plots(results: dict[str, Any], out_dir: str) -> list[str]:
    """Write the three figures into ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fs = runs_of(runs, "fscache")
    ttl = runs_of(runs, "ttl")
    redis = [r for r in runs if r["system"] == "redis"]
    zero = term0_run(runs)
    base = zero["server_consistency_msgs_per_s"] if zero else None
    model_base = zero["model_nominal_consistency_msgs_per_s"] if zero else None
    terms = [r["term"] for r in fs + ttl]
    title = results.get("title", "")
    paths = []

    # 1. consistency load vs term, normalised to term 0 (the paper's figure)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if base and model_base:
        ax.plot([r["term"] for r in fs], [r["model_nominal_consistency_msgs_per_s"] / model_base
                for r in fs], "-", color="tab:blue", label="fscache, model")  # fmt: skip
        ax.plot([r["term"] for r in fs], [r["server_consistency_msgs_per_s"] / base
                for r in fs], "o", color="tab:blue", label="fscache, measured")  # fmt: skip
        if ttl:
            ax.plot([r["term"] for r in ttl], [r["model_nominal_consistency_msgs_per_s"]
                    / model_base for r in ttl], "--", color="tab:orange",
                    label="TTL cache, model")  # fmt: skip
            ax.plot([r["term"] for r in ttl], [r["server_consistency_msgs_per_s"] / base
                    for r in ttl], "s", color="tab:orange",
                    label="TTL cache (stale reads!), measured")  # fmt: skip
        for r in redis:
            ax.axhline(r["server_consistency_msgs_per_s"] / base, color="tab:red", ls=":",
                       label="Redis tracking, measured")  # fmt: skip
        ax.set_ylabel("consistency messages / term 0's")
        ax.set_ylim(bottom=0)
    _x_axis(ax, terms)
    ax.set_title(f"Server consistency load vs lease term{title}")
    _legend(ax)
    paths.append(_save(fig, plt, out_dir, CONSISTENCY_PNG))

    # 2. read latency vs term
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["term"] for r in fs]
    for key, style, label in (
        ("read_mean_us", "o-", "mean, measured"),
        ("read_p50_us", "^-", "p50"),
        ("read_p99_us", "v-", "p99"),
        ("miss_p50_us", "x:", "p50 of misses"),
        ("hit_p50_us", "+:", "p50 of hits"),
    ):
        ax.plot(xs, [r[key] or float("nan") for r in fs], style, label=f"fscache {label}")
    ax.plot(xs, [r["model_read_delay_us"] for r in fs], "k--", label="model: mean added delay")
    for r in redis:
        ax.axhline(r["read_mean_us"], color="tab:red", ls=":", label="Redis mean")
    ax.set_yscale("log")
    ax.set_ylabel("read latency (µs)")
    _x_axis(ax, terms)
    ax.set_title(f"Read latency vs lease term{title}")
    _legend(ax)
    paths.append(_save(fig, plt, out_dir, READ_LATENCY_PNG))

    # 3. write delay vs term
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style, label in (
        ("write_p50_ms", "o-", "p50"),
        ("write_p99_ms", "^-", "p99"),
        ("write_max_ms", "v:", "max"),
    ):
        ax.plot(xs, [r[key] or float("nan") for r in fs], style, label=f"fscache {label}")
    if zero and zero["write_p50_ms"]:
        ax.plot(xs, [zero["write_p50_ms"] + r["model_write_added_ms"] for r in fs], "k--",
                label="model: term-0 p50 + approval t_a")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.set_ylabel("write latency (ms)")
    _x_axis(ax, terms)
    ax.set_title(f"Write delay vs lease term{title}")
    _legend(ax)
    paths.append(_save(fig, plt, out_dir, WRITE_DELAY_PNG))
    return paths


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _save(fig: Any, plt: Any, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
