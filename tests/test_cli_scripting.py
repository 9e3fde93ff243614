"""The command line for scripts, against a real ``fscache serve`` process (the
``served`` fixture, localhost, port 0): ``stat`` and ``ls --json`` print JSON,
``ls --long`` a line per entry, and a version read so goes to ``--if-version``,
given anywhere among the command's positionals. No timing is asserted.
"""

from __future__ import annotations

import json

from .test_end_to_end import fscache_command, served  # noqa: F401 (a fixture)


def test_stat_prints_what_client_stat_returns_as_json(served):  # noqa: F811
    written = fscache_command("write", served, "docs/a.txt", "-", stdin=b"hello")
    assert written.returncode == 0, written.stderr
    done = fscache_command("stat", served, "docs/a.txt")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "path": "docs/a.txt", "version": int(written.stdout), "size": 5, "is_dir": False,
    }  # fmt: skip
    for spelling in ("docs", "./docs/"):
        directory = json.loads(fscache_command("stat", served, spelling).stdout)
        assert (directory["path"], directory["size"], directory["is_dir"]) == ("docs", 0, True)
    root = json.loads(fscache_command("stat", served, "").stdout)
    assert (root["path"], root["is_dir"]) == ("", True)
    missing = fscache_command("stat", served, "docs/b.txt")
    assert (missing.returncode, missing.stdout) == (1, b"")
    assert missing.stderr.startswith(b"fscache: NotFound: ")


def test_a_version_from_stat_is_what_if_version_takes(served):  # noqa: F811
    assert fscache_command("write", served, "f", "-", stdin=b"one").returncode == 0
    version = json.loads(fscache_command("stat", served, "f").stdout)["version"]
    # The options between PATH and FILE, as a script may put them.
    stale = fscache_command("write", served, "f", "--if-version", str(version + 1), "-")
    assert stale.returncode == 1 and stale.stderr.startswith(b"fscache: Conflict: ")
    won = fscache_command("write", served, "f", "--if-version", str(version), "-", stdin=b"two")
    assert won.returncode == 0, won.stderr
    assert json.loads(fscache_command("stat", served, "f").stdout)["version"] == int(won.stdout)
    assert fscache_command("read", served, "f").stdout == b"two"


def test_ls_long_and_json_give_each_entrys_kind_size_and_version(served):  # noqa: F811
    assert fscache_command("mkdir", served, "d").returncode == 0
    assert fscache_command("mkdir", served, "d/sub").returncode == 0
    a = int(fscache_command("write", served, "d/a b.txt", "-", stdin=b"abc").stdout)
    sub = json.loads(fscache_command("stat", served, "d/sub").stdout)["version"]

    plain = fscache_command("ls", served, "d")
    assert plain.stdout.decode().splitlines() == ["a b.txt", "sub/"]  # as it always was
    for flag in ("-l", "--long"):
        long = fscache_command("ls", served, flag, "d")  # the option before DIR
        assert long.returncode == 0, long.stderr
        assert long.stdout.decode().splitlines() == [f"file 3 {a} a b.txt", f"dir 0 {sub} sub/"]
    listed = fscache_command("ls", served, "d", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {"name": "a b.txt", "is_dir": False, "size": 3, "version": a},
        {"name": "sub", "is_dir": True, "size": 0, "version": sub},
    ]
    assert json.loads(fscache_command("ls", served, "d/sub", "--json").stdout) == []
    both = fscache_command("ls", served, "d", "-l", "--json")
    assert both.returncode == 2 and b"not allowed with argument" in both.stderr
    a_file = fscache_command("ls", served, "d/a b.txt", "-l")
    assert a_file.returncode == 1 and a_file.stderr.startswith(b"fscache: NotADirectory: ")
