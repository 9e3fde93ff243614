"""fsspec's own abstract test suite, run against a real ``fscache serve`` process.

One server process for the module (a fresh root), one file system on it, and a
fresh directory per test, so the tests share nothing they can see. Directories
are the server's own, so an empty one exists: ``supports_empty_directories`` is
true.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator

import fsspec.tests.abstract as abstract
import pytest

from fscache.cli import parse_serving_line
from fscache.client.fsspec_fs import FscacheFileSystem

# The store fsyncs every write and delete; these tests are about fsspec's conventions,
# not durability, so the root lives on a memory file system where one is mounted.
MEMORY_FS = "/dev/shm"


@pytest.fixture(scope="module")
def server_address() -> Iterator[tuple[str, int]]:
    """A real ``fscache serve`` process on a free port: ``(host, port)``."""
    with tempfile.TemporaryDirectory(
        prefix="fscache-fsspec-", dir=MEMORY_FS if os.path.isdir(MEMORY_FS) else None
    ) as root:
        yield from _serve(root)


def _serve(root: str) -> Iterator[tuple[str, int]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", root, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline().decode()
        address = parse_serving_line(line)
        assert address is not None, line + process.stderr.read().decode()
        yield address
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def module_fs(server_address: tuple[str, int]) -> Iterator[FscacheFileSystem]:
    """One file system (one client) on that server for the whole module."""
    host, port = server_address
    fs = FscacheFileSystem(host=host, port=port, skip_instance_cache=True)
    yield fs
    fs.client.close()


class FscacheFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, module_fs: FscacheFileSystem) -> FscacheFileSystem:
        return module_fs

    @pytest.fixture
    def fs_path(self) -> str:
        return f"t{uuid.uuid4().hex}"

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return True


class TestFscacheCopy(abstract.AbstractCopyTests, FscacheFixtures):  # type: ignore[misc]
    pass


class TestFscacheGet(abstract.AbstractGetTests, FscacheFixtures):  # type: ignore[misc]
    pass


class TestFscachePut(abstract.AbstractPutTests, FscacheFixtures):  # type: ignore[misc]
    pass


class TestFscacheOpen(abstract.AbstractOpenTests, FscacheFixtures):  # type: ignore[misc]
    pass


class TestFscachePipe(abstract.AbstractPipeTests, FscacheFixtures):  # type: ignore[misc]
    pass
