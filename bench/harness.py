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
PORT_ATTEMPTS = 3  # starts of a server whose picked port another process took
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
    """A port free now; another process may take it before ours binds it: start a
    server that cannot be told port 0 with :func:`spawn_on_free_ports`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on 127.0.0.1:``port``
    (Linux's ``/proc``), rather than some other process that took the port."""
    local = f"0100007F:{port:04X}"
    try:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # it has ended
        return False
    sockets = {f"socket:[{row[9]}]" for row in rows if row[1] == local and row[3] == "0A"}
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                return True
    return False


def _serves(pid: int, port: int, ready: Callable[[int], bool]) -> bool:
    return listens(pid, port) and ready(port)


def spawn_on_free_ports(
    name: str,
    ports: int,
    argv_for: Callable[[list[int], int], list[str]],
    ready: Callable[[int], bool],
    timeout: float = START_TIMEOUT,
) -> ServerProcess:
    """Start a server that must be given its ports (Redis, etcd): ``argv_for(ports,
    attempt)`` on ``ports`` free ones, the first its clients'. It is ready when it
    listens on that port itself and ``ready(port)`` holds. A port that another process
    took between :func:`free_port` and the server's bind makes the server exit: it is
    started again on fresh ports, up to :data:`PORT_ATTEMPTS` times in all."""
    for attempt in range(PORT_ATTEMPTS):
        picked = [free_port() for _ in range(ports)]
        popen = subprocess.Popen(
            argv_for(picked, attempt),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the terminal is ours to handle
        )  # fmt: skip
        server = ServerProcess(name, popen, picked[0])  # type: ignore[arg-type]
        try:
            up = functools.partial(_serves, popen.pid, picked[0], ready)
            if wait_ready(popen, up, timeout):
                return server
        except BaseException:
            server.stop()
            raise
        timed_out = popen.poll() is None
        server.stop()
        if timed_out:
            raise RuntimeError(f"{name} did not start in {timeout:.0f} s")
    raise RuntimeError(
        f"{name} did not start: it exited {PORT_ATTEMPTS} times, last with code {popen.returncode}"
    )


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
def echo_server(*, wire: bool = False, root: str | None = None) -> Iterator[ServerProcess]:
    """The bare trio echo server of :mod:`fscache.bench.echo` on a free port
    (``wire``: on fscache's own socket I/O instead of trio's SocketStream; ``root``:
    answering each read frame with that file beneath ``root``)."""
    argv = [
        sys.executable, "-m", "fscache.bench.echo", *(["--wire"] if wire else []),
        *(["--root", root] if root is not None else []),
    ]  # fmt: skip
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

    def argv(ports: list[int], attempt: int) -> list[str]:
        return [
            binary, "--port", str(ports[0]), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", workdir, "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip

    server = spawn_on_free_ports("redis", 1, argv, _accepts)
    try:
        yield server
    finally:
        server.stop()
