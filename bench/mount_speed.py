"""A cached read through the FUSE mount against the same read on tmpfs.

``python -m fscache.bench.mount_speed [--quick]`` starts ``fscache serve`` (a long
term, so the lease outlives the run) and ``fscache mount`` in their own
processes, writes a 100-byte file through the mount and reads it once, so the
client holds a lease and the kernel its pages. Then it times ``os.open``,
``os.read``, ``os.close`` of that file in a loop, and the same loop on a file of
the same size in ``/dev/shm`` (tmpfs). Passes alternate between the two, so a
noisy moment of the machine lands on both; each pass gives a ratio and the table
shows the median per-call times and the median of the ratios.

Nothing here is asserted by tests: the numbers belong to the machine they were
taken on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

from fscache.bench import run_main
from fscache.bench.harness import fscache_server

FILE_SIZE = 100
LONG_TERM = 600.0  # the lease outlives the measurement: every open is a cached one
MOUNT_WAIT = 30.0  # s for ``fscache mount`` to say it is mounted
TARGET = 20.0  # at most this many tmpfs reads


@contextlib.contextmanager
def mounted(address: str, mountpoint: str) -> Iterator[subprocess.Popen[str]]:
    """``fscache mount address mountpoint`` in a child process, until the block ends."""
    argv = [sys.executable, "-m", "fscache", "mount", address, mountpoint]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("fscache mounted"):
            process.kill()
            _, err = process.communicate(timeout=MOUNT_WAIT)
            raise SystemExit(f"fscache mount failed: {line}{err}")
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # it unmounts on the way out
            try:
                process.wait(timeout=MOUNT_WAIT)
            except subprocess.TimeoutExpired:
                process.kill()
                subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False)
        process.communicate()


def per_call(path: str, loops: int) -> float:
    """Seconds per ``open``, ``read``, ``close`` of ``path``."""
    flags = os.O_RDONLY
    started = time.perf_counter()
    for _ in range(loops):
        fd = os.open(path, flags)
        os.read(fd, 4096)
        os.close(fd)
    return (time.perf_counter() - started) / loops


def compare(mount_file: str, tmpfs_file: str, *, loops: int, passes: int) -> dict[str, float]:
    """Interleaved passes over both files; median times (s) and median ratio."""
    per_call(mount_file, loops)  # warm both: lease, pages, dentries
    per_call(tmpfs_file, loops)
    times = []
    for _ in range(passes):
        tmpfs = per_call(tmpfs_file, loops)
        times.append((per_call(mount_file, loops), tmpfs))
    mount, tmpfs_median, ratios = medians(times)
    return {
        "mount": mount,
        "tmpfs": tmpfs_median,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def medians(times: Sequence[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """Of interleaved pairs of timings: the median of each side, and each pair's ratio
    (first / second)."""
    firsts, seconds = zip(*times, strict=True)
    ratios = [first / second for first, second in times]
    return statistics.median(firsts), statistics.median(seconds), ratios


def format_table(figures: dict[str, float], *, loops: int, passes: int) -> str:
    met = "met" if figures["ratio"] <= TARGET else "NOT met"
    return "\n".join(
        (
            f"cached open+read+close of a {FILE_SIZE}-byte file"
            f" ({passes} interleaved passes of {loops} calls, medians)",
            f"{'through the fscache mount':<28}{figures['mount'] * 1e6:>10.2f} µs",
            f"{'tmpfs (/dev/shm)':<28}{figures['tmpfs'] * 1e6:>10.2f} µs",
            f"{'ratio':<28}{figures['ratio']:>10.1f}"
            f"   (passes {figures['ratio_min']:.1f}-{figures['ratio_max']:.1f};"
            f" target <= {TARGET:g}: {met})",
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.mount_speed", description=__doc__
    )
    parser.add_argument("--loops", type=int, default=20_000, help="calls per pass")
    parser.add_argument("--passes", type=int, default=9, help="passes per file system")
    parser.add_argument("--quick", action="store_true", help="few loops (a smoke test)")
    args = parser.parse_args(argv)
    loops, passes = (200, 3) if args.quick else (args.loops, args.passes)
    if shutil.which("fusermount3") is None:
        raise SystemExit("fusermount3 is not installed (apt-get install fuse3)")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    data = os.urandom(FILE_SIZE)
    with (
        tempfile.TemporaryDirectory(prefix="fscache-root-") as root,
        tempfile.TemporaryDirectory(prefix="fscache-mnt-") as mountpoint,
        tempfile.TemporaryDirectory(prefix="fscache-tmpfs-", dir=shm) as tmpfs,
        fscache_server(root, term=LONG_TERM) as server,
        mounted(server.address, mountpoint),
    ):
        mount_file = os.path.join(mountpoint, "f.bin")
        with open(mount_file, "wb") as f:
            f.write(data)
        tmpfs_file = os.path.join(tmpfs, "f.bin")
        with open(tmpfs_file, "wb") as f:
            f.write(data)
        with open(mount_file, "rb") as f:
            if f.read() != data:
                raise SystemExit("the mount did not read back what was written")
        figures = compare(mount_file, tmpfs_file, loops=loops, passes=passes)
    print(format_table(figures, loops=loops, passes=passes))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
