"""Tests of the durable store (fscache.server.store): plain blocking code, real files."""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from fscache.errors import (
    BadPath,
    Conflict,
    FscacheError,
    IsADirectory,
    NoSpace,
    NotADirectory,
    NotFound,
    TooLarge,
    error_for_code,
)
from fscache.paths import RESERVED_PREFIX
from fscache.server import store as store_mod
from fscache.server.store import TEMP_PREFIX, Store

MAX = 1 << 16


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


@pytest.fixture
def store(root: Path) -> Store:
    return Store(root, max_file_size=MAX)


def temp_files(root: Path) -> list[str]:
    return sorted(
        os.path.join(d, n)
        for d, _, names in os.walk(root)
        for n in names
        if n.startswith(TEMP_PREFIX)
    )


# ------------------------------------------------------------------- round trips


def test_write_read_stat_round_trip(store: Store, root: Path) -> None:
    version = store.write("a.txt", b"hello")
    assert store.read("a.txt") == (version, b"hello")
    assert store.stat("a.txt") == (version, 5, False)
    assert (root / "a.txt").read_bytes() == b"hello"
    assert version_of(os.stat(root / "a.txt")) == version


def test_empty_file(store: Store) -> None:
    version = store.write("empty", b"")
    assert store.read("empty") == (version, b"")
    assert store.stat("empty") == (version, 0, False)


def test_exactly_max_size_is_fine(store: Store) -> None:
    data = os.urandom(MAX)
    version = store.write("big", data)
    assert store.read("big") == (version, data)


def test_nested_paths_create_directories(store: Store, root: Path) -> None:
    version = store.write("a/b/c/d.bin", b"deep")
    assert (root / "a" / "b" / "c").is_dir()
    assert store.read("a/b/c/d.bin") == (version, b"deep")
    dir_version, size, is_dir = store.stat("a/b")
    assert is_dir and size == 0
    assert dir_version == os.stat(root / "a" / "b").st_mtime_ns
    store.write("a/b/other", b"x")  # an existing directory is reused
    assert store.listdir("a/b") == ["c/", "other"]


def test_listdir(store: Store, root: Path) -> None:
    store.write("z", b"1")
    store.write("b/x", b"2")
    store.write("a", b"3")
    (root / "emptydir").mkdir()
    assert store.listdir("") == ["a", "b/", "emptydir/", "z"]
    assert store.listdir("b") == ["x"]
    assert store.listdir("emptydir") == []


def test_listdir_hides_temp_and_reserved_names(store: Store, root: Path) -> None:
    store.write("d/keep", b"k")
    (root / f"{TEMP_PREFIX}0123abcd").write_bytes(b"half a write")
    (root / "d" / f"{TEMP_PREFIX}ffff").write_bytes(b"")
    (root / ".fscache-other").mkdir()
    assert store.listdir("") == ["d/"]
    assert store.listdir("d") == ["keep"]


def test_delete(store: Store, root: Path) -> None:
    store.write("d/f", b"x")
    store.delete("d/f")
    assert not (root / "d" / "f").exists()
    with pytest.raises(NotFound):
        store.read("d/f")
    with pytest.raises(NotFound):
        store.stat("d/f")
    assert store.listdir("d") == []  # the directory stays


def test_overwrite_replaces_contents(store: Store) -> None:
    store.write("f", b"a much longer first version")
    version = store.write("f", b"short")
    assert store.read("f") == (version, b"short")


# ---------------------------------------------------------------------- versions


def test_versions_strictly_increase_across_writes(store: Store) -> None:
    versions = [store.write("f", str(i).encode()) for i in range(50)]
    assert versions == sorted(set(versions))
    assert store.read("f") == (versions[-1], b"49")


def test_versions_increase_across_delete_and_recreate(store: Store) -> None:
    v1 = store.write("f", b"one")
    store.delete("f")
    v2 = store.write("f", b"two")
    assert v2 > v1


def test_versions_increase_across_restart(root: Path) -> None:
    v1 = Store(root, max_file_size=MAX).write("f", b"one")
    again = Store(root, max_file_size=MAX)
    assert again.read("f") == (v1, b"one")
    assert again.write("f", b"two") > v1


def test_versions_increase_with_a_frozen_or_backward_clock(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(root, max_file_size=MAX)
    real = store.write("f", b"real clock")
    monkeypatch.setattr(store_mod, "time_ns", lambda: 1_000)  # far in the past, frozen
    a = store.write("f", b"a")
    assert os.stat(root / "f").st_mtime_ns == real + 1  # the stamp: just above the last
    b = store.write("f", b"b")
    assert real < a < b
    store.delete("f")
    c = store.write("f", b"c")
    assert c > b and os.stat(root / "f").st_mtime_ns == b + 1  # the in-memory floor
    store.write("g", b"new path")
    assert os.stat(root / "g").st_mtime_ns == 1_000  # a new path: the clock's value
    restarted = Store(root, max_file_size=MAX)
    d = restarted.write("f", b"d")  # above the file's own version
    assert d > c and restarted.read("f") == (d, b"d")


def test_versions_increase_on_coarse_timestamps(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system that keeps whole seconds only: the store moves the stamp forward."""
    second = 10**9
    real_utime = os.utime

    def coarse_utime(fd: int, *, ns: tuple[int, int]) -> None:
        real_utime(fd, ns=(ns[0] // second * second, ns[1] // second * second))

    store = Store(root, max_file_size=MAX)
    monkeypatch.setattr(store_mod, "time_ns", lambda: 5 * second + 123)
    monkeypatch.setattr(os, "utime", coarse_utime)
    versions = [store.write("f", bytes([i])) for i in range(4)]
    assert versions == sorted(set(versions))  # strictly increasing
    mtime = os.stat(root / "f").st_mtime_ns
    assert mtime % second == 0 and mtime > versions[2]  # whole seconds, above the last
    assert store.read("f") == (versions[3], b"\x03")


# ---------------------------------------------------------------- compare-and-set


def test_if_version_success(store: Store) -> None:
    v0 = store.write("f", b"new", if_version=0)  # 0: must not exist yet
    v1 = store.write("f", b"next", if_version=v0)
    assert v1 > v0
    store.delete("f", if_version=v1)
    with pytest.raises(NotFound):
        store.stat("f")


def test_if_version_conflict_changes_nothing(store: Store, root: Path) -> None:
    v0 = store.write("f", b"original")
    with pytest.raises(Conflict):
        store.write("f", b"lost", if_version=v0 - 1)
    with pytest.raises(Conflict):
        store.write("f", b"lost", if_version=0)
    with pytest.raises(Conflict):
        store.delete("f", if_version=v0 + 1)
    assert store.read("f") == (v0, b"original")
    with pytest.raises(Conflict):
        store.write("absent", b"x", if_version=v0)
    with pytest.raises(NotFound):
        store.stat("absent")
    assert temp_files(root) == []


def test_compare_and_set_is_atomic_between_threads(store: Store) -> None:
    """Threads increment a counter with read + write(if_version): no update is lost."""
    store.write("counter", b"0")
    wins = [0] * 8

    def worker(i: int) -> None:
        for _ in range(15):
            while True:
                version, data = store.read("counter")
                try:
                    store.write("counter", str(int(data) + 1).encode(), if_version=version)
                except Conflict:
                    continue
                wins[i] += 1
                break

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(wins))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.read("counter")[1] == str(sum(wins)).encode() == b"120"


def test_a_read_that_opened_a_file_then_replaced_reads_the_new_one(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacing a file moves the old inode's ctime, its version: a read whose open
    came before the replace and whose fstat after it would pair the old bytes with
    the new file's version (and a compare-and-set on it would win). It reads anew."""
    store.write("f", b"old")
    real_open = store._open_for_read
    replaced: list[int] = []

    def open_then_replace(path: str) -> int:
        fd = real_open(path)
        if not replaced:
            replaced.append(store.write("f", b"new"))
        return fd

    monkeypatch.setattr(store, "_open_for_read", open_then_replace)
    assert store.read("f") == (replaced[0], b"new")
    replaced.clear()
    assert store.read_range("f", 0, 10) == (replaced[0], 3, b"new")
    replaced.clear()
    store.delete("f")
    store.write("f", b"x")

    def open_then_delete(path: str) -> int:
        fd = real_open(path)  # the second open finds nothing: NotFound
        store.delete("f")
        return fd

    monkeypatch.setattr(store, "_open_for_read", open_then_delete)
    with pytest.raises(NotFound):
        store.read("f")


# -------------------------------------------------------------------------- errors


def test_not_found(store: Store) -> None:
    store.write("file", b"x")
    calls: list[Callable[[], object]] = [
        lambda: store.read("missing"),
        lambda: store.stat("missing"),
        lambda: store.delete("missing"),
        lambda: store.delete("missing", if_version=123),
        lambda: store.listdir("missing"),
        lambda: store.read("no/such/dir/f"),
        lambda: store.read("file/below"),  # a parent is a file
        lambda: store.listdir("file/below"),
    ]
    for call in calls:
        with pytest.raises(NotFound):
            call()


def test_is_a_directory(store: Store, root: Path) -> None:
    store.write("dir/f", b"x")
    with pytest.raises(IsADirectory):
        store.read("dir")
    with pytest.raises(IsADirectory):
        store.write("dir", b"y")
    with pytest.raises(IsADirectory):
        store.delete("dir")
    with pytest.raises(NotADirectory):
        store.listdir("dir/f")  # a file where a directory was expected: as scandir says
    with pytest.raises(IsADirectory):
        store.write("dir/f/g", b"y")  # a parent is a file
    with pytest.raises(IsADirectory):
        store.write("", b"y")
    with pytest.raises(IsADirectory):
        store.read("")
    assert (root / "dir").is_dir()
    assert store.read("dir/f")[1] == b"x"
    assert temp_files(root) == []


def test_too_large(store: Store, root: Path) -> None:
    with pytest.raises(TooLarge):
        store.write("big", b"x" * (MAX + 1))
    assert not (root / "big").exists()
    assert temp_files(root) == []
    (root / "outsider").write_bytes(b"y" * (MAX + 1))  # put there by another program
    with pytest.raises(TooLarge):
        store.read("outsider")
    assert store.stat("outsider")[1:] == (MAX + 1, False)


def test_bad_root(tmp_path: Path) -> None:
    with pytest.raises(FscacheError, match="does not exist"):
        Store(tmp_path / "missing", max_file_size=MAX)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(FscacheError, match="not a directory"):
        Store(tmp_path / "file", max_file_size=MAX)


def test_a_root_on_a_read_only_file_system_is_refused_naming_the_cause(tmp_path: Path) -> None:
    """Not the user's permissions: the mount. A store that only reads may use it."""
    mnt = tmp_path / "rofs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mnt)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs: {done.stderr.strip() or done.returncode}")
    try:
        with pytest.raises(FscacheError) as refused:
            Store(mnt, max_file_size=MAX, exclusive=True)
        assert str(refused.value) == (
            f"store root {str(mnt)!r} is on a read-only file system (EROFS):"
            " a server writes its state there"
        )
        assert Store(mnt, max_file_size=MAX).listdir("") == []
    finally:
        subprocess.run(["umount", "--lazy", str(mnt)], check=True)


@pytest.mark.parametrize(
    ("mode", "exclusive", "may"),
    [(0o555, True, "readable and writable"), (0o000, False, "readable")],
    ids=["a server's store, read-only", "unreadable"],
)
def test_a_root_this_user_may_not_use_is_refused_by_name(
    mode: int, exclusive: bool, may: str
) -> None:
    """A real user without the access (root may write anywhere: then the store is
    opened as nobody, in a child process, under a directory nobody may enter). A
    server's store writes its state in the root; a store that only reads need not."""
    base = Path(tempfile.mkdtemp(prefix="fscache-access-"))
    try:
        base.chmod(0o755)
        root = base / "root"
        root.mkdir()
        root.chmod(mode)
        opening = (
            "from fscache.server.store import Store;"
            f" Store({str(root)!r}, max_file_size=1, exclusive={exclusive})"
        )
        argv = [sys.executable, "-c", opening]
        if os.getuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("running as root without setpriv to drop to another user")
            argv = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        (base / "root").chmod(0o755)
        shutil.rmtree(base)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"fscache.errors.FscacheError: store root {str(root)!r} is not {may}"
        f" by this user (uid {pwd.getpwnam('nobody').pw_uid if os.getuid() == 0 else os.getuid()})"
    )


def test_symlink_escaping_root_is_refused(store: Store, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    os.symlink(outside, root / "link")
    os.symlink(outside / "secret", root / "filelink")
    calls: list[Callable[[], object]] = [
        lambda: store.read("link/secret"),
        lambda: store.read("filelink"),
        lambda: store.stat("link"),
        lambda: store.stat("link/secret"),
        lambda: store.listdir("link"),
        lambda: store.write("link/new", b"x"),
        lambda: store.write("link/secret", b"overwritten"),
        lambda: store.write("filelink", b"overwritten"),
        lambda: store.delete("link/secret"),
        lambda: store.delete("filelink"),
    ]
    for call in calls:
        with pytest.raises(BadPath):
            call()
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == b"secret"
    assert store.listdir("") == []  # escaping symlinks are not shown either


def test_symlink_inside_root_is_refused_too(store: Store, root: Path) -> None:
    store.write("real/f", b"data")
    os.symlink(root / "real", root / "alias")
    os.symlink(root / "real" / "f", root / "falias")
    for call in (
        lambda: store.read("alias/f"),
        lambda: store.read("falias"),
        lambda: store.write("alias/f", b"x"),
        lambda: store.stat("falias"),
    ):
        with pytest.raises(BadPath, match="symlink, which the store never follows"):
            call()
    assert store.listdir("") == ["real/"]
    assert store.read("real/f")[1] == b"data"


def test_unnormalised_paths_cannot_escape(store: Store) -> None:
    for bad in ("../x", "/etc/passwd", "a/../../x", f"{TEMP_PREFIX}abc", "d/.fscache", "a\0b"):
        with pytest.raises(BadPath):
            store.read(bad)
        with pytest.raises(BadPath):
            store.write(bad, b"x")


def test_os_errors_become_fscache_errors(
    store: Store, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v0 = store.write("f", b"old")

    def full_disk(src: str, dst: str, **dir_fds: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "rename", full_disk)
    with pytest.raises(NoSpace, match="disk is full") as info:
        store.write("f", b"new")
    assert type(info.value) is NoSpace
    monkeypatch.undo()
    assert store.read("f") == (v0, b"old")
    assert temp_files(root) == []  # the failed write cleaned up after itself


@pytest.mark.parametrize(
    ("code", "said"),
    [(errno.ENOSPC, "disk is full"), (errno.EDQUOT, "disk is full (quota exceeded)")],
)
def test_a_full_disk_or_quota_is_no_space_and_goes_over_the_wire_as_such(
    store: Store, monkeypatch: pytest.MonkeyPatch, code: int, said: str
) -> None:
    """Its own code, so that a client (the mount: ENOSPC) can tell the writer the
    disk is full rather than that something failed."""

    def full(src: str, dst: str, **dir_fds: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "rename", full)
    with pytest.raises(NoSpace) as info:
        store.write("f", b"new")
    assert str(info.value) == f"cannot write 'f': the store's {said}"
    assert info.value.code == "no_space"
    assert type(error_for_code(info.value.code, str(info.value))) is NoSpace
    assert NoSpace.__mro__[1] is FscacheError  # a flat family


def test_a_failed_write_leaves_no_directory_it_made(
    store: Store, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (or a lost compare-and-set) after the missing parents were made:
    the write is not acknowledged, so they go again; directories that were there, or
    that another write now uses, stay."""
    store.write("kept/f", b"")

    def full_disk(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod, "_write_all", full_disk)
    with pytest.raises(FscacheError, match="disk is full"):
        store.write("kept/brand/new/x.txt", b"x")
    monkeypatch.undo()
    assert store.listdir("kept") == ["f"]
    assert temp_files(root) == []
    with pytest.raises(Conflict):
        store.write("new/dir/x.txt", b"x", if_version=7)
    upload = store.upload_begin("up/dir/x.txt")
    store.upload_part(upload, 0, b"x")
    store.upload_sync(upload)
    with pytest.raises(Conflict):
        store.upload_commit(upload, if_version=7)
    assert os.listdir(root) == ["kept"]


# ------------------------------------------------------------------------- recover


def test_recover_removes_leftover_temp_files(store: Store, root: Path) -> None:
    store.write("a/b/keep", b"k")
    for p in (root, root / "a", root / "a" / "b"):
        (p / f"{TEMP_PREFIX}{os.urandom(4).hex()}").write_bytes(b"torn")
    assert len(temp_files(root)) == 3
    assert store.listdir("a/b") == ["keep"]
    assert store.recover() == 3
    assert temp_files(root) == []
    assert store.recover() == 0
    assert store.read("a/b/keep")[1] == b"k"


def test_new_store_recovers_on_start(root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / f"{TEMP_PREFIX}dead").write_bytes(b"torn")
    store = Store(root, max_file_size=MAX)
    assert temp_files(root) == []
    assert store.recover() == 0


# --------------------------------------------------------------------------- crash

CHILD = r"""
import hashlib, os, random, sys
from fscache.server.store import Store

store = Store(sys.argv[1], max_file_size=1 << 20)
paths = [f"d{i % 3}/s{i % 4}/f{i}" for i in range(int(sys.argv[2]))]
rnd = random.Random(1)
seq = 0
while True:
    seq += 1
    path = rnd.choice(paths)
    body = f"{path}|{seq}|".encode() + os.urandom(rnd.randrange(0, 48 * 1024))
    content = body + hashlib.sha256(body).hexdigest().encode()
    version = store.write(path, content)
    sys.stdout.write(f"{path} {seq} {version} {hashlib.sha256(content).hexdigest()}\n")
    sys.stdout.flush()
"""


def parse_self_checking(content: bytes) -> tuple[str, int]:
    """(path, seq) from a file the child wrote; fails if the file is torn."""
    body, digest = content[:-64], content[-64:]
    assert hashlib.sha256(body).hexdigest().encode() == digest, "torn or foreign file"
    path, seq, _ = body.split(b"|", 2)
    return path.decode(), int(seq)


@pytest.mark.slow
def test_sigkill_mid_stream_keeps_every_acknowledged_write(root: Path) -> None:
    n_paths = 24
    paths = [f"d{i % 3}/s{i % 4}/f{i}" for i in range(n_paths)]
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(n_paths)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        lines: list[bytes] = []
        try:
            while len(lines) < 300:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
            # Aim the kill into a write: wait (briefly; the child keeps writing) until a
            # temp file exists, i.e. the child is between creating it and renaming it.
            leaves = [root / f"d{d}" / f"s{s}" for d in range(3) for s in range(4)]
            give_up = time.monotonic() + 2.0
            while not any(temp_files(leaf) for leaf in leaves) and time.monotonic() < give_up:
                pass
            os.kill(proc.pid, signal.SIGKILL)
            rest, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert len(lines) == 300, err.decode(errors="replace")
        assert proc.returncode == -signal.SIGKILL
    lines += rest.splitlines(keepends=True)

    acked: dict[str, tuple[int, int, str]] = {}  # path -> (seq, version, sha256)
    max_seq = 0
    for line in lines:
        if not line.endswith(b"\n"):
            continue  # killed while printing: not acknowledged
        path, seq_text, version_text, digest = line.decode().split()
        assert int(seq_text) > max_seq
        max_seq = int(seq_text)
        previous = acked.get(path)
        assert previous is None or int(version_text) > previous[1]
        acked[path] = (max_seq, int(version_text), digest)
    assert max_seq >= 300

    leftovers = len(temp_files(root))  # 0 or 1: the write in flight when killed
    assert leftovers <= 1
    store = Store(root, max_file_size=1 << 20)  # the restart: recovers in __init__
    assert temp_files(root) == []
    assert store.recover() == 0

    unacked_seen = 0
    for path in paths:
        try:
            version, content = store.read(path)
        except NotFound:
            assert path not in acked, f"acknowledged write of {path} lost"
            continue
        written_path, seq = parse_self_checking(content)
        assert written_path == path
        if path in acked and seq == acked[path][0]:
            assert version == acked[path][1]
            assert hashlib.sha256(content).hexdigest() == acked[path][2]
        else:
            # Only the one write in flight at the kill may be newer than its ack.
            assert seq == max_seq + 1, f"{path} holds write {seq}, acked {acked.get(path)}"
            assert path not in acked or version > acked[path][1]
            unacked_seen += 1
    assert unacked_seen <= 1
    for d in range(3):
        for s in range(4):
            assert all(not n.startswith(".fscache") for n in store.listdir(f"d{d}/s{s}"))


# ------------------------------------------------------------------ content cache

LATER = 10 * 10**9  # the injected wall clock runs this far ahead: files look old enough


@pytest.fixture
def cstore(root: Path, opens: list[str]) -> Store:
    """A store whose wall clock runs ahead, so every file is past the racy window
    (made after ``opens`` starts counting, so its reads are counted too)."""
    s = Store(root, max_file_size=MAX)
    s._time_ns = lambda: time.time_ns() + LATER
    return s


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path os.open is called with, from now on."""
    seen: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: int, **kwargs: int) -> int:
        seen.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    real_beneath = store_mod._beneath_opener

    def counting_beneath(root: str) -> Callable[[str, int], int] | None:
        before = len(seen)
        inner = real_beneath(root)
        del seen[before:]  # the root's own descriptor, opened once per store
        if inner is None:
            return None

        def counting_openat2(path: str, flags: int) -> int:
            seen.append(path)
            return inner(path, flags)

        return counting_openat2

    monkeypatch.setattr(store_mod, "_beneath_opener", counting_beneath)
    return seen


def put(root: Path, name: str, data: bytes) -> Path:
    """Write a file as another program would, with an mtime in the past."""
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.utime(p, ns=(1_000_000_000_000, 1_000_000_000_000))
    return p


def test_cache_serves_an_unchanged_file_without_opening_it(
    cstore: Store, root: Path, opens: list[str]
) -> None:
    version = version_of(os.stat(put(root, "d/f", b"hello")))
    assert cstore.read("d/f") == (version, b"hello")
    assert len(opens) == 1 and cstore.content_hits == 0
    for _ in range(3):
        assert cstore.read("d/f") == (version, b"hello")
    assert len(opens) == 1 and cstore.content_hits == 3


def version_of(st: os.stat_result) -> int:
    """A file's version as the store gives it: the later of its mtime and ctime."""
    return max(st.st_mtime_ns, st.st_ctime_ns)


def test_a_file_replaced_with_its_mtime_kept_gets_a_new_version(store: Store, root: Path) -> None:
    """``cp -p``, ``rsync -t`` and ``tar -x`` set the mtime they copy: the version still
    moves (the ctime does), so no cache answers "not modified" for the new bytes."""
    version = store.write("a.txt", b"AAAA")
    old = os.stat(root / "a.txt")
    time.sleep(0.05)  # past a coarse clock's tick
    new = root / "incoming"
    new.write_bytes(b"BBBB")
    os.utime(new, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(new, root / "a.txt")  # as rsync puts its temp file in place
    assert os.stat(root / "a.txt").st_mtime_ns == old.st_mtime_ns
    replaced, data = store.read("a.txt")
    assert data == b"BBBB" and replaced > version
    assert store.stat("a.txt")[0] == replaced
    assert store.write("a.txt", b"CCCC", if_version=replaced) > replaced


def test_every_change_by_the_store_returns_the_version_reads_then_see(
    store: Store, root: Path
) -> None:
    """Write, upload, in-place write, truncate and rename each return the version a read
    gives afterwards (a rename moves the file's ctime: it is read after it)."""
    assert store.write("w", b"1") == store.stat("w")[0]
    upload = store.upload_begin("u")
    store.upload_part(upload, 0, b"22")
    store.upload_sync(upload)
    assert store.upload_commit(upload) == store.stat("u")[0]
    assert store.write_range("w", 1, b"3") == store.stat("w")[0]
    assert store.truncate("w", 1) == store.stat("w")[0]
    assert store.rename("w", "moved") == store.stat("moved")[0] == store.read("moved")[0]
    assert version_of(os.stat(root / "moved")) == store.stat("moved")[0]


def test_cache_sees_an_external_in_place_edit(cstore: Store, root: Path) -> None:
    p = put(root, "f", b"aaaa")
    before = os.stat(p)
    assert cstore.read("f")[1] == b"aaaa"
    with open(p, "r+b") as fh:  # same inode, same size, mtime put back: only ctime moves
        fh.write(b"bbbb")
    os.utime(p, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(p)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    if after.st_ctime_ns == before.st_ctime_ns:
        pytest.skip(
            "this file system's ctime is too coarse to see the edit (and the clock is faked)"
        )
    assert cstore.read("f") == (version_of(after), b"bbbb")
    assert version_of(after) > version_of(before)  # a new version, for all its mtime
    assert cstore.content_hits == 0


def test_cache_sees_an_external_replace(cstore: Store, root: Path) -> None:
    p = put(root, "f", b"old!")
    assert cstore.read("f")[1] == b"old!"
    q = put(root, "elsewhere", b"new!")  # same size and mtime, another inode
    os.replace(q, p)
    assert cstore.read("f") == (version_of(os.stat(p)), b"new!")
    assert cstore.content_hits == 0


def test_cache_sees_an_external_delete(cstore: Store, root: Path) -> None:
    p = put(root, "d/f", b"x")
    cstore.read("d/f")
    p.unlink()
    with pytest.raises(NotFound):
        cstore.read("d/f")
    (root / "d").rmdir()
    (root / "d").write_bytes(b"now a file")
    with pytest.raises(NotFound):
        cstore.read("d/f")
    cstore.settle()  # close and cache the reads so far
    assert cstore._content == {}


@pytest.mark.parametrize("swap", ["dir", "file-symlink", "dir-symlink", "fifo"])
def test_cache_refuses_a_swapped_path_as_an_uncached_read_does(tmp_path: Path, swap: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_bytes(b"secret")
    results: list[str] = []
    for cache_bytes in (0, 1 << 20):
        root = tmp_path / f"root{cache_bytes}"
        root.mkdir()
        s = Store(root, max_file_size=MAX, content_cache_bytes=cache_bytes)
        s._time_ns = lambda: time.time_ns() + LATER
        p = put(root, "d/f", b"inside")
        assert s.read("d/f")[1] == b"inside"
        s.settle()  # close and cache the reads so far
        assert len(s._content) == (1 if cache_bytes else 0)
        if swap == "dir":
            p.unlink()
            p.mkdir()
        elif swap == "file-symlink":
            p.unlink()
            os.symlink(outside / "f", p)
        elif swap == "dir-symlink":
            shutil.rmtree(root / "d")
            os.symlink(outside, root / "d")
        else:
            p.unlink()
            os.mkfifo(p)
        with pytest.raises(FscacheError) as info:
            s.read("d/f")
        results.append(type(info.value).__name__)
        s.settle()  # close and cache the reads so far
        assert s.content_hits == 0 and s._content == {}
    assert results[0] == results[1]
    assert (
        results[0]
        == {
            "dir": "IsADirectory",
            "file-symlink": "BadPath",
            "dir-symlink": "BadPath",
            "fifo": "FscacheError",
        }[swap]
    )


def test_cache_never_holds_a_path_through_a_symlink(cstore: Store, root: Path) -> None:
    put(root, "real/f", b"data")
    os.symlink(root / "real", root / "alias")
    os.symlink(root / "real" / "f", root / "falias")
    for _ in range(2):
        with pytest.raises(BadPath):
            cstore.read("alias/f")
        with pytest.raises(BadPath):
            cstore.read("falias")
    cstore.settle()  # close and cache the reads so far
    assert cstore.content_hits == 0 and cstore._content == {}


def test_a_freshly_changed_file_is_not_cached(root: Path, opens: list[str]) -> None:
    s = Store(root, max_file_size=MAX)  # the real clock: the file's ctime is "now"
    s.write("f", b"fresh")
    for _ in range(2):
        assert s.read("f")[1] == b"fresh"
    s.settle()  # close and cache the reads so far
    assert s.content_hits == 0 and s._content == {}

    ctime = os.stat(root / "f").st_ctime_ns
    s._time_ns = lambda: ctime + store_mod._RACY_NS - 1  # one ns inside the window
    s.read("f")
    s.settle()  # close and cache the reads so far
    assert s._content == {}
    s._time_ns = lambda: ctime + store_mod._RACY_NS  # just old enough
    s.read("f")
    s.settle()  # close and cache the reads so far
    assert list(s._content) == ["f"]
    opened = len(opens)
    assert s.read("f")[1] == b"fresh"
    assert len(opens) == opened and s.content_hits == 1


def test_a_file_edited_while_being_read_is_read_again_next_time(
    cstore: Store, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = put(root, "f", b"one")
    before = os.stat(p)
    real_read = os.read

    def read_then_edit(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        with open(p, "r+b") as fh:  # in place, same size, mtime put back
            fh.write(b"two")
        os.utime(p, ns=(before.st_atime_ns, before.st_mtime_ns))
        return data

    monkeypatch.setattr(os, "read", read_then_edit)
    assert cstore.read("f")[1] == b"one"
    monkeypatch.undo()
    if os.stat(p).st_ctime_ns == before.st_ctime_ns:
        pytest.skip(
            "this file system's ctime is too coarse to see the edit (and the clock is faked)"
        )
    assert cstore.read("f")[1] == b"two"  # the entry's key is from before the edit


def test_cache_tells_apart_files_that_differ_only_in_inode(cstore: Store, root: Path) -> None:
    """Two files with equal size, mtime and ctime: a directory swap must still miss."""
    for _ in range(100):
        shutil.rmtree(root / "d", ignore_errors=True)
        shutil.rmtree(root / "e", ignore_errors=True)
        a, b = put(root, "d/f", b"AAAA"), put(root, "e/f", b"BBBB")
        os.utime(a, ns=(0, 10**12))
        os.utime(b, ns=(0, 10**12))
        if os.stat(a).st_ctime_ns == os.stat(b).st_ctime_ns:
            break
    else:
        pytest.skip("could not make two files with the same ctime")
    assert cstore.read("d/f")[1] == b"AAAA"
    os.rename(root / "d", root / "old")  # renaming a directory leaves its files' ctimes
    os.rename(root / "e", root / "d")
    assert cstore.read("d/f")[1] == b"BBBB"
    assert cstore.content_hits == 0


def test_cache_stays_within_its_byte_budget(root: Path, opens: list[str]) -> None:
    cost = store_mod._CACHE_ENTRY_OVERHEAD + len("a") + 100  # overhead, path, data
    s = Store(root, max_file_size=MAX, content_cache_bytes=3 * cost)
    s._time_ns = lambda: time.time_ns() + LATER
    for name in "abcd":
        put(root, name, name.encode() * 100)
    put(root, "big", b"x" * (3 * cost))  # larger than the whole budget: never cached
    for name in ("a", "b", "c", "d", "big"):
        s.read(name)
        s.settle()  # close and cache the reads so far
        assert s._content_bytes <= 3 * cost
    s.settle()  # close and cache the reads so far
    assert list(s._content) == ["b", "c", "d"]  # "a", the oldest, went
    s.settle()  # close and cache the reads so far
    assert s._content_bytes == 3 * cost
    opened = len(opens)
    assert s.read("c")[1] == b"c" * 100 and len(opens) == opened  # a hit keeps its place
    assert s.read("a")[1] == b"a" * 100 and len(opens) == opened + 1  # a miss
    s.settle()  # close and cache the reads so far
    assert list(s._content) == ["c", "d", "a"]
    s.settle()  # close and cache the reads so far
    assert s._content_bytes == 3 * cost


def test_cache_holds_at_most_its_number_of_files_however_small(
    root: Path, opens: list[str]
) -> None:
    s = Store(root, max_file_size=MAX, content_cache_files=3)
    s._time_ns = lambda: time.time_ns() + LATER
    for name in "abcde":
        put(root, name, b"")
        s.read(name)
        s.settle()  # close and cache the reads so far
        assert len(s._content) <= 3
    assert list(s._content) == ["c", "d", "e"]  # the oldest went
    s.read("d")  # a hit keeps its place
    put(root, "e", b"changed")  # a miss drops its entry; cached again, it is the newest
    s.read("e")
    s.settle()
    assert list(s._content) == ["c", "d", "e"]
    s.read("a")
    s.settle()
    assert list(s._content) == ["d", "e", "a"]
    assert s._content_bytes == sum(entry.cost(path) for path, entry in s._content.items())
    with pytest.raises(FscacheError):
        Store(root, max_file_size=MAX, content_cache_files=-1)


def test_a_cache_entry_takes_no_more_memory_than_it_is_charged(root: Path) -> None:
    """Tiny files cost the cache their overhead, not their data: it is counted, so a
    million of them cannot grow it past its budget. Measured by tracemalloc: what the
    entries hold (their paths included, as if no lease shared them)."""
    files = 2_000
    s = Store(root, max_file_size=MAX, content_cache_files=files)
    s._time_ns = lambda: time.time_ns() + LATER
    for i in range(files):
        put(root, f"d/f{i:05d}", b"" if i % 2 else b"x" * (i % 100))
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(files):
            s.read(f"d/f{i:05d}".encode().decode())  # a path of its own, as from a frame
            s.settle()
        gc.collect()
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(s._content) == files
    assert used <= s._content_bytes


def test_a_dropped_entry_frees_its_data_at_once_and_the_order_stays_small(
    cstore: Store, root: Path
) -> None:
    put(root, "big", b"x" * 60_000)
    put(root, "small", b"y")
    gc.collect()
    tracemalloc.start()
    try:
        for n in range(3 * store_mod._ORDER_SLACK):
            assert cstore.read("big")[1] == b"x" * 60_000
            cstore.settle()  # cached
            cstore._forget("big")  # as the store's own write of it does
            cstore.read("small")
            cstore.settle()
            assert len(cstore._content_order) <= 2 + store_mod._ORDER_SLACK
            if n == 0:
                gc.collect()
                first, _ = tracemalloc.get_traced_memory()
        gc.collect()
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(cstore._content) == ["small"]
    assert used - first < 60_000  # no dropped copy of big is held


def test_a_file_whose_times_do_not_fit_64_bits_is_read_but_not_cached(
    cstore: Store, root: Path, opens: list[str]
) -> None:
    p = put(root, "future", b"data")
    try:
        os.utime(p, ns=(0, 2**63 + 10**9))  # past the year 2262
    except (OSError, OverflowError):
        pytest.skip("this file system cannot set such a time")
    version = version_of(os.stat(p))
    if version < 2**63:
        pytest.skip("this file system does not keep such a time")
    for _ in range(2):
        assert cstore.read("future") == (version, b"data")
        cstore.settle()
    assert len(opens) == 2 and cstore._content == {}


def test_own_write_and_delete_drop_the_entry(cstore: Store, root: Path) -> None:
    put(root, "real/f", b"v1")
    put(root, "g", b"g")
    cstore.read("real/f")
    cstore.read("g")
    cstore.settle()  # close and cache the reads so far
    assert set(cstore._content) == {"real/f", "g"}
    version = cstore.write("real/f", b"v2")
    cstore.settle()  # close and cache the reads so far
    assert set(cstore._content) == {"g"}
    assert cstore.read("real/f") == (version, b"v2")
    cstore.delete("g")
    cstore.settle()  # close and cache the reads so far
    assert "g" not in cstore._content
    with pytest.raises(NotFound):
        cstore.read("g")


def test_content_cache_bytes_zero_never_caches(root: Path, opens: list[str]) -> None:
    s = Store(root, max_file_size=MAX, content_cache_bytes=0)
    s._time_ns = lambda: time.time_ns() + LATER
    put(root, "f", b"")
    put(root, "g", b"data")
    for _ in range(3):
        assert s.read("f")[1] == b"" and s.read("g")[1] == b"data"
    s.settle()  # close and cache the reads so far
    assert len(opens) == 6 and s.content_hits == 0 and s._content == {}
    with pytest.raises(FscacheError):
        Store(root, max_file_size=MAX, content_cache_bytes=-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="openat2 is Linux's")
def test_reads_are_confined_to_the_root_by_the_kernel_where_openat2_exists(
    root: Path, tmp_path: Path
) -> None:
    """openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) refuses what leaves the root or
    meets a symlink, inside the root or not: both are a BadPath."""
    s = Store(root, max_file_size=MAX)
    if s._openat2 is None:
        pytest.skip("this kernel has no openat2")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"secret")
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"inside")
    os.symlink(tmp_path / "outside", root / "escape")
    os.symlink("d", root / "alias")
    with pytest.raises(OSError) as refused:
        s._openat2("escape/secret", store_mod._READ_FLAGS)
    assert refused.value.errno in (errno.EXDEV, errno.ELOOP)
    with pytest.raises(BadPath):
        s.read("escape/secret")
    with pytest.raises(BadPath):
        s.read("alias/f")
    assert s.read("d/f")[1] == b"inside"


def test_a_read_leaves_its_descriptor_open_only_until_settle_or_the_next_read(
    cstore: Store, root: Path
) -> None:
    """The server closes and caches after its replies are sent (settle); a store that
    is only read from never holds more than one read's descriptor open."""
    for i in range(50):
        put(root, f"f{i}", b"x")
    gc.collect()  # stores of earlier tests close their root descriptors now, not below
    fds = os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else None
    before = len(os.listdir("/proc/self/fd")) if fds is not None else 0
    for i in range(50):
        cstore.read(f"f{i}")
        if fds is not None:
            assert len(os.listdir("/proc/self/fd")) <= before + 1
    assert len(cstore._unsettled) == 1 and len(cstore._content) == 49
    cstore.settle()
    assert cstore._unsettled == [] and len(cstore._content) == 50
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(not hasattr(os, "O_NOATIME"), reason="no O_NOATIME on this system")
def test_reading_does_not_touch_the_access_time_of_our_own_files(root: Path) -> None:
    """relatime would update an access time older than the mtime on the first read
    (an inode write per read); the store opens its own files with O_NOATIME."""
    p = put(root, "f", b"data")
    st = os.stat(p)
    os.utime(p, ns=(st.st_mtime_ns - 10**12, st.st_mtime_ns))  # atime well before mtime
    before = os.stat(p).st_atime_ns
    s = Store(root, max_file_size=MAX)
    assert s.read("f")[1] == b"data"
    s.settle()
    assert os.stat(p).st_atime_ns == before


@pytest.mark.skipif(
    not hasattr(os, "O_NOATIME") or os.geteuid() != 0, reason="needs root to become nobody"
)
def test_files_of_another_owner_are_read_without_o_noatime() -> None:
    """O_NOATIME is refused (EPERM) on a file the reader does not own: the store reads
    it anyway, through openat2 and through the plain open. A forked child becomes
    nobody and reads root's world-readable file."""
    top = Path(tempfile.mkdtemp(prefix="fscache-noatime-", dir="/tmp"))
    try:
        root = top / "root"
        (root / "d").mkdir(parents=True)
        (root / "d" / "f").write_bytes(b"theirs")
        for p in (top, root, root / "d"):
            p.chmod(0o755)
        pid = os.fork()
        if pid == 0:  # the child: no pytest from here on, only an exit code
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                s = Store(root, max_file_size=MAX)
                ok = s.read("d/f")[1] == b"theirs" and s.read("d/f")[1] == b"theirs"
                ok = ok and s._openat2 is not None  # still in use: EPERM was O_NOATIME's
                plain = Store(root, max_file_size=MAX, content_cache_bytes=0)
                plain._openat2 = None  # the os.open way
                ok = ok and plain.read("d/f")[1] == b"theirs" and plain.read("d/f")[1] == b"theirs"
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        shutil.rmtree(top)


# ---------------------------------------------------------------- the server's state files
def test_state_files_are_written_durably_and_hidden_from_clients(store: Store, root: Path) -> None:
    assert store.load_state("record") is None
    store.save_state("record", b"one")
    store.save_state("record", b"two")  # replaced whole, like any write
    assert store.load_state("record") == b"two"
    assert (root / RESERVED_PREFIX / "record").read_bytes() == b"two"
    assert store.listdir("") == [] and temp_files(root) == []
    with pytest.raises(BadPath):
        store.read(f"{RESERVED_PREFIX}/record")


def test_recover_clears_temp_files_in_the_state_directory(store: Store, root: Path) -> None:
    store.save_state("record", b"kept")
    (root / RESERVED_PREFIX / f"{TEMP_PREFIX}dead").write_bytes(b"torn")
    assert store.recover() == 1
    assert store.load_state("record") == b"kept"


# ---------------------------------------------------------------- large directories
@pytest.mark.parametrize("count", [0, 1, store_mod._SORT_RUN, store_mod._SORT_RUN * 3 + 7])
def test_names_sorted_in_runs_are_sorted(count: int) -> None:
    names = [f"n{(i * 7919) % (count or 1):07d}-{i % 3}" for i in range(count)]
    assert store_mod._sorted_in_runs(list(names)) == sorted(names)


def test_a_large_directory_is_listed_once_per_version(
    store: Store, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = root / "big"
    big.mkdir()
    count = store_mod.LISTING_PAGE_ENTRIES + 5
    for i in range(count):
        (big / f"f{i:05d}").touch()
    calls: list[int] = []
    names_in = store_mod._names_in

    def counted(fd: int) -> tuple[list[str], set[str]]:
        calls.append(fd)
        return names_in(fd)

    monkeypatch.setattr(store_mod, "_names_in", counted)
    monkeypatch.setattr(store, "_time_ns", lambda: time.time_ns() + 3 * 10**9)  # ctime not racy
    first, more = store.list_page("big", None)
    assert len(first) == store_mod.LISTING_PAGE_ENTRIES and more
    rest, more = store.list_page("big", first[-1])
    assert first + rest == [f"f{i:05d}" for i in range(count)] and not more
    assert len(calls) == 1  # the second page came from the cache
    store.write("big/new", b"x")  # a change of the name set: the cache is not used
    *_, last = store.listdir("big")
    assert last == "new" and len(calls) == 2


def test_a_directory_changed_moments_ago_is_not_kept(
    store: Store, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = root / "big"
    big.mkdir()
    for i in range(store_mod.LISTING_PAGE_ENTRIES + 1):
        (big / f"f{i:05d}").touch()
    calls: list[int] = []
    names_in = store_mod._names_in
    monkeypatch.setattr(store_mod, "_names_in", lambda fd: calls.append(fd) or names_in(fd))
    store.listdir("big")
    store.listdir("big")
    assert len(calls) == 2  # its ctime is within the racy margin: listed each time
