"""Test rules for the whole suite (files with real sockets repeat theirs at the top).

* Localhost only: every socket is on 127.0.0.1 and every listener on port 0, so
  tests never collide and never leave the machine.
* Mock clock whenever a test sleeps for the sake of time: timing rules run under
  ``autojump_clock`` (a trio MockClock with ``autojump_threshold=0``) over memory
  streams, so a 10-second lease expires in microseconds and a test asserts the
  exact virtual instant something happened. (The mock clock may jump while bytes
  are in flight on a real socket, so exact instants never go with real sockets.)
* Real sockets where the point is the real network: back-pressure, TLS, partitions,
  processes. There a test sleeps only to poll for a condition, inside a
  ``trio.fail_after`` of several seconds, and asserts order and lower bounds (the
  safety rules), never an upper bound a busy machine could exceed.
* Crash, kill and restart tests use real processes killed with SIGKILL.
* No test asserts a wall-clock speed figure: speed lives in ``bench/``.
* Tests run side by side, on one pytest-xdist worker a core, so a test owns nothing
  beyond its ``tmp_path`` (or a temp dir of its own) and its port-0 listeners: no
  fixed path, port or name, and nothing written into the checkout.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path):
    """An empty directory for a server to own."""
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, mounted for real (skipped where this machine will not)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "--lazy", str(mnt)], check=True)  # a Store may hold its root
