"""fsspec speaks fscache: ``fsspec.open("fscache://host:port/path")``."""

from __future__ import annotations

import fsspec
import pytest
import trio

from fscache.server.service import ServerSettings, serve


@pytest.fixture
async def address(nursery, root):
    server = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    return f"127.0.0.1:{server.port}"


async def test_fsspec_reads_writes_lists_and_deletes(address):
    def use_it() -> None:
        with fsspec.open(f"fscache://{address}/docs/a.txt", "wb") as f:
            f.write(b"through fsspec")
        with fsspec.open(f"fscache://{address}/docs/a.txt", "rb") as f:
            assert f.read() == b"through fsspec"
        fs = fsspec.filesystem("fscache", host="127.0.0.1", port=int(address.split(":")[1]))
        assert fs.ls("docs", detail=False) == ["docs/a.txt"]
        assert fs.info("docs/a.txt")["size"] == 14
        assert fs.info("docs")["type"] == "directory"
        assert fs.cat_file("docs/a.txt", start=8) == b"fsspec"
        fs.pipe_file("docs/b.txt", b"b")
        assert sorted(fs.ls("docs", detail=False)) == ["docs/a.txt", "docs/b.txt"]
        fs.rm_file("docs/a.txt")
        assert not fs.exists("docs/a.txt")
        with pytest.raises(FileNotFoundError):
            fs.cat_file("docs/a.txt")
        with pytest.raises(FileNotFoundError):
            fs.rm_file("docs/a.txt")
        fs.client.close()

    await trio.to_thread.run_sync(use_it)
