"""The async client's example in ``docs/design.md`` ("Public API", "Async (trio)")
runs top to bottom as written, against a fresh server: only its address is the
test's, and what it leaves to the reader is given (``file``, a binary file object,
``local.bin`` in the working directory, and the modules ``fscache`` and
``contextlib``)."""

from __future__ import annotations

import contextlib
import io
import pathlib
import textwrap
from typing import Any

import trio

import fscache
from fscache.server.service import ServerSettings, serve
from fscache.settings import CHUNK_SIZE

DESIGN = pathlib.Path(__file__).parent.parent / "docs" / "design.md"


def async_example() -> str:
    """The first Python block under the "Async (trio)" heading."""
    section = DESIGN.read_text().split("\n### Async (trio)\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


async def test_the_design_notes_async_example_runs_as_written(nursery, root, tmp_path, monkeypatch):
    server = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    example = async_example()
    assert example.startswith('async with fscache.open_client("127.0.0.1", 7710) as c:')
    example = example.replace('"127.0.0.1", 7710', f"{server.host!r}, {server.port}", 1)
    scope: dict[str, Any] = {"fscache": fscache, "contextlib": contextlib}
    exec("async def run(file):\n" + textwrap.indent(example, "    "), scope)

    local = bytes(range(256)) * ((2 * CHUNK_SIZE + 4096) // 256)  # an upload in parts
    (tmp_path / "local.bin").write_bytes(local)
    monkeypatch.chdir(tmp_path)
    copy = io.BytesIO()
    with trio.fail_after(30):
        await scope["run"](copy)

    assert copy.getvalue() == local
    assert (root / "big.bin").read_bytes() == local
    assert (root / "out.txt").read_bytes() == b"..."
    assert not (root / "docs" / "a.txt").exists() and not (root / "docs" / "b.txt").exists()
    with trio.fail_after(10):  # ephemeral: gone with the client's goodbye
        while (root / "services" / "api" / "n1").exists():
            await trio.sleep(0.01)
