"""``fscache demo crash``: real processes, real time.

The demo judges its own timing against the lease rules and says so in its verdict
and exit status. On a busy machine a write may land late, so the full runs here
use a tolerance only a real bug exceeds for everything that may be *late* (a
prompt approval, the write after the dead reader's lease): those are speed.
What may not be *early* keeps the demo's own bound: the write must not land before
``grant + term + skew`` (safety), and the dead reader must have stopped trusting
its copy before the write landed. No test asserts a wall-clock figure of its own.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from fscache import cli
from fscache.bench import demo
from fscache.bench.demo_script import Tolerances

pytestmark = pytest.mark.slow

TIMEOUT = 60  # the demo itself takes about term + 1.5 s
PATIENT = Tolerances(prompt=10.0, late=10.0)  # `early` stays the demo's own bound


def run_demo_in_process(*, term: float, clients: int) -> tuple[int, list[str]]:
    out = io.StringIO()  # not a terminal
    status = demo.run_crash_demo(term=term, clients=clients, out=out, tolerances=PATIENT)
    return status, out.getvalue().rstrip().splitlines()


def test_crash_demo_shows_the_writer_waiting_out_the_dead_readers_lease() -> None:
    status, lines = run_demo_in_process(term=1.5, clients=3)
    out = "\n".join(lines)
    assert status == 0, out
    assert "\x1b[" not in out  # not a terminal: no colour, no redrawn lines
    assert "reader 0   KILLED with SIGKILL" in out
    for reader in ("reader 1", "reader 2"):
        assert f"{reader}   approval request: dropped its copy and approved at once" in out
        assert f"{reader}   read generation 3 from" in out
    assert "reader 0   approval request" in out  # in the first write, while it was alive
    assert out.count("approval request") == 3 + 2
    assert "still waiting: reader 0's lease runs out in" in out
    assert "writer     write applied after" in out
    assert "its held read returned generation 3" in out
    assert "writer     read generation 3" in out
    assert "FAIL" not in out
    for check in ("write past the dead reader", "no stale read possible", "on disk"):
        assert any(line.startswith(f"  ok    {check}") for line in lines), check
    assert lines[-1].startswith("OK: the writer waited ")


def test_the_events_come_in_the_order_the_lease_rules_give() -> None:
    status, lines = run_demo_in_process(term=1.0, clients=2)
    assert status == 0, "\n".join(lines)

    def first(text: str, after: int = 0) -> int:
        return next(i for i, line in enumerate(lines) if i > after and text in line)

    killed = first("reader 0   KILLED with SIGKILL")
    write = first("writer     writes generation 3")
    approved = first("reader 1   approval request: dropped its copy and approved", write)
    applied = first("writer     write applied after", write)
    final = first("reader 1   read generation 3", applied)
    assert killed < write < approved < applied < final
    stamps = [float(line.split()[0]) for line in lines if line.lstrip().startswith("+")]
    assert len(stamps) > 10 and stamps == sorted(stamps), "the timeline is printed in time order"


def test_crash_demo_refuses_a_single_client() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fscache", "demo", "crash", "--clients", "1"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode == 2
    assert "fscache demo crash: error: argument --clients: must be from 2 to 32" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["crash", "--clients", "300"], "argument --clients: must be from 2 to 32: '300'"),
        (["crash", "--term", "0"], "argument --term: must be at least 0.5 seconds: '0'"),
        (["crash", "--skew", "3"], "--skew must be at least 0 and less than --term"),
        (["crash", "--term", "1e6"], "--term must be at most 86400 s (a server's longest)"),
        (["election", "--candidates", "1"], "argument --candidates: must be from 2 to 16"),
        (["election", "--ttl", "0"], "argument --ttl: must be at least 0.5 seconds: '0'"),
        (["election", "--ttl", "301"], "--ttl must be at most 300 s (a lock's longest), not 301"),
    ],
)
def test_demo_options_out_of_range_are_bad_usage(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", *args])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"fscache demo {args[0]}: error: ") and error in last, last


@pytest.mark.parametrize(
    ("demo", "shown"),
    [("crash", ["0.5..86400 (default 3.0)", "2..32 (default 3)"]),
     ("election", ["0.5..300 (default", "2..16 (default 3)"])],
)  # fmt: skip
def test_demo_help_shows_the_ranges_and_defaults(demo: str, shown: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fscache", "demo", demo, "--help"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    text = " ".join(result.stdout.split())
    assert result.returncode == 0 and all(s in text for s in shown), text


def test_a_write_that_lands_before_the_lease_ran_out_fails_the_demo() -> None:
    # The safety bound, made impossible: even a write that lands exactly on time is
    # "early" by this tolerance, so the demo must say FAIL.
    out = io.StringIO()
    strict = Tolerances(prompt=10.0, early=-1.0, late=10.0)
    assert demo.run_crash_demo(term=1.0, clients=2, out=out, tolerances=strict) == 1
    lines = out.getvalue().rstrip().splitlines()
    assert any(line.startswith("  FAIL  write past the dead reader") for line in lines)
    assert any(line.startswith("FAIL: ") for line in lines)
