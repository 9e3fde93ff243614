"""Tests of the store's confined operations (fscache.server.store): rename, mkdir,
rmdir, scandir, ranged reads, uploads, in-place writes and truncates.

Plain blocking code on real files. Durability order is checked by recording the
store's system calls; full disks on a real, small tmpfs (skipped, with the reason,
where this machine will not mount one).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fscache.errors import (
    BadPath,
    Conflict,
    Exists,
    FscacheError,
    IsADirectory,
    NoSpace,
    NotADirectory,
    NotDurable,
    NotEmpty,
    NotFound,
    ProtocolError,
    error_for_code,
)
from fscache.server import store as store_mod
from fscache.server.store import TEMP_PREFIX, Facts, Store
from fscache.settings import CHUNK_SIZE

from .test_store import MAX, store, temp_files

__all__ = ["store"]  # the fixture, shared with test_store


def dir_version(store: Store, path: str) -> int:
    return store.scandir(path)[0]


# ------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (NotADirectory, "not_a_directory"),
        (NotEmpty, "not_empty"),
        (Exists, "exists"),
        (NoSpace, "no_space"),
    ],
)
def test_new_error_codes_map_back_to_their_class(cls: type[FscacheError], code: str) -> None:
    assert cls.code == code
    assert type(error_for_code(code, "m")) is cls
    assert cls.__mro__[1] is FscacheError  # a flat family, like IsADirectory


# ------------------------------------------------------------------ ranged reads


def test_read_range_returns_the_range_the_version_and_the_whole_size(store: Store) -> None:
    version = store.write("f", b"0123456789")
    assert store.read_range("f", 0, 4) == (version, 10, b"0123")
    assert store.read_range("f", 8, 100) == (version, 10, b"89")
    assert store.read_range("f", 10, 5) == (version, 10, b"")
    assert store.read_range("f", 50, 5) == (version, 10, b"")


def test_read_range_errors(store: Store, root: Path) -> None:
    (root / "d").mkdir()
    store.write("f", b"x")
    with pytest.raises(NotFound):
        store.read_range("missing", 0, 1)
    with pytest.raises(IsADirectory):
        store.read_range("d", 0, 1)
    with pytest.raises(ProtocolError):
        store.read_range("f", -1, 1)
    with pytest.raises(ProtocolError):
        store.read_range("f", 0, -1)


@pytest.mark.parametrize("value", [-1, 2**63, 2**64 - 1])
def test_offsets_and_sizes_outside_off_t_are_refused(store: Store, value: int) -> None:
    """What the wire allows (any CBOR unsigned integer) but the kernel cannot take:
    refused by the store as a protocol error, never an OverflowError (found by fuzzing)."""
    store.write("f", b"x")
    for call in (
        lambda: store.read_range("f", value, 1),
        lambda: store.read_range("f", 0, value),
        lambda: store.write_range("f", value, b"y"),
        lambda: store.truncate("f", value),
    ):
        with pytest.raises(ProtocolError, match=r"0\.\.2\*\*63-1"):
            call()
    assert store.read("f")[1] == b"x"


def test_read_range_reads_files_larger_than_the_whole_read_limit(store: Store) -> None:
    upload = store.upload_begin("big")
    store.upload_part(upload, 0, b"a" * MAX)
    store.upload_part(upload, MAX, b"b" * MAX)
    version = store.upload_commit(upload)
    assert store.read_range("big", MAX - 2, 4) == (version, 2 * MAX, b"aabb")


# ------------------------------------------------------------------------ uploads


def test_upload_round_trip_in_parts(store: Store, root: Path) -> None:
    old = store.write("f", b"old")
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"hello ")
    assert store.read("f") == (old, b"old")  # nothing visible before the commit
    assert store.listdir("") == ["f"]  # the temp file is hidden
    assert [e[0] for e in store.scandir("")[1]] == ["f"]
    store.upload_part(upload, 6, b"world")
    store.upload_sync(upload)
    version = store.upload_commit(upload)
    assert version > old
    assert store.read_range("f", 0, 100) == (version, 11, b"hello world")
    assert temp_files(root) == []
    assert upload.closed


def test_upload_temp_file_is_private_and_the_result_has_writes_mode(
    store: Store, root: Path
) -> None:
    upload = store.upload_begin("f")
    (temp,) = temp_files(root)
    assert stat.S_IMODE(os.stat(temp).st_mode) == 0o600
    store.upload_commit(upload)
    store.write("g", b"")
    assert os.stat(root / "f").st_mode == os.stat(root / "g").st_mode


def test_upload_part_must_continue_where_the_last_ended(store: Store, root: Path) -> None:
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"abc")
    with pytest.raises(ProtocolError, match="expected 3"):
        store.upload_part(upload, 2, b"x")
    with pytest.raises(ProtocolError):
        store.upload_part(upload, 4, b"x")
    store.upload_part(upload, 3, b"d")
    store.upload_commit(upload)
    assert store.read("f")[1] == b"abcd"
    with pytest.raises(ProtocolError, match="ended"):
        store.upload_part(upload, 4, b"x")


def test_upload_commit_compare_and_set(store: Store, root: Path) -> None:
    v1 = store.write("f", b"one")
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"two")
    with pytest.raises(Conflict):
        store.upload_commit(upload, if_version=v1 + 1)
    assert upload.closed and temp_files(root) == []  # a lost commit ends the upload
    assert store.read("f") == (v1, b"one")
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"two")
    assert store.upload_commit(upload, if_version=v1) > v1
    upload = store.upload_begin("new")
    assert store.upload_commit(upload, if_version=0) > 0  # 0: must not exist yet


def test_upload_refuses_directories(store: Store, root: Path) -> None:
    (root / "d").mkdir()
    with pytest.raises(IsADirectory):
        store.upload_begin("d")
    upload = store.upload_begin("later")
    (root / "later").mkdir()  # a directory appears before the commit
    with pytest.raises(IsADirectory):
        store.upload_commit(upload)
    assert temp_files(root) == []


def test_an_upload_into_missing_directories_makes_them_as_a_write_does(
    store: Store, root: Path
) -> None:
    upload = store.upload_begin("newdir/sub/f")
    (temp,) = temp_files(root)
    assert os.path.dirname(temp) == str(root)  # in the root until its directory exists
    store.upload_part(upload, 0, b"a" * MAX)
    store.upload_part(upload, MAX, b"b")
    assert store.listdir("") == []  # nothing visible before the commit
    store.upload_sync(upload)
    version = store.upload_commit(upload)
    assert store.read_range("newdir/sub/f", MAX - 1, 2) == (version, MAX + 1, b"ab")
    assert store.listdir("") == ["newdir/"] and store.listdir("newdir") == ["sub/"]
    assert temp_files(root) == [] and upload.closed


def test_an_upload_below_a_file_fails_at_commit_as_a_write_does(store: Store, root: Path) -> None:
    old = store.write("f", b"a file")
    upload = store.upload_begin("f/below")
    store.upload_part(upload, 0, b"x")
    with pytest.raises(IsADirectory, match="parent directories is a file"):
        store.upload_commit(upload)
    with pytest.raises(IsADirectory, match="parent directories is a file"):
        store.write("f/below", b"x")
    assert store.read("f") == (old, b"a file")
    assert temp_files(root) == [] and upload.closed


def test_an_upload_commit_into_a_new_directory_fsyncs_it_and_both_parents(
    store: Store, calls: list[str]
) -> None:
    upload = store.upload_begin("d/f")  # the temp file is in the root
    store.upload_part(upload, 0, b"x")
    store.upload_sync(upload)
    calls.clear()
    store.upload_commit(upload)
    # the new directory and the root that gained it; the file's inode; the rename;
    # the directory that gained the file, and the root that lost the temp file
    assert calls == ["fsync:dir", "fsync:dir", "fsync:file", "rename", "fsync:dir", "fsync:dir"]


def test_upload_abort_and_recover_remove_the_temp_file(store: Store, root: Path) -> None:
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"data")
    store.upload_abort(upload)
    store.upload_abort(upload)  # a no-op on an ended upload
    assert temp_files(root) == [] and not (root / "f").exists()
    leftover = store.upload_begin("g")
    store.upload_part(leftover, 0, b"data")  # never ended: as after a crash
    assert len(temp_files(root)) == 1
    assert Store(root, max_file_size=MAX).recover() == 0  # the new store recovered on start
    assert temp_files(root) == []
    store.upload_abort(leftover)


def test_recover_removes_an_uploads_temp_file_left_in_the_root(store: Store, root: Path) -> None:
    leftover = store.upload_begin("nodir/f")
    store.upload_part(leftover, 0, b"data")  # never ended: as after a crash
    (temp,) = temp_files(root)
    assert os.path.dirname(temp) == str(root)
    assert Store(root, max_file_size=MAX).recover() == 0  # the new store recovered on start
    assert temp_files(root) == [] and store.listdir("") == []
    store.upload_abort(leftover)


def test_upload_commits_to_the_path_even_if_its_directory_moved(store: Store, root: Path) -> None:
    store.mkdir("d")
    upload = store.upload_begin("d/f")
    store.upload_part(upload, 0, b"x")
    store.rename("d", "e")
    store.mkdir("d")
    store.upload_commit(upload)
    assert store.read("d/f")[1] == b"x"
    assert not (root / "e" / "f").exists()
    assert temp_files(root) == []


def test_upload_memory_is_bounded_by_one_part(store: Store) -> None:
    parts = 64  # 64 MiB in 1 MiB parts
    tracemalloc.start()
    try:
        upload = store.upload_begin("big")
        for i in range(parts):
            store.upload_part(upload, i * CHUNK_SIZE, bytes([i]) * CHUNK_SIZE)
        store.upload_sync(upload)
        version = store.upload_commit(upload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * CHUNK_SIZE
    assert store.read_range("big", 63 * CHUNK_SIZE, 1) == (version, parts * CHUNK_SIZE, b"\x3f")
    assert store.stat("big")[1] == parts * CHUNK_SIZE


# ------------------------------------------------------- in-place writes, truncate


def test_write_range_creates_extends_and_overwrites_in_place(store: Store, root: Path) -> None:
    v1 = store.write_range("f", 0, b"hello")
    ino = os.stat(root / "f").st_ino
    v2 = store.write_range("f", 3, b"p!!")
    v3 = store.write_range("f", 8, b"z")
    assert v1 < v2 < v3
    assert store.read("f") == (v3, b"help!!\0\0z")
    assert os.stat(root / "f").st_ino == ino  # in place: the same inode
    with pytest.raises(Conflict):
        store.write_range("f", 0, b"x", if_version=v2)
    assert store.write_range("f", 0, b"H", if_version=v3) > v3
    with pytest.raises(ProtocolError):
        store.write_range("f", -1, b"x")


def test_offsets_beyond_4_gib_work(store: Store) -> None:
    far = 5 << 30  # a sparse file: only the last block is written
    version = store.write_range("sparse", far, b"end")
    assert store.read_range("sparse", far - 1, 10) == (version, far + 3, b"\0end")
    assert store.truncate("sparse", 0) > version


def test_truncate_shrinks_and_extends(store: Store) -> None:
    v1 = store.write("f", b"0123456789")
    v2 = store.truncate("f", 4)
    v3 = store.truncate("f", 6)
    assert v1 < v2 < v3
    assert store.read("f") == (v3, b"0123\0\0")
    assert store.truncate("new", 3) > 0
    assert store.read("new")[1] == b"\0\0\0"
    with pytest.raises(Conflict):
        store.truncate("f", 0, if_version=v1)
    with pytest.raises(ProtocolError):
        store.truncate("f", -1)


def test_in_place_writes_refuse_directories_and_missing_parents(store: Store, root: Path) -> None:
    (root / "d").mkdir()
    for op in (lambda p: store.write_range(p, 0, b"x"), lambda p: store.truncate(p, 0)):
        with pytest.raises(IsADirectory):
            op("d")
        with pytest.raises(NotFound):
            op("nodir/f")
    assert not (root / "nodir").exists()


def test_versions_increase_across_in_place_writes_delete_and_recreate(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "time_ns", lambda: 1_000)  # a clock that never moves
    seen = [store.write_range("f", 0, b"a")]
    seen.append(store.truncate("f", 0))
    store.delete("f")
    seen.append(store.write_range("f", 0, b"b"))
    seen.append(store.write("f", b"c"))
    assert seen == sorted(set(seen))


# ------------------------------------------------------------------------ renames


def test_rename_file_over_file_replaces_it_and_keeps_the_inode(store: Store, root: Path) -> None:
    store.write("a", b"A")
    old_b = store.write("b", b"B")
    ino = os.stat(root / "a").st_ino
    version = store.rename("a", "b")
    assert version > old_b
    assert store.read("b") == (version, b"A")
    assert os.stat(root / "b").st_ino == ino
    assert store.facts("a") == Facts(exists=False, is_dir=False)
    assert temp_files(root) == []


def test_rename_versions_stay_above_the_destinations_past(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "time_ns", lambda: 1_000)  # a clock that never moves
    a = store.write("a", b"A")
    b = store.write("b", b"B")
    b2 = store.write("b", b"B2")  # b's version is now above a's
    assert a <= b < b2
    moved = store.rename("a", "b")
    assert moved > b2
    store.delete("b")  # a floor for b
    store.write("c", b"C")
    assert store.rename("c", "b") > moved
    recreated = store.write("a", b"A2")  # a's floor, recorded by the rename
    assert recreated > a


def test_rename_directory_over_empty_directory(store: Store) -> None:
    store.mkdir("d")
    store.write("d/f", b"x")
    empty = store.mkdir("e")
    version = store.rename("d", "e")
    assert version > empty
    assert store.read("e/f")[1] == b"x"
    assert store.scandir("e")[0] == version
    assert store.facts("d") == Facts(exists=False, is_dir=False)


def test_rename_errors_name_both_paths_and_the_one_at_fault(store: Store, root: Path) -> None:
    store.write("f", b"x")
    store.write("g", b"y")
    store.mkdir("d")
    store.mkdir("full")
    store.write("full/x", b"")
    os.symlink("d", root / "link")
    plain = "is not a plain path below the root, or has a reserved name"
    cases: list[tuple[str, str, type[FscacheError], str]] = [
        ("f", "d", IsADirectory, "'f' is a file and 'd' is a directory"),
        ("d", "f", NotADirectory, "'d' is a directory and 'f' is a file"),
        ("d", "full", NotEmpty, "'full' is a directory that is not empty"),
        ("missing", "x", NotFound, "'missing' does not exist"),
        ("nodir/f", "x", NotFound, "the source's directory 'nodir' does not exist"),
        ("f", "nodir/x", NotFound, "the destination's directory 'nodir' does not exist"),
        ("g/x", "y", NotFound, "the source's directory 'g' is not a directory"),
        ("g", "f/x", NotFound, "the destination's directory 'f' is not a directory"),
        ("d", "d/sub", BadPath, "a directory cannot go inside itself"),
        ("", "x", BadPath, "the source is the root"),
        ("f", "", BadPath, "the destination is the root"),
        ("f", ".fscache-tmp-x", BadPath, f"the destination {plain}"),
        (".fscache", "x", BadPath, f"the source {plain}"),
        ("link", "x", BadPath, "'link' is a symlink, which the store never follows"),
        ("f", "link/x", BadPath, "the destination's directory 'link' is or passes through"),
    ]
    for src, dst, error, reason in cases:
        with pytest.raises(error) as caught:
            store.rename(src, dst)
        assert type(caught.value) is error
        assert str(caught.value).startswith(f"cannot rename {src!r} to {dst!r}: {reason}")
    assert store.read("f")[1] == b"x" and store.read("g")[1] == b"y"
    assert store.listdir("") == ["d/", "f", "full/", "g"]


@pytest.mark.parametrize(
    ("code", "error", "reason"),
    [
        (errno.ENOTEMPTY, NotEmpty, "'b' is a directory that is not empty"),
        (errno.EEXIST, Exists, "'b' is a directory that is not empty"),
        (errno.EISDIR, IsADirectory, "'b' is a directory and 'a' is not"),
        (errno.ENOTDIR, NotADirectory, "'a' is a directory and 'b' is not"),
        (errno.ENOENT, NotFound, "'a', or the directory of 'b', is gone"),
        (errno.EIO, FscacheError, "the store's disk failed (I/O error)"),
    ],
)
def test_an_error_of_the_rename_call_itself_names_both_paths(
    store: Store, monkeypatch: pytest.MonkeyPatch, code: int, error: type[FscacheError], reason: str
) -> None:
    """What another program racing the store could make ``rename(2)`` say."""
    store.write("a", b"A")

    def failing(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(error) as caught:
        store.rename("a", "b")
    assert type(caught.value) is error
    assert str(caught.value) == f"cannot rename 'a' to 'b': {reason}"


def test_a_rename_that_may_not_be_durable_names_both_paths(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write("a", b"A")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(NotDurable) as caught:
        store.rename("a", "b")
    assert str(caught.value).startswith("cannot rename 'a' to 'b': the store's disk failed")
    monkeypatch.undo()
    assert store.read("b")[1] == b"A"


def test_rename_onto_itself_changes_nothing(store: Store) -> None:
    version = store.write("f", b"x")
    assert store.rename("f", "f") == version
    assert store.read("f") == (version, b"x")


def test_facts(store: Store, root: Path) -> None:
    store.write("f", b"x")
    store.mkdir("d")
    assert store.facts("") == Facts(exists=True, is_dir=True)
    assert store.facts("f") == Facts(exists=True, is_dir=False)
    assert store.facts("d") == Facts(exists=True, is_dir=True)
    assert store.facts("nope") == Facts(exists=False, is_dir=False)
    assert store.facts("nodir/nope") == Facts(exists=False, is_dir=False)
    assert store.facts("f/under") == Facts(exists=False, is_dir=False)


# -------------------------------------------------------------------- directories


def test_mkdir_and_rmdir(store: Store, root: Path) -> None:
    store.mkdir("d")
    store.mkdir("d/e")
    assert (root / "d" / "e").is_dir()
    store.write("f", b"x")
    refused: list[tuple[Callable[[str], object], str, type[FscacheError]]] = [
        (store.mkdir, "d", Exists),
        (store.mkdir, "f", Exists),
        (store.mkdir, "nodir/x", NotFound),
        (store.mkdir, "f/x", NotADirectory),
        (store.rmdir, "f/x", NotADirectory),
        (store.listdir, "f", NotADirectory),
        (store.rmdir, "d", NotEmpty),
        (store.rmdir, "f", NotADirectory),
        (store.rmdir, "missing", NotFound),
        (store.rmdir, "", BadPath),
    ]
    for op, path, error in refused:
        with pytest.raises(error):
            op(path)
    store.rmdir("d/e")
    store.rmdir("d")
    assert store.listdir("") == ["f"]


def test_scandir_lists_sorted_entries_and_hides_the_rest(store: Store, root: Path) -> None:
    store.write("b", b"12345")
    store.mkdir("a")
    (root / (TEMP_PREFIX + "x")).write_bytes(b"")
    os.symlink(root / "b", root / "link")
    os.mkfifo(root / "fifo")
    version, entries, _ = store.scandir("")
    a_version = store.scandir("a")[0]
    b_version = store.stat("b")[0]
    assert entries == [("a", True, 0, a_version), ("b", False, 5, b_version)]
    assert version == store.stat("")[0]
    assert store.scandir("a") == (a_version, [], False)
    with pytest.raises(NotADirectory):
        store.scandir("b")
    with pytest.raises(NotFound):
        store.scandir("missing")


def test_directory_version_moves_on_every_name_change(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "time_ns", lambda: 1_000)  # a clock that never moves
    store.mkdir("d")
    store.mkdir("e")
    seen = [dir_version(store, "d")]
    changes: list[Callable[[], object]] = [
        lambda: store.write("d/a", b"x"),
        lambda: store.delete("d/a"),
        lambda: store.write_range("d/b", 0, b"x"),
        lambda: store.truncate("d/c", 1),
        lambda: store.mkdir("d/sub"),
        lambda: store.rmdir("d/sub"),
        lambda: store.rename("d/b", "d/b2"),
        lambda: store.rename("d/b2", "e/b"),
        lambda: store.rename("e/b", "d/b"),
        lambda: store.upload_commit(store.upload_begin("d/u")),
    ]
    for change in changes:
        change()
        seen.append(dir_version(store, "d"))
    assert seen == sorted(set(seen)), seen


def test_directory_versions_stay_above_a_removed_directorys(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "time_ns", lambda: 1_000)  # a clock that never moves
    first = store.mkdir("d")
    store.write("d/f", b"x")
    changed = dir_version(store, "d")
    store.delete("d/f")
    store.rmdir("d")
    again = store.mkdir("d")
    assert first < changed < again
    store.mkdir("e")
    store.rename("d", "e")  # over an empty directory, whose version was higher still
    assert dir_version(store, "e") > again


# --------------------------------------------------------------------- confinement


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret").write_bytes(b"secret")
    (out / "sub").mkdir()
    return out


def _outside_untouched(outside: Path) -> None:
    assert sorted(os.listdir(outside)) == ["secret", "sub"]
    assert (outside / "secret").read_bytes() == b"secret"
    assert os.listdir(outside / "sub") == []


@pytest.mark.parametrize("resolver", ["openat2", "steps"])
def test_every_operation_refuses_a_symlink_where_a_directory_was(
    store: Store, root: Path, outside: Path, resolver: str
) -> None:
    """With openat2, or without it (one O_NOFOLLOW step per name from the root)."""
    if resolver == "steps":
        store._openat2 = None
    store.mkdir("d")
    store.write("f", b"x")
    os.rmdir(root / "d")
    os.symlink(outside, root / "d")  # swapped in by another program
    ops: list[Callable[[], object]] = [
        lambda: store.read_range("d/secret", 0, 10),
        lambda: store.upload_begin("d/new"),
        lambda: store.write_range("d/secret", 0, b"pwned"),
        lambda: store.write_range("d/new", 0, b"pwned"),
        lambda: store.truncate("d/secret", 0),
        lambda: store.rename("f", "d/f"),
        lambda: store.rename("d/secret", "stolen"),
        lambda: store.mkdir("d/sub2"),
        lambda: store.rmdir("d/sub"),
        lambda: store.scandir("d"),
        lambda: store.read("d/secret"),
        lambda: store.write("d/secret", b"pwned"),
        lambda: store.write("d/new/deeper", b"pwned"),
        lambda: store.delete("d/secret"),
        lambda: store.stat("d/secret"),
        lambda: store.listdir("d"),
    ]
    for op in ops:
        with pytest.raises(BadPath):
            op()
    _outside_untouched(outside)
    assert store.facts("f") == Facts(exists=True, is_dir=False)
    with pytest.raises(BadPath):
        store.facts("d/secret")


def test_an_upload_cannot_be_committed_through_a_swapped_in_symlink(
    store: Store, root: Path, outside: Path
) -> None:
    store.mkdir("d")
    upload = store.upload_begin("d/f")
    store.upload_part(upload, 0, b"pwned")
    os.rename(root / "d", root / "moved")
    os.symlink(outside, root / "d")
    with pytest.raises(BadPath):
        store.upload_commit(upload)
    _outside_untouched(outside)
    assert temp_files(root) == []


def test_the_last_name_is_never_followed(store: Store, root: Path, outside: Path) -> None:
    os.symlink(outside / "secret", root / "link")
    os.symlink(outside, root / "dlink")
    with pytest.raises(BadPath):
        store.write_range("link", 0, b"pwned")
    with pytest.raises(BadPath):
        store.truncate("link", 0)
    with pytest.raises(BadPath):
        store.upload_commit(store.upload_begin("link"))
    with pytest.raises(Exists):
        store.mkdir("link")
    with pytest.raises(NotADirectory):
        store.rmdir("dlink")
    with pytest.raises(BadPath, match="symlink"):
        store.rename("link", "moved")
    _outside_untouched(outside)
    assert os.readlink(root / "link") == str(outside / "secret")


def test_crossing_renames_from_many_threads_neither_deadlock_nor_lose_a_file(
    store: Store,
) -> None:
    """Each rename locks both names in one order, so a->b and b->a never wait on
    each other forever; every rename is atomic, so exactly one file stays."""
    store.write("a", b"the file")
    rounds = 200

    def shuttle(src: str, dst: str) -> None:
        for _ in range(rounds):
            with contextlib.suppress(NotFound):  # the other thread moved it first
                store.rename(src, dst)

    threads = [threading.Thread(target=shuttle, args=pair) for pair in [("a", "b"), ("b", "a")]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    names = [name for name, *_ in store.scandir("")[1]]
    assert len(names) == 1 and store.read(names[0])[1] == b"the file"


# ------------------------------------------------------------ durability order


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The store's fsync and rename calls, in order: 'fsync:file', 'fsync:dir', 'rename'."""
    log: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        log.append("fsync:dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync:file")
        real_fsync(fd)

    def rename(*args: Any, **kwargs: Any) -> None:
        log.append("rename")
        real_rename(*args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    yield log


def test_upload_commit_fsyncs_the_data_then_renames_then_fsyncs_the_directory(
    store: Store, calls: list[str]
) -> None:
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"x")
    store.upload_sync(upload)
    assert calls == ["fsync:file"]
    store.upload_commit(upload)
    assert calls == ["fsync:file", "fsync:file", "rename", "fsync:dir"]


def test_rename_fsyncs_both_directories_after_renaming(store: Store, calls: list[str]) -> None:
    store.mkdir("a")
    store.mkdir("b")
    store.write("a/f", b"x")
    calls.clear()
    store.rename("a/f", "b/f")
    assert calls == ["rename", "fsync:dir", "fsync:dir"]
    calls.clear()
    store.rename("b/f", "b/g")
    assert calls == ["rename", "fsync:dir"]


def test_in_place_writes_fsync_before_returning(store: Store, calls: list[str]) -> None:
    store.write_range("f", 0, b"x")
    assert calls == ["fsync:file", "fsync:dir"]  # new: the directory entry too
    calls.clear()
    store.write_range("f", 0, b"y")
    store.truncate("f", 0)
    assert calls == ["fsync:file", "fsync:file"]


def test_mkdir_and_rmdir_fsync_the_parent(store: Store, calls: list[str]) -> None:
    store.mkdir("d")
    assert calls == ["fsync:dir", "fsync:dir"]  # the new directory (its stamp), its parent
    calls.clear()
    store.rmdir("d")
    assert calls == ["fsync:dir"]


# ---------------------------------------------------------------- disk errors


def test_full_disk_ends_an_upload_without_a_temp_file(small_disk: Path) -> None:
    store = Store(small_disk, max_file_size=MAX)
    old = store.write("f", b"old")
    upload = store.upload_begin("f")
    with pytest.raises(NoSpace, match="disk is full"):
        for i in range(4):
            store.upload_part(upload, i * CHUNK_SIZE, b"x" * CHUNK_SIZE)
    assert upload.closed
    assert temp_files(small_disk) == []
    assert store.read("f") == (old, b"old")


def test_full_disk_leaves_in_place_writes_untouched(small_disk: Path) -> None:
    store = Store(small_disk, max_file_size=MAX)
    old = store.write("f", b"old")
    too_big = b"x" * (2 * CHUNK_SIZE)
    with pytest.raises(NoSpace, match="disk is full"):
        store.write_range("f", 0, too_big)
    assert store.read("f") == (old, b"old")  # blocks are reserved before any byte changes
    with pytest.raises(NoSpace, match="disk is full"):
        store.write_range("new", 0, too_big)
    assert store.facts("new") == Facts(exists=False, is_dir=False)  # no stray file
    assert store.listdir("") == ["f"]


def test_no_inodes_left_leaves_no_stray_directory(small_disk: Path) -> None:
    store = Store(small_disk, max_file_size=MAX)
    made = 0
    with pytest.raises(NoSpace, match="disk is full"):
        for made in range(100):
            store.mkdir(f"d{made:03}")
    assert len(store.scandir("")[1]) == made
    assert temp_files(small_disk) == []


@pytest.mark.parametrize("failing", ["fsync", "rename"])
def test_io_error_at_commit_leaves_the_old_file_and_no_temp_file(
    store: Store, root: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    old = store.write("f", b"old")
    upload = store.upload_begin("f")
    store.upload_part(upload, 0, b"new")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(FscacheError, match="I/O error"):
        store.upload_commit(upload)
    monkeypatch.undo()
    assert store.read("f") == (old, b"old")
    assert temp_files(root) == []
