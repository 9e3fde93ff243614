"""The command line's arguments, parsed without a server: options may come anywhere
among a command's positionals, an optional positional among them (``write``'s FILE,
``ls``'s DIR); bad usage is exit 2.
"""

from __future__ import annotations

import argparse

import pytest

from fscache import cli

ADDRESS = "127.0.0.1:7830"


def parsed(*argv: str) -> argparse.Namespace:
    args, rest = cli.build_parser().parse_known_args(list(argv))
    assert rest == [], rest
    return args


@pytest.mark.parametrize(
    "argv",
    [
        ["write", ADDRESS, "cli/a.txt", "in.txt", "--if-version", "1", "--tls", "d"],
        ["write", ADDRESS, "cli/a.txt", "--if-version", "1", "in.txt", "--tls", "d"],
        ["write", ADDRESS, "cli/a.txt", "--tls", "d", "--if-version", "1", "in.txt"],
        ["write", ADDRESS, "--tls", "d", "cli/a.txt", "--if-version", "1", "in.txt"],
        ["write", "--if-version", "1", "--tls", "d", ADDRESS, "cli/a.txt", "in.txt"],
    ],
)
def test_write_takes_its_options_anywhere_among_its_positionals(argv):
    args = parsed(*argv)
    assert (args.address, args.path, args.source) == (ADDRESS, "cli/a.txt", "in.txt")
    assert (args.if_version, args.tls) == (1, "d")


def test_write_without_a_file_reads_stdin_whatever_comes_after_the_path():
    for argv in (
        ["write", ADDRESS, "a", "--if-version", "0"],
        ["write", ADDRESS, "a", "--fence", "jobs/leader:3"],
        ["write", ADDRESS, "a", "-", "--if-version", "0"],
    ):
        assert parsed(*argv).source == "-"
    args = parsed("write", ADDRESS, "a", "--fence", "jobs/leader:3", "f")
    assert (args.fence, args.source) == (("jobs/leader", 3), "f")


def test_a_positional_that_looks_like_an_option_still_comes_after_two_dashes():
    args = parsed("write", ADDRESS, "--if-version", "2", "--", "-a", "-b")
    assert (args.path, args.source, args.if_version) == ("-a", "-b", 2)


@pytest.mark.parametrize(
    ("argv", "tls", "path"),
    [
        (["ls", ADDRESS, "--tls", "d", "docs"], "d", "docs"),
        (["ls", ADDRESS, "docs", "--tls", "d"], "d", "docs"),
        (["ls", "--tls", "d", ADDRESS], "d", ""),
        (["ls", ADDRESS, "--tls", "d"], "d", ""),
        (["ls", ADDRESS], None, ""),
    ],
)
def test_ls_takes_its_options_anywhere_among_its_positionals(argv, tls, path):
    args = parsed(*argv)
    assert (args.address, args.tls, args.path) == (ADDRESS, tls, path)


@pytest.mark.parametrize(
    "argv",
    [
        ["mv", ADDRESS, "a", "--fence", "l:1", "b"],
        ["rm", ADDRESS, "--if-version", "3", "a"],
        ["read", ADDRESS, "--tls", "d", "a"],
        ["mount", ADDRESS, "--debug", "m"],
        ["certs", "--force", "d"],
    ],
)
def test_every_other_command_already_takes_options_between_positionals(argv):
    assert parsed(*argv).command == argv[0]


def test_a_positional_too_many_is_still_bad_usage(capsys):
    for argv in (
        ["write", ADDRESS, "a", "--if-version", "1", "f", "g"],
        ["ls", ADDRESS, "d", "--tls", "t", "e"],
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        assert "error: unrecognized arguments: " in capsys.readouterr().err.splitlines()[-1]


def test_subcommands_of_subcommands_and_the_benchmark_parse_as_before():
    args = parsed("demo", "crash", "--clients", "3")
    assert (args.command, args.demo, args.clients) == ("demo", "crash", 3)
    args, rest = cli.build_parser().parse_known_args(["bench", "--quick", "--out", "o"])
    assert (args.command, rest) == ("bench", ["--quick", "--out", "o"])


def test_mount_takes_how_long_its_requests_wait_out_an_outage(capsys):
    assert parsed("mount", ADDRESS, "/mnt/x").outage_wait == 120.0
    assert parsed("mount", ADDRESS, "/mnt/x", "--outage-wait", "1.5").outage_wait == 1.5
    with pytest.raises(SystemExit) as refused:
        parsed("mount", ADDRESS, "/mnt/x", "--outage-wait", "-1")
    assert refused.value.code == 2
    assert "--outage-wait" in capsys.readouterr().err
