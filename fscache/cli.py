"""The ``fscache`` command: serve, read, write, ls, stat, mv, rm, mkdir, rmdir, leader,
stats, mount, certs, demo, bench. ``read`` and ``write`` stream chunk by chunk:
memory stays bounded whatever the file's size. ``stat``, ``stats`` and ``ls
--json`` print JSON, and ``ls --long`` a line per entry, for scripts.

Exit codes: 0 success, 1 an fscache error (not found, bad path, conflict, not
allowed by the access rules, ...), 2 bad usage (an argument or option the command
cannot take: out of its range, or a ``--tls DIR`` that is no bundle of the
command's role), 3 the server cannot be reached, 4 credentials refused by TLS (ours
by the server, or the server's by us).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pathlib
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TextIO, TypeVar

from fscache.command import exit_interrupted
from fscache.errors import BadPath, FscacheError, Unauthorized, Unavailable
from fscache.settings import (
    DEFAULT_HOST,
    DEFAULT_HOT_WRITES,
    DEFAULT_PORT,
    DEFAULT_SKEW,
    DEFAULT_TERM,
    FRAME_TIMEOUT,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IDENTITY,
    MAX_IN_FLIGHT,
    MAX_LEASES_PER_HOLDER,
    MAX_OUTBOX,
    MAX_PENDING_WRITE_BYTES,
    MAX_PENDING_WRITE_BYTES_TOTAL,
    MAX_TERM,
    OUTAGE_WAIT,
    SEND_TIMEOUT,
    BadSetting,
    check_duration,
    check_host,
)

# `fscache serve` announces itself with this first line; tools that start a server
# read the address from it with parse_serving_line (the root may contain anything).
_SERVING = re.compile(r"^fscache serving .* on (?:\[(\S+)\]|(\S+)):(\d+) \(term .*\)$")

T = TypeVar("T")

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_UNAUTHORIZED = 4


def _seconds(text: str) -> float:
    """A term or a skew, checked by :func:`fscache.settings.check_duration`."""
    try:
        return check_duration("a duration", float(text))
    except BadSetting as exc:  # before ValueError, its base
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _timeout(text: str) -> float:
    """A duration that must be more than 0 (a limit's timeout)."""
    seconds = _seconds(text)
    if seconds == 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return seconds


def _limit(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1: {text!r}")
    return int(text)


def _host(text: str) -> str:
    """An address to listen on (an IPv6 one may be in brackets), checked by
    :func:`fscache.settings.check_host`."""
    try:
        return check_host("the address", text)
    except BadSetting as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535: {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0: {text!r}")
    return int(text)


def _seconds_from(least: float) -> Callable[[str], float]:
    """A duration of at least ``least`` seconds (a demo's term or ttl)."""

    def seconds(text: str) -> float:
        value = _seconds(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least:g} seconds: {text!r}")
        return value

    return seconds


def _whole_from(least: int, most: int) -> Callable[[str], int]:
    """A whole number from ``least`` to ``most`` (a demo's process count)."""

    def whole(text: str) -> int:
        if not text.isdigit() or not least <= int(text) <= most:
            raise argparse.ArgumentTypeError(f"must be from {least} to {most}: {text!r}")
        return int(text)

    return whole


def _version() -> str:
    from fscache import __version__

    return __version__


_EXIT_STATUS = """exit status:
  0    done
  1    the request failed (the message says why)
  2    bad usage
  3    the server cannot be reached (unavailable)
  4    TLS credentials refused (unauthorized)
  130  interrupted (Ctrl-C)"""
_PATH_HELP = "a file's path under the served root, with / between names (no leading /)"


class _CommandParser(argparse.ArgumentParser):
    """A command's parser whose options may come anywhere among its positionals, as
    in ``fscache write HOST:PORT PATH --if-version 3 FILE``. Plain argparse takes an
    optional positional (``write``'s FILE, ``ls``'s DIR) as absent when an option
    follows the ones before it, and then refuses what comes after the option; a
    parser with such a positional parses intermixed instead (options first, then the
    positionals). One with subcommands of its own (``demo``) or with no optional
    positional parses as argparse does."""

    _intermixing = False  # inside parse_known_intermixed_args, which calls back here

    def parse_known_args(  # type: ignore[override]  # one signature for its overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        optional = any(a.nargs in ("?", "*") for a in self._get_positional_actions())
        if self._intermixing or self._subparsers is not None or not optional:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser() -> argparse.ArgumentParser:
    from fscache.bench import demo_options as d  # light: the demos' ranges and defaults

    parser = argparse.ArgumentParser(
        prog="fscache",
        description="A file service with lease-based cache consistency (Gray & Cheriton 1989).",
        epilog=_EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )

    serve = sub.add_parser("serve", help="serve a directory tree")
    serve.add_argument("--config", metavar="FILE", help="options from a TOML file; flags win")
    serve.add_argument("--root", metavar="DIR", help="the directory to serve (required)")
    serve.add_argument(
        "--host", type=_host, default=DEFAULT_HOST,
        help="the address to listen on (default %(default)s)",
    )  # fmt: skip
    serve.add_argument(
        "--port", type=_port, default=DEFAULT_PORT,
        help="the port to listen on; 0 picks a free one (default %(default)s)",
    )  # fmt: skip
    serve.add_argument(
        "--term", type=_seconds, default=DEFAULT_TERM,
        help=f"lease term, seconds, 0..{MAX_TERM:g} (default %(default)s)",
    )  # fmt: skip
    serve.add_argument(
        "--skew", type=_seconds, default=DEFAULT_SKEW,
        help=f"clock skew allowance, seconds, 0..{MAX_TERM:g} (default %(default)s)",
    )  # fmt: skip
    serve.add_argument(
        "--hot-writes", type=_count, default=DEFAULT_HOT_WRITES,
        help="writes within one term that make a file write-shared (term 0); 0: off"
        " (default %(default)s)",
    )  # fmt: skip
    serve.add_argument(
        "--session-ttl", type=_seconds,
        help="a disconnected session's life, seconds, at least 1"
        " (default: term + skew, at least 5)",
    )  # fmt: skip
    serve.add_argument(
        "--tls", metavar="DIR",
        help="mutual TLS with the server bundle in DIR (fscache certs writes it to CERTS/server)",
    )  # fmt: skip
    serve.add_argument("--access", metavar="FILE", help="access rules (TOML); SIGHUP reloads")
    serve.add_argument(
        "--shared", action=argparse.BooleanOptionalAction, default=False,
        help="new files and directories readable by the group (default: not)",
    )  # fmt: skip
    serve.add_argument(
        "--metrics-port", type=_port, help="serve Prometheus metrics at /metrics; 0: a free port"
    )
    serve.add_argument(
        "--metrics-host", type=_host, default=DEFAULT_HOST,
        help="the metrics' address (default %(default)s)",
    )  # fmt: skip
    serve.add_argument(
        "--log-format", choices=("text", "json"), default="text",
        help="json: one JSON object per line per event (default %(default)s)",
    )  # fmt: skip
    limits = serve.add_argument_group(
        "limits", "what one client or all of them can take (docs/design.md, Limits)"
    )
    for option, default, kind, metavar, what in (
        ("--max-connections", MAX_CONNECTIONS, _limit, "N", "open connections"),
        ("--max-connections-per-identity", MAX_CONNECTIONS_PER_IDENTITY, _limit, "N",
         "connections of one identity (every plain-TCP client is anonymous)"),
        ("--max-in-flight", MAX_IN_FLIGHT, _limit, "N", "requests one connection has waiting"),
        ("--max-leases-per-holder", MAX_LEASES_PER_HOLDER, _limit, "N",
         "leases of one session; beyond, reads are not cached"),
        ("--max-pending-write-bytes", MAX_PENDING_WRITE_BYTES, _limit, "BYTES",
         "bytes of one session's waiting writes"),
        ("--max-pending-write-bytes-total", MAX_PENDING_WRITE_BYTES_TOTAL, _limit, "BYTES",
         "bytes of all sessions' waiting writes"),
        ("--max-outbox", MAX_OUTBOX, _limit, "BYTES",
         "unsent bytes of one connection before it is dropped"),
        ("--frame-timeout", FRAME_TIMEOUT, _timeout, "SECONDS",
         "how long a begun frame may take to arrive whole"),
        ("--send-timeout", SEND_TIMEOUT, _timeout, "SECONDS",
         "how long a send may take before its connection is dropped"),
    ):  # fmt: skip
        limits.add_argument(
            option, type=kind, default=default, metavar=metavar,
            help=f"{what} (default %(default)s)",
        )  # fmt: skip

    def client_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(
            name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
            epilog=_EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        command.add_argument(
            "address", metavar="HOST:PORT", type=_address,
            help=f"the server (a HOST alone: port {DEFAULT_PORT}; an IPv6 address in [ ])",
        )  # fmt: skip
        command.add_argument(
            "--tls", metavar="DIR",
            help="connect with TLS, as the client whose bundle is DIR (made by"
            " `fscache certs CERTS --client NAME`: pass CERTS/clients/NAME)",
        )  # fmt: skip
        return command

    read = client_command("read", "print a file's contents")
    read.add_argument("path", metavar="PATH", help=_PATH_HELP)
    write = client_command("write", "write a file from FILE or stdin")
    write.add_argument("path", metavar="PATH", help=_PATH_HELP)
    write.add_argument(
        "source", metavar="FILE|-", nargs="?", default="-",
        help="a local file to send, streamed (default -: standard input)",
    )  # fmt: skip
    write.add_argument(
        "--if-version", type=_file_version, metavar="VERSION",
        help="compare-and-set: only if at VERSION (0: only if it does not exist)",
    )  # fmt: skip
    fence_help = "only while TOKEN is the newest of the lock NAME (fencing)"
    write.add_argument("--fence", metavar="NAME:TOKEN", type=_fence, help=fence_help)
    ls = client_command("ls", "list a directory")
    ls.add_argument(
        "path", metavar="DIR", nargs="?", default="",
        help="a directory under the root (default: the root); directories end in /",
    )  # fmt: skip
    ls_form = ls.add_mutually_exclusive_group()
    ls_form.add_argument(
        "-l", "--long", action="store_true",
        help="a line per entry: KIND (file or dir) SIZE VERSION NAME, as of the listing",
    )  # fmt: skip
    ls_form.add_argument(
        "--json", action="store_true",
        help="a JSON array of the entries: name, is_dir, size, version",
    )  # fmt: skip
    stat = client_command("stat", "print a file's or directory's version and size as JSON")
    stat.add_argument("path", metavar="PATH", help=_PATH_HELP + "; '' or . is the root")
    mv = client_command("mv", "rename SRC to DST atomically (prints DST's version)")
    mv.add_argument("src", metavar="SRC")
    mv.add_argument("dst", metavar="DST")
    mv.add_argument("--fence", metavar="NAME:TOKEN", type=_fence, help=fence_help)
    rm = client_command("rm", "delete a file (rmdir removes a directory)")
    rm.add_argument("path", metavar="PATH", help=_PATH_HELP)
    rm.add_argument(
        "--if-version", type=_file_version, metavar="VERSION",
        help="compare-and-set: only if at VERSION",
    )  # fmt: skip
    rm.add_argument("--fence", metavar="NAME:TOKEN", type=_fence, help=fence_help)
    leader = client_command("leader", "print who holds a lock (nothing if nobody does)")
    leader.add_argument("name", metavar="NAME")
    client_command("mkdir", "make a directory").add_argument("path", metavar="DIR")
    client_command("rmdir", "remove an empty directory").add_argument("path", metavar="DIR")
    client_command("stats", "print the server's counters as JSON")
    mount = client_command("mount", "mount the tree on a local directory (FUSE)")
    mount.add_argument(
        "mountpoint", metavar="MOUNTPOINT",
        help="a local directory to mount on; files already in it are hidden (not changed)"
        " until the unmount",
    )  # fmt: skip
    mount.add_argument("--debug", action="store_true", help="log every FUSE request")
    mount.add_argument(
        "--outage-wait", metavar="SECONDS", type=_seconds, default=OUTAGE_WAIT,
        help="how long a request waits for an unreachable server before it fails with EIO"
        f" (default {OUTAGE_WAIT:g})",
    )  # fmt: skip

    certs = sub.add_parser("certs", help="make CA, server and client certificates")
    certs.add_argument("directory", metavar="DIR")
    certs.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="HOST",
        type=_server_name,
        help="server name or IP (repeatable)",
    )
    certs.add_argument(
        "--client", action="append", dest="clients", default=[], metavar="NAME",
        type=_client_name,
        help="add a client bundle DIR/clients/NAME signed by the CA (repeatable)",
    )  # fmt: skip
    certs.add_argument("--force", action="store_true", help="overwrite existing files")

    demo = sub.add_parser("demo", help="demonstrations")
    demo_sub = demo.add_subparsers(dest="demo", required=True, metavar="DEMO")
    crash = demo_sub.add_parser("crash", help="kill a lease holder; watch the writer proceed")
    crash.add_argument(
        "--term", type=_seconds_from(d.MIN_TERM), default=d.CRASH_TERM,
        help=f"lease term, seconds, {d.MIN_TERM:g}..{d.MAX_CRASH_TERM:g} (default %(default)s)",
    )  # fmt: skip
    crash.add_argument(
        "--skew", type=_seconds, default=DEFAULT_SKEW,
        help="skew allowance, seconds, less than --term (default %(default)s)",
    )  # fmt: skip
    crash.add_argument(
        "--clients", type=_whole_from(d.MIN_CLIENTS, d.MAX_CLIENTS), default=d.CRASH_CLIENTS,
        help=f"reader processes, {d.MIN_CLIENTS}..{d.MAX_CLIENTS} (default %(default)s)",
    )  # fmt: skip
    election = demo_sub.add_parser("election", help="kill the leader; watch the hand-over")
    election.add_argument(
        "--ttl", type=_seconds_from(d.MIN_TTL), default=d.ELECTION_TTL,
        help=f"leadership lock ttl, seconds, {d.MIN_TTL:g}..{d.MAX_TTL:g} (default %(default)s)",
    )  # fmt: skip
    election.add_argument(
        "--skew", type=_seconds, default=DEFAULT_SKEW,
        help="skew allowance, seconds, less than half of --ttl (default %(default)s)",
    )  # fmt: skip
    election.add_argument(
        "--candidates", type=_whole_from(d.MIN_CANDIDATES, d.MAX_CANDIDATES),
        default=d.ELECTION_CANDIDATES,
        help=f"candidate processes, {d.MIN_CANDIDATES}..{d.MAX_CANDIDATES}"
        " (default %(default)s)",
    )  # fmt: skip

    # The benchmark parses its own options (--quick, --out ...): main hands them over.
    sub.add_parser(
        "bench", help="the read/write workload benchmark (fscache bench --help)", add_help=False
    )
    return parser


class OutputFailed(Exception):
    """Standard output did not take what a command wrote: a full disk, a closed
    descriptor (``>&-``). (A reader that went away, ``| head``, is not a failure.)"""


@contextlib.contextmanager
def _writing_stdout() -> Iterator[TextIO]:
    """Standard output, for a command's result: :class:`OutputFailed` if it is closed
    (``print`` would write nothing, silently) or if a write to it fails. A broken
    pipe stays itself (``| head`` took what it wanted)."""
    if sys.stdout is None:
        raise OutputFailed("standard output is closed")
    try:
        yield sys.stdout
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputFailed(exc.strerror or str(exc)) from None


def _say(text: object) -> None:
    """Print one line of a command's result to standard output."""
    with _writing_stdout() as out:
        print(text, file=out)


class _StdoutSink:
    """Standard output's bytes, for a file read whole to it."""

    def __init__(self) -> None:
        with _writing_stdout():  # a closed one is said before anything is asked
            pass

    def write(self, data: bytes) -> int:
        with _writing_stdout() as out:
            return out.buffer.write(data)

    def seekable(self) -> bool:
        return False


def _flush_stdout() -> None:
    if sys.stdout is not None:
        with _writing_stdout() as out:
            out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # before a command began: while its modules load
        print("interrupted", file=sys.stderr)
        return exit_interrupted()


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.command != "bench" and rest:  # in the usage of the command they follow
        command = _subcommand(parser, args.command)
        if args.command == "demo":
            command = _subcommand(command, args.demo)
        command.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "serve":
        args = _serve_options(parser, argv, args)
    if getattr(args, "tls", None):
        _check_tls_bundle(parser, args)
    if args.command == "demo":
        _demo_options(parser, args)
    try:
        try:
            if args.command == "bench":
                from fscache.bench.workload import main as bench_main

                return bench_main(rest)
            status = _COMMANDS[args.command](args)
            _flush_stdout()  # here, where a failure is reported, not at exit
            return status
        except BaseExceptionGroup as group:  # trio groups what a nursery raised
            if group.subgroup(KeyboardInterrupt) is not None:  # Ctrl-C beside others
                raise KeyboardInterrupt from None
            leaf = _single_leaf(group)
            if leaf is None:
                raise
            raise leaf from None
    except Unavailable as exc:
        return _failed(args, f"unavailable: {exc}", EXIT_UNAVAILABLE)
    except FscacheError as exc:
        if _credentials_refused(exc):
            return _failed(args, f"unauthorized: {exc}", EXIT_UNAUTHORIZED)
        # A client command names the kind of error the server answered (NotFound: ...);
        # serve's own errors are the operator's, said in words alone.
        named = type(exc) is not FscacheError and args.command != "serve"
        kind = f"{type(exc).__name__}: " if named else ""
        return _failed(args, f"{kind}{exc}", EXIT_ERROR)
    except KeyboardInterrupt:  # Ctrl-C: the children are stopped on the way out
        if _json_log(args):
            return _failed(args, "interrupted", exit_interrupted())
        print("interrupted", file=sys.stderr)
        return exit_interrupted()
    except BrokenPipeError:  # `fscache stats ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OutputFailed as exc:  # `fscache read ... > /dev/full`, `>&-`
        if sys.stdout is not None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # drop the rest
        return _failed(args, f"cannot write to standard output: {exc}", EXIT_ERROR)
    except Exception:
        if not _json_log(args):
            raise
        logging.getLogger("fscache").exception("fscache serve: internal error")
        return EXIT_ERROR


def _json_log(args: argparse.Namespace) -> bool:
    """Whether the command is ``serve --log-format json``: all it writes to stderr
    is then one JSON object a line, from the first record to the last. So this also
    sets the log's format, for a failure (a Ctrl-C) before the server has."""
    if not (args.command == "serve" and args.log_format == "json"):
        return False
    from fscache.server.logs import configure

    configure("json", args.verbose)
    return True


def _failed(args: argparse.Namespace, what: str, code: int) -> int:
    """Say why the command failed, ``fscache: WHAT`` on stderr (a ``fatal`` event in
    a JSON log), and return its exit status ``code``."""
    if _json_log(args):
        from fscache.server.logs import EVENTS

        EVENTS.critical(
            "fscache: %s", what, extra={"event": "fatal", "fields": {"error": what, "exit": code}}
        )
    else:
        print(f"fscache: {what}", file=sys.stderr)
    return code


def _credentials_refused(exc: FscacheError) -> bool:
    """Whether TLS refused a certificate (exit 4), not the access rules a request
    (an Unauthorized with accepted credentials: exit 1, as any fscache error)."""
    if not isinstance(exc, Unauthorized):
        return False
    from fscache.tls import CredentialsRefused  # loaded already by any client command

    return isinstance(exc, CredentialsRefused)


def parse_serving_line(line: str) -> tuple[str, int] | None:
    """``(host, port)`` from the first line ``fscache serve`` prints, or None."""
    match = _SERVING.match(line.strip())
    return None if match is None else (match[1] or match[2], int(match[3]))


def _single_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception inside nested single-member groups, or None."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


# ---------------------------------------------------------------- serve
def _serve_options(
    parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace
) -> argparse.Namespace:
    """The serve options: ``--config``'s file under the command line's flags."""
    if args.config is not None:
        from fscache.server.config import BadConfig, load

        serve = _subcommand(parser, "serve")
        try:
            serve.set_defaults(**load(args.config, serve))
        except BadConfig as exc:
            serve.error(str(exc))
        args = parser.parse_args(argv)
    if not args.root:
        _subcommand(parser, "serve").error("--root is needed (or root in the --config file)")
    return args


_WHOLE_NUMBER_LIMIT = 2**64  # what the protocol carries (CBOR's own integers)


def _whole_number(text: str, least: int) -> int | None:
    """``text`` as a whole number from ``least`` up to what the protocol carries,
    written in ASCII digits (``int`` would also take ``٢`` or ``1_0``); else None."""
    if not (text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if least <= number < _WHOLE_NUMBER_LIMIT else None


def _file_version(text: str) -> int:
    """``--if-version``'s VERSION: a whole number, 0 or more (bad usage otherwise)."""
    version = _whole_number(text, 0)
    if version is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a version (a whole number, 0 to 2**64-1)"
        )
    return version


def _check_tls_bundle(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--tls DIR`` that names no bundle of the command's role (no such directory,
    or one without a bundle's files, such as the ``fscache certs`` directory itself)
    is bad usage, said before anything starts. A bundle whose files are there is
    loaded by the command: files that cannot be read or are no certificates are an
    fscache error (exit 1), as any other."""
    from fscache import tls

    serving = args.command == "serve"
    files = tls.SERVER_FILES if serving else tls.CLIENT_FILES
    bundle = pathlib.Path(args.tls)
    if bundle.is_dir() and all((bundle / name).exists() for name in files):
        return
    try:  # the loader's own words for what is missing (it raises here)
        (tls.server_context if serving else tls.client_context)(bundle)
    except FscacheError as exc:
        where = "--tls (or tls in the --config file)" if getattr(args, "config", None) else "--tls"
        _subcommand(parser, args.command).error(f"argument {where}: {exc}")


def _address(text: str) -> str:
    """A client command's HOST:PORT, checked (a bad one is bad usage)."""
    from fscache.client.client import parse_address

    try:
        parse_address(text)
    except FscacheError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _client_name(text: str) -> str:
    """A ``certs --client`` name, checked (a bad one is bad usage)."""
    from fscache.tls import check_client_name

    try:
        return check_client_name(text)
    except FscacheError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _server_name(text: str) -> str:
    """A ``certs --host`` name, checked (a bad one is bad usage)."""
    from fscache.tls import check_host_name

    try:
        return check_host_name(text)
    except FscacheError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            command: argparse.ArgumentParser = action.choices[name]
            return command
    raise LookupError(name)


def _serve(args: argparse.Namespace) -> int:
    import trio

    from fscache.net import shown_address
    from fscache.server.logs import configure, event
    from fscache.server.metrics import serve_metrics
    from fscache.server.service import LIMITS, TIMEOUTS, ServerSettings, serve

    root = os.path.abspath(args.root)  # the store checks that it is a directory
    try:
        settings = ServerSettings(
            root=root, host=args.host, port=args.port, term=args.term, skew=args.skew,
            hot_writes=args.hot_writes, tls_dir=args.tls, access_file=args.access,
            shared=args.shared, session_ttl=args.session_ttl,
            **{name: getattr(args, name) for name in LIMITS + TIMEOUTS},
        )  # fmt: skip
    except BadSetting as exc:  # settings that are wrong together (each alone was checked)
        print(f"fscache serve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure(args.log_format, args.verbose)
    if 0 < args.term <= args.skew:
        logging.getLogger("fscache.server").warning(
            "the skew (%g s) is not less than the term (%g s): a client trusts a lease"
            " for term - skew, so none will answer from its cache, yet writers wait"
            " out every lease; lower --skew, or serve with --term 0 for no caching",
            args.skew, args.term,
        )  # fmt: skip
    # In JSON every line on stderr is one object: the shutdown is told there as
    # events; stdout keeps the lines tools read at start (the serving line first).
    json_log = args.log_format == "json"

    def tell(line: str) -> None:
        """One of the lines tools read from stdout at start: if it cannot be written,
        the start fails (:class:`OutputFailed`; a broken pipe stays itself)."""
        with _writing_stdout() as out:
            print(line, file=out, flush=True)

    def tell_if_heard(line: str) -> None:
        """A line of the stop: its reader may have gone (the stop goes on regardless)."""
        with contextlib.suppress(OSError, OutputFailed):
            tell(line)

    async def run() -> None:
        # Signals are taken from before the serving line: a SIGTERM sent as soon as it
        # is read stops the server as any other does, not by the default action.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            await serve_until(signals)

    async def serve_until(signals: AsyncIterator[int]) -> None:
        async with trio.open_nursery() as nursery:
            service = await nursery.start(serve, settings)
            try:
                metrics = None
                if args.metrics_port is not None:  # up before the server says it serves
                    metrics = await nursery.start(
                        serve_metrics, service, args.metrics_host, args.metrics_port
                    )
                window = service.restart_window
                tell(
                    f"fscache serving {root} on {shown_address(service.host, service.port)}"
                    f" (term {args.term:g} s, skew {args.skew:g} s, epoch {service.epoch}"
                    f"{', TLS' if args.tls else ''})"
                )
                if window > 0:
                    tell(f"restart window: writes held for {window:g} s")
                if metrics is not None:
                    host, port = metrics
                    tell(f"metrics at http://{shown_address(host, port)}/metrics")
            except BaseException:
                service.shutdown()  # it served nothing yet
                raise
            async for signum in signals:
                name = signal.Signals(signum).name
                break
            # Recorded first: telling it must not keep a clean stop from being one.
            live = service.shutdown()
            window = 0.0 if service.stopped_cleanly else service.policy.max_term + args.skew
            why = f"{live} lease(s) still live" if live else "writes still held or waiting"
            if json_log:
                event("shutdown", "%s: shutting down", name, signal=name)
                event(
                    "stopped", "stopped %s", "cleanly" if window == 0 else f"({why})",
                    clean=window == 0, leases_live=live, next_restart_window_s=window,
                )  # fmt: skip
            else:
                tell_if_heard(f"{name}: shutting down")
                if window:
                    tell_if_heard(f"{why}: the next start holds writes for at least {window:g} s")
            nursery.cancel_scope.cancel()

    trio.run(run)
    return 0


# ---------------------------------------------------------------- client commands
def _with_client(args: argparse.Namespace, body: Callable[[Any], Awaitable[T]]) -> T:
    import trio

    from fscache.client.client import open_client, parse_address

    host, port = parse_address(args.address)
    ssl_context = None
    if args.tls:
        from fscache.tls import client_context

        ssl_context = client_context(args.tls)

    async def run() -> T:
        # One command, one use of each file: nothing to cache, so memory stays bounded
        # by the chunks in flight.
        async with open_client(host, port, ssl_context=ssl_context, cache_bytes=0) as client:
            return await body(client)

    try:
        return trio.run(run)
    except BadPath as exc:  # "path is empty" for '.': say which path, as typed
        paths = [getattr(args, name, None) for name in ("path", "src", "dst")]
        typed = [path for path in paths if path is not None]
        if not typed or any(repr(path) in str(exc) for path in typed):
            raise
        refused = [path for path in typed if _refused(path)] or typed
        raise BadPath(f"{' and '.join(map(_shown_path, refused))}: {exc}") from None


def _refused(path: str) -> bool:
    """Whether the path rules refuse ``path`` (which one of mv's two was bad)."""
    from fscache.paths import normalize

    try:
        normalize(path)
    except BadPath:
        return True
    return False


def _shown_path(path: str, most: int = 60) -> str:
    """``path`` as an error shows it: whole, or its start and its length if long."""
    if len(path) <= most:
        return repr(path)
    return f"{path[:most]!r}... ({len(path.encode(errors='replace'))} bytes)"


def _read(args: argparse.Namespace) -> int:
    sink = _StdoutSink()
    _with_client(args, lambda c: c.read_into(args.path, sink))
    return 0


def _write(args: argparse.Namespace) -> int:
    if args.source == "-":
        source = sys.stdin.buffer
    else:
        try:
            source = open(args.source, "rb")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise FscacheError(f"cannot read {args.source}: {exc.strerror}") from None
    with source:
        version = _with_client(
            args,
            lambda c: c.write(args.path, source, if_version=args.if_version, fence=args.fence),
        )
    _say(version)
    return 0


def _mv(args: argparse.Namespace) -> int:
    _say(_with_client(args, lambda c: c.rename(args.src, args.dst, fence=args.fence)))
    return 0


def _rm(args: argparse.Namespace) -> int:
    _with_client(args, lambda c: c.delete(args.path, if_version=args.if_version, fence=args.fence))
    return 0


def _leader(args: argparse.Namespace) -> int:
    """The lock's holder's identity on stdout; nothing there (and a word on stderr)
    if nobody holds it: a script tests the output, a person reads both."""
    identity = _with_client(args, lambda c: c.leader(args.name))
    if identity is None:
        print(f"nobody holds {args.name!r}", file=sys.stderr)
    else:
        _say(identity)
    return 0


def _fence(text: str) -> tuple[str, int]:
    """``--fence NAME:TOKEN``: a lock's name and a fencing token (bad usage otherwise)."""
    from fscache.errors import BadPath
    from fscache.paths import normalize

    name, colon, token_text = text.rpartition(":")
    token = _whole_number(token_text, 1)
    if not colon or not name or token is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME:TOKEN (a lock's name, a token of 1 to 2**64-1)"
        )
    try:
        normalize(name)  # a lock's name follows the path rules
    except BadPath as exc:
        raise argparse.ArgumentTypeError(f"the lock name {name!r} is not valid: {exc}") from None
    return name, token


def _mkdir(args: argparse.Namespace) -> int:
    _with_client(args, lambda c: c.mkdir(args.path))
    return 0


def _rmdir(args: argparse.Namespace) -> int:
    _with_client(args, lambda c: c.rmdir(args.path))
    return 0


def _ls(args: argparse.Namespace) -> int:
    """The names, one a line (directories end in /); ``--long``: each entry's kind,
    size, version and name on its line (the name last, so it may hold spaces);
    ``--json``: the entries as one JSON array. Sizes and versions are the listing's."""
    if not (args.long or args.json):
        for name in _with_client(args, lambda c: c.listdir(args.path)):
            _say(name)
        return 0
    entries = _with_client(args, lambda c: c.scandir(args.path))
    if args.json:
        _say(json.dumps([_entry_fields(entry) for entry in entries], indent=2))
        return 0
    for entry in entries:
        kind, name = ("dir", entry.name + "/") if entry.is_dir else ("file", entry.name)
        _say(f"{kind} {entry.size} {entry.version} {name}")
    return 0


def _entry_fields(entry: Any) -> dict[str, Any]:
    """A listing's entry (a :class:`~fscache.cache.DirEntry`) as JSON shows it."""
    return {
        "name": entry.name,
        "is_dir": entry.is_dir,
        "size": entry.size,
        "version": entry.version,
    }


def _stat(args: argparse.Namespace) -> int:
    """:meth:`Client.stat` of PATH as one JSON object: path, version, size, is_dir."""
    st = _with_client(args, lambda c: c.stat(args.path))
    fields = {"path": st.path, "version": st.version, "size": st.size, "is_dir": st.is_dir}
    _say(json.dumps(fields, indent=2))
    return 0


def _stats(args: argparse.Namespace) -> int:
    _say(json.dumps(_with_client(args, lambda c: c.server_stats()), indent=2, sort_keys=True))
    return 0


def _mount(args: argparse.Namespace) -> int:
    import trio

    from fscache.client.mount import check_mountpoint, mount

    mountpoint = os.path.abspath(args.mountpoint)
    check_mountpoint(mountpoint)  # before connecting: a stale FUSE mount, a file ...

    async def serve_mount(client: Any) -> int:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def until_unmounted(task_status: trio.TaskStatus[None]) -> None:
                    await mount(
                        client, mountpoint, debug=args.debug, outage_wait=args.outage_wait,
                        task_status=task_status,
                    )  # fmt: skip
                    print("unmounted", flush=True)
                    nursery.cancel_scope.cancel()

                await nursery.start(until_unmounted)
                print(
                    f"fscache mounted {args.address} on {mountpoint}"
                    f" (to unmount: fusermount3 -u {mountpoint}, or Ctrl-C)",
                    flush=True,
                )
                async for signum in signals:
                    print(f"{signal.Signals(signum).name}: unmounting", flush=True)
                    break
                nursery.cancel_scope.cancel()
        return 0

    return _with_client(args, serve_mount)


# ---------------------------------------------------------------- the rest
def _certs(args: argparse.Namespace) -> int:
    from fscache.tls import make_certs

    hosts = args.hosts or ["127.0.0.1", "localhost", "::1"]
    written = make_certs(args.directory, hosts=hosts, clients=args.clients, overwrite=args.force)
    for path in written:
        _say(path)
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.demo == "election":
        from fscache.bench.demo_election import run_election_demo

        return run_election_demo(ttl=args.ttl, skew=args.skew, candidates=args.candidates)
    from fscache.bench.demo import run_crash_demo

    return run_crash_demo(term=args.term, skew=args.skew, clients=args.clients)


def _demo_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options each in its range were checked while parsing; here, together
    (the skew against the term): out of range is bad usage, before the demo starts."""
    from fscache.bench.demo_options import check_crash, check_election

    try:
        if args.demo == "election":
            check_election(ttl=args.ttl, skew=args.skew, candidates=args.candidates)
        else:
            check_crash(term=args.term, skew=args.skew, clients=args.clients)
    except BadSetting as exc:
        _subcommand(_subcommand(parser, "demo"), args.demo).error(str(exc))


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve,
    "read": _read,
    "write": _write,
    "ls": _ls,
    "mv": _mv,
    "rm": _rm,
    "leader": _leader,
    "mkdir": _mkdir,
    "rmdir": _rmdir,
    "stats": _stats,
    "stat": _stat,
    "mount": _mount,
    "certs": _certs,
    "demo": _demo,
}

if __name__ == "__main__":
    sys.exit(main())
