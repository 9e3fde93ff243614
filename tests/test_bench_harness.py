"""The benchmarks' peer servers on ports they must be given (Redis, etcd): a port that
another process takes between the pick and the server's bind is not taken for the
server's, and the server is started again on fresh ones. Real servers, real sockets;
each test skips where Debian's server is not installed."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fscache.bench import harness, locks


@pytest.fixture
def taken_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A port another process listens on, handed out by the first ``free_port`` call,
    as if that process had taken it between the pick and the server's bind."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        picks = iter([port])
        pick = harness.free_port
        monkeypatch.setattr(harness, "free_port", lambda: next(picks, None) or pick())
        yield port


def _redis_ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64)


@pytest.mark.skipif(harness.redis_server_binary() is None, reason="redis-server is not installed")
def test_redis_starts_again_on_a_fresh_port_when_its_port_was_taken(
    tmp_path: Path, taken_port: int
) -> None:
    with harness.redis_server(str(tmp_path)) as redis:
        assert redis.port != taken_port
        assert harness.listens(redis.pid, redis.port)
        assert _redis_ping(redis.port) == b"+PONG\r\n"
    assert redis.popen.poll() is not None


@pytest.mark.slow
@pytest.mark.skipif(locks.etcd_version() is None, reason=f"{locks.ETCD} is not installed")
def test_etcd_starts_again_on_fresh_ports_when_one_was_taken(
    tmp_path: Path, taken_port: int
) -> None:
    with locks.etcd_server(str(tmp_path)) as etcd:
        assert etcd.port != taken_port
        assert locks._etcd_healthy(etcd.port)
    assert etcd.popen.poll() is not None


def test_a_port_another_process_listens_on_is_not_ours() -> None:
    with socket.socket() as ours:
        ours.bind(("127.0.0.1", 0))
        port = ours.getsockname()[1]
        assert not harness.listens(os.getpid(), port)  # bound, not listening
        ours.listen()
        assert harness.listens(os.getpid(), port)
        assert not harness.listens(1, port)  # the port's listener is not process 1


def test_a_server_that_cannot_start_is_reported_after_a_few_attempts(tmp_path: Path) -> None:
    starts = []

    def argv(ports: list[int], attempt: int) -> list[str]:
        starts.append(attempt)
        return ["false"]

    with pytest.raises(RuntimeError, match="exited 3 times, last with code 1"):
        harness.spawn_on_free_ports("nothing", 1, argv, lambda port: True)
    assert starts == [0, 1, 2]
