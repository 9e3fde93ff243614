"""Hardening: one spelling per file, one server per tree, private files, and disk
errors that harm nothing.

Test rules: 127.0.0.1 and port 0 only. Lease timing runs on the mock clock over
memory streams (:mod:`tests.harness`); the root lock is shown with real processes
and SIGKILL; a full disk is a real, small tmpfs (skipped, with the reason, where it
cannot be mounted); I/O errors and a failing fsync are monkeypatched into ``os``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import fscache
from fscache import protocol as p
from fscache.client.client import open_client
from fscache.errors import BadPath, FscacheError, NotDurable
from fscache.paths import normalize, normalize_key
from fscache.server.service import STORAGE_WARNING_INTERVAL, ServerSettings
from fscache.server.store import LOCK_FILE, TEMP_PREFIX, Store

from .harness import Cluster, RawPeer
from .test_faults import running_server

MAX = 4 << 20
NFD = "cafe\u0301"  # "café" as e, combining acute accent
NFC = "caf\u00e9"


def temp_files(root: Path) -> list[Path]:
    return [path for path in root.rglob(f"{TEMP_PREFIX}*")]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# ---------------------------------------------------------------- one spelling per file
def test_a_path_is_put_in_nfc_and_its_lease_key_too() -> None:
    assert normalize(f"docs/{NFD}") == f"docs/{NFC}"
    assert normalize(f"{NFD}//x/") == f"{NFC}/x"
    assert normalize_key(f"{NFD}/") == f"{NFC}/"
    assert normalize(NFC) == NFC


@pytest.mark.parametrize(
    "path", [".FSCACHE", ".Fscache-tmp-1", "a/.fScAcHe/x", ".FSCACHE-TMP-0", ".f\u017fcache"]
)
def test_the_reserved_name_is_reserved_in_any_case(path: str) -> None:
    with pytest.raises(BadPath, match="reserved"):
        normalize(path)


def test_the_store_hides_names_no_client_can_spell(root: Path) -> None:
    store = Store(root, max_file_size=MAX)
    (root / ".FSCACHE-mine").write_bytes(b"x")  # reserved, in another case
    (root / NFD).write_bytes(b"x")  # made by another program, not in NFC
    store.write(NFC, b"y")
    assert store.listdir("") == [NFC]
    with pytest.raises(BadPath):
        store.read(".FSCACHE-mine")


async def test_two_spellings_of_one_name_share_one_lease(
    nursery: trio.Nursery, root: Path, autojump_clock: Any
) -> None:
    cluster = Cluster(nursery, root, term=10.0, skew=0.1)
    await cluster.start()
    async with cluster.client("a") as a, cluster.client("b") as b:
        await a.write(NFD, b"v1")
        assert await b.read(NFC) == b"v1"  # b caches it, under the NFC key
        start = trio.current_time()
        await a.write(NFD, b"v2")  # b is asked to approve: the same key
        assert trio.current_time() == start  # approved at once, not waited out
        assert await b.read(NFC) == b"v2"
    assert sorted(os.listdir(root)) == [".fscache", NFC]  # one file, spelled in NFC


# ---------------------------------------------------------------- one server per tree
@contextlib.contextmanager
def server_process(root: Path) -> Iterator[subprocess.Popen[str]]:
    """``fscache serve`` on ``root`` in a child process; SIGKILLed and reaped on exit."""
    command = [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            yield process
        finally:
            process.kill()


def serving(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()  # "" if it exited instead
    assert line.startswith("fscache serving"), (line, process.poll())
    return line


def test_a_second_server_on_one_root_is_refused_and_a_restart_after_sigkill_works(
    root: Path,
) -> None:
    with server_process(root) as first:
        serving(first)
        (root / ".fscache" / f"{TEMP_PREFIX}live").write_bytes(b"in flight")
        with server_process(root) as second:
            _, err = second.communicate(timeout=60)
        assert second.returncode == 1, err
        assert f"another fscache server (pid {first.pid}) is serving" in err
        assert temp_files(root) != []  # the refused server removed nothing
        first.kill()  # SIGKILL: no clean shutdown; the kernel lets go of the lock
        first.wait()
        with server_process(root) as third:
            serving(third)
            assert temp_files(root) == []  # the new owner recovered the tree


def test_the_root_lock_is_held_until_close(root: Path) -> None:
    owner = Store(root, max_file_size=MAX, exclusive=True)
    with pytest.raises(FscacheError, match=f"pid {os.getpid()}"):
        Store(root, max_file_size=MAX, exclusive=True)
    Store(root, max_file_size=MAX)  # a store that does not ask for the lock is not refused
    owner.close()
    Store(root, max_file_size=MAX, exclusive=True).close()
    assert mode(root / ".fscache" / LOCK_FILE) == 0o600


def test_a_server_inside_a_served_tree_is_refused_naming_the_outer_root(root: Path) -> None:
    """Two servers whose trees overlap would each change files the other's clients
    hold leases on, unseen: the second to start is refused, whichever is inside."""
    inner = root / "sub" / "deeper"
    inner.mkdir(parents=True)
    with server_process(root) as outer:
        serving(outer)
        with server_process(inner) as nested:
            _, err = nested.communicate(timeout=60)
    assert nested.returncode == 1, err
    assert err == (
        f"fscache: another fscache server (pid {outer.pid}) is serving {root},"
        f" which contains {inner}: one server per tree\n"
    )


def test_a_store_above_or_below_a_served_root_is_refused_and_a_stale_lock_is_not(
    tmp_path: Path,
) -> None:
    outer = tmp_path / "outer"
    inner = outer / "a" / "inner"
    (inner / "x").mkdir(parents=True)
    owner = Store(inner, max_file_size=MAX, exclusive=True)
    (inner / f"{TEMP_PREFIX}live").write_bytes(b"in flight")
    with pytest.raises(FscacheError, match=f"serving {inner}, inside {outer}: one server"):
        Store(outer, max_file_size=MAX, exclusive=True)
    assert temp_files(inner) != []  # the refused store removed nothing of the inner's
    with pytest.raises(FscacheError, match=f"serving {inner}, which contains {inner / 'x'}:"):
        Store(inner / "x", max_file_size=MAX, exclusive=True)
    assert not (outer / "a" / ".fscache").exists()  # a look above makes nothing there
    owner.close()  # its lock stays on disk, held by no one
    Store(outer, max_file_size=MAX, exclusive=True).close()  # the refused one let go too
    Store(inner / "x", max_file_size=MAX, exclusive=True).close()


# ---------------------------------------------------------------- private by default
@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(
    ("shared", "file_mode", "dir_mode"), [(False, 0o600, 0o700), (True, 0o640, 0o750)]
)
def test_what_the_store_creates_is_private_unless_shared(
    root: Path, shared: bool, file_mode: int, dir_mode: int
) -> None:
    with umask(0):
        store = Store(root, max_file_size=MAX, shared=shared)
        store.write("a/b/written", b"x")  # makes a and a/b
        store.write_range("a/in-place", 0, b"x")
        store.mkdir("made")
        upload = store.upload_begin("uploaded")
        store.upload_part(upload, 0, b"x")
        store.upload_commit(upload)
        store.save_state("record", b"x")
    for name in ("a/b/written", "a/in-place", "uploaded"):
        assert mode(root / name) == file_mode, name
    for name in ("a", "a/b", "made"):
        assert mode(root / name) == dir_mode, name
    assert mode(root / ".fscache") == 0o700 if not shared else 0o750
    assert mode(root / ".fscache" / "record") == file_mode


def test_serve_shared_is_one_flag() -> None:
    from fscache.cli import build_parser

    args = build_parser().parse_args(["serve", "--root", "/x", "--shared"])
    assert args.shared is True
    assert ServerSettings(root="/x").shared is False


# ---------------------------------------------------------------- a change that is not durable
def fsync_failing_on(kind: Callable[[int], bool]) -> Callable[[int], None]:
    real = os.fsync

    def fsync(fd: int) -> None:
        if kind(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    return fsync


@pytest.mark.parametrize("op", ["write", "upload", "delete", "rename", "write_range"])
def test_a_failed_fsync_after_the_change_says_it_may_not_be_durable(
    root: Path, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    store = Store(root, max_file_size=MAX)
    store.write("f", b"old")
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"new")
    store.upload_sync(upload)
    failing = stat.S_ISREG if op == "write_range" else stat.S_ISDIR
    monkeypatch.setattr(os, "fsync", fsync_failing_on(failing))
    change: dict[str, Callable[[], object]] = {
        "write": lambda: store.write("f", b"new"),
        "upload": lambda: store.upload_commit(upload),
        "delete": lambda: store.delete("f"),
        "rename": lambda: store.rename("f", "g"),
        "write_range": lambda: store.write_range("f", 0, b"new"),
    }
    with pytest.raises(NotDurable, match=r"I/O error.*may or may not be durable"):
        change[op]()
    monkeypatch.undo()
    store.upload_abort(upload)
    assert temp_files(root) == []
    if op in ("delete", "rename"):
        assert not (root / "f").exists()  # the change is visible: the old file is gone
    else:
        assert store.read("f")[1] == b"new"


async def test_a_write_that_may_not_be_durable_leaves_no_lease_on_the_old_contents(
    nursery: trio.Nursery, root: Path, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    term, skew = 10.0, 0.1
    cluster = Cluster(nursery, root, term=term, skew=skew)
    service = await cluster.start()
    async with cluster.client("reader") as reader, cluster.client("other") as other:
        await other.write("f", b"old")
        writer: RawPeer = await cluster.raw("writer")  # answers no approval request
        assert isinstance(await writer.read("f"), p.Data)  # writer holds a lease on "old"
        assert await reader.read("f") == b"old"
        monkeypatch.setattr(os, "fsync", fsync_failing_on(stat.S_ISDIR))
        await writer.send(p.Write(id=2, path="f", data=b"new"))
        reply = await writer.receive()
        monkeypatch.undo()
        assert isinstance(reply, p.Error) and reply.code == "not_durable", reply
        assert "may or may not be durable" in reply.message
        assert await reader.read("f") == b"new"  # the reader's copy was dropped
        # Had the writer kept its lease on the old contents, this write would wait
        # for its approval (it never answers) until term + skew.
        start = trio.current_time()
        await other.write("f", b"newer")
        assert trio.current_time() == start
        assert service.counters.errors == 1


# ---------------------------------------------------------------- a full or failing disk
@contextlib.asynccontextmanager
async def raw_peer(port: int) -> AsyncIterator[RawPeer]:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        peer = RawPeer(stream)
        await peer.send(p.Hello(version=p.PROTOCOL_VERSION, client_id="raw"))
        assert isinstance(await peer.receive(), p.Welcome)
        yield peer


async def call(peer: RawPeer, message: p.Message) -> p.Message | None:
    await peer.send(message)
    return await peer.receive()


def is_full(reply: p.Message | None) -> bool:
    return isinstance(reply, p.Error) and "disk is full" in reply.message


async def test_a_full_disk_fails_each_change_cleanly_and_the_server_goes_on(
    small_disk: Path,
) -> None:
    big = b"x" * (600 << 10)  # on the 1 MiB disk: fits once, not twice
    with trio.fail_after(60):
        async with (
            running_server(small_disk) as service,
            open_client("127.0.0.1", service.port, client_id="a") as a,
            open_client("127.0.0.1", service.port, client_id="b") as b,
            raw_peer(service.port) as raw,
        ):
            kept = {"keep": b"acknowledged", "d/deep": b"also"}
            for path, data in kept.items():
                await a.write(path, data)
            await a.write("big", big)
            before = sorted(p.name for p in small_disk.rglob("*"))

            with pytest.raises(FscacheError, match="disk is full"):
                await a.write("big2", big)  # whole-file write
            assert is_full(await call(raw, p.WriteRange(id=1, path="keep", offset=0, data=big)))
            assert await b.read("keep") == b"acknowledged"  # nothing torn in place
            assert isinstance(await call(raw, p.UploadBegin(id=2, path="up")), p.Done)
            replies = []
            half = len(big) // 2
            for i in range(2):
                data, offset = big[i * half : (i + 1) * half], i * half
                replies.append(
                    await call(raw, p.UploadPart(id=3 + i, upload=2, offset=offset, data=data))
                )
            assert any(is_full(reply) for reply in replies), replies
            filler = 0
            while filler < 100:  # the inodes run out: mkdir fails
                reply = await call(raw, p.MkDir(id=10 + filler, path=f"m{filler}"))
                if not isinstance(reply, p.Done):
                    break
                filler += 1
            assert is_full(reply), reply

            assert temp_files(small_disk) == []
            for path, data in kept.items():
                assert await b.read(path) == data
            assert (small_disk / "big").read_bytes() == big
            assert await a.listdir("") == sorted(
                ["big", "d/", "keep", *(f"m{i}/" for i in range(filler))]
            )
            assert sorted(p.name for p in small_disk.rglob("*")) == sorted(
                before + [f"m{i}" for i in range(filler)]
            )
            await a.delete("big")  # space again: writes work
            for i in range(filler):
                assert isinstance(await call(raw, p.RmDir(id=200 + i, path=f"m{i}")), p.Done)
            await a.write("big2", big)
            assert (await b.stat("big2")).size == len(big)
            assert (small_disk / "big2").read_bytes() == big


async def test_an_io_error_fails_the_write_and_the_server_goes_on(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write

    def failing_write(fd: int, data: Any) -> int:
        if bytes(data[:4]) == b"boom":
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    with trio.fail_after(30):
        async with (
            running_server(root) as service,
            open_client("127.0.0.1", service.port, client_id="a") as a,
        ):
            await a.write("f", b"old")
            monkeypatch.setattr(os, "write", failing_write)
            with pytest.raises(FscacheError, match="disk failed"):
                await a.write("f", b"boom")
            assert await a.read("f") == b"old"
            await a.write("g", b"fine")
            assert await a.read("g") == b"fine"
    assert temp_files(root) == []


async def test_storage_failures_are_logged_once_per_cause_and_interval(
    nursery: trio.Nursery,
    root: Path,
    autojump_clock: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full disk or a refused permission is the operator's to fix: a warning naming
    the operation and the path, at most one per cause per interval (the rest counted
    in the next one). The client's own mistakes are not logged."""
    caplog.set_level(logging.INFO, logger="fscache.events")
    cluster = Cluster(nursery, root)
    await cluster.start()
    errno_now = [errno.ENOSPC]

    def failing_rename(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno_now[0], os.strerror(errno_now[0]))

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", None) == "storage_failed"]

    async with cluster.client("a") as a:
        await a.write("f", b"old")
        with pytest.raises(fscache.NotFound):
            await a.read("missing")
        with pytest.raises(fscache.Conflict):
            await a.write("f", b"lost", if_version=1)
        monkeypatch.setattr(os, "rename", failing_rename)
        for _ in range(5):
            with pytest.raises(FscacheError, match="disk is full"):
                await a.write("f", b"new")
        errno_now[0] = errno.EACCES  # another cause: logged at once
        with pytest.raises(FscacheError, match="not permitted"):
            await a.write("f", b"new")
        await trio.sleep(STORAGE_WARNING_INTERVAL)
        errno_now[0] = errno.ENOSPC
        with pytest.raises(FscacheError, match="disk is full"):
            await a.write("g", b"new")
        monkeypatch.undo()
        assert await a.read("f") == b"old"

    logged = failures()
    assert all(r.levelno == logging.WARNING for r in logged)
    assert [r.fields["cause"] for r in logged] == ["ENOSPC", "EACCES", "ENOSPC"]
    assert [r.fields["suppressed"] for r in logged] == [0, 0, 4]
    assert all(r.fields["request"] == "write" for r in logged)
    assert "cannot write 'f': the store's disk is full" in logged[0].getMessage()
    assert "cannot write 'g'" in logged[2].getMessage()
    assert logged[2].getMessage().endswith("(and 4 more since the last one of these)")
    assert cluster.service is not None and cluster.service.counters.errors == 9
