"""Test rules for the whole suite.

* Localhost only, port 0 for every listener: tests never collide and never leave
  the machine.
* Timing rules run under ``autojump_clock`` (a trio MockClock with
  ``autojump_threshold=0``) over memory streams, so a 10-second lease expires in
  microseconds and a test can assert the exact virtual instant something happened.
  Real sockets are used where the point is the real network, never with exact times.
* Crash, kill and restart tests use real processes killed with SIGKILL.
* No test asserts a wall-clock speed figure: speed lives in ``bench/``.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def root(tmp_path):
    """An empty directory for a server to own."""
    path = tmp_path / "root"
    path.mkdir()
    return path
