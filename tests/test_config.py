"""``fscache serve --config`` (``docs/design.md``, "Configuration").

Test rules: the file's checks (unknown keys, types, ranges, relative paths, flags
over the file) run in process on the command line's own parser. One test starts a
real server process from a file that sets every option, on 127.0.0.1 addresses and
port 0, and checks that each took effect. The example file in ``docs/`` is parsed
and compared with the parser, so the two cannot drift.
"""

from __future__ import annotations

import json
import os
import re
import stat
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import fscache
from fscache.cli import _serve_options, _subcommand, build_parser, main
from fscache.server.config import BadConfig, load, options
from fscache.server.service import LIMITS, TIMEOUTS, ServerSettings
from fscache.settings import BadSetting
from fscache.tls import client_context, make_certs

from .test_metrics import serve_process

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "config-example.toml"
SERVE = _subcommand(build_parser(), "serve")


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fscache.toml"
    path.write_text(text)
    return str(path)


def serve_args(*argv: str) -> Any:
    parser = build_parser()
    args, _ = parser.parse_known_args(["serve", *argv])
    return _serve_options(parser, ["serve", *argv], args)


# ---------------------------------------------------------------- the file's checks
def test_an_unknown_key_is_named_with_the_nearest_known_one(tmp_path: Path) -> None:
    path = config(tmp_path, "term = 5\nsesion-ttl = 7\n")

    with pytest.raises(BadConfig, match="unknown key 'sesion-ttl'; did you mean 'session-ttl'"):
        load(path, SERVE)


def test_a_key_written_with_underscores_is_unknown_and_the_dashed_one_suggested(
    tmp_path: Path,
) -> None:
    with pytest.raises(BadConfig, match="unknown key 'hot_writes'; did you mean 'hot-writes'"):
        load(config(tmp_path, "hot_writes = 1\n"), SERVE)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('port = "7710"', "port must be an integer, not str '7710'"),
        ("port = 7710.0", "port must be an integer, not float 7710.0"),
        ('term = "10"', "term must be a number, not str '10'"),
        ("term = true", "term must be a number, not bool True"),
        ('shared = "yes"', "shared must be a boolean, not str 'yes'"),
        ("host = 1", "host must be a string, not int 1"),
        ('log-format = "xml"', "log-format must be one of 'text', 'json', not 'xml'"),
        ("port = 70000", "port: port must be 0..65535"),
        ("term = -1", "term: a duration must be a finite number >= 0"),
        ("hot-writes = -1", "hot-writes: must be a whole number >= 0"),
        ("max-connections = 0", "max-connections: must be a whole number >= 1"),
        ("max-outbox = 1.5", "max-outbox must be an integer, not float 1.5"),
        ("send-timeout = 0", "send-timeout: must be more than 0 seconds"),
        ('host = ""', "host: the address must be a host name or an address, such as 127.0.0.1"),
        ('metrics-host = " "', "metrics-host: the address must be a host name or an address"),
    ],
)
def test_a_wrong_value_is_named_with_its_key_and_what_it_must_be(
    tmp_path: Path, line: str, message: str
) -> None:
    with pytest.raises(BadConfig, match=message.replace(".", r"\.").replace("(", r"\(")):
        load(config(tmp_path, line + "\n"), SERVE)


def test_a_file_that_is_not_toml_is_named_with_its_line(tmp_path: Path) -> None:
    with pytest.raises(BadConfig, match=r"fscache\.toml: .*line 2"):
        load(config(tmp_path, "term = 5\nport = = 1\n"), SERVE)


def test_a_file_that_is_not_utf8_is_named_with_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "fscache.toml"
    path.write_bytes(b'root = "r"\nhost = "\xff\xfe"\n')
    with pytest.raises(BadConfig, match=r"fscache\.toml: not UTF-8 \(at byte offset 19"):
        load(str(path), SERVE)


def test_paths_are_relative_to_the_files_directory(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "fscache.toml"
    path.write_text('root = "../data"\ntls = "tls/server"\naccess = "/abs/access.toml"\n')

    values = load(str(path), SERVE)

    assert values["root"] == str(tmp_path / "etc" / ".." / "data")
    assert values["tls"] == str(tmp_path / "etc" / "tls" / "server")
    assert values["access"] == "/abs/access.toml"


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = config(tmp_path, 'root = "r"\nterm = 5\nskew = 0.5\nshared = true\nport = 0\n')

    args = serve_args("--config", path, "--term", "2", "--port", "7")

    assert args.term == 2.0  # the flag
    assert args.port == 7
    assert args.skew == 0.5  # the file
    assert args.shared is True
    assert args.root == str(tmp_path / "r")
    assert args.hot_writes == 3  # neither: the default
    assert serve_args("--config", path, "--no-shared").shared is False  # a switch turned off


def test_every_limit_is_an_option_whose_default_is_the_servers() -> None:
    defaults = ServerSettings(root="r")

    for name in LIMITS + TIMEOUTS:
        assert SERVE.get_default(name) == getattr(defaults, name), name
    args = serve_args("--root", "r", "--max-connections", "20000", "--frame-timeout", "2.5")
    assert (args.max_connections, args.frame_timeout) == (20000, 2.5)


def test_limits_wrong_together_are_bad_usage_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--root", str(tmp_path), "--max-outbox", "1000"]) == 2
    assert "fscache serve: error: max_outbox must be at least max_frame" in capsys.readouterr().err


def test_values_of_a_file_wrong_together_are_named_as_the_file_spells_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As any other error in the file: the file first, then its key (not the field)."""
    path = config(tmp_path, 'root = "r"\nmax-outbox = 10\n')
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--config", path])

    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"fscache serve: error: {path}: max-outbox must be at least max_frame (2097152), not 10"
    )
    assert serve_args("--config", config(tmp_path, "max-outbox = 2097152\n"), "--root", "r")


def test_a_bracketed_ipv6_host_is_taken_without_its_brackets(tmp_path: Path) -> None:
    path = config(tmp_path, 'root = "r"\nhost = "[::1]"\n')

    assert serve_args("--config", path).host == "::1"
    assert serve_args("--root", "r", "--host", "[::1]", "--metrics-host", "[::1]").metrics_host == (
        "::1"
    )
    assert ServerSettings(root="r", host="[::1]").host == "::1"
    with pytest.raises(BadSetting, match="host must be a host name or an address"):
        ServerSettings(root="r", host="")


def test_an_empty_host_on_the_command_line_is_bad_usage_with_what_a_host_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--root", str(tmp_path), "--host", ""])

    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --host: the address must be a host name or an address" in err
    assert "::1" in err and "0.0.0.0" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("term = 5\n", "fscache serve: error: --root is needed (or root in the --config file)"),
        ("trem = 5\n", "unknown key 'trem'; did you mean 'term'"),
    ],
)
def test_a_file_without_a_root_or_with_a_bad_key_is_bad_usage_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--config", config(tmp_path, text)])

    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- the example file
def test_the_example_names_every_option_and_sets_each_default() -> None:
    keys = options(SERVE)
    set_there = load(str(EXAMPLE), SERVE)  # it parses: every key it sets is known and typed
    commented = re.findall(r"^# ([a-z-]+) = ", EXAMPLE.read_text(), flags=re.MULTILINE)

    assert set(set_there) | {keys[key].dest for key in commented} == {
        action.dest for action in keys.values()
    }
    for dest, value in set_there.items():
        assert value == SERVE.get_default(dest), dest
    for key in commented:  # only an option with no default is left out
        assert SERVE.get_default(keys[key].dest) is None, key


# ---------------------------------------------------------------- every option, for real
@pytest.mark.slow
def test_a_server_started_from_a_file_with_every_option_uses_each(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "root").mkdir(parents=True)
    make_certs(etc / "tls", hosts=["127.0.0.2"], clients=["alice"])
    (etc / "access.toml").write_text(
        'default = "read"\n[[rule]]\nidentity = "alice"\nprefix = "docs"\naccess = "read-write"\n'
    )
    (etc / "fscache.toml").write_text(
        'root = "root"\nhost = "127.0.0.2"\nport = 0\nterm = 5\nskew = 0.25\n'
        'hot-writes = 1\nsession-ttl = 7.5\ntls = "tls/server"\naccess = "access.toml"\n'
        'shared = true\nmetrics-port = 0\nmetrics-host = "127.0.0.3"\nlog-format = "json"\n'
        "max-connections = 50\nmax-connections-per-identity = 2\nmax-in-flight = 8\n"
        "max-leases-per-holder = 1000\nmax-pending-write-bytes = 4000000\n"
        "max-pending-write-bytes-total = 8000000\nmax-outbox = 3000000\n"
        "frame-timeout = 12.5\nsend-timeout = 20\n"
    )
    assert set(load(str(etc / "fscache.toml"), SERVE)) == {
        action.dest for action in options(SERVE).values()
    }
    alice = client_context(etc / "tls" / "clients" / "alice")
    elsewhere = tmp_path / "elsewhere"  # relative paths are the file's, not the cwd's
    elsewhere.mkdir()
    log_path = tmp_path / "server.log"
    with (
        log_path.open("w") as log_file,
        serve_process(
            "--config", str(etc / "fscache.toml"), metrics=True, cwd=elsewhere, stderr=log_file
        ) as server,
    ):
        assert server.host == "127.0.0.2"  # host
        assert server.port not in (0, 7710)  # port 0: a free one
        assert server.metrics is not None
        assert server.metrics.startswith("http://127.0.0.3:")  # metrics-host, metrics-port
        with urllib.request.urlopen(server.metrics, timeout=30) as response:
            assert b"fscache_reads_total" in response.read()
        with (
            fscache.connect(server.address, ssl_context=alice, client_id="w") as writer,  # tls
            fscache.connect(server.address, ssl_context=alice, client_id="r") as reader,
        ):
            stats = writer.server_stats()
            assert (stats["term"], stats["skew"], stats["session_ttl"]) == (5.0, 0.25, 7.5)
            writer.write("docs/a.txt", b"x")
            with pytest.raises(fscache.Unauthorized):  # access: alice writes docs/ only
                writer.write("other.txt", b"x")
            reader.read("docs/a.txt")
            reader.read("docs/a.txt")
            # hot-writes 1: one write made the file write-shared, so it is not cached
            assert reader.stats["misses"] == 2
            # max-connections-per-identity 2: alice's third connection is turned away
            with pytest.raises(fscache.Unavailable, match="max_connections_per_identity"):
                fscache.connect(server.address, ssl_context=alice, client_id="x")
    mode = stat.S_IMODE(os.stat(etc / "root" / "docs" / "a.txt").st_mode)
    assert mode & stat.S_IRGRP  # shared
    logged = [json.loads(line) for line in log_path.read_text().splitlines()]  # log-format
    (limits,) = [line["message"] for line in logged if line["message"].startswith("limits: ")]
    assert limits.startswith(  # the other limits, as the server has them
        "limits: max_connections 50, max_connections_per_identity 2, max_in_flight 8,"
        " max_pending_write_bytes 4000000, max_pending_write_bytes_total 8000000,"
        " max_leases_per_holder 1000, max_outbox 3000000, frame_timeout 12.5, send_timeout 20.0,"
        " open files "
    )
    assert {"w", "r"} <= {line.get("label") for line in logged if line["event"] == "connect"}
    assert {line.get("identity") for line in logged if line["event"] == "connect"} == {"alice"}
