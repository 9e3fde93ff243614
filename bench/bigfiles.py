"""Big files: a ranged read against a small miss, and the memory a big copy takes.

``python -m fscache.bench.bigfiles [--size-mib N]`` starts ``fscache serve`` and
``fscache mount`` in their own processes and measures:

* a 4 KiB ranged read at a random offset of a file of N/2 MiB (1 GiB by default)
  against a read of a whole 4 KiB file, both misses (each path is relinquished
  after every read, untimed), in interleaved rounds; the table shows the medians
  and the median of the per-round ratios;
* the peak resident set of a library client process copying an N MiB file (2 GiB
  by default) into the server (``write(path, file)``) and out of it
  (``read_into``), and of the mount process while ``cp`` copies it in and out
  through the mount; every copy is checked against the source with sha256.

Nothing here is asserted by tests: the numbers belong to the machine they were
taken on.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import fscache
from fscache.bench import bounded, run_main
from fscache.bench.harness import fscache_server
from fscache.bench.mount_speed import medians, mounted

MIB = 1 << 20
READ = 4096
LONG_TERM = 600.0

# Each copy prints its own peak RSS: a child's ru_maxrss may carry its parent's RSS
# from before the exec.
PEAK = """
with open("/proc/self/status") as status:
    print(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""
COPY_IN = (
    """
import sys, fscache
with fscache.connect(sys.argv[1]) as c, open(sys.argv[2], "rb") as f:
    c.write(sys.argv[3], f)
"""
    + PEAK
)
COPY_OUT = (
    """
import sys, fscache
with fscache.connect(sys.argv[1]) as c, open(sys.argv[3], "wb") as f:
    c.read_into(sys.argv[2], f)
"""
    + PEAK
)


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(MIB):
            digest.update(block)
    return digest.hexdigest()


def make_source(path: str, size_mib: int) -> None:
    with open(path, "wb") as f:
        for _ in range(size_mib):
            f.write(os.urandom(MIB))


def child_peak(argv: Sequence[str]) -> tuple[float, float]:
    """Run ``argv``, which prints its peak RSS (KiB) last; that (MiB) and the time (s)."""
    started = time.perf_counter()
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return int(done.stdout.split()[-1]) / 1024, time.perf_counter() - started


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def peak(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmHWM for process {pid}")


def while_peak(pid: int, argv: Sequence[str]) -> tuple[float, float]:
    """Run ``argv``; the peak RSS (MiB) of process ``pid`` meanwhile, and the time."""
    reset_peak(pid)
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return peak(pid), time.perf_counter() - started


def ranged_against_miss(address: str, big_size: int, rounds: int) -> dict[str, float]:
    times = []
    rng = random.Random(1)
    with fscache.connect(address) as client:
        for _ in range(rounds):
            offset = rng.randrange(0, big_size - READ) // READ * READ
            started = time.perf_counter()
            data = client.read("ranged.bin", offset=offset, length=READ)
            ranged = time.perf_counter() - started
            started = time.perf_counter()
            client.read("small.bin")
            times.append((ranged, time.perf_counter() - started))
            client.relinquish("ranged.bin", "small.bin")
            if len(data) != READ:
                raise SystemExit(f"a ranged read returned {len(data)} bytes")
    ranged_median, small_median, ratios = medians(times)
    return {"ranged": ranged_median, "small": small_median, "ratio": statistics.median(ratios)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.bigfiles",
        description=(__doc__ or "").replace("``", ""),  # as plain text
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the bullets apart
    )
    parser.add_argument(
        "--size-mib", type=bounded(int, 1), default=2048,
        help="the copied file, MiB; the ranged read's file is about half (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=bounded(int, 1), default=200,
        help="rounds of the two reads (default %(default)s)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if shutil.which("fusermount3") is None:
        raise SystemExit("fusermount3 is not installed (apt-get install fuse3)")
    size = args.size_mib * MIB
    big_size = max(size // 2, 2 * READ)
    rows: list[tuple[str, float, float, bool]] = []
    with (
        tempfile.TemporaryDirectory(prefix="fscache-root-") as root,
        tempfile.TemporaryDirectory(prefix="fscache-mnt-") as mountpoint,
        tempfile.TemporaryDirectory(prefix="fscache-big-") as work,
        fscache_server(root, term=LONG_TERM) as server,
        mounted(server.address, mountpoint) as mount_process,
    ):
        with open(os.path.join(root, "ranged.bin"), "wb") as f:
            f.truncate(big_size)  # sparse: the server reads its zeros like any bytes
        with open(os.path.join(root, "small.bin"), "wb") as f:
            f.write(os.urandom(READ))
        reads = ranged_against_miss(server.address, big_size, args.rounds)

        source = os.path.join(work, "source.bin")
        make_source(source, args.size_mib)
        want = sha256(source)
        python = [sys.executable, "-c"]
        out = os.path.join(work, "out.bin")
        rss, took = child_peak([*python, COPY_IN, server.address, source, "lib.bin"])
        rows.append(
            ("copy in, library client", rss, took, sha256(os.path.join(root, "lib.bin")) == want)
        )
        rss, took = child_peak([*python, COPY_OUT, server.address, "lib.bin", out])
        rows.append(("copy out, library client", rss, took, sha256(out) == want))
        os.unlink(out)
        in_mount = os.path.join(mountpoint, "cp.bin")
        rss, took = while_peak(mount_process.pid, ["cp", source, in_mount])
        rows.append(
            ("copy in, cp to the mount", rss, took, sha256(os.path.join(root, "cp.bin")) == want)
        )
        rss, took = while_peak(mount_process.pid, ["cp", in_mount, out])
        rows.append(("copy out, cp from the mount", rss, took, sha256(out) == want))
    print(format_table(reads, rows, big_size=big_size, size=size, rounds=args.rounds))
    return 0 if all(same for *_, same in rows) else 1


def format_table(
    reads: dict[str, float],
    rows: list[tuple[str, float, float, bool]],
    *,
    big_size: int,
    size: int,
    rounds: int,
) -> str:
    lines = [
        f"4 KiB misses ({rounds} interleaved rounds, medians)",
        f"{'ranged read of a ' + _mib(big_size) + ' file':<36}{reads['ranged'] * 1e6:>10.1f} µs",
        f"{'read of a 4 KiB file':<36}{reads['small'] * 1e6:>10.1f} µs",
        f"{'ratio':<36}{reads['ratio']:>10.2f}",
        f"copies of a {_mib(size)} file: peak RSS of the copying process / of the mount",
    ]
    for name, rss, took, same in rows:
        check = "identical" if same else "DIFFERENT"
        lines.append(f"{name:<36}{rss:>10.1f} MiB {took:>8.1f} s  sha256 {check}")
    return "\n".join(lines)


def _mib(size: int) -> str:
    return f"{size / MIB:g} MiB"


if __name__ == "__main__":
    raise SystemExit(run_main(main))
