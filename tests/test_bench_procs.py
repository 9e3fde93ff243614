"""The benchmarks' worker pool (``fscache.bench.procs.WorkerPool``): real ``spawn``
processes, each test a few seconds; what is asserted is how the pool ends, which
must hold on any machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
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


_CTRL_C_WHILE_STARTING = """
import multiprocessing, os, signal, sys, threading, time
from multiprocessing import util
from fscache.bench.procs import WorkerPool

def deaf_to_ctrl_c():
    # SIGINT blocked or ignored: a Ctrl-C cannot reach this process
    with open("/proc/self/status") as status:
        lines = [line.split() for line in status]
    masks = [int(line[1], 16) for line in lines if line[0] in ("SigBlk:", "SigIgn:")]
    return any(mask & 1 << (signal.SIGINT - 1) for mask in masks)

DEAF_AT_IMPORT = deaf_to_ctrl_c()  # in a worker: while spawn imports this, before _worker

def deaf(connection):
    connection.send(DEAF_AT_IMPORT)
    connection.recv()

if __name__ == "__main__":
    with WorkerPool(deaf, 2, name="t") as pool:  # the first: spawn's helper starts too
        pool.send_all([None, None])
        print("deaf to Ctrl-C while the workers imported:", *pool.receive_all(60.0))
    spawn = util.spawnv_passfds
    def spawn_then_ctrl_c(*args):
        pid = spawn(*args)
        os.kill(os.getpid(), signal.SIGINT)  # pressed between the fork and the start-up data
        time.sleep(0.3)  # time for another thread, if one takes it, to run the handler
        return pid
    util.spawnv_passfds = spawn_then_ctrl_c
    try:
        WorkerPool(deaf, 2, name="t")
    except KeyboardInterrupt:
        print("interrupted")
    # Another thread, not blocking SIGINT, takes the signal: still held until all started.
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    try:
        WorkerPool(deaf, 2, name="t")
    except KeyboardInterrupt:
        print("interrupted, with another thread")
    print("workers left:", len(multiprocessing.active_children()))
"""


def test_a_ctrl_c_while_the_workers_start_is_not_lost(tmp_path: Path) -> None:
    """The workers start with Ctrl-C blocked, so that they ignore it from their first
    instruction; in the parent it is held, whichever thread takes it, and raised once
    they are all started: not ignored and lost (the benchmark would run on as if no
    one had pressed it), nor raised between a worker's fork and its start-up data."""
    script = tmp_path / "starting.py"  # a file: spawn's children import it
    script.write_text(_CTRL_C_WHILE_STARTING)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "deaf to Ctrl-C while the workers imported: True True",
        "interrupted",
        "interrupted, with another thread",
        "workers left: 0",
    ]
    assert "Traceback" not in run.stderr, run.stderr  # no worker cut off mid-start
