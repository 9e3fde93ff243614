"""The benchmarks (``fscache.bench``): the paper's model by hand, the workload's
plumbing, and one tiny real run.

Test rules: the model tests compare with values worked out by hand (shown in each
test). The runs use real processes and TCP on 127.0.0.1 with ports picked by the
kernel, last a few seconds, and assert only what must hold on any machine (the
result file's shape, no stale reads from fscache, the figures written) -- never a
speed. Redis tests skip when ``redis-server`` or redis-py is missing.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cbor2
import numpy as np
import pytest

from fscache import cli
from fscache.bench import (
    echo,
    harness,
    model,
    plots,
    run_main,
    speed,
    sweep,
    workload,
    workload_config,
    workload_report,
)
from fscache.bench.driver import (
    RunSpec,
    decode_value,
    encode_value,
    schedule,
)
from fscache.bench.workload_config import ClientPlan
from fscache.protocol import data_frame, read_frame

REQUIRED_RUN_KEYS = {
    "system", "term", "server_consistency_msgs_per_s", "model_consistency_msgs_per_s",
    "read_p50_us", "read_p99_us", "write_p50_ms", "write_p99_ms", "hit_ratio", "stale_reads",
}  # fmt: skip


# ---------------------------------------------------------------- the model, by hand
def test_client_term_subtracts_the_message_times_and_the_skew() -> None:
    # 10 - (0.001 + 2 * 0.002) - 0.1 = 9.895
    assert model.client_term(10.0, 0.001, 0.002, 0.1) == pytest.approx(9.895)


def test_client_term_is_never_negative() -> None:
    assert model.client_term(0.1, 0.01, 0.02, 0.1) == 0.0


def test_consistency_load_with_a_term() -> None:
    # 2NR / (1 + R t_C) + NSW = 2*10*1 / (1 + 1*9) + 10*2*0.1 = 2 + 2
    assert model.consistency_load(10, 1.0, 0.1, 2, 10.0, 9.0) == pytest.approx(4.0)


def test_consistency_load_at_term_zero_is_every_read_and_no_approval() -> None:
    # 2NR = 2*10*1; no lease, so no write needs approval
    assert model.consistency_load(10, 1.0, 0.1, 2, 0.0, 0.0) == pytest.approx(20.0)


def test_term_zero_beats_a_very_short_term() -> None:
    # t_C = 0 caches nothing but still pays NSW = 2 for approvals: 22 > 20
    very_short = model.consistency_load(10, 1.0, 0.1, 2, 0.05, 0.0)
    assert very_short == pytest.approx(22.0)
    assert very_short > model.consistency_load(10, 1.0, 0.1, 2, 0.0, 0.0)


def test_the_papers_headline_ten_seconds_is_about_a_tenth() -> None:
    # R = 0.864/s, t_S = 10 s, eps = 0.1 s: 1 / (1 + 0.864 * 9.9) = 0.1047 (no writes)
    t_c = model.client_term(10.0, 0.0, 0.0, 0.1)
    ratio = model.consistency_load(1, 0.864, 0, 1, 10.0, t_c) / model.consistency_load(
        1, 0.864, 0, 1, 0.0, 0.0
    )
    assert ratio == pytest.approx(0.1047, abs=1e-4)


def test_approval_delay() -> None:
    # t_a = 2 m_prop + (S + 2) m_proc = 0.002 + 5 * 0.002
    assert model.approval_delay(3, 0.001, 0.002) == pytest.approx(0.012)


def test_added_delay_per_operation() -> None:
    # reads: 2R (m_prop + 2 m_proc) / (1 + R t_C) = 2 * 0.005 / 10 = 0.001
    # writes: W t_a = 1 * (0.002 + 4 * 0.002) = 0.010;  (0.001 + 0.010) / (R + W = 2)
    assert model.added_delay(1.0, 1.0, 2, 10.0, 9.0, 0.001, 0.002) == pytest.approx(0.0055)
    # term 0: every read pays the round trip, no write waits for approval
    assert model.added_delay(1.0, 1.0, 2, 0.0, 0.0, 0.001, 0.002) == pytest.approx(0.005)


def test_calibration_round_trip() -> None:
    assert model.Calibration(m_prop=0.001, m_proc=0.002).round_trip == pytest.approx(0.010)


def test_one_file_per_client_reduces_to_the_papers_formula() -> None:
    rates = [1.0] * 10  # N = 10 clients, one lease stream each
    assert model.consistency_load_for_rates(rates, 1.0, 2, 10.0, 9.0) == pytest.approx(
        model.consistency_load(10, 1.0, 0.1, 2, 10.0, 9.0)
    )


def test_several_files_per_client_are_separate_lease_streams() -> None:
    # one client reading 2 files at 0.5/s each, t_C = 2: 2 * 0.5 / (1 + 1) = 0.5 reads/s
    assert model.server_read_rate([0.5, 0.5], 2.0) == pytest.approx(0.5)
    assert model.hit_ratio_for_rates([0.5, 0.5], 2.0) == pytest.approx(0.5)
    assert model.hit_ratio_for_rates([1.0], 9.0) == pytest.approx(0.9)


def test_mean_read_delay_is_the_miss_fraction_of_a_round_trip() -> None:
    costs = model.Calibration(m_prop=0.001, m_proc=0.002)  # round trip 10 ms
    assert model.mean_read_delay_for_rates([1.0], 9.0, costs) == pytest.approx(0.001)


def test_ttl_load_has_no_approvals() -> None:
    # 2 * 2 / (1 + 2 * 1.5) = 1
    assert model.ttl_load_for_rates([2.0], 1.5) == pytest.approx(1.0)


# ---------------------------------------------------------------- workload plumbing
def test_each_file_is_read_by_sharing_clients_and_written_by_one() -> None:
    cfg = workload_config.Config(clients=6, sharing=3, files=12)
    plans = workload_config.plan_clients(cfg)
    readers: dict[int, set[int]] = {}
    writers: dict[int, set[int]] = {}
    for plan in plans:
        assert sum(plan.read_p) == pytest.approx(1.0)
        assert sum(plan.write_p) == pytest.approx(1.0)
        for f in plan.files:
            readers.setdefault(f, set()).add(plan.index)
        for f in plan.owned:
            writers.setdefault(f, set()).add(plan.index)
    assert sorted(readers) == list(range(12))
    assert all(len(r) == 3 for r in readers.values())
    assert all(len(w) == 1 and w <= readers[f] for f, w in writers.items())
    assert sorted(writers) == list(range(12))


def test_zipf_popularity() -> None:
    # weights 1, 1/2, 1/3 normalised by 11/6
    assert workload_config.popularity(3, "zipf", 1.0) == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    assert workload_config.popularity(4, "uniform", 1.0) == [0.25] * 4


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of --sharing"):
        workload_config.Config(clients=5, sharing=2).validate()
    with pytest.raises(ValueError, match="--files"):
        workload_config.Config(clients=4, sharing=2, files=3).validate()
    with pytest.raises(ValueError, match="unknown systems"):
        workload_config.Config(systems=("nfs",)).validate()


def _run(system: str, term: float, load: float, model_error: float | None) -> dict[str, Any]:
    return {
        "system": system, "term": term, "server_consistency_msgs_per_s": load,
        "model_error": model_error, "stale_reads": 0, "impossible_reads": 0,
    }  # fmt: skip


def test_the_targets_are_met_or_not_when_terms_0_and_above_ran() -> None:
    runs = [_run("fscache", 0, 100.0, 0.0), _run("fscache", 10, 30.0, -0.3)]
    line = workload_report.format_targets(workload_report.check_targets(runs))
    assert line == (
        "targets: every term > 0 within 25% of the model: NO (worst 30.0%);"
        " largest term <= 1/4 of term 0: NO (0.300); fscache stale reads: 0"
    )


@pytest.mark.parametrize(
    ("runs", "model", "quarter"),
    [
        (
            [_run("redis", 0, 50.0, None)],
            "not evaluated (no fscache term > 0 run)",
            "not evaluated (no fscache term 0 run)",
        ),
        (
            [_run("fscache", 0.2, 40.0, 0.1)],
            "yes (worst 10.0%)",
            "not evaluated (no fscache term 0 run)",
        ),
        (
            [_run("fscache", 0, 40.0, 0.0)],
            "not evaluated (no fscache term > 0 run)",
            "not evaluated (no fscache term > 0 run)",
        ),
    ],
    ids=["redis alone", "no term 0", "term 0 alone"],
)
def test_a_target_the_runs_cannot_decide_is_not_evaluated_rather_than_missed(
    runs: list[dict[str, Any]], model: str, quarter: str
) -> None:
    targets = workload_report.check_targets(runs)
    assert workload_report.format_targets(targets) == (
        f"targets: every term > 0 within 25% of the model: {model};"
        f" largest term <= 1/4 of term 0: {quarter}; fscache stale reads: 0"
    )
    assert targets["largest_term_at_most_quarter"] is None


def test_the_calibration_line_says_when_m_prop_is_clamped_and_counts_the_ticks() -> None:
    tick = harness.CPU_TICK_S
    clamped = {"rtt_s": 143e-6, "m_proc_s": 40e-6, "m_prop_s": 0.0,
               "server_cpu_s": 16 * tick, "messages": 16 * tick / 40e-6}  # fmt: skip
    first, note = workload_report.describe_calibration(clamped).splitlines()
    assert f"m_proc 40.0 µs (16 ticks of {tick * 1000:g} ms of server CPU" in first
    # 4 m_proc = 160 µs, 160/143 - 1 = 12%
    assert "4 m_proc = 160 µs" in note and "12% longer than the measured round trip" in note
    # m_prop > 0: 2 (m_prop + 2 m_proc) is the measured round trip; nothing to say
    fitted = {"rtt_s": 300e-6, "m_proc_s": 40e-6, "m_prop_s": 70e-6}
    assert workload_report.describe_calibration(fitted) == (
        "calibration: round trip 300 µs, m_proc 40.0 µs, m_prop 70.0 µs"
    )


def test_quick_keeps_the_shape_of_the_curve() -> None:
    full, quick = workload_config.Config(), workload_config.Config.quick_preset()
    per_file = full.read_rate / full.files_per_client
    quick_per_file = quick.read_rate / quick.files_per_client
    # every quick term is a full-run term with R t (per lease stream) unchanged
    full_r_t = {round(t * per_file, 9) for t in full.terms}
    assert all(round(t * quick_per_file, 9) in full_r_t for t in quick.terms)
    assert quick_per_file * quick.skew == pytest.approx(per_file * full.skew)
    assert quick.write_rate / quick.read_rate == pytest.approx(full.write_rate / full.read_rate)


def test_command_line_options_override_the_preset() -> None:
    args = workload.build_parser().parse_args(
        ["--quick", "--terms", "0,0.5", "--clients", "4", "--systems", "fscache,ttl"]
    )
    cfg = workload.config_from_args(args)
    assert cfg.quick and cfg.terms == (0.0, 0.5) and cfg.clients == 4
    assert cfg.systems == ("fscache", "ttl")
    assert workload.main(["--clients", "3", "--sharing", "2"]) == 2  # refused, nothing run


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (["--terms", "nan"], "--terms must be from 0 to 600, not nan"),
        (["--terms", ","], "--terms names no term (fscache is among --systems)"),
        (["--ttl-terms", ",", "--systems", "ttl"], "--ttl-terms names no lifetime"),
        (["--duration", "inf"], "--duration must be more than 0 and at most 3600, not inf"),
        (["--read-rate", "1e9"], "--read-rate must be more than 0 and at most 1000"),
        (["--read-rate", "900", "--clients", "20"], "must be at most 10000 operations/s"),
        (["--skew", "-1"], "--skew must be from 0 to 10, not -1"),
        (["--processes", "0"], "--processes must be from 1 to 64 and at most --clients"),
        (["--seed", "-1"], "--seed must be 0 or more"),
        (["--systems", ","], "--systems names no system"),
    ],
)
def test_values_a_run_cannot_take_are_one_line_of_bad_usage(
    options: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert workload.main(["--quick", *options]) == 2  # refused, nothing run
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fscache bench: ") and refusal in err, err


@pytest.mark.parametrize("prefix", [[], ["-v"]], ids=["bench", "-v bench"])
def test_fscache_bench_hands_its_options_to_the_benchmark(prefix: list[str]) -> None:
    """Options after ``bench`` are the benchmark's, whatever comes before it."""
    assert cli.main([*prefix, "bench", "--clients", "3", "--sharing", "2"]) == 2  # refused
    with pytest.raises(SystemExit) as exit_:
        cli.main([*prefix, "ls", "127.0.0.1:1", "--clients", "3"])  # not ls's option
    assert exit_.value.code == 2


# Runs a module as ``python -m`` would, with the named modules made unimportable: an
# install without the bench extra, in a venv that has it.
WITHOUT = """
import runpy, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import raises ModuleNotFoundError
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_without(missing: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, missing, *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_fscache_bench_help_needs_no_bench_extra() -> None:
    result = run_without("numpy,matplotlib", "fscache", "bench", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: fscache bench" in result.stdout


def test_a_benchmark_without_the_bench_extra_says_how_to_get_it() -> None:
    result = run_without("numpy", "fscache", "bench", "--quick", "--no-progress")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "fscache bench: numpy is not installed; the benchmarks need it:"
        " pip install -e '.[bench]' in the fscache checkout"
    ]


def test_the_locks_benchmark_without_etcd3gw_says_how_to_get_it() -> None:
    result = run_without("etcd3gw", "fscache.bench.locks", "--quick")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "etcd3gw is not installed" in result.stderr
    assert "pip install -e '.[bench]' in the fscache checkout" in result.stderr


def leftovers(pgid: int, marker: str) -> list[str]:
    """Processes still in process group ``pgid``, or with ``marker`` on their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        if stat[0] != "Z" and (int(stat[2]) == pgid or marker in argv):
            found.append(f"{entry.name}: {argv}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "wait"),
    [("fscache", 0.5), ("fscache", 2.5), ("fscache.bench.workload", 2.5)],
    ids=["fscache bench, starting", "fscache bench, running", "python -m"],
)
def test_ctrl_c_stops_the_benchmark_and_all_its_children(
    tmp_path: Path, command: str, wait: float
) -> None:
    """SIGINT to the benchmark's process group, as a Ctrl-C at the terminal sends it:
    one line, exit 130, no traceback (the workers ignore it), no server left."""
    temp = tmp_path / "temp"  # the servers' roots are made here: their command lines say so
    temp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", command, *(["bench"] if command == "fscache" else []),
         "--quick", "--no-progress",
         "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    time.sleep(wait)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.splitlines()[-1] == "interrupted", err
    deadline = time.monotonic() + 10  # the workers' sentinel may lag the parent's exit
    while (left := leftovers(proc.pid, str(temp))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


_INTERRUPTED_IN_EXEC = {
    "benchmark": (
        "import sys\n"
        "from fscache.bench import run_main\n"
        "def main():\n"
        "    exec('raise KeyboardInterrupt')\n"
        "sys.exit(run_main(main))\n"
    ),
    "command": (
        "import sys\n"
        "from fscache import cli\n"
        "def ls(args):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "cli._COMMANDS['ls'] = ls\n"
        "sys.exit(cli.main(['ls', '127.0.0.1:1']))\n"
    ),
}


@pytest.mark.parametrize("entry", sorted(_INTERRUPTED_IN_EXEC))
def test_a_ctrl_c_that_lands_in_generated_code_still_exits_130(tmp_path: Path, entry: str) -> None:
    """A Ctrl-C may arrive while a dataclass's methods are made with ``exec``, as
    modules import. Under ``python -m``, CPython then exits by SIGINT rather than with
    the status the handler returned, unless the mark it left is cleared."""
    (tmp_path / "interrupted_in_exec.py").write_text(_INTERRUPTED_IN_EXEC[entry])
    result = subprocess.run(
        [sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (result.returncode, result.stderr.splitlines()[-1:]) == (130, ["interrupted"])


def test_a_ctrl_c_inside_a_nursery_is_one_line_and_130(capsys: pytest.CaptureFixture[str]) -> None:
    """trio raises the interrupt inside a group when it lands in a nursery's task."""

    def interrupted_in_a_nursery() -> int:
        raise BaseExceptionGroup("nursery", [KeyboardInterrupt(), ConnectionResetError()])

    assert run_main(interrupted_in_a_nursery) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_failure_inside_a_nursery_is_not_taken_for_a_ctrl_c() -> None:
    def failed_in_a_nursery() -> int:
        raise ExceptionGroup("nursery", [ValueError("bad")])

    with pytest.raises(ExceptionGroup):
        run_main(failed_in_a_nursery)


def test_values_round_trip_through_file_contents() -> None:
    data = encode_value(1234, 64)
    assert len(data) == 64 and decode_value(data) == 1234


def _spec(prime_term: float, read_rate: float, files: int, length: float) -> RunSpec:
    plan = ClientPlan(0, tuple(range(files)), (1 / files,) * files, (), ())
    return RunSpec(
        run=0, system="fscache", term=prime_term, port=0, clients=(plan,),
        read_rate=read_rate, write_rate=0.0, file_size=16, steady_from=prime_term,
        prime_term=prime_term, length=length, window=(prime_term, length), seed=7,
    )  # fmt: skip


def test_schedule_is_poisson_after_the_priming_reads() -> None:
    spec = _spec(prime_term=2.0, read_rate=400.0, files=400, length=12.0)
    offsets, who, kinds, files = schedule(spec)
    assert list(offsets) == sorted(offsets) and set(who) == {0} and set(kinds) == {0}
    steady = offsets[offsets >= 2.0]
    assert len(steady) == pytest.approx(400 * 10, rel=0.1)  # rate x span
    # priming: a stream of rate r = 1/s is inside a lease with probability
    # t_C / (t_C + 1/r) = 2/3 at a random instant; each such stream gets one read in
    # the t_C before the steady state, none earlier
    primed = offsets[offsets < 2.0]
    assert len(primed) == pytest.approx(400 * 2 / 3, rel=0.15)
    assert len(set(files[offsets < 2.0].tolist())) == len(primed)
    assert primed.min() >= 0.0


def test_no_priming_without_a_term() -> None:
    offsets, *_ = schedule(_spec(prime_term=0.0, read_rate=50.0, files=5, length=2.0))
    assert len(offsets) and offsets.min() >= 0.0


def test_interleave_alternates_which_pass_goes_first() -> None:
    order: list[str] = []
    passes = {name: (lambda name=name: order.append(name) or len(order)) for name in "ab"}
    assert speed.interleave(passes, 4) == {"a": [1, 4, 5, 8], "b": [2, 3, 6, 7]}
    assert "".join(order) == "abbaabba"


def test_speed_ratios_are_medians_of_the_per_round_ratios() -> None:
    passes = {
        "hit_baseline_s": [1e-7, 1e-7, 2e-7], "hit_blocking_s": [2e-7, 2e-7, 2e-7],
        "hit_async_s": [5e-7, 5e-7, 5e-7],
        "echo_rtt_s": [1e-4] * 3, "miss_s": [1.2e-4] * 3, "miss_frame_client_s": [1.1e-4] * 3,
        "miss_warm_s": [1.5e-4] * 3, "echo_wire_rtt_s": [9e-5] * 3,
        "echo_file_rtt_s": [1.1e-4] * 3,
        # a burst of noise in round 3 slows the baseline pass beside it, not the ratio
        "echo_msgs_per_s": [40000.0, 40000.0, 10000.0],
        "fscache_msgs_per_s": [20000.0, 20000.0, 5000.0],
        "echo_wire_msgs_per_s": [50000.0] * 3, "echo_wire_cpu_per_request_s": [1.5e-5] * 3,
        "echo_cpu_per_request_s": [2e-5] * 3, "fscache_cpu_per_request_s": [5e-5] * 3,
    }  # fmt: skip
    rows = {r["figure"]: r for r in speed.summarize(passes)}
    blocking = rows["hit, blocking client"]
    assert blocking["ratio"] == pytest.approx(2.0)  # ratios 2, 2, 1
    assert blocking["ratio_spread"] == pytest.approx([1.0, 2.0])
    assert blocking["value"] == pytest.approx(0.2) and blocking["baseline"] == pytest.approx(0.1)
    assert blocking["met"] is True
    assert rows["hit, async client"]["met"] is False  # 5x > 4x
    assert rows["miss (lease granted), async client"]["met"] is True
    assert rows["  same, file warm on the server"]["met"] is False  # 1.5x > 1.4x
    throughput = rows["throughput, 50 clients, term 0"]
    assert throughput["ratio"] == pytest.approx(0.5)
    assert throughput["ratio_spread"] == pytest.approx([0.5, 0.5])
    assert throughput["met"] is False
    assert "NO" in speed.format_table(list(rows.values()))


# ---------------------------------------------------------------- tiny real runs
def _tiny(systems: tuple[str, ...], terms: tuple[float, ...]) -> workload_config.Config:
    return workload_config.Config(
        clients=4, processes=2, read_rate=40.0, write_rate=4.0, sharing=2, files=4,
        file_size=64, duration=1.5, terms=terms, ttl_terms=(0.2,), skew=0.02,
        systems=systems, calibration_reads=100, quick=True,
    )  # fmt: skip


@pytest.mark.slow
def test_smoke_run_writes_results_table_and_plots(tmp_path: Path) -> None:
    cfg = _tiny(("fscache", "ttl"), (0.0, 0.4))
    results = sweep.run_benchmark(cfg, str(tmp_path), progress=False)

    document = json.loads((tmp_path / "results.json").read_text())
    runs = document["runs"]
    assert [(r["system"], r["term"]) for r in runs] == [
        ("fscache", 0.0), ("fscache", 0.4), ("ttl", 0.2),
    ]  # fmt: skip
    for run in runs:
        assert run.keys() >= REQUIRED_RUN_KEYS
        assert run["reads"] > 0 and run["errors"] == 0
        assert run["impossible_reads"] == 0
        assert math.isfinite(run["model_consistency_msgs_per_s"])
    for run in runs[:2]:
        assert run["stale_reads"] == 0, run["stale_examples"]
    zero, leased = runs[0], runs[1]
    assert zero["hit_ratio"] == 0.0  # term 0: nothing is cached
    assert leased["hit_ratio"] > 0.0
    assert document["targets"]["fscache_no_stale_reads"] is True
    assert document["calibration"]["m_proc_s"] > 0
    assert (tmp_path / "table.txt").read_text().count("fscache") >= 2
    for name in (plots.CONSISTENCY_PNG, plots.READ_LATENCY_PNG, plots.WRITE_DELAY_PNG):
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(results["plots"]) == sorted(str(tmp_path / n) for n in (
        plots.CONSISTENCY_PNG, plots.READ_LATENCY_PNG, plots.WRITE_DELAY_PNG))  # fmt: skip


@pytest.mark.slow
def test_smoke_run_with_the_redis_peer(tmp_path: Path) -> None:
    why = sweep.redis_unavailable()
    if why is not None:
        pytest.skip(why)
    results = sweep.run_benchmark(_tiny(("redis",), (0.0,)), str(tmp_path), progress=False)
    (run,) = results["runs"]
    assert run["system"] == "redis" and run["term"] is None
    assert run.keys() >= REQUIRED_RUN_KEYS
    assert run["reads"] > 0 and run["errors"] == 0 and run["impossible_reads"] == 0
    assert run["hit_ratio"] > 0.0  # RESP3 client tracking does cache
    assert isinstance(run["stale_reads"], int)  # what the checker sees; not asserted
    assert np.isfinite(run["server_consistency_msgs_per_s"])


def test_the_file_echo_answers_a_read_frame_with_the_file_as_fscache_would(
    tmp_path: Path,
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a").write_bytes(b"contents")
    reply = cbor2.loads(echo.file_reader(str(tmp_path))(read_frame(7, "m/a")[4:]))
    assert reply.keys() == cbor2.loads(data_frame(7, 1, 0.0, b"")[4:]).keys()
    assert (reply["t"], reply["id"], reply["data"]) == ("data", 7, b"contents")
    assert reply["version"] == (tmp_path / "m" / "a").stat().st_mtime_ns


@pytest.mark.slow
def test_speed_smoke_run_reports_every_figure(tmp_path: Path, capsys: Any) -> None:
    """The speed benchmark runs end to end, briefly (figures are reported, never
    asserted): the table's shape and the JSON's."""
    out = tmp_path / "speed.json"
    argv = ["--rounds", "2", "--hit-loops", "2000", "--misses", "20", "--seconds", "0.2"]
    assert speed.main([*argv, "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    rows = document["rows"]
    assert [row["figure"] for row in rows] == [row["figure"] for row in speed.summarize(
        document["passes"])]  # fmt: skip
    assert all(len(results) == 2 for results in document["passes"].values())
    for row in rows:
        assert row["value"] > 0 and row["baseline"] > 0 and row["rounds"] == 2
        low, high = row["ratio_spread"]
        assert low <= row["ratio"] <= high
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["figure", "fscache", "baseline", "ratio", "[spread]", "target",
                                "met"]  # fmt: skip
    assert len(table) == 2 + len(rows)
