"""The mount benchmark runs and prints its table (no speed figure is asserted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="/dev/fuse does not exist")
@pytest.mark.skipif(shutil.which("fusermount3") is None, reason="fusermount3 is not installed")
def test_mount_speed_quick_prints_its_table():
    done = subprocess.run(
        [sys.executable, "-m", "fscache.bench.mount_speed", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cached open+read+close of a 100-byte file")
    assert [line.split()[0] for line in lines[1:]] == ["through", "tmpfs", "ratio"]
