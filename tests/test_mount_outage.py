"""The mount while its server is away: a real FUSE mount of a real server process,
killed with SIGKILL and started again with the same command line.

The fixtures and the mount's test rules are those of ``tests/test_mount.py``. Times
are asserted only as lower bounds and as order: a close must not return before the
server that stores its file is back.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

import fscache
from fscache.cli import parse_serving_line
from fscache.client.mount import mount
from tests import test_mount

mountable = test_mount.mountable
mountpoint = test_mount.mountpoint
on_mount = test_mount.on_mount
read_file = test_mount.read_file
write_file = test_mount.write_file

CHUNK = 100_000


class ServerProcess:
    """``fscache serve`` in a process of its own, on one port across restarts. A
    short term keeps the restart window (writes held for a term after a restart)
    short."""

    def __init__(self, root: Path, *options: str) -> None:
        with socket.socket() as probe:  # a free port, the same for every start
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.command = [
            *(sys.executable, "-m", "fscache", "serve"),
            *("--root", str(root), "--port", str(self.port)),
            *(options or ("--term", "1")),
        ]
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        process = subprocess.Popen(self.command, stdout=subprocess.PIPE)
        self.process = process
        assert process.stdout is not None
        line = await trio.to_thread.run_sync(process.stdout.readline)
        assert parse_serving_line(line.decode()) == ("127.0.0.1", self.port), line

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.stop()

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.process = None


@pytest.fixture
async def server(root) -> AsyncIterator[ServerProcess]:
    server = ServerProcess(root)
    await server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def mounted(
    server: ServerProcess, mountpoint: Path, **options
) -> AsyncIterator[fscache.Client]:
    """The server mounted on ``mountpoint``; yields the mount's client."""
    async with (
        fscache.open_client("127.0.0.1", server.port) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(functools.partial(mount, **options), client, mountpoint)
        yield client
        nursery.cancel_scope.cancel()


async def stored(server: ServerProcess, path: str) -> bytes:
    async with fscache.open_client("127.0.0.1", server.port) as client:
        return await client.read(path)


async def test_a_close_while_the_server_restarts_waits_for_it_and_stores_the_whole_file(
    mountable, server, mountpoint
):
    """A program writes a new file, the server is killed, the program closes the
    file: the close waits (the spool keeps every byte) until the server is back,
    and returns only once the whole file is stored, never an empty or partial one."""
    data = (bytes(range(256)) * (20 * CHUNK // 256 + 1))[: 20 * CHUNK]
    async with mounted(server, mountpoint):
        fd = await on_mount(os.open, mountpoint / "log.bin", os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
        try:
            for at in range(0, 10 * CHUNK, CHUNK):
                await on_mount(os.write, fd, data[at : at + CHUNK])
            server.kill()
            for at in range(10 * CHUNK, 20 * CHUNK, CHUNK):
                await on_mount(os.write, fd, data[at : at + CHUNK])
        finally:
            closed = trio.Event()
            outcome: list[BaseException | None] = []

            async def close() -> None:
                try:
                    await on_mount(os.close, fd)
                    outcome.append(None)
                except OSError as exc:
                    outcome.append(exc)
                closed.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(close)
                await trio.sleep(1.5)  # longer than a request waits for a connection
                assert not closed.is_set(), outcome  # not stored, so not done
                await server.start()
                with trio.fail_after(60):
                    await closed.wait()
        assert outcome == [None]
        assert await stored(server, "log.bin") == data


async def test_a_create_and_a_mkdir_during_a_restart_wait_for_the_server(
    mountable, server, mountpoint
):
    """The calls that make a name wait out a server restart as a close does, rather
    than fail with EIO after a second. They are made once the mount's client has
    seen its connection go: one sent in the instant before that goes out on the
    dead connection, and fails (EIO), as it may have been applied."""
    async with mounted(server, mountpoint) as client:
        await on_mount(os.listdir, mountpoint)
        server.kill()
        with trio.fail_after(30):
            while client.connected:
                await trio.sleep(0.01)
        done: list[str] = []

        async def make() -> None:
            await on_mount(os.mkdir, mountpoint / "made")
            await on_mount(write_file, mountpoint / "made" / "late.txt", b"late")
            done.append("made")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(make)
            await trio.sleep(1.5)
            assert done == []
            await server.start()
        assert done == ["made"]
        assert await on_mount(read_file, mountpoint / "made" / "late.txt") == b"late"
    assert await stored(server, "made/late.txt") == b"late"


async def test_a_close_fails_once_the_server_stays_away_longer_than_the_mount_waits(
    mountable, server, mountpoint, caplog
):
    """Past ``outage_wait`` the close fails with EIO, the log names the file, and the
    server never gets a partial file: it has the empty one the create made."""
    caplog.set_level(logging.WARNING, logger="fscache.mount")
    async with mounted(server, mountpoint, outage_wait=1.5):
        fd = await on_mount(os.open, mountpoint / "lost.bin", os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
        try:
            await on_mount(os.write, fd, b"x" * CHUNK)
            server.kill()
            await on_mount(os.write, fd, b"y" * CHUNK)
        finally:
            started = trio.current_time()
            with pytest.raises(OSError) as failed:
                await on_mount(os.close, fd)
            waited = trio.current_time() - started
        assert failed.value.errno == errno.EIO
        assert waited >= 1.5
        said = [r.getMessage() for r in caplog.records]
        assert any("lost.bin was not written" in line for line in said), said
        await server.start()
    assert await stored(server, "lost.bin") == b""


async def test_a_leased_listing_is_served_while_the_server_is_away(mountable, root, mountpoint):
    """What the mount holds under a lease needs no server: a directory whose listing
    is leased lists, and a leased file reads, after the server is killed; a directory
    never listed cannot be, and fails (EIO) once the mount has waited for the server.
    (A directory written often is leased for no time: it needs the server too.)"""
    server = ServerProcess(root, "--term", "30", "--hot-writes", "0")
    await server.start()
    try:
        async with fscache.open_client("127.0.0.1", server.port) as other:
            for path in ("d/a", "d/b", "e/c"):
                await other.write(path, path.encode())
        async with mounted(server, mountpoint, outage_wait=1.0):
            assert sorted(await on_mount(os.listdir, mountpoint / "d")) == ["a", "b"]
            assert await on_mount(read_file, mountpoint / "d" / "a") == b"d/a"
            server.kill()
            assert sorted(await on_mount(os.listdir, mountpoint / "d")) == ["a", "b"]
            assert await on_mount(read_file, mountpoint / "d" / "a") == b"d/a"
            with pytest.raises(OSError) as away:
                await on_mount(os.listdir, mountpoint / "e")
            assert away.value.errno == errno.EIO
    finally:
        server.stop()
