"""fsspec's own abstract test suite, run against a real ``fscache serve`` process.

One server process for the module (a fresh root), one file system on it, and a
fresh directory per test, so the tests share nothing they can see. Directories
follow the object-store convention (see ``fscache/client/fsspec_fs.py``), so the
suite runs with ``supports_empty_directories`` false.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import fsspec.tests.abstract as abstract
import pytest

from fscache.cli import parse_serving_line
from fscache.client.fsspec_fs import FscacheFileSystem


@pytest.fixture(scope="module")
def server_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A real ``fscache serve`` process on a free port: ``(host, port)``."""
    root = tmp_path_factory.mktemp("root")
    process = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0"],
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
        return False


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
