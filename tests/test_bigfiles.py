"""The big-file benchmark runs at a tiny size and prints its table (no figure is asserted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="/dev/fuse does not exist")
@pytest.mark.skipif(shutil.which("fusermount3") is None, reason="fusermount3 is not installed")
def test_bigfiles_at_a_tiny_size_prints_its_table():
    done = subprocess.run(
        [sys.executable, "-m", "fscache.bench.bigfiles", "--size-mib", "3", "--rounds", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("4 KiB misses (5 interleaved rounds")
    assert [line.split()[0] for line in lines[1:4]] == ["ranged", "read", "ratio"]
    assert lines[4].startswith("copies of a 3 MiB file")
    copies = [line.split(",")[0] for line in lines[5:]]
    assert copies == ["copy in", "copy out", "copy in", "copy out"]
    assert all(line.endswith("sha256 identical") for line in lines[5:])
