"""``fscache demo crash``: the real command, real processes, real time.

The demo judges its own timing (expected versus measured wait) and says so in its
verdict and exit status; these tests assert that verdict and the timeline's key
lines, never a wall-clock figure of their own.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from fscache.bench import demo

pytestmark = pytest.mark.slow

TIMEOUT = 60  # the demo itself takes about term + 1.5 s


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fscache", "demo", "crash", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_crash_demo_shows_the_writer_waiting_out_the_dead_readers_lease() -> None:
    result = run_demo("--term", "1.5", "--clients", "3")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
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
    assert out.rstrip().splitlines()[-1].startswith("OK: the writer waited ")


def test_crash_demo_refuses_a_single_client() -> None:
    result = run_demo("--clients", "1")
    assert result.returncode == 1
    assert "--clients must be at least 2" in result.stderr
    assert result.stdout == ""


def test_crash_demo_exits_non_zero_when_the_wait_deviates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An impossible tolerance: any real wait is "late", so the demo must say FAIL.
    monkeypatch.setattr(demo, "LATE_MARGIN", -1.0)
    out = io.StringIO()
    assert demo.run_crash_demo(term=1.0, clients=2, out=out) == 1
    lines = out.getvalue().rstrip().splitlines()
    assert any(line.startswith("  FAIL  write past the dead reader") for line in lines)
    assert lines[-1].startswith("FAIL: write past the dead reader: expected +")
