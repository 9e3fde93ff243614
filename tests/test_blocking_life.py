"""The blocking client's life (``client/blocking.py``, "Life of a client"): closed
when dropped or at exit, interrupted calls cancelled on the loop thread, and no use
of the parent's cache in a forked child.

Test rules: a real ``fscache serve`` process with a long term (30 s), so that a
lease given back by a goodbye and one that ran out cannot be confused; processes
that exit or are interrupted are real subprocesses; the fork is a real fork.
"""

from __future__ import annotations

import gc
import multiprocessing
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import trio

import fscache
from fscache.client.blocking import FORKED, BlockingClient

from .test_metrics import serve_process

TERM = 30.0


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("root")
    args = ("--root", str(root), "--port", "0", "--term", str(TERM), "--hot-writes", "0")
    with serve_process(*args) as server:
        yield server.address


def live_leases(address: str) -> int:
    with fscache.connect(address) as observer:
        leases: int = observer.server_stats()["leases_active"]
    return leases


def wait_until(condition: object, what: str, limit: float = 10.0) -> None:
    """Poll ``condition()`` for up to ``limit`` s: well under the 30 s term, so only
    a lease that was not given back can run it out."""
    assert callable(condition)
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def run_python(address: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), address],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


# ---------------------------------------------------------------- closing
def test_a_process_that_exits_without_close_gives_its_leases_back(address: str) -> None:
    with fscache.connect(address) as writer:
        writer.write("exit/f", b"x")
    done = run_python(
        address,
        """
        import sys, fscache
        c = fscache.connect(sys.argv[1])
        assert c.read("exit/f") == b"x"  # a lease of 30 s, and no close()
        """,
    )
    assert done.returncode == 0, done.stderr
    wait_until(lambda: live_leases(address) == 0, "the exited reader's lease is still live")


def test_a_client_dropped_without_close_is_closed_with_its_thread(address: str) -> None:
    with fscache.connect(address) as writer:
        writer.write("drop/f", b"x")
    threads = threading.active_count()

    for _ in range(5):
        client = fscache.connect(address)
        assert client.read("drop/f") == b"x"
        del client
    gc.collect()

    assert threading.active_count() == threads
    wait_until(lambda: live_leases(address) == 0, "a dropped client's lease is still live")


# ---------------------------------------------------------------- state
def test_the_connection_and_lease_state_is_read_on_the_callers_thread(address: str) -> None:
    """``connected``, ``session_id``, ``leased`` and ``lease_remaining``, as the async
    client has them: read here, without a hop to the loop thread (as a hit)."""
    with fscache.connect(address) as writer:
        writer.write("state/f", b"four")
        writer.mkdir("state/d")
    client = fscache.connect(address)
    assert client.connected
    assert isinstance(client.session_id, str) and client.session_id
    assert client.leased("state/f") is None and client.lease_remaining("state/f") == 0.0
    assert client.read("state/f") == b"four"  # a lease of 30 s from now on
    client.listdir("state")
    version = client.stat("state/f").version
    loop_thread_calls = client._run
    client._run = lambda *args: pytest.fail("a state read crossed to the loop thread")  # type: ignore[method-assign]
    leased = client.leased("state/f")
    assert leased is not None
    assert (leased.path, leased.size, leased.is_dir) == ("state/f", 4, False)
    assert leased.version == version
    assert 0.0 < client.lease_remaining("state/f") <= TERM
    assert 0.0 < client.lease_remaining("state/") <= TERM  # the listing's key
    seen: list[object] = []
    other = threading.Thread(
        target=lambda: seen.extend([client.connected, client.leased("state/f")])
    )
    other.start()
    other.join(30)
    assert seen == [True, leased]
    client._run = loop_thread_calls  # type: ignore[method-assign]
    session = client.session_id
    client.close()
    assert not client.connected and client.session_id == session
    assert client.leased("state/f") is None and client.lease_remaining("state/f") == 0.0


def test_a_blocking_client_says_when_its_server_has_gone(tmp_path: pathlib.Path) -> None:
    with (
        serve_process("--root", str(tmp_path), "--port", "0") as server,
        fscache.connect(server.address) as client,
    ):
        assert client.connected
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)
        wait_until(lambda: not client.connected, "still connected to a stopped server")


# ---------------------------------------------------------------- interrupting
def test_an_interrupted_acquire_holds_nothing(address: str) -> None:
    done = run_python(
        address,
        """
        import os, signal, sys, threading, fscache
        holder, waiter, third = (fscache.connect(sys.argv[1]) for _ in range(3))
        held = holder.acquire("interrupted/lock", 5)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            waiter.acquire("interrupted/lock", 5)  # waits in line: Ctrl-C
        except KeyboardInterrupt:
            pass
        else:
            sys.exit("the acquire was not interrupted")
        holder.release(held)
        # Had the waiter's acquire gone on, it would hold the lock now, renewed.
        third.acquire("interrupted/lock", 5, timeout=4)
        print("taken by the third", flush=True)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "taken by the third\n"


# ---------------------------------------------------------------- forking
def _child(address: str, forked: object, written: object, results: object) -> None:
    parents = _PARENTS[0]
    state = (parents.connected, parents.leased("fork/f"), parents.lease_remaining("fork/f"))
    results.put(("parent's state", *state))  # type: ignore[attr-defined]
    try:
        parents.read("fork/f")
    except fscache.FscacheError as exc:
        results.put(("parent's client", parents.closed, str(exc)))
    else:
        results.put(("parent's client", parents.closed, "read"))
    forked.set()  # type: ignore[attr-defined]
    written.wait(30)  # type: ignore[attr-defined]
    own = BlockingClient(address)
    results.put(("own client", own.read("fork/f")))
    own.close()


_PARENTS: list[BlockingClient] = []


def test_a_forked_child_never_reads_the_parents_cache(address: str) -> None:
    context = multiprocessing.get_context("fork")
    with fscache.connect(address) as parent:
        parent.write("fork/f", b"old")
        assert parent.read("fork/f") == b"old"  # cached under a 30 s lease
        _PARENTS[:] = [parent]
        forked, written, results = context.Event(), context.Event(), context.Queue()
        child = context.Process(target=_child, args=(address, forked, written, results))
        child.start()
        assert forked.wait(30)
        parent.write("fork/f", b"new")  # no approval comes from the child's copy
        written.set()
        child.join(60)

        assert child.exitcode == 0
        assert results.get(timeout=5) == ("parent's state", False, None, 0.0)
        assert results.get(timeout=5) == ("parent's client", True, FORKED)
        assert results.get(timeout=5) == ("own client", b"new")
        assert parent.read("fork/f") == b"new"  # the parent's client is unharmed


def test_a_client_closed_from_inside_a_trio_task_ends_its_thread_and_session(
    address: str,
) -> None:
    """``close()`` blocks for the goodbye, which a trio task may do; the other calls
    say to use the async client or a thread instead."""
    with fscache.connect(address) as writer:
        writer.write("trio/f", b"x")

    def loop_threads() -> list[threading.Thread]:  # (trio keeps its idle workers a while)
        return [t for t in threading.enumerate() if t.name.startswith("fscache-client")]

    async def main() -> None:
        client = fscache.connect(address)
        assert client.epoch is not None  # known as soon as connect() returns
        with pytest.raises(RuntimeError, match="open_client"):
            client.read("trio/f")
        assert await trio.to_thread.run_sync(client.read, "trio/f") == b"x"  # 30 s lease
        client.close()
        assert client.closed

    trio.run(main)
    assert loop_threads() == []
    wait_until(lambda: live_leases(address) == 0, "the closed client's lease is still live")
