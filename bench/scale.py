"""The scale benchmark: how far one server goes on this machine, with real processes.

``python -m fscache.bench.scale [--quick] [--out DIR]`` measures, each in its own
server process:

* **connections** -- server RSS against connected clients
  (:func:`fscache.bench.scale_conns.measure_connections`);
* **leases** -- server RSS against live leases, many files with a few holders each
  and a million files with one (:func:`fscache.bench.scale_leases.measure_leases`);
* **fan-out** -- a write to a file held by 100 to 10,000 clients that all approve at
  once: seconds from its request to its reply
  (:func:`fscache.bench.scale_leases.measure_fanout`);
* **restart storm** -- 10,000 clients coming back after a SIGKILL and restart of the
  server: when, how many connection attempts the kernel dropped (a refusal: the
  bar is none), how many read old data
  (:func:`fscache.bench.scale_conns.measure_restart_storm`);
* **fairness** -- an idle client's latency while others load the server
  (:func:`fscache.bench.scale_conns.measure_fairness`);
* **locks** -- 10,000 clients each holding a lock of its own, renewed every ttl/3:
  the server's CPU while they hold them, and how many were lost
  (:func:`fscache.bench.scale_conns.measure_locks`).

It prints one table per measurement and, with ``--out DIR``, writes ``scale.json``
(the same rows) and ``scale.png`` (connections and leases against server RSS,
holders against fan-out time). A measurement whose module is not installed is
reported as not measured, with the reason. ``--quick`` runs small sizes in well
under a minute (for tests); its figures say nothing about scale.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from fscache.bench import run_main

SCALE_JSON = "scale.json"
SCALE_PNG = "scale.png"
MIB = 1024 * 1024


def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "connections": [10, 50],
            "lease_shapes": [(2_000, 2), (5_000, 1)],
            "fanout": [10, 50],
            "fanout_repetitions": 3,
            "storm_clients": 10,
            "fairness_s": 1.0,
            "locks": 20,
            "lock_ttl_s": 3.0,
            "lock_window_s": 1.0,
        }
    return {
        "connections": [100, 1_000, 5_000, 10_000],
        "lease_shapes": [(100_000, 10), (1_000_000, 1)],
        "fanout": [100, 1_000, 10_000],
        "fanout_repetitions": 5,
        "storm_clients": 10_000,
        "fairness_s": 5.0,
        "locks": 10_000,
        "lock_ttl_s": 30.0,
        "lock_window_s": 20.0,
    }


def _module(name: str) -> ModuleType | str:
    """``fscache.bench.<name>``, or why it cannot be had."""
    try:
        return importlib.import_module(f"fscache.bench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"fscache.bench.{name}":
            raise
        return f"not measured (bench/{name}.py absent)"


def measure(quick: bool, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every measurement, as rows (or a ``not_measured`` reason) by name."""
    sizes = _sizes(quick)
    leases = _module("scale_leases")
    conns = _module("scale_conns")
    results: dict[str, Any] = {"quick": quick}

    def run(name: str, module: ModuleType | str, call: Callable[[ModuleType], Any]) -> None:
        say(f"measuring {name} ...")
        if isinstance(module, str):
            results[name] = {"not_measured": module}
        else:
            results[name] = call(module)

    run("connections", conns, lambda m: m.measure_connections(sizes["connections"]))
    run("leases", leases, lambda m: m.measure_leases(sizes["lease_shapes"]))
    run(
        "fanout",
        leases,
        lambda m: m.measure_fanout(sizes["fanout"], repetitions=sizes["fanout_repetitions"]),
    )
    run("restart_storm", conns, lambda m: m.measure_restart_storm(sizes["storm_clients"]))
    run("fairness", conns, lambda m: m.measure_fairness(sizes["fairness_s"]))
    run(
        "locks",
        conns,
        lambda m: m.measure_locks(
            sizes["locks"], ttl=sizes["lock_ttl_s"], seconds=sizes["lock_window_s"]
        ),
    )
    return results


# ---------------------------------------------------------------- the table
_COLUMNS = {  # each measurement's fields, in the order shown
    "connections": ["clients", "server_rss_bytes", "baseline_rss_bytes", "per_client_bytes"],
    "leases": [
        "files", "holders", "leases", "server_rss_bytes", "baseline_rss_bytes", "bytes_per_lease",
    ],
    "fanout": [
        "holders", "holders_nice", "repetitions", "apply_p50_s", "apply_max_s",
        "server_cpu_p50_s", "holders_cpu_p50_s",
    ],
    "restart_storm": [
        "clients", "clients_nice", "all_back_s", "median_back_s", "refused", "listen_overflows",
        "stale_reads", "server_cpu_s",
    ],
    "fairness": ["idle_median_s", "idle_p99_s", "loaded_median_s", "loaded_p99_s", "ratio"],
    "locks": ["locks", "ttl_s", "all_held_s", "server_cpu_share", "not_taken", "lost"],
}  # fmt: skip


def _cell(field: str, value: float) -> str:
    """A figure in its unit, which its field's name ends with (bytes, seconds)."""
    if field.endswith("_rss_bytes"):
        return f"{value / MIB:,.1f} MiB"
    if field.endswith("bytes") or field.startswith("bytes"):
        return f"{value:,.0f} B"
    if field.endswith("_s"):
        return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:,.2f} s"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def table(results: dict[str, Any]) -> str:
    """One small table per measurement, in the order measured."""
    out: list[str] = []
    for name, columns in _COLUMNS.items():
        value = results.get(name)
        out.append(f"{name.replace('_', ' ')}:")
        if value is None or (isinstance(value, dict) and "not_measured" in value):
            reason = "not measured" if value is None else value["not_measured"]
            out.append(f"  {reason}")
            out.append("")
            continue
        rows = value if isinstance(value, list) else [value]
        lines = [columns] + [[_cell(field, row[field]) for field in columns] for row in rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
        for line in lines:
            out.append("  " + "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------- the plot
def write_plot(results: dict[str, Any], out_dir: str) -> str:
    """``scale.png``: connections and leases against server RSS, holders against the
    write's time; a panel whose measurement did not run says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels: Sequence[tuple[str, str, str, str, float, str]] = (
        ("connections", "clients", "server_rss_bytes", "server RSS (MiB)", MIB, "connections"),
        ("leases", "leases", "server_rss_bytes", "server RSS (MiB)", MIB, "live leases"),
        ("fanout", "holders", "apply_p50_s", "write applied after (s)", 1.0, "holders approving"),
    )
    for ax, (name, x, y, ylabel, scale, xlabel) in zip(axes, panels, strict=True):
        rows = results.get(name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if not isinstance(rows, list) or not rows:
            reason = rows["not_measured"] if isinstance(rows, dict) else "not measured"
            ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes)
            continue
        style = "o" if name == "leases" else "o-"  # leases: separate shapes, not a series
        label = "p50" if name == "fanout" else None
        ax.plot([r[x] for r in rows], [r[y] / scale for r in rows], style, label=label)
        if name == "fanout":
            ax.plot([r[x] for r in rows], [r["apply_max_s"] for r in rows], "x--",
                    color="tab:orange", label="max")  # fmt: skip
            ax.legend()
        if name == "leases":
            for r in rows:
                ax.annotate(f"{r['files']:,} files x {r['holders']}", (r[x], r[y] / scale),
                            textcoords="offset points", xytext=(4, 4), fontsize=8)  # fmt: skip
        ax.set_xscale("log")
    title = "fscache scale" + (" (--quick: small sizes)" if results.get("quick") else "")
    fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(out_dir, SCALE_PNG)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a test run)")
    parser.add_argument("--out", metavar="DIR", help=f"write {SCALE_JSON} and {SCALE_PNG} here")
    args = parser.parse_args(argv)
    results = measure(args.quick)
    print()
    print(table(results))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, SCALE_JSON), "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {os.path.join(args.out, SCALE_JSON)} and {write_plot(results, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
