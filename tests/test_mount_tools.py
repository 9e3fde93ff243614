"""The tools people run, on a real FUSE mount of a real server.

Each test runs a tool in a child process on the mount (the kernel's requests are
answered by this test's trio loop, so the tool must not run on the loop's own
thread) and then checks, through another fscache client, that the rest of the
world sees the result at once. The fixtures and the mount's test rules are those
of ``tests/test_mount.py``.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
import trio

from tests import test_mount

mountable = test_mount.mountable
mountpoint = test_mount.mountpoint
server = test_mount.server
other = test_mount.other
mnt = test_mount.mnt
on_mount = test_mount.on_mount


async def run(*argv: str | Path, cwd: Path | None = None) -> str:
    """``argv`` in a child process; its stdout, or the test fails with its stderr."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd or os.getcwd())}
    done = await trio.run_process(
        [str(arg) for arg in argv], cwd=cwd, env=env, capture_stdout=True,
        capture_stderr=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{argv}: {done.stderr.decode()}"
    return done.stdout.decode()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_git_init_add_commit_gc_and_fsck(mnt, other):
    repo = mnt / "repo"
    await on_mount(os.mkdir, repo)
    git = ["git", "-c", "user.name=T", "-c", "user.email=t@example.com", "-c", "gc.auto=0"]
    await run(*git, "init", "-q", "-b", "main", cwd=repo)
    for n in range(20):
        await on_mount((repo / f"f{n}.txt").write_text, f"file {n}\n" * (n + 1))
    await run(*git, "add", ".", cwd=repo)
    await run(*git, "commit", "-q", "-m", "first", cwd=repo)
    await on_mount((repo / "f3.txt").write_text, "changed\n")
    await run(*git, "commit", "-q", "-am", "second", cwd=repo)
    await run(*git, "gc", "-q", cwd=repo)
    await run(*git, "fsck", "--strict", cwd=repo)
    assert (await run(*git, "log", "--format=%s", cwd=repo)).split() == ["second", "first"]
    assert await run(*git, "status", "--porcelain", cwd=repo) == ""
    head = (await run(*git, "rev-parse", "HEAD", cwd=repo)).strip()
    assert (await other.read("repo/.git/HEAD")).strip() == b"ref: refs/heads/main"
    packed = await other.read("repo/.git/packed-refs")  # written by gc
    assert head.encode() in packed
    assert await other.read("repo/f3.txt") == b"changed\n"


async def test_sed_in_place(mnt, other):
    await other.write("conf.ini", b"a = 1\nb = 2\n")
    await run("sed", "-i", "s/b = 2/b = 3/", mnt / "conf.ini")  # temp file, rename over
    assert await other.read("conf.ini") == b"a = 1\nb = 3\n"
    assert await other.listdir("") == ["conf.ini"]  # no temp file left


def _tarball() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in [("t/a.txt", b"a"), ("t/sub/b.bin", os.urandom(300_000))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def test_tar_x_and_cp_r(mnt, other, tmp_path):
    archive = tmp_path / "t.tgz"
    archive.write_bytes(_tarball())
    await run("tar", "xzf", archive, "-C", mnt)
    await run("cp", "-r", mnt / "t", mnt / "copy")
    with tarfile.open(archive) as tar:
        member = tar.extractfile("t/sub/b.bin")
        assert member is not None
        expected = member.read()
    for top in ("t", "copy"):
        assert await other.read(f"{top}/a.txt") == b"a"
        assert await other.read(f"{top}/sub/b.bin") == expected
        assert await other.listdir(top) == ["a.txt", "sub/"]
    await run("cp", "-r", mnt / "copy", tmp_path / "out")  # and out again
    assert (tmp_path / "out" / "sub" / "b.bin").read_bytes() == expected


SQLITE = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("create table t (n integer primary key, s text)")
for batch in range(10):
    with db:
        rows = [(batch * 100 + i, "x" * i) for i in range(100)]
        db.executemany("insert into t values (?, ?)", rows)
with db:
    db.execute("update t set s = 'updated' where n % 7 = 0")
(count,) = db.execute("select count(*) from t").fetchone()
print(count, db.execute("pragma integrity_check").fetchone()[0])
db.close()
"""
CHECK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
print(*db.execute("select count(*), sum(s = 'updated') from t").fetchone())
"""


async def test_sqlite_transactions(mnt, other, tmp_path):
    out = await run(sys.executable, "-c", SQLITE, mnt / "db.sqlite")
    assert out.split() == ["1000", "ok"]
    # After the close, another client reads the same bytes the mount has.
    data = await other.read("db.sqlite")
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(data)
    assert (await run(sys.executable, "-c", CHECK, copy)).split() == ["1000", "143"]
    assert await on_mount((mnt / "db.sqlite").read_bytes) == data


async def test_atomic_save_with_os_replace(mnt, other):
    await other.write("doc.txt", b"first draft")
    assert await on_mount((mnt / "doc.txt").read_bytes) == b"first draft"  # leased here

    def save() -> None:
        with open(mnt / ".doc.txt.tmp", "wb") as f:
            f.write(b"second draft")
            f.flush()
            os.fsync(f.fileno())
        os.replace(mnt / ".doc.txt.tmp", mnt / "doc.txt")

    await on_mount(save)
    assert await other.read("doc.txt") == b"second draft"
    assert await other.listdir("") == ["doc.txt"]
    assert await on_mount((mnt / "doc.txt").read_bytes) == b"second draft"


async def test_a_file_bigger_than_a_chunk_in_and_out(mnt, other, tmp_path):
    data = os.urandom(5 << 20 | 12345)
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    await run("cp", source, mnt / "big.bin")
    assert hashlib.sha256(await other.read("big.bin")).digest() == hashlib.sha256(data).digest()
    await run("cp", mnt / "big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == data

    def poke() -> None:  # in place: only the written range goes out
        with open(mnt / "big.bin", "r+b") as f:
            f.seek(3 << 20)
            f.write(b"POKE")

    await on_mount(poke)
    assert (
        await other.read("big.bin", offset=(3 << 20) - 2, length=8)
        == data[(3 << 20) - 2 : 3 << 20] + b"POKE" + data[(3 << 20) + 4 : (3 << 20) + 6]
    )
