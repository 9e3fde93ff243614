"""A bad argument to a client call is the caller's error: a ``TypeError`` or a
``BadSetting`` that names the argument, raised before anything is sent, and the same
whether the call would have been answered from the cache or by the server.

The async client runs against the real service over memory streams
(:class:`tests.harness.Cluster`); "nothing sent" is the service's count of messages
received. The blocking client runs against a real server on a worker thread.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import trio

import fscache
from fscache.server.service import ServerSettings, serve
from fscache.settings import CHUNK_SIZE, BadSetting

from .harness import Cluster

# (offset, length) a read refuses, each with the error it gets.
BAD_RANGES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"offset": -1}, BadSetting, r"offset must be 0\.\.2\*\*63-1, not -1"),
    ({"offset": 2**64}, BadSetting, r"offset must be 0\.\.2\*\*63-1"),
    ({"length": -1}, BadSetting, r"length must be 0\.\.2\*\*63-1, not -1"),
    ({"length": 2**70}, BadSetting, r"length must be 0\.\.2\*\*63-1"),
    ({"length": float("nan")}, TypeError, "length must be an int, not float"),
    ({"offset": True}, TypeError, "offset must be an int, not bool"),
    ({"offset": False}, TypeError, "offset must be an int, not bool"),
    ({"offset": 0.0}, TypeError, "offset must be an int, not float"),
    ({"offset": None}, TypeError, "offset must be an int, not NoneType"),
    ({"offset": "1"}, TypeError, "offset must be an int, not str"),
    ({"offset": 1, "length": "2"}, TypeError, "length must be an int, not str"),
]


@pytest.fixture
async def cluster(nursery, root):
    cluster = Cluster(nursery, root)
    await cluster.start()
    return cluster


def received(cluster: Cluster) -> int:
    assert cluster.service is not None
    return cluster.service.counters.messages_in


async def test_a_ranged_read_is_checked_alike_on_a_hit_and_on_a_miss(cluster):
    async with cluster.client("c") as c:
        await c.write("a.txt", b"0123456789")
        for kwargs, kind, message in BAD_RANGES:
            assert await c.read("a.txt") == b"0123456789"  # cached whole: a hit from now on
            hits, before = c.stats["hits"], received(cluster)
            with pytest.raises(kind, match=message):
                await c.read("a.txt", **kwargs)
            assert c.stats["hits"] == hits + 1 and received(cluster) == before
            await c.relinquish("a.txt")  # cold: the same check, before any request
            before = received(cluster)
            with pytest.raises(kind, match=message):
                await c.read("a.txt", **kwargs)
            assert received(cluster) == before
        assert await c.read("a.txt") == b"0123456789"
        assert await c.read("a.txt", offset=2, length=3) == b"234"  # good ones still work
        assert await c.read("a.txt", offset=0) == b"0123456789"


async def test_writes_and_truncates_refuse_mistyped_extents_before_sending(cluster):
    async with cluster.client("c") as c:
        await c.write("f", b"data")
        before = received(cluster)
        for call, message in [
            (lambda: c.truncate("f", "3"), "size must be an int, not str"),
            (lambda: c.truncate("f", 3.0), "size must be an int, not float"),
            (lambda: c.write("f", b"x", offset="1"), "offset must be an int, not str"),
            (lambda: c.write("f", b"x", offset=True), "offset must be an int, not bool"),
        ]:
            with pytest.raises(TypeError, match=message):
                await call()
        assert received(cluster) == before
        assert await c.read("f") == b"data"


async def test_a_negative_if_version_is_refused_before_sending(cluster, tmp_path):
    """Not a Conflict (which says another writer won): versions are >= 0."""
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (2 * CHUNK_SIZE + 1))
    async with cluster.client("c") as c:
        await c.write("f", b"data")
        before = received(cluster)
        with open(big, "rb") as source:
            calls: list[Callable[[], Any]] = [
                lambda: c.write("f", b"x", if_version=-1),
                lambda: c.write("f", source, if_version=-1),  # an upload
                lambda: c.write("f", b"x", offset=0, if_version=-1),
                lambda: c.truncate("f", 0, if_version=-1),
                lambda: c.delete("f", if_version=-1),
            ]
            for call in calls:
                with pytest.raises(BadSetting, match=r"if_version must be >= 0.*not -1"):
                    await call()
            # An upload's commit carries if_version after the parts: it is checked first.
            for bad, kind in (("1", TypeError), (2**70, BadSetting)):
                with pytest.raises(kind, match=r"write\.if_version"):
                    await c.write("f", source, if_version=bad)
        assert received(cluster) == before
        assert await c.read("f") == b"data"
        await c.write("new", b"x", if_version=0)  # 0: only if there is no file, as before


async def test_read_into_refuses_what_cannot_take_bytes_before_sending(cluster):
    async with cluster.client("c") as c:
        await c.write("f", b"data")
        before = received(cluster)
        for file in (None, io.StringIO(), "out.bin"):
            with pytest.raises(TypeError, match=r"file must be a binary file object.*not"):
                await c.read_into("f", file)  # type: ignore[arg-type]
        assert received(cluster) == before

        class Writer:  # only write(): not seekable, so a change mid-copy is a Conflict
            def __init__(self) -> None:
                self.got = b""

            def write(self, data: bytes) -> int:
                self.got += data
                return len(data)

        writer = Writer()
        assert await c.read_into("f", writer) == 4  # type: ignore[arg-type]
        assert writer.got == b"data"


async def test_a_path_that_is_no_str_is_a_type_error_before_sending(cluster, tmp_path):
    """bytes, a pathlib.Path, None: a mistyped argument (TypeError), not a string that
    breaks the path rules (BadPath)."""
    async with cluster.client("c") as c:
        await c.write("f", b"data")
        before = received(cluster)
        calls: list[Callable[[Any], Any]] = [
            lambda bad: c.read(bad),
            lambda bad: c.read_into(bad, io.BytesIO()),
            lambda bad: c.write(bad, b"x"),
            lambda bad: c.truncate(bad, 0),
            lambda bad: c.delete(bad),
            lambda bad: c.rename(bad, "g"),
            lambda bad: c.rename("f", bad),
            lambda bad: c.mkdir(bad),
            lambda bad: c.rmdir(bad),
            lambda bad: c.stat(bad),
            lambda bad: c.scandir(bad),
            lambda bad: c.listdir(bad),
            lambda bad: c.relinquish(bad),
            lambda bad: c.extend(bad),
            lambda bad: c.acquire(bad),  # a lock's name follows the path rules
            lambda bad: c.leader(bad),
        ]
        for bad in (b"f", tmp_path / "f", None, 7):
            message = f"path must be a str, not {type(bad).__name__}"
            for call in calls:
                with pytest.raises(TypeError, match=message):
                    await call(bad)
        assert received(cluster) == before
        with pytest.raises(fscache.BadPath):  # a str that breaks the rules: as before
            await c.read("../f")


async def test_read_into_a_file_open_for_reading_only_is_refused_before_reading(cluster, tmp_path):
    local = tmp_path / "local.bin"
    local.write_bytes(b"mine")
    async with cluster.client("c") as c:
        await c.write("f", b"data")
        before = received(cluster)
        with (
            open(local, "rb") as read_only,
            pytest.raises(TypeError, match=r"this BufferedReader is not writable"),
        ):
            await c.read_into("f", read_only)
        assert received(cluster) == before
        assert local.read_bytes() == b"mine"
        with open(local, "r+b") as both:  # read and write: taken
            assert await c.read_into("f", both) == 4
        assert local.read_bytes() == b"data"


async def test_a_negative_cache_bound_is_named_as_the_caller_gave_it(cluster):
    with pytest.raises(BadSetting, match=r"cache_bytes must be 0\.\.2\*\*63-1, not -1"):
        async with cluster.client("c", cache_bytes=-1):
            pass
    with pytest.raises(TypeError, match="cache_bytes must be an int, not str"):
        async with cluster.client("c", cache_bytes="64M"):
            pass
    assert received(cluster) == 0  # not even a hello


# ---------------------------------------------------------------- the blocking client
@pytest.fixture
async def address(nursery, root):
    server = await nursery.start(serve, ServerSettings(root=str(root), port=0))
    return f"{server.host}:{server.port}"


async def test_the_blocking_client_checks_alike_and_answers_a_ranged_hit_itself(address):
    def use() -> None:
        with fscache.connect(address) as c:
            c.write("a.txt", b"0123456789")
            for kwargs, kind, message in BAD_RANGES:
                assert c.read("a.txt") == b"0123456789"
                with pytest.raises(kind, match=message):
                    c.read("a.txt", **kwargs)
                c.relinquish("a.txt")
                with pytest.raises(kind, match=message):
                    c.read("a.txt", **kwargs)
            assert c.read("a.txt") == b"0123456789"
            hits = c.stats["hits"]
            assert c.read("a.txt", offset=2, length=3) == b"234"
            assert c.read("./a.txt", offset=8) == b"89"  # another spelling hits too
            assert c.stats["hits"] == hits + 2  # each counted once

            with pytest.raises(TypeError, match="size must be an int, not str"):
                c.truncate("a.txt", "3")
            with pytest.raises(TypeError, match="file must be a binary file object"):
                c.read_into("a.txt", None)  # type: ignore[arg-type]
            with pytest.raises(BadSetting, match="if_version must be >= 0"):
                c.write("a.txt", b"x", if_version=-1)
            for bad in (b"a.txt", None):  # on the caller's thread or the loop's, alike
                with pytest.raises(TypeError, match="path must be a str"):
                    c.read(bad)  # type: ignore[arg-type]
                with pytest.raises(TypeError, match="path must be a str"):
                    c.stat(bad)  # type: ignore[arg-type]
            with (
                open(__file__, "rb") as read_only,
                pytest.raises(TypeError, match="is not writable"),
            ):
                c.read_into("a.txt", read_only)
            assert c.read("a.txt") == b"0123456789"

        with pytest.raises(BadSetting, match="cache_bytes must be 0"):
            fscache.connect(address, cache_bytes=-1)

    await trio.to_thread.run_sync(use)


async def test_a_closed_blocking_client_refuses_with_as_every_call(address):
    def use() -> None:
        c = fscache.connect(address)
        c.close()
        with pytest.raises(fscache.FscacheError, match="client is closed"):
            c.read("a.txt")
        with pytest.raises(fscache.FscacheError, match="client is closed"), c:
            pass

    await trio.to_thread.run_sync(use)


# ---------------------------------------------------------------- where to connect
@pytest.mark.parametrize(
    ("port", "kind", "message"),
    [
        (70000, BadSetting, r"port must be 1\.\.65535, not 70000"),
        (65536, BadSetting, r"port must be 1\.\.65535, not 65536"),
        (-1, BadSetting, r"port must be 1\.\.65535, not -1"),
        (0, BadSetting, r"port must be 1\.\.65535, not 0"),
        (7830.0, TypeError, r"port must be an int 1\.\.65535, not float 7830\.0"),
        (True, TypeError, r"port must be an int 1\.\.65535, not bool"),
        ("7830", TypeError, r"port must be an int 1\.\.65535, not str '7830'"),
        (None, TypeError, r"port must be an int 1\.\.65535, not NoneType"),
    ],
)
async def test_open_client_checks_the_port_before_connecting(port, kind, message):
    """The port's range is the one ``fscache.connect("HOST:PORT")`` allows; text
    such as "HOST:PORT" is connect's to take, not open_client's."""
    with pytest.raises(kind, match=message):
        async with fscache.open_client("127.0.0.1", port):
            pass
    with pytest.raises(kind, match=message):  # with an opener too: nothing is opened
        async with fscache.open_client(port=port, opener=_never_opened):
            pass


async def _never_opened() -> trio.abc.Stream:
    raise AssertionError("a bad argument reached the connection")


@pytest.mark.parametrize(
    ("host", "kind", "message"),
    [
        (b"127.0.0.1", TypeError, "host must be a str .*, not bytes"),
        (None, TypeError, "host must be a str .*, not NoneType"),
        ("", BadSetting, "host must be a name or an address, .* not ''"),
        ("  ", BadSetting, "host must be a name or an address, .* not '  '"),
        ("[::1]", BadSetting, r"without brackets.*open_client\('::1', 17301\)"),
        ("127.0.0.1:5", BadSetting, r"port apart: open_client\('127.0.0.1', 5\)"),
    ],
)
async def test_open_client_checks_the_host_before_connecting(host, kind, message):
    with pytest.raises(kind, match=message):
        async with fscache.open_client(host, 17301):
            pass


def test_connect_checks_its_address_alike():
    for address in ("127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:-1", "127.0.0.1:7830.0"):
        with pytest.raises(BadSetting, match=r"port must be 1\.\.65535"):
            fscache.connect(address)
    for address in (None, 7830, b"127.0.0.1:7830"):
        with pytest.raises(TypeError, match="an address is a str"):
            fscache.connect(address)  # type: ignore[arg-type]
