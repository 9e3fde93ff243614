"""What the client's ``write(..., ephemeral=True)`` takes (``docs/design.md``,
"Ephemeral files and watches"): bytes or a binary file object, a whole-file write
or an upload commit, never a ranged write.

Test rules: the service runs under ``autojump_clock`` over memory streams
(``harness.py``), with a session TTL of 7 s, so a session's end is reached at once.
"""

from __future__ import annotations

import io
import pathlib

import pytest
import trio
import trio.testing

from fscache.settings import CHUNK_SIZE, BadSetting

from . import test_sessions_service
from .harness import Cluster
from .test_ephemeral_service import service_ties
from .test_sessions_service import TERM, TTL

cluster = test_sessions_service.cluster  # the fixture: term 10 s, skew 0.1 s, session TTL 7 s

SMALL = b"10.0.0.5:8080"
BIG = b"x" * (CHUNK_SIZE + 1)  # more than one chunk: an upload, committed ephemeral


@pytest.mark.parametrize("data", [SMALL, BIG], ids=["one write", "an upload"])
async def test_a_file_object_is_written_ephemeral_and_kept_as_bytes_are(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock, data: bytes
) -> None:
    async with cluster.client("reg") as reg:
        await reg.mkdir("svc")  # an upload's directory must exist
        await reg.write("svc/n1", io.BytesIO(data), ephemeral=True)
        assert service_ties(cluster) == {"svc/n1": reg.session_id}
        assert (root / "svc/n1").read_bytes() == data
        assert reg._ephemeral == {"svc/n1": data}  # what it writes again in a new session
    await trio.testing.wait_all_tasks_blocked()
    assert not (root / "svc/n1").exists()  # gone with the session, as a bytes write's


async def test_a_file_objects_registration_is_written_again_in_a_new_session(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster.client("reg") as reg:
        await reg.write("n1", io.BytesIO(SMALL), ephemeral=True)
        old_session = reg.session_id
        cluster.refuse = True  # away past the session TTL: the session ends, and its file
        await cluster.cut("reg")  # goes once the writer's own lease is waited out too
        await trio.sleep(TTL + TERM + 1.0)
        assert not (root / "n1").exists()
        cluster.refuse = False
        with trio.fail_after(30):
            while service_ties(cluster) != {"n1": reg.session_id}:
                await trio.sleep(0.1)
        assert reg.session_id != old_session
        assert (root / "n1").read_bytes() == SMALL


async def test_an_ephemeral_write_in_place_is_refused_before_anything_is_sent(
    cluster: Cluster, root: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A write with ``offset`` is a ranged write, which unties an ephemeral file: it
    cannot make one. Refused with BadSetting whatever the data (bytes or a file)."""
    async with cluster.client("reg") as reg:
        writes = reg.stats["writes"]
        for data in (b"small", io.BytesIO(b"small")):
            for offset in (0, 5):
                with pytest.raises(BadSetting, match="takes no offset"):
                    await reg.write("f", data, ephemeral=True, offset=offset)
        assert reg.stats["writes"] == writes
        assert not (root / "f").exists() and service_ties(cluster) == {}
