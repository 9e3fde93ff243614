"""The scale benchmark (``python -m fscache.bench.scale``), run at its quick sizes.

Test rules: one real run, with a real server process, client processes and TCP on
127.0.0.1 (ports picked by the kernel). It asserts that the table and the files are
written and that every measurement has rows or says why not -- never a figure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fscache.bench import scale, scale_conns, scale_leases, speed


def test_the_quick_run_prints_the_table_and_writes_json_and_the_plot(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fscache.bench.scale", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for heading in ("connections:", "leases:", "fanout:", "restart storm:", "fairness:", "locks:"):
        assert heading in run.stdout
    results = json.loads((tmp_path / scale.SCALE_JSON).read_text())
    assert results["quick"] is True
    assert (tmp_path / scale.SCALE_PNG).stat().st_size > 0
    fanout_lines = [line for line in run.stderr.splitlines() if line.startswith("fan-out to ")]
    assert len(fanout_lines) == 2, run.stderr[-2000:]
    for line in fanout_lines:  # rounded, readable progress: no raw float lists
        assert re.fullmatch(
            r"fan-out to \d+ holders: write applied in \d+\.\d(, \d+\.\d)* ms"
            r" \(median \d+\.\d ms\)",
            line,
        ), line

    leases = results["leases"]
    assert [(r["files"], r["holders"]) for r in leases] == [(2_000, 2), (5_000, 1)]
    assert all(r["leases"] == r["files"] * r["holders"] for r in leases)
    assert [r["holders"] for r in results["fanout"]] == [10, 50]
    assert {r["holders_nice"] for r in results["fanout"]} == {scale_leases.FANOUT_HOLDERS_NICE}
    storm = results["restart_storm"]
    if "not_measured" not in storm:
        assert storm["clients_nice"] == scale_conns.STORM_CLIENTS_NICE
    assert set(results["locks"]) == {*scale._COLUMNS["locks"]} and results["locks"]["locks"] == 20
    for name in ("connections", "restart_storm", "fairness", "locks"):  # rows, or why not
        value = results[name]
        assert value, name
        if isinstance(value, dict) and "not_measured" in value:
            assert "scale_conns" in value["not_measured"]
            assert value["not_measured"] in run.stdout


def test_the_fanout_command_runs_its_holders_at_the_nice_value_asked(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable, "-m", "fscache.bench.scale_leases", "fanout", "--holders", "4",
            "--repetitions", "1", "--processes", "1", "--holders-nice", "3",
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = [json.loads(line) for line in run.stdout.splitlines()]
    assert row["holders"] == 4 and row["holders_nice"] == 3 and row["repetitions"] == 1


def test_the_fanout_command_refuses_a_nice_value_it_cannot_set() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fscache.bench.scale_leases", "fanout", "--holders-nice", "-3"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--holders-nice" in run.stderr and "invalid choice" in run.stderr


def test_fanout_progress_is_rounded_milliseconds() -> None:
    line = scale_leases._progress([0.0123456789, 0.015, 0.2])
    assert line == "write applied in 12.3, 15.0, 200.0 ms (median 15.0 ms)"


@pytest.mark.parametrize(
    ("main", "argv", "refusal"),
    [
        (scale_leases._main, ["fanout", "--holders", "0"], "--holders: must be a whole number, 1"),
        (scale_leases._main, ["fanout", "--holders", "-2"], "--holders: must be"),
        (scale_leases._main, ["fanout", "--repetitions", "0"], "--repetitions: must be"),
        (scale_leases._main, ["fanout", "--processes", "0"], "--processes: must be"),
        (scale_leases._main, ["leases", "--processes", "-1"], "--processes: must be"),
        (scale_leases._main, ["leases", "--shape", "0x3"], "--shape: a shape is FILESxHOLDERS"),
        (scale_conns.main, ["--clients", "0"], "--clients: must be a whole number, 1 or more"),
        (scale_conns.main, ["--seconds", "nan"], "--seconds: must be a number from 0.1 to 300"),
        (speed.main, ["--rounds", "0"], "--rounds: must be a whole number, 1 or more"),
        (speed.main, ["--seconds", "inf"], "--seconds: must be a number from 0.1 to 600"),
    ],
)
def test_a_count_or_duration_a_run_cannot_take_is_bad_usage(
    main: Callable[[list[str]], int], argv: list[str], refusal: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Before anything starts: --holders 0 once left a server and its workers idle for ever."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert refusal in capsys.readouterr().err.splitlines()[-1]
