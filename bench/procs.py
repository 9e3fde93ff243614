"""Child processes of the benchmarks and the demo: start them, read what they say,
and stop every one of them on every path out.

Two kinds of child: a *command* (``subprocess.Popen``: a server, a demo reader),
stopped with SIGTERM and, if it hangs, SIGKILL; and a *worker* (a ``spawn``
``multiprocessing`` process running a Python function), driven over a pipe by a
:class:`WorkerPool` and told to stop by ``None`` on its pipe.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from typing import Any

import trio


def stop_command(popen: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM, wait up to ``timeout`` s, SIGKILL if it hangs; close the pipes. Idempotent."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def join_worker(process: BaseProcess, timeout: float) -> None:
    """Wait up to ``timeout`` s for ``process`` to end, SIGKILL it if it does not."""
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
    process.close()


class Commands:
    """Commands started with their stderr in a log file each; :meth:`stop_all` ends
    whatever still runs."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], str]:
        log_path = os.path.join(self.log_dir, f"{name}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # a Ctrl-C at the terminal is ours to handle
            )
        self.procs.append(proc)
        return proc, log_path

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            stop_command(proc, 3.0)


def stdout_stream(proc: subprocess.Popen[bytes]) -> trio.lowlevel.FdStream:
    """An async stream on a duplicate of the child's stdout. ``proc.stdout`` stays open
    until the child is stopped, so a child that prints while it stops after we
    stopped listening (the server's "SIGTERM: shutting down") gets no broken pipe."""
    assert proc.stdout is not None
    return trio.lowlevel.FdStream(os.dup(proc.stdout.fileno()))


async def lines(stream: trio.abc.ReceiveStream) -> AsyncGenerator[str, None]:
    """The lines of ``stream`` (without newlines) until end of input."""
    buffer = b""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            if buffer:
                yield buffer.decode(errors="replace")
            return
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace")


@contextlib.asynccontextmanager
async def stdin_lines() -> AsyncIterator[AsyncGenerator[str, None]]:
    """A child's commands: the lines of its stdin, read without blocking trio."""
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stdin, contextlib.aclosing(lines(stdin)) as each:
        yield each


def wait_ready(popen: subprocess.Popen[Any], ready: Callable[[], bool], timeout: float) -> bool:
    """Poll ``ready()`` until it holds (True), the child exits or ``timeout`` s pass (False)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if popen.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The child's exit status, or ``None`` if it still runs after ``timeout`` s."""
    with trio.move_on_after(timeout):
        while proc.poll() is None:
            await trio.sleep(0.01)
    return proc.poll()


def tail(path: str, count: int = 8) -> list[str]:
    """The last ``count`` lines of a log file (none if it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-count:]
    except OSError:
        return []


def _worker(target: Callable[[Any], None], connection: Any) -> None:
    """A worker's life: ``target(connection)`` with Ctrl-C ignored. A Ctrl-C at the
    terminal reaches the whole process group; the parent alone handles it and stops
    its workers, which would otherwise each print a KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the parent
    target(connection)


class WorkerPool:
    """``n`` worker processes running ``target(connection)``, reused for many rounds:
    send each a request, then collect one reply from each.

    As a context manager it closes the pool on the way out, at once if the way out is
    an exception. Open it inside the ``with`` of the servers its workers talk to: the
    workers are then gone before the servers stop, rather than failing, each with a
    traceback, on connections the stopped servers reset (a Ctrl-C mid-round)."""

    def __init__(self, target: Callable[[Any], None], n: int, *, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes = []
        self.processes = []
        # While the workers start, a Ctrl-C is held, not acted on at once, for two
        # reasons. In each worker it must do nothing from its first instruction, not
        # only once _worker ignores it (a Ctrl-C while a worker imports would be a
        # traceback): SIGINT is blocked here, and a signal mask survives fork and
        # exec. And here it must not cut a start in half, between the fork and the
        # worker's start-up data (the worker would die of an EOFError traceback);
        # blocking covers only this thread, and another of ours may take the signal,
        # so the handler meanwhile only notes it. It is raised once every worker has
        # started, and those workers are then stopped at once. (Ignoring it instead
        # would lose it: the run would go on as if no one had pressed it.)
        # multiprocessing starts its resource tracker with the first worker, and then
        # unblocks Ctrl-C (where it should restore the mask): started first, it cannot.
        resource_tracker.ensure_running()
        held: list[int] = []
        try:
            handler = signal.signal(signal.SIGINT, lambda signum, _: held.append(signum))
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                for i in range(n):
                    ours, theirs = context.Pipe()
                    process = context.Process(
                        target=_worker, args=(target, theirs), name=f"{name}-{i}", daemon=True
                    )
                    process.start()
                    theirs.close()
                    self.pipes.append(ours)
                    self.processes.append(process)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a blocked one comes now
                signal.signal(signal.SIGINT, handler)
            if held:
                raise KeyboardInterrupt
        except BaseException:  # that Ctrl-C, or a worker that could not start
            self.close(at_once=True)
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(at_once=kind is not None)

    def send_all(self, items: Sequence[Any]) -> None:
        for pipe, item in zip(self.pipes, items, strict=True):
            pipe.send(item)

    def receive_all(self, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        replies = []
        for pipe, process in zip(self.pipes, self.processes, strict=True):
            while not pipe.poll(0.2):
                if not process.is_alive():
                    raise RuntimeError(f"{process.name} died (exit code {process.exitcode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{process.name} did not answer in {timeout:.0f} s")
            replies.append(pipe.recv())
        return replies

    def renice(self, nice: int) -> int:
        """Set the workers' nice value; the value the kernel has for them. A benchmark's
        client processes stand for clients on machines of their own: niced, they take
        only the CPU the server leaves."""
        pids = [process.pid for process in self.processes if process.pid is not None]
        for pid in pids:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
        return max(os.getpriority(os.PRIO_PROCESS, pid) for pid in pids)

    def close(self, *, at_once: bool = False) -> None:
        """Tell each worker to stop and wait for it; ``at_once`` (the run failed or
        was interrupted): SIGTERM them instead of waiting for their round to end."""
        for pipe, process in zip(self.pipes, self.processes, strict=True):
            if at_once:
                process.terminate()
            else:
                with contextlib.suppress(OSError, BrokenPipeError):
                    pipe.send(None)
        for process in self.processes:
            join_worker(process, 10.0)
        for pipe in self.pipes:
            pipe.close()
