"""Access rules (``docs/design.md``, "Security"): the pure rules, every request message
under them, the service refusing before any effect, and reload on SIGHUP.

Test rules: the rules themselves are pure and tested without I/O; service tests use
real TCP on 127.0.0.1, port 0 (TLS where identities matter); the reload test runs
``fscache serve`` as a real process and waits for its log lines, never for time.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest
import trio

import fscache
from fscache import protocol as p
from fscache.access import ANONYMOUS, Access, BadAccessFile, need, parse
from fscache.cli import parse_serving_line
from fscache.server.service import ServerSettings, serve
from fscache.tls import client_context, make_certs

from .harness import RawPeer

RULES = """\
default = "read"

[[rule]]
identity = "writer"
prefix = ""
access = "read-write"

[[rule]]
identity = "reader"
prefix = "inbox/reader"
access = "read-write"

[[rule]]
identity = "reader"
prefix = "secret"
access = "none"

[[rule]]
identity = "anonymous"
prefix = "pub"
access = "read"
"""

# One example of every message a client may send, with the access it needs.
EXAMPLES: dict[type[p.Message], tuple[p.Message, Access | None, tuple[str, ...]]] = {
    p.Hello: (p.Hello(version=1, client_id="c"), None, ()),
    p.Read: (p.Read(id=1, path="d/f"), Access.READ, ("d/f",)),
    p.Write: (p.Write(id=1, path="d/f", data=b"x"), Access.READ_WRITE, ("d/f",)),
    p.Delete: (p.Delete(id=1, path="d/f"), Access.READ_WRITE, ("d/f",)),
    p.Stat: (p.Stat(id=1, path=""), Access.READ, ("",)),
    p.ListDir: (p.ListDir(id=1, path="d"), Access.READ, ("d",)),
    p.Relinquish: (p.Relinquish(id=1, paths=["d/f"]), None, ()),
    p.Extend: (p.Extend(id=1, paths=["a", "b/c"], versions=[1, 2]), Access.READ, ("a", "b/c")),
    p.Approve: (p.Approve(path="d/f", write=3), None, ()),
    p.GetStats: (p.GetStats(id=1), None, ()),
    p.Ping: (p.Ping(id=1), None, ()),
    p.Goodbye: (p.Goodbye(), None, ()),
    p.ReadRange: (p.ReadRange(id=1, path="d/f", offset=0, length=9), Access.READ, ("d/f",)),
    p.UploadBegin: (p.UploadBegin(id=1, path="d/f"), Access.READ_WRITE, ("d/f",)),
    p.UploadPart: (p.UploadPart(id=2, upload=1, offset=0, data=b"x"), None, ()),
    p.UploadCommit: (p.UploadCommit(id=3, upload=1), None, ()),
    p.UploadAbort: (p.UploadAbort(id=3, upload=1), None, ()),
    p.WriteRange: (
        p.WriteRange(id=1, path="d/f", offset=4, data=b"x"),
        Access.READ_WRITE,
        ("d/f",),
    ),
    p.Truncate: (p.Truncate(id=1, path="d/f", size=0), Access.READ_WRITE, ("d/f",)),
    p.Rename: (p.Rename(id=1, src="a/x", dst="b/y"), Access.READ_WRITE, ("a/x", "b/y")),
    p.MkDir: (p.MkDir(id=1, path="d/n"), Access.READ_WRITE, ("d/n",)),
    p.RmDir: (p.RmDir(id=1, path="d/n"), Access.READ_WRITE, ("d/n",)),
    p.ScanDir: (p.ScanDir(id=1, path="d"), Access.READ, ("d",)),
    p.Acquire: (p.Acquire(1, "j/l", 5.0, "w", wait=True), Access.READ_WRITE, ("j/l",)),
    p.Renew: (p.Renew(id=1, name="j/l", token=1), Access.READ_WRITE, ("j/l",)),
    p.Release: (p.Release(id=1, name="j/l", token=1), Access.READ_WRITE, ("j/l",)),
    p.LockQuery: (p.LockQuery(id=1, name="j/l"), Access.READ, ("j/l",)),
    p.LockWatch: (p.LockWatch(id=1, name="j/l"), Access.READ, ("j/l",)),
}
WRITES = [m for m, access, _ in EXAMPLES.values() if access is Access.READ_WRITE]
READS = [m for m, access, _ in EXAMPLES.values() if access is Access.READ]


def test_every_client_message_has_a_need() -> None:
    assert set(EXAMPLES) == set(p.CLIENT_MESSAGES)
    for message, access, paths in EXAMPLES.values():
        required = need(message)
        assert (None if required is None else (required.access, required.paths)) == (
            None if access is None else (access, paths)
        ), message


def test_a_message_type_without_a_need_is_refused() -> None:
    with pytest.raises(fscache.ProtocolError, match="no access rule"):
        need(p.Welcome(2, "e", 1.0, 0.1, 1 << 20, session="s", secret=b"k", resumed=False))


def moved(message: p.Message, where: str) -> p.Message:
    """``message`` with every path it names put under ``where``."""
    import dataclasses

    fields = {f: f"{where}/x" for f in ("path", "src", "dst", "name") if hasattr(message, f)}
    if isinstance(message, p.Extend):
        return dataclasses.replace(message, paths=[f"{where}/x"], versions=[1])
    return dataclasses.replace(message, **fields)  # type: ignore[type-var]


@pytest.mark.parametrize("message", WRITES, ids=lambda m: m.TYPE)
def test_a_read_only_identity_cannot_write_in_any_way(message: p.Message) -> None:
    rules = parse(RULES)
    with pytest.raises(fscache.Unauthorized, match=r"'carol' may not write 'docs/x'"):
        rules.check_request("carol", moved(message, "docs"))  # carol: the default, read
    rules.check_request("writer", moved(message, "docs"))
    rules.check_request("reader", moved(message, "inbox/reader"))  # its own prefix
    with pytest.raises(fscache.Unauthorized):
        rules.check_request("reader", moved(message, "inbox/readerx"))  # whole segments only


@pytest.mark.parametrize("message", READS, ids=lambda m: m.TYPE)
def test_reads_follow_the_longest_prefix_and_the_default(message: p.Message) -> None:
    rules = parse(RULES)
    rules.check_request("carol", moved(message, "docs"))
    rules.check_request("reader", moved(message, "docs"))
    with pytest.raises(fscache.Unauthorized, match=r"'reader' may not read 'secret/x'"):
        rules.check_request("reader", moved(message, "secret"))
    rules.check_request(ANONYMOUS, moved(message, "pub"))
    with pytest.raises(fscache.Unauthorized, match="'anonymous'"):
        rules.check_request(ANONYMOUS, moved(message, "docs"))  # no default for anonymous


def test_a_rename_needs_write_on_both_names() -> None:
    rules = parse(RULES)
    rules.check_request("reader", p.Rename(id=1, src="inbox/reader/a", dst="inbox/reader/b"))
    with pytest.raises(fscache.Unauthorized, match="'docs/b'"):
        rules.check_request("reader", p.Rename(id=1, src="inbox/reader/a", dst="docs/b"))
    with pytest.raises(fscache.Unauthorized, match="'docs/a'"):
        rules.check_request("reader", p.Rename(id=1, src="docs/a", dst="inbox/reader/b"))


def test_levels_and_defaults() -> None:
    rules = parse(RULES)
    assert rules.level("writer", "any/where") is Access.READ_WRITE
    assert rules.level("reader", "secret") is Access.NONE
    assert rules.level("reader", "secretary") is Access.READ
    assert rules.level("reader", "") is Access.READ
    assert rules.level(ANONYMOUS, "pub") is Access.READ
    assert rules.level(ANONYMOUS, "") is Access.NONE
    empty = parse("")
    assert empty.level("someone", "x") is Access.NONE  # no default: nothing


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('default = "read"\ndefault = "none"\n', "line 2"),  # tomllib: a syntax error
        ('[[rule]]\nidentity = "a"\nprefix = \n', "line 3"),
        ('\ndefault = "rw"\n', r"line 2\): default: 'rw' is not one of none, read, read-write"),
        ('default = "read"\nwho = 1\n', r"line 2\): unknown key 'who'"),
        (RULES + '\n[[rule]]\nidentity = "x"\nprefix = "a"\n', r"line 23\): rule\[4\]: missing"),
        # a value's fault: the line of its key, not the table's (line 22)
        (RULES + '[[rule]]\nidentity = "x"\nprefix = "/a"\naccess = "read"',
         r"line 24\): rule\[4\]\.prefix"),
        (RULES + '[[rule]]\nidentity = "x"\nprefix = "a"\n\n# why\naccess = "all"',
         r"line 27\): rule\[4\]\.access: 'all' is not one of"),
        (RULES + '[[rule]]\n"identity" = ""\nprefix = "a"\naccess = "read"',
         r"line 23\): rule\[4\]\.identity"),
        (RULES + '[[rule]]\nidentity = "x"\nprefix = "a"\naccess = "read"\nwho = 1',
         r"line 26\): rule\[4\]: unknown key 'who'"),
        ('rule = [{identity = "x", prefix = "a", access = "all"}]',  # inline: no line
         r"^access.toml: rule\[0\]\.access"),
        (RULES + '\n[[rule]]\nidentity = "reader"\nprefix = "secret/"\naccess = "read"\n',
         r"rule\[4\]: repeats identity 'reader' and prefix 'secret' of rule\[2\]"),
        ('rule = "everything"\n', "array of tables"),
    ],
)  # fmt: skip
def test_an_invalid_file_is_refused_with_line_and_reason(text: str, where: str) -> None:
    with pytest.raises(BadAccessFile, match=where):
        parse(text, source="access.toml")


def test_a_start_refused_for_its_access_file_leaves_no_restart_window(
    root: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A refused start served nothing: the next start must not wait out its leases."""
    bad = tmp_path / "bad.toml"
    bad.write_text('default = "read"\n\n[[rule]]\nidentity = "a"\nprefix = ""\naccess = "all"\n')
    serve = [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0"]
    for access in (bad, tmp_path / "missing.toml"):
        refused = subprocess.run(
            [*serve, "--access", str(access)], capture_output=True, text=True, timeout=30
        )
        assert refused.returncode == 1, refused.stderr
        assert str(access) in refused.stderr and "Traceback" not in refused.stderr
    proc = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    try:
        assert parse_serving_line(proc.stdout.readline()) is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()  # what readline buffered too
        proc.wait(timeout=30)
        proc.stdout.close()
    assert "restart window" not in out, out


# ---------------------------------------------------------------- the service
@pytest.fixture
def tls(tmp_path: pathlib.Path) -> pathlib.Path:
    make_certs(tmp_path / "tls", clients=["writer", "reader"])
    return tmp_path / "tls"


async def test_the_service_refuses_before_any_effect_by_certificate_identity(
    nursery: Any, root: pathlib.Path, tmp_path: pathlib.Path, tls: pathlib.Path
) -> None:
    access = tmp_path / "access.toml"
    access.write_text(RULES)
    settings = ServerSettings(
        root=str(root), port=0, tls_dir=str(tls / "server"), access_file=str(access)
    )
    server = await nursery.start(serve, settings)

    def client(name: str) -> Any:
        ctx = client_context(tls / "clients" / name)
        return fscache.open_client("127.0.0.1", server.port, ssl_context=ctx)

    async with client("writer") as writer, client("reader") as reader:
        await writer.write("docs/a", b"1")
        await writer.write("secret/s", b"s")
        assert await reader.read("docs/a") == b"1"
        with pytest.raises(fscache.Unauthorized, match="'reader' may not write 'docs/a'"):
            await reader.write("docs/a", b"2")
        with pytest.raises(fscache.Unauthorized, match="'reader' may not write 'docs/a'"):
            await reader.delete("docs/a")
        with pytest.raises(fscache.Unauthorized, match="'reader' may not read 'secret/s'"):
            await reader.read("secret/s")
        await reader.write("inbox/reader/note", b"n")
        assert await writer.read("docs/a") == b"1"  # nothing changed
        identities = sorted(c.identity for c in server.connections.values())
        assert identities == ["reader", "writer"]
    assert (root / "docs" / "a").read_bytes() == b"1"
    assert (root / "inbox" / "reader" / "note").read_bytes() == b"n"


def test_sighup_reloads_the_rules_and_keeps_connections(
    root: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    access = tmp_path / "access.toml"
    access.write_text('[[rule]]\nidentity = "anonymous"\nprefix = ""\naccess = "read-write"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0",
         "--access", str(access)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None

    def log_line(containing: str) -> str:
        for line in proc.stderr:  # type: ignore[union-attr]
            if containing in line:
                return line
        raise AssertionError(f"the server exited without logging {containing!r}")

    try:
        address = parse_serving_line(proc.stdout.readline())
        assert address is not None
        log_line("access rules from")
        with fscache.connect(f"{address[0]}:{address[1]}") as c:
            c.write("a", b"1")
            access.write_text('[[rule]]\nidentity = "anonymous"\nprefix = ""\naccess = "read"\n')
            proc.send_signal(signal.SIGHUP)
            assert "0 identit" not in log_line("access rules from")
            with pytest.raises(fscache.Unauthorized, match="'anonymous' may not write 'a'"):
                c.write("a", b"2")
            assert c.read("a") == b"1"

            access.write_text('[[rule]]\nidentity = "anonymous"\nprefix = \n')
            proc.send_signal(signal.SIGHUP)
            refused = log_line("not reloaded")
            assert "line 3" in refused, refused
            with pytest.raises(fscache.Unauthorized):  # the old rules stay
                c.write("a", b"3")
            assert c.read("a") == b"1"
            assert c.server_stats()["connections_total"] == 1  # one connection throughout
        assert (root / "a").read_bytes() == b"1"
    finally:
        proc.terminate()
        proc.communicate()


@pytest.mark.parametrize("with_tls", [False, True], ids=["plain", "tls"])
def test_sighup_without_an_access_file_is_logged_and_the_server_serves_on(
    root: pathlib.Path, tls: pathlib.Path, with_tls: bool
) -> None:
    args = ["--root", str(root), "--port", "0"]
    context = None
    if with_tls:
        args += ["--tls", str(tls / "server")]
        context = client_context(tls / "clients" / "writer")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        address = parse_serving_line(proc.stdout.readline())
        assert address is not None
        for line in proc.stderr:  # the log's first line: the limits
            assert " INFO limits: " in line, line
            break
        proc.send_signal(signal.SIGHUP)
        for line in proc.stderr:
            if "SIGHUP" in line:
                assert " INFO " in line and "no access file" in line, line
                break
        with fscache.connect(f"{address[0]}:{address[1]}", ssl_context=context) as c:
            c.write("a", b"1")
            assert c.read("a") == b"1"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "still live" not in out  # stopped cleanly: the next start holds no writes
    assert json.loads((root / ".fscache" / "incarnation.json").read_text())["clean"] is True


def test_the_command_line_tells_a_refused_request_from_a_refused_certificate(
    root: pathlib.Path, tmp_path: pathlib.Path, tls: pathlib.Path
) -> None:
    """Exit 1 for what the access rules refuse (the certificate was accepted), 4 for a
    certificate TLS refused."""
    access = tmp_path / "access.toml"
    access.write_text(RULES)
    make_certs(tmp_path / "strangers", clients=["writer"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0",
         "--tls", str(tls / "server"), "--access", str(access)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        address = parse_serving_line(proc.stdout.readline())
        assert address is not None
        where = f"{address[0]}:{address[1]}"

        def write(bundle: pathlib.Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "fscache", "write", where, "docs/a", "-",
                 "--tls", str(bundle)],
                input="x", capture_output=True, text=True, timeout=30,
            )  # fmt: skip

        assert write(tls / "clients" / "writer").returncode == 0
        refused = write(tls / "clients" / "reader")
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("fscache: Unauthorized: ")
        assert "'reader' may not write 'docs/a'" in refused.stderr
        stranger = write(tmp_path / "strangers" / "clients" / "writer")
        assert stranger.returncode == 4, stranger.stderr
        assert stranger.stderr.startswith("fscache: unauthorized: ")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


async def test_an_upload_is_checked_again_at_commit(
    nursery: Any, root: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Parts and the commit name no path: the commit is checked against the upload's
    path under the rules in force then, and a refused upload leaves nothing behind."""
    access = tmp_path / "access.toml"
    access.write_text('[[rule]]\nidentity = "anonymous"\nprefix = ""\naccess = "read-write"\n')
    settings = ServerSettings(root=str(root), port=0, access_file=str(access))
    server = await nursery.start(serve, settings)
    peer = RawPeer(await trio.open_tcp_stream("127.0.0.1", server.port))
    await peer.send(p.Hello(version=p.PROTOCOL_VERSION, client_id="raw"))
    assert isinstance(await peer.receive(), p.Welcome)
    await peer.send(p.UploadBegin(id=1, path="up"))
    assert await peer.receive() == p.Done(id=1)
    await peer.send(p.UploadPart(id=2, upload=1, offset=0, data=b"data"))
    assert await peer.receive() == p.Done(id=2)
    server.access = parse('[[rule]]\nidentity = "anonymous"\nprefix = ""\naccess = "read"\n')
    await peer.send(p.UploadCommit(id=3, upload=1))
    refused = await peer.receive()
    assert isinstance(refused, p.Error) and refused.code == "unauthorized", refused
    assert "'anonymous' may not write 'up'" in refused.message
    await peer.close()
    assert sorted(os.listdir(root)) == [".fscache"]  # no file, no temp file
