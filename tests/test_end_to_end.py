"""The public contract, used as a user would: real TCP on 127.0.0.1, port 0.

The async API, the blocking API, the ``fscache`` command (as subprocesses) and
mutual TLS. Timing is not asserted here (see test_service_timing.py).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
from functools import partial

import pytest
import trio

import fscache
from fscache.bench.frames import FrameConnection
from fscache.cli import parse_serving_line
from fscache.client.client import parse_address
from fscache.protocol import read_frame
from fscache.server.service import FileService, ServerSettings, serve
from fscache.settings import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SKEW, DEFAULT_TERM, BadSetting
from fscache.tls import client_context, make_certs

STATS_FIELDS = {
    "reads", "writes", "leases_granted", "leases_active", "approvals_sent",
    "writes_delayed", "uptime_s",
}  # fmt: skip


@pytest.fixture
async def server(nursery, root):
    return await nursery.start(serve, ServerSettings(root=str(root), port=0))


async def test_the_async_api_does_what_its_contract_says(server):
    async with fscache.open_client("127.0.0.1", server.port) as c:
        version = await c.write("docs/a.txt", b"new")
        assert isinstance(version, int)
        assert await c.read("docs/a.txt") == b"new"
        st = await c.stat("docs/a.txt")
        assert (st.version, st.size) == (version, 3)
        assert await c.listdir("docs") == ["a.txt"]
        assert await c.listdir("") == ["docs/"]
        await c.write("docs/b.txt", b"b")
        await c.relinquish("docs/a.txt", "docs/b.txt")
        assert c.stats["relinquished"] == 2
        await c.delete("docs/a.txt")
        with pytest.raises(fscache.NotFound):
            await c.read("docs/a.txt")
        assert {"hits", "misses"} <= set(c.stats)


async def test_a_write_is_seen_by_every_other_client_at_once(server):
    async with (
        fscache.open_client("127.0.0.1", server.port) as a,
        fscache.open_client("127.0.0.1", server.port) as b,
        fscache.open_client("127.0.0.1", server.port) as c,
    ):
        await a.write("shared", b"1")
        assert await b.read("shared") == await c.read("shared") == b"1"
        await a.write("shared", b"2")
        assert await b.read("shared") == await c.read("shared") == b"2"
        assert b.stats["approvals"] == c.stats["approvals"] == 1
        stats = await a.server_stats()
        assert set(stats) >= STATS_FIELDS
        assert stats["approvals_sent"] == 2


async def test_a_file_replaced_behind_the_server_with_its_mtime_kept_is_seen(nursery, root):
    """``rsync -t``, ``cp -p`` and ``tar -x`` put a file in place with the mtime they
    copy: once its lease has run out, a client that cached the old bytes reads the
    new ones (their version differs all the same)."""
    settings = ServerSettings(root=str(root), port=0, term=0.5, skew=0.1)
    server = await nursery.start(serve, settings)
    async with fscache.open_client("127.0.0.1", server.port) as c:
        await c.write("a.txt", b"AAAA")
        assert await c.read("a.txt") == b"AAAA"
        old = os.stat(root / "a.txt")
        await trio.sleep(0.05)  # past a coarse clock's tick
        (root / "incoming").write_bytes(b"BBBB")
        os.utime(root / "incoming", ns=(old.st_atime_ns, old.st_mtime_ns))
        os.replace(root / "incoming", root / "a.txt")
        await trio.sleep(2 * settings.term)  # its lease is over: the next read asks
        assert await c.read("a.txt") == b"BBBB"


async def test_the_blocking_api_answers_hits_on_the_callers_thread(server):
    port = server.port

    def use_it() -> dict:
        with fscache.connect(f"127.0.0.1:{port}") as c:
            c.write("b.txt", b"blocking")
            assert c.read("b.txt") == b"blocking"
            before = c.stats["misses"]
            for _ in range(1000):
                assert c.read("b.txt") == b"blocking"
            assert c.stats["misses"] == before
            assert c.listdir("") == ["b.txt"]
            assert c.stat("b.txt").size == 8
            with pytest.raises(fscache.NotFound):
                c.read("nope")
            c.delete("b.txt")
            return dict(c.stats)

    stats = await trio.to_thread.run_sync(use_it)
    assert stats["hits"] >= 1000


async def test_blocking_hits_stay_on_the_callers_thread_for_any_spelling(server):
    port = server.port

    def use_it() -> None:
        with fscache.connect(f"127.0.0.1:{port}") as c:
            c.write("docs/a.txt", b"a")
            assert c.read("./docs//a.txt") == b"a"  # a miss: learns the spelling
            loop_thread_calls = c._run
            c._run = lambda *args: pytest.fail("a cache hit crossed to the loop thread")
            for spelling in ("docs/a.txt", "./docs//a.txt"):
                assert c.read(spelling) == b"a"
            c._run = loop_thread_calls
            with pytest.raises(fscache.BadPath):
                c.read("../outside")

    await trio.to_thread.run_sync(use_it)


async def test_the_blocking_client_reports_an_unreachable_server(nursery):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nothing listens there now

    def try_it() -> None:
        with pytest.raises(fscache.Unavailable):
            fscache.connect(f"127.0.0.1:{port}")

    await trio.to_thread.run_sync(try_it)


async def test_mutual_tls_admits_our_clients_and_refuses_strangers(nursery, root, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fscache.events")
    ours, strangers = tmp_path / "ours", tmp_path / "strangers"
    make_certs(ours, clients=["c"])
    make_certs(strangers, clients=["c"])
    settings = ServerSettings(root=str(root), port=0, tls_dir=str(ours / "server"))
    server = await nursery.start(serve, settings)
    ctx = client_context(ours / "clients" / "c")
    async with fscache.open_client("127.0.0.1", server.port, ssl_context=ctx) as c:
        await c.write("secret", b"s")
        assert await c.read("secret") == b"s"
    with pytest.raises(fscache.Unauthorized):
        async with fscache.open_client(
            "127.0.0.1", server.port, ssl_context=client_context(strangers / "clients" / "c")
        ) as c:
            await c.read("secret")
    with pytest.raises(fscache.Unavailable, match=r"the server may expect TLS \(--tls\)"):
        async with fscache.open_client("127.0.0.1", server.port) as c:
            await c.read("secret")

    async def refusals() -> list[str]:  # the server logs each refused handshake, and why
        while (
            len(found := [r for r in caplog.records if getattr(r, "event", "") == "tls_refused"])
            < 2
        ):
            await trio.sleep(0.01)
        return [r.fields["reason"] for r in found]

    with trio.fail_after(30):
        reasons = await refusals()
    assert reasons[0]  # the stranger hung up (trio sends no alert first): an EOF, or its alert
    assert reasons[1] == "WRONG_VERSION_NUMBER"  # a plain hello is no TLS record


async def test_a_tls_client_of_a_plain_server_is_told_it_may_not_speak_tls(server, tmp_path):
    make_certs(tmp_path / "tls", clients=["c"])
    ctx = client_context(tmp_path / "tls" / "clients" / "c")
    with pytest.raises(fscache.Unavailable, match="the server may not speak TLS"):
        async with fscache.open_client("127.0.0.1", server.port, ssl_context=ctx):
            pass


@pytest.mark.parametrize(
    "banner", [b"SSH-2.0-OpenSSH_9.2p1\r\n", b"HTTP/1.1 400 Bad Request\r\n\r\n", b"\xff" * 8]
)
async def test_a_peer_that_is_no_fscache_server_is_named_so_with_its_first_bytes(nursery, banner):
    """Another service on the port (an SSH banner, an HTTP reply, noise) is
    Unavailable, saying what it sent: not a frame too large to take."""

    async def impostor(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.send_all(banner)
            await trio.sleep(5)

    listeners = await nursery.start(partial(trio.serve_tcp, impostor, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(fscache.Unavailable, match="not an fscache server") as refused:
        async with fscache.open_client("127.0.0.1", port):
            pass
    assert repr(banner[:24]) in str(refused.value)


async def test_a_failed_start_leaves_a_crashed_incarnations_record_as_it_was(root, tmp_path):
    """A crashed server's long term is still owed by the next start: a start that
    failed (bad TLS material) must not record its own shorter one over it."""
    crashed = FileService(ServerSettings(root=str(root), port=0, term=60.0))
    crashed.store.close()  # a crash: no shutdown, its record says "not clean"
    record = (root / ".fscache" / "incarnation.json").read_bytes()
    bad = ServerSettings(root=str(root), port=0, term=1.0, tls_dir=str(tmp_path / "none"))
    with pytest.raises(BaseExceptionGroup) as refused:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, bad)
    assert refused.group_contains(fscache.FscacheError, match="does not exist", depth=None)
    assert (root / ".fscache" / "incarnation.json").read_bytes() == record
    again = FileService(ServerSettings(root=str(root), port=0, term=1.0))
    assert again.restart_window == pytest.approx(60.0 + DEFAULT_SKEW)
    again.store.close()


# ---------------------------------------------------------------- the command line
def fscache_command(
    *args: str, stdin: bytes = b"", timeout: float = 30
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fscache", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
    )


@pytest.fixture
def served(root):
    """A real ``fscache serve`` process on a free port; yields ``host:port``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = process.stdout.readline().decode()
        address = parse_serving_line(line)
        assert address is not None, line + process.stderr.read().decode()
        yield f"{address[0]}:{address[1]}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        process.stdout.close()
        process.stderr.close()


def test_the_command_line_round_trip(served, tmp_path):
    source = tmp_path / "in.txt"
    source.write_bytes(b"from a file\n")
    wrote = fscache_command("write", served, "notes/a.txt", str(source))
    assert wrote.returncode == 0, wrote.stderr
    assert int(wrote.stdout) > 0
    assert fscache_command("write", served, "notes/b.txt", "-", stdin=b"stdin\n").returncode == 0
    read = fscache_command("read", served, "notes/a.txt")
    assert (read.returncode, read.stdout) == (0, b"from a file\n")
    listing = fscache_command("ls", served, "notes")
    assert listing.stdout.decode().split() == ["a.txt", "b.txt"]
    assert fscache_command("ls", served).stdout.decode().split() == ["notes/"]
    stats = json.loads(fscache_command("stats", served).stdout)
    assert set(stats) >= STATS_FIELDS
    assert stats["writes"] == 2


def test_serve_with_stdout_full_fails_in_one_line_and_needs_no_window_after(root):
    """The serving line is what tools wait for: if stdout takes nothing, the start
    fails, said in one line, and records the stop as clean (it served nothing)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0"],
            stdout=full, stderr=subprocess.PIPE, timeout=60,
        )  # fmt: skip
    said = done.stderr.decode().splitlines()  # after the log's "limits: ..." line
    assert (done.returncode, said[-1]) == (
        1, "fscache: cannot write to standard output: No space left on device",
    )  # fmt: skip
    assert "Traceback" not in done.stderr.decode()
    assert json.loads((root / ".fscache" / "incarnation.json").read_text())["clean"] is True


def test_a_stop_whose_stdout_reader_has_gone_is_still_recorded_clean(root):
    process = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert parse_serving_line(process.stdout.readline().decode()) is not None
    process.stdout.close()  # the reader goes: the stop's lines meet a broken pipe
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert b"Traceback" not in process.stderr.read()  # (the log's start line only)
    process.stderr.close()
    assert json.loads((root / ".fscache" / "incarnation.json").read_text())["clean"] is True


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("read", "{addr}", "missing"), 1, "NotFound"),
        (("read", "{addr}", "../etc/passwd"), 1, "BadPath"),
        (("write", "{addr}", "x", "/no/such/file"), 1, "cannot read /no/such/file"),
        (("read", "127.0.0.1:1", "x"), 3, "unavailable"),
    ],
)
def test_command_line_errors_are_one_clear_line(served, args, code, message):
    result = fscache_command(*(a.format(addr=served) for a in args))
    assert result.returncode == code
    err = result.stderr.decode()
    assert message in err and len(err.strip().splitlines()) == 1, err


BAD_ADDRESSES = [
    "127.0.0.1:notaport", "localhost:99999", ":7710", "", "127.0.0.1:",
    "http://127.0.0.1:17301", "::1:17301", "127.0.0.1:17301:5", "[localhost]:1", "[::1]x",
    "a..b:17301", "a" * 64 + ":17301", "\udcff:17301",  # names IDNA cannot encode
]  # fmt: skip


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_a_bad_address_is_bad_usage(address):
    result = subprocess.run(
        [sys.executable, "-m", "fscache", "read", address, "x"],
        capture_output=True, timeout=30, errors="surrogateescape",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fscache read: error: argument HOST:PORT: bad address ")
    assert "expected HOST:PORT, HOST or [IPv6]:PORT" in last


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_a_bad_address_is_a_bad_setting_for_the_library(address):
    with pytest.raises(BadSetting, match="bad address"):
        parse_address(address)
    with pytest.raises(ValueError):  # BadSetting is one
        fscache.connect(address)


@pytest.mark.parametrize(
    ("address", "parsed"),
    [("h", ("h", DEFAULT_PORT)), ("h:1", ("h", 1)), ("[::1]:2", ("::1", 2)),
     ("::1", ("::1", DEFAULT_PORT)), (" 127.0.0.1:3 ", ("127.0.0.1", 3))],
)  # fmt: skip
def test_good_addresses_parse(address, parsed):
    assert parse_address(address) == parsed


def test_an_address_that_is_no_string_is_a_type_error():
    for address in (None, 7710, b"h:1"):
        with pytest.raises(TypeError):
            parse_address(address)


async def test_open_client_refuses_a_host_it_cannot_resolve_or_with_a_port():
    with pytest.raises(BadSetting, match=r"open_client\('127.0.0.1', 17301\)"):
        async with fscache.open_client("127.0.0.1:17301"):
            pass
    for host in ("a..b", "a" * 64, "\udcff"):
        with pytest.raises(BadSetting, match="not a valid host name"):
            async with fscache.open_client(host, 17301):
                pass


def test_an_unreachable_ipv6_server_is_named_in_brackets():
    result = fscache_command("read", "[::1]:1", "x")
    assert result.returncode == 3
    assert "[::1]:1" in result.stderr.decode()


@pytest.mark.parametrize("host", ["a..b", "a" * 64])
def test_serve_on_a_host_name_that_cannot_be_encoded_is_one_line(tmp_path, host):
    result = fscache_command("serve", "--root", str(tmp_path), "--port", "0", "--host", host)
    err = result.stderr.decode()
    assert result.returncode == 1 and f"cannot listen on {host}:0: bad host name" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_bad_serve_arguments_are_refused(tmp_path):
    for args in (["--term", "-1"], ["--term", "nan"], ["--skew", "inf"], ["--port", "70000"],
                 ["--root", ""]):  # fmt: skip
        result = fscache_command("serve", "--root", str(tmp_path), *args)
        assert result.returncode == 2 and "fscache serve: error" in result.stderr.decode()
    result = fscache_command("serve", "--root", str(tmp_path / "missing"))
    assert result.returncode == 1
    assert result.stderr.decode() == (  # the operator's error: no class name before it
        f"fscache: cannot serve the store root {str(tmp_path / 'missing')!r}: it does not exist\n"
    )


@pytest.mark.parametrize(
    "bad",
    [{"term": -1.0}, {"term": float("nan")}, {"skew": float("inf")}, {"skew": True},
     {"port": 70000}, {"hot_writes": -1}, {"max_frame": 1023}, {"max_connections": 0},
     {"frame_timeout": 0}, {"send_timeout": -1.0}, {"max_outbox": 1024 * 1024}],
)  # fmt: skip
def test_server_settings_out_of_range_are_refused_with_bad_setting(root, bad):
    with pytest.raises(BadSetting):
        ServerSettings(root=str(root), **bad)


def test_server_settings_default_to_the_shared_defaults(root):
    settings = ServerSettings(root=str(root))
    assert (settings.host, settings.port) == (DEFAULT_HOST, DEFAULT_PORT)
    assert (settings.term, settings.skew) == (DEFAULT_TERM, DEFAULT_SKEW)


def test_the_serving_line_gives_the_address_whatever_the_root_is_called():
    line = "fscache serving /data on tap (2) on ::1:7710 (term 10 s, skew 0.1 s, epoch ab)\n"
    assert parse_serving_line(line) == ("::1", 7710)
    assert parse_serving_line("restart window: writes held for 10.1 s") is None


def test_serve_on_a_busy_port_says_so_in_one_line(served, tmp_path):
    port = served.split(":")[1]
    other = tmp_path / "other"  # beside the served root: a tree of its own
    other.mkdir()
    result = fscache_command("serve", "--root", str(other), "--port", port)
    err = result.stderr.decode()
    assert result.returncode == 1 and "cannot listen on" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_certs_command_makes_usable_certificates(tmp_path):
    result = fscache_command("certs", str(tmp_path / "tls"))
    assert result.returncode == 0, result.stderr
    assert {"ca", "server"} <= set(os.listdir(tmp_path / "tls"))
    again = fscache_command("certs", str(tmp_path / "tls"))
    assert again.returncode == 1 and "overwrite" in again.stderr.decode()


def test_certs_into_a_file_is_one_clear_line(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    for where in (taken, tmp_path / "tls"):
        if where != taken:
            where.mkdir()
            (where / "ca").write_text("a file where the CA's directory goes")
        result = fscache_command("certs", str(where), "--client", "a")
        err = result.stderr.decode()
        assert result.returncode == 1 and "cannot make certificates in" in err, err
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["bad/name", "..", "anonymous", ""])
def test_certs_for_a_bad_client_name_is_bad_usage(tmp_path, name):
    result = fscache_command("certs", str(tmp_path / "tls"), "--client", name)
    assert result.returncode == 2
    assert "fscache certs: error: argument --client: client name" in result.stderr.decode()
    assert not (tmp_path / "tls").exists()  # refused before anything was made


def test_version_prints_the_package_version():
    result = fscache_command("--version")
    assert (result.returncode, result.stdout.decode()) == (0, f"fscache {fscache.__version__}\n")


@pytest.mark.parametrize(
    ("args", "usage"),
    [(("ls", "127.0.0.1:1", "a", "b"), "usage: fscache ls "),
     (("demo", "crash", "extra"), "usage: fscache demo crash "),
     (("stats", "127.0.0.1:1", "--nope"), "usage: fscache stats ")],
)  # fmt: skip
def test_a_usage_error_after_a_command_shows_that_commands_usage(args, usage):
    result = fscache_command(*args)
    err = result.stderr.decode()
    assert result.returncode == 2 and err.startswith(usage), err
    assert f"fscache {args[0]}" in err.splitlines()[-1] and "unrecognized arguments" in err


def test_a_bad_path_names_the_path_as_typed(served):
    result = fscache_command("write", served, ".", "-", stdin=b"x")
    assert result.returncode == 1
    assert result.stderr.decode() == "fscache: BadPath: '.': path is empty\n"


def test_serve_says_its_limits_in_one_line_and_no_more(root):
    proc = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parse_serving_line(proc.stdout.readline()) is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    lines = err.splitlines()
    assert len(lines) == 1 and " INFO limits: max_connections 1024, " in lines[0], err
    assert ", open files " in lines[0]


def test_the_readmes_python_example_runs_after_its_command_line_block(served, tmp_path):
    """The README's first Python example, against the server its command-line block
    used (that block made ``archive``), twice: it is idempotent."""
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    host, port = served.rsplit(":", 1)
    example = example.replace('"127.0.0.1", 7710', f"{host!r}, {port}")
    assert fscache_command("mkdir", served, "archive").returncode == 0
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", example], capture_output=True, text=True, timeout=60,
            cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr


def test_blocking_client_from_many_threads(served):
    with fscache.connect(served) as c:
        c.write("t", b"x")
        errors: list[BaseException] = []

        def hammer() -> None:
            try:
                for _ in range(200):
                    assert c.read("t") == b"x"
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


async def test_one_connection_carries_many_concurrent_requests_and_approvals(nursery, root):
    """Over plain TCP a request's own task reads the socket while it waits, the
    others follow, and an idle reader takes over between requests: with 30 tasks
    sharing one client while another client keeps writing (so approval requests
    arrive in between replies), every read after a completed write sees it."""
    settings = ServerSettings(root=str(root), port=0, hot_writes=0)  # every read leased
    server = await nursery.start(serve, settings)
    async with (
        fscache.open_client("127.0.0.1", server.port) as reader,
        fscache.open_client("127.0.0.1", server.port) as writer,
    ):

        async def rounds(i: int) -> None:
            for n in range(15):
                value = f"{i}:{n}".encode()
                await writer.write(f"shared/{i}", value)
                assert await reader.read(f"shared/{i}") == value
                assert await reader.read(f"shared/{i}") == value  # now from the cache

        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(rounds, i)
        assert reader.stats["approvals"] >= 30 * 14  # each write after the first
        assert reader.stats["hits"] >= 30 * 15


async def test_a_cancelled_request_hands_the_socket_on(nursery, root):
    """Two reads wait behind writes that wait out a silent holder's lease. The first
    is the task reading the socket; it is cancelled, and the other (a follower)
    must take the socket over and get its reply when its write is done."""
    settings = ServerSettings(root=str(root), port=0, term=1.0, skew=0.1, hot_writes=0)
    server = await nursery.start(serve, settings)
    for name in ("held", "held2", "free"):
        (root / name).write_bytes(b"old")
    holder = await FrameConnection.open("127.0.0.1", server.port)  # reads, then is silent
    await holder.call(read_frame(1, "held"))
    await holder.call(read_frame(2, "held2"))
    async with (
        fscache.open_client("127.0.0.1", server.port) as writer,
        fscache.open_client("127.0.0.1", server.port) as reader,
    ):
        results: dict[str, bytes] = {}

        async def follower() -> None:
            results["held2"] = await reader.read("held2")

        started = trio.current_time()
        with trio.fail_after(2.5):  # a stuck socket would end in Unavailable after 3 s
            async with trio.open_nursery() as inner:
                inner.start_soon(writer.write, "held", b"new")
                inner.start_soon(writer.write, "held2", b"new2")
                await trio.sleep(0.05)
                with trio.move_on_after(0.2) as timeout:
                    inner.start_soon(follower)  # starts after us: we read, it follows
                    await reader.read("held")
                assert timeout.cancelled_caught
                assert await reader.read("free") == b"old"  # the socket still works
        assert results["held2"] == b"new2"
        assert await reader.read("held") == b"new"
        assert trio.current_time() - started >= 1.0  # the writes did wait for the lease
    await holder.aclose()
