"""The benchmarks' worker pool (``fscache.bench.procs.WorkerPool``): real ``spawn``
processes, each test a few seconds; what is asserted is how the pool ends, which
must hold on any machine.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from fscache.bench.procs import WorkerPool


def _busy_for_its_round(connection: Any) -> None:
    """A worker whose round outlasts any test: it has to be stopped."""
    while connection.recv() is not None:
        time.sleep(600)


def _answers_each_round(connection: Any) -> None:
    while (request := connection.recv()) is not None:
        connection.send(request * 2)


def test_a_pool_left_by_an_exception_stops_its_workers_mid_round() -> None:
    """A Ctrl-C while the workers run a round: they are stopped at once, not waited for
    (and before the servers they talk to, when the pool is opened inside theirs)."""
    with pytest.raises(KeyboardInterrupt), WorkerPool(_busy_for_its_round, 2, name="t") as pool:
        pool.send_all([1, 1])
        began = time.monotonic()
        raise KeyboardInterrupt
    assert time.monotonic() - began < 5


def test_a_pool_left_normally_lets_its_workers_finish() -> None:
    with WorkerPool(_answers_each_round, 2, name="t") as pool:
        pool.send_all([1, 2])
        assert pool.receive_all(60.0) == [2, 4]
    assert all(pipe.closed for pipe in pool.pipes)
