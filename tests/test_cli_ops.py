"""The command line's names and streams against a real ``fscache serve`` process:
``mv``, ``mkdir``, ``rmdir``, and ``read`` / ``write`` of a file larger than the
memory the command may use (its peak RSS, as the kernel counts it, is bounded).
Localhost only, port 0 (the ``served`` fixture); no timing is asserted. The RSS
bound needs Linux's ``/proc``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import IO

import pytest

import fscache

from .test_end_to_end import fscache_command, served  # noqa: F401 (a fixture)

MIB = 1 << 20

# Runs the command in-process and reports its peak RSS (KiB) on stderr's last line.
# VmHWM is this process image's own high-water mark; getrusage's ru_maxrss would
# carry over the RSS of the forking test process across exec.
MEASURED = """
import runpy, sys
sys.argv = ["fscache", *sys.argv[1:]]
try:
    runpy.run_module("fscache", run_name="__main__")
finally:
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(peak, file=sys.stderr)
"""


def measured(*args: str, stdout: IO[bytes] | int = subprocess.DEVNULL) -> int:
    """The peak RSS in MiB of ``fscache *args`` (which must succeed)."""
    result = subprocess.run(
        [sys.executable, "-c", MEASURED, *args], stdout=stdout, stderr=subprocess.PIPE, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return int(result.stderr.decode().split()[-1]) // 1024


def test_mv_prints_the_new_version_and_moves_the_name(served):  # noqa: F811
    assert fscache_command("mkdir", served, "d").returncode == 0
    assert fscache_command("write", served, "d/a", "-", stdin=b"A").returncode == 0
    moved = fscache_command("mv", served, "d/a", "b")
    assert moved.returncode == 0, moved.stderr
    assert int(moved.stdout) > 0
    assert fscache_command("read", served, "b").stdout == b"A"
    assert fscache_command("ls", served).stdout.decode().split() == ["b", "d/"]
    missing = fscache_command("mv", served, "d/a", "c")
    assert missing.returncode == 1 and b"NotFound" in missing.stderr
    assert b"cannot rename 'd/a' to 'c': 'd/a' does not exist" in missing.stderr
    no_dir = fscache_command("mv", served, "b", "no_such_dir/b")
    assert no_dir.returncode == 1 and b"NotFound" in no_dir.stderr
    assert b"the destination's directory 'no_such_dir' does not exist" in no_dir.stderr
    assert fscache_command("rmdir", served, "d").returncode == 0
    assert fscache_command("ls", served).stdout.decode().split() == ["b"]


def test_mkdir_and_rmdir_refusals_are_one_clear_line(served):  # noqa: F811
    assert fscache_command("mkdir", served, "d").returncode == 0
    exists = fscache_command("mkdir", served, "d")
    assert exists.returncode == 1 and b"Exists" in exists.stderr
    assert fscache_command("write", served, "d/f", "-", stdin=b"").returncode == 0
    not_empty = fscache_command("rmdir", served, "d")
    assert not_empty.returncode == 1 and b"NotEmpty" in not_empty.stderr


def test_a_directory_operation_on_a_file_is_not_a_directory(served):  # noqa: F811
    """``ls`` of a file, and ``mkdir`` or ``rmdir`` below one, say NotADirectory as
    scandir does (docs/design.md's error table), never IsADirectory or NotFound."""
    assert fscache_command("write", served, "a.txt", "-", stdin=b"a").returncode == 0
    for args in (("ls", served, "a.txt"), ("mkdir", served, "a.txt/sub"),
                 ("rmdir", served, "a.txt/sub"), ("rmdir", served, "a.txt")):  # fmt: skip
        result = fscache_command(*args)
        err = result.stderr.decode()
        assert result.returncode == 1 and err.startswith("fscache: NotADirectory: "), (args, err)


def test_rm_deletes_a_file_with_or_without_compare_and_set(served):  # noqa: F811
    version = int(fscache_command("write", served, "f", "-", stdin=b"1").stdout)
    stale = fscache_command("rm", served, "f", "--if-version", str(version + 1))
    assert stale.returncode == 1 and stale.stderr.startswith(b"fscache: Conflict: ")
    assert fscache_command("rm", served, "f", "--if-version", str(version)).returncode == 0
    assert fscache_command("read", served, "f").returncode == 1  # gone
    assert fscache_command("write", served, "g", "-", stdin=b"2").returncode == 0
    removed = fscache_command("rm", served, "g")
    assert (removed.returncode, removed.stdout) == (0, b"")
    assert fscache_command("ls", served).stdout == b""
    missing = fscache_command("rm", served, "g")
    assert missing.returncode == 1 and missing.stderr.startswith(b"fscache: NotFound: ")
    assert fscache_command("mkdir", served, "d").returncode == 0
    a_dir = fscache_command("rm", served, "d")
    assert a_dir.returncode == 1 and a_dir.stderr.startswith(b"fscache: IsADirectory: ")


def test_write_of_a_big_file_makes_its_missing_directories(served, tmp_path):  # noqa: F811
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(MIB) * 2 + b"tail")  # over one chunk: an upload
    written = fscache_command("write", served, "newdirC/f", str(source))
    assert written.returncode == 0, written.stderr
    assert int(written.stdout) > 0
    assert fscache_command("read", served, "newdirC/f").stdout == source.read_bytes()
    assert fscache_command("ls", served).stdout.decode().split() == ["newdirC/"]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_read_and_write_stream_a_big_file_in_bounded_memory(served, tmp_path):  # noqa: F811
    size = 160 * MIB
    source = tmp_path / "big.bin"
    with open(source, "wb") as f:
        for i in range(size // MIB):
            f.write(bytes([i % 256]) * MIB)
    write_peak = measured("write", served, "big.bin", str(source))
    copy = tmp_path / "copy.bin"
    with open(copy, "wb") as out:
        read_peak = measured("read", served, "big.bin", stdout=out)
    print(f"peak RSS: write {write_peak} MiB, read {read_peak} MiB")
    assert copy.stat().st_size == size
    with open(source, "rb") as a, open(copy, "rb") as b:
        while chunk := a.read(8 * MIB):
            assert chunk == b.read(8 * MIB)
    assert write_peak < 100, write_peak  # MiB: far below the file's 160
    assert read_peak < 100, read_peak


def test_read_streams_by_ranges_so_it_counts_in_range_reads(served):  # noqa: F811
    assert fscache_command("write", served, "f.txt", "-", stdin=b"abc").returncode == 0
    before = json.loads(fscache_command("stats", served).stdout)
    read = fscache_command("read", served, "f.txt")
    assert (read.returncode, read.stdout) == (0, b"abc")
    after = json.loads(fscache_command("stats", served).stdout)
    assert after["range_reads"] == before["range_reads"] + 1
    assert after["reads"] == before["reads"]  # whole-file reads only (docs/design.md, Stats)


def test_leader_names_a_locks_holder_and_fence_guards_write_rm_and_mv(served):  # noqa: F811
    """``fscache leader`` prints who holds a lock (nothing, and a word on stderr, when
    nobody does); ``--fence NAME:TOKEN`` lets a change through only while TOKEN is the
    lock's newest."""
    nobody = fscache_command("leader", served, "jobs/leader")
    assert (nobody.returncode, nobody.stdout) == (0, b"")
    assert b"nobody holds 'jobs/leader'" in nobody.stderr
    with fscache.connect(served) as c:
        with c.lock("jobs/leader", 30, identity="worker-7") as lock:
            assert fscache_command("leader", served, "jobs/leader").stdout == b"worker-7\n"
            fence = f"jobs/leader:{lock.token}"
            done = fscache_command("write", served, "f", "-", "--fence", fence, stdin=b"x")
            assert done.returncode == 0
            assert fscache_command("mv", served, "f", "g", "--fence", fence).returncode == 0
        stale = fscache_command("rm", served, "g", "--fence", fence)  # released: still newest
        assert stale.returncode == 0
        c.write("h", b"y")
        with c.lock("jobs/leader", 30):  # a newer token: the old one is refused
            refused = fscache_command("rm", served, "h", "--fence", fence)
            assert refused.returncode == 1 and refused.stderr.startswith(b"fscache: Conflict: ")
    for bad in (
        "jobs/leader", "jobs/leader:", ":3", "jobs/leader:0", "jobs/leader:x",
        "jobs/leader:\u0662", f"jobs/leader:{2**64}",
    ):  # fmt: skip
        usage = fscache_command("write", served, "f", "-", "--fence", bad)
        assert usage.returncode == 2 and b"NAME:TOKEN" in usage.stderr
    usage = fscache_command("rm", served, "f", "--fence", "/abs:2")  # the name, not the path
    assert usage.returncode == 2
    assert b"--fence: the lock name '/abs' is not valid: path must be relative" in usage.stderr


@pytest.mark.parametrize("command", [["read", "f"], ["ls"], ["stats"]])
def test_output_that_cannot_be_written_is_one_line_and_exit_1(served, command):  # noqa: F811
    """A full disk (``> /dev/full``) or a closed descriptor (``>&-``) takes nothing a
    command prints: one line says so, and the status says it failed."""
    assert fscache_command("write", served, "f", "-", stdin=b"x" * 100_000).returncode == 0
    argv = [sys.executable, "-m", "fscache", command[0], served, *command[1:]]
    with open("/dev/full", "wb") as full:
        to_full = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, timeout=60)
    closed = subprocess.run(
        ["sh", "-c", '"$@" >&-', "sh", *argv], stderr=subprocess.PIPE, timeout=60
    )  # fmt: skip
    assert (to_full.returncode, to_full.stderr.decode().splitlines()) == (
        1, ["fscache: cannot write to standard output: No space left on device"],
    )  # fmt: skip
    assert (closed.returncode, closed.stderr.decode().splitlines()) == (
        1, ["fscache: cannot write to standard output: standard output is closed"],
    )  # fmt: skip


@pytest.mark.parametrize("version", ["-5", "\u0662", "1_0", str(2**64)])
def test_an_if_version_out_of_range_is_bad_usage_before_anything_is_sent(
    served,  # noqa: F811
    version,
):
    for command in (["write", served, "f", "-"], ["rm", served, "f"]):
        done = fscache_command(*command[:1], "--if-version", version, *command[1:])
        assert done.returncode == 2
        assert f"{version!r} is not a version (a whole number, 0 to 2**64-1)" in (
            done.stderr.decode()
        )


def test_a_ctrl_c_while_the_arguments_are_read_is_one_line_and_130(monkeypatch, capsys):
    """Checking HOST:PORT loads the client and trio (the slow part of a start): a
    Ctrl-C then is the one line a Ctrl-C later gets, not a traceback."""
    from fscache import cli

    def interrupted(text: str) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_address", interrupted)
    assert cli.main(["ls", "127.0.0.1:1"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_ctrl_c_while_the_command_loads_is_one_line_and_130():
    """The console script's entry point loads the command's modules itself: a Ctrl-C
    then (here: raised by the import of fscache.cli) is one line and 130 too."""
    script = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def load(name, *args, **kwargs):\n"
        "    if name == 'fscache.cli':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = load\n"
        "from fscache.command import main\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert (done.returncode, done.stderr) == (130, b"interrupted\n")


def test_a_bad_path_is_named_short_and_mv_says_which_of_its_two(served):  # noqa: F811
    long = "d/" * 3000 + "x"
    refused = fscache_command("read", served, long)
    (line,) = refused.stderr.decode().splitlines()
    assert refused.returncode == 1 and len(line) < 200
    assert line.endswith("... (6001 bytes): path is longer than 1024 bytes")
    assert fscache_command("mv", served, "", "x").stderr == b"fscache: BadPath: '': path is empty\n"
    assert (
        fscache_command("mv", served, "a", ".").stderr == b"fscache: BadPath: '.': path is empty\n"
    )
