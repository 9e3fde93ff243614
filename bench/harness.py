"""Processes the benchmarks start and measure: an fscache server, a bare echo server,
a Redis server, and the CPU time each one uses.

Every server runs in its own process (its own interpreter and GIL), listens on
127.0.0.1 with a port the kernel picks, and is stopped by the ``with`` block that
started it. CPU time is read from ``/proc/PID/stat`` (Linux), so it needs no
cooperation from the server.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

from fscache.bench.procs import stop_command, wait_ready
from fscache.cli import parse_serving_line

START_TIMEOUT = 15.0  # seconds a server may take to print its address
STOP_TIMEOUT = 10.0
CPU_TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # the kernel counts CPU time in these (10 ms)


class ServerProcess:
    """A server in a child process; ``port`` is where it listens."""

    def __init__(self, name: str, popen: subprocess.Popen[str], port: int) -> None:
        self.name = name
        self.popen = popen
        self.port = port

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL if it hangs; close the pipes. Idempotent."""
        stop_command(self.popen, STOP_TIMEOUT)


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds used so far by process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * CPU_TICK_S  # utime, stime


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` now (``VmRSS``), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spawn(
    name: str, argv: Sequence[str], address_in: Callable[[str], tuple[str, int] | None]
) -> ServerProcess:
    """Start ``argv``; ``address_in`` finds host and port in its first stdout line."""
    popen = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # a Ctrl-C at the terminal is ours to handle
    )
    server = ServerProcess(name, popen, 0)
    assert popen.stdout is not None
    try:
        line = popen.stdout.readline()
    except BaseException:  # interrupted (Ctrl-C) before the caller's `with` holds it
        server.stop()
        raise
    address = address_in(line)
    if address is None:
        server.stop()
        raise RuntimeError(f"{name} did not start: {line.strip() or 'no output'}")
    server.port = address[1]
    return server


def _echo_address(line: str) -> tuple[str, int] | None:
    """From ``echo serving on HOST:PORT``."""
    if not line.startswith("echo serving on "):
        return None
    host, _, port = line.split()[-1].rpartition(":")
    return host, int(port)


def serve_argv(
    root: str, *, term: float, skew: float, port: int = 0, hot_writes: int = 0
) -> list[str]:
    """The command line that starts ``fscache serve`` in a child process."""
    return [
        sys.executable, "-m", "fscache", "serve", "--root", root, "--port", str(port),
        "--term", repr(term), "--skew", repr(skew), "--hot-writes", str(hot_writes),
    ]  # fmt: skip


@contextlib.contextmanager
def fscache_server(
    root: str, *, term: float, skew: float = 0.1, hot_writes: int = 0
) -> Iterator[ServerProcess]:
    """``fscache serve`` on a free port. ``hot_writes=0``: a fixed term, as the paper's
    model assumes."""
    argv = serve_argv(root, term=term, skew=skew, hot_writes=hot_writes)
    server = spawn("fscache", argv, parse_serving_line)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def echo_server(*, wire: bool = False) -> Iterator[ServerProcess]:
    """The bare trio echo server of :mod:`fscache.bench.echo` on a free port
    (``wire``: on fscache's own socket I/O instead of trio's SocketStream)."""
    argv = [sys.executable, "-m", "fscache.bench.echo", *(["--wire"] if wire else [])]
    server = spawn("echo", argv, _echo_address)
    try:
        yield server
    finally:
        server.stop()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


@functools.cache  # asked by the skip check and again for the results' environment
def redis_version() -> str | None:
    binary = redis_server_binary()
    if binary is None:
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    for word in out.stdout.split():
        if word.startswith("v="):
            return word[2:]
    return None


@contextlib.contextmanager
def redis_server(workdir: str) -> Iterator[ServerProcess]:
    """redis-server on a free port, in memory only (no RDB, no AOF), in ``workdir``."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    port = free_port()
    argv = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", workdir, "--daemonize", "no", "--loglevel", "warning",
    ]  # fmt: skip
    popen = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C at the terminal is ours to handle
    )  # fmt: skip
    server = ServerProcess("redis", popen, port)  # type: ignore[arg-type]
    try:
        if not wait_ready(popen, functools.partial(_accepts, port), START_TIMEOUT):
            raise RuntimeError("redis-server did not start")
        yield server
    finally:
        server.stop()
