"""JSON logs (``docs/design.md``, "Logs").

Test rules: a real ``fscache serve --log-format json`` process on 127.0.0.1 with a
short term; the lease holder is a real process killed with SIGKILL. Every line the
server writes to stderr must parse as JSON; the events are checked for what happened
and in what order, never for how long a real wait took. The exact wait an event
reports is checked in process, under ``autojump_clock`` over memory streams
(``harness.Cluster``); the formatter too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import fscache
from fscache.server.logs import (
    EVENTS,
    JsonFormatter,
    Throttle,
    _not_quiet,
    event,
    loud_event,
    wall_time,
)
from fscache.tls import client_context, make_certs

from .harness import Cluster
from .test_metrics import serve_process

pytestmark = pytest.mark.slow

TERM = 3.0  # long enough that the holder's lease outlives its kill on a busy machine
SKEW = 0.1

HOLDER = """
import sys, fscache
c = fscache.connect(sys.argv[1], client_id="holder")
c.read("f.txt")
print("cached", flush=True)
sys.stdin.readline()
"""


def events(path: Path) -> list[dict[str, Any]]:
    """Every line of the log at ``path``, each of which must be one JSON object."""
    lines = path.read_text().splitlines()
    assert lines, "the server logged nothing"
    return [json.loads(line) for line in lines]


def wait_for_events(path: Path, name: str, count: int, timeout: float = 30.0) -> None:
    """Poll the log at ``path`` until it holds ``count`` events ``name`` (whole lines)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        whole = path.read_text().rpartition("\n")[0].splitlines()
        if sum(json.loads(line)["event"] == name for line in whole) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} {name} events in {timeout} s")


def test_a_write_delayed_by_a_killed_holder_is_logged_from_connect_to_expiry(
    root: Path, tmp_path: Path
) -> None:
    log_path = tmp_path / "server.log"
    args = ("--root", str(root), "--port", "0", "--log-format", "json")
    timing = ("--term", str(TERM), "--skew", str(SKEW), "--hot-writes", "0")
    with (
        log_path.open("w") as log_file,
        serve_process(*args, *timing, stderr=log_file) as server,
    ):
        with fscache.connect(server.address, client_id="writer") as writer:
            writer.write("f.txt", b"old")
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER, server.address],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert holder.stdout is not None
                assert holder.stdout.readline() == "cached\n"
            finally:
                holder.kill()  # SIGKILL: no goodbye, its lease stays until it expires
                holder.wait()
                holder.stdin.close()  # type: ignore[union-attr]
                holder.stdout.close()  # type: ignore[union-attr]
            writer.write("f.txt", b"new")  # waits out the holder's lease
        wait_for_events(log_path, "disconnect", 2)  # the server reads the goodbye in its time

    logged = events(log_path)
    names = [line["event"] for line in logged]  # in the order they happened
    assert all(isinstance(line["ts"], str) and "T" in line["ts"] for line in logged)
    connects = {line["label"]: line for line in logged if line["event"] == "connect"}
    assert set(connects) == {"writer", "holder"}
    holder_session = connects["holder"]["session"]
    assert connects["holder"]["identity"] == "anonymous"
    assert connects["holder"]["peer"].startswith("127.0.0.1:")

    delayed = [line for line in logged if line["event"] == "write_delayed"]
    assert len(delayed) == 1
    assert delayed[0]["path"] == "f.txt"
    assert delayed[0]["cause"] == "approvals"
    assert delayed[0]["asked"] == [holder_session]

    expired = [line for line in logged if line["event"] == "lease_expired"]
    assert len(expired) == 1
    assert expired[0]["holder"] == holder_session
    assert expired[0]["path"] == "f.txt"
    assert expired[0]["waited_s"] > 0  # the remaining lease: up to term + skew

    disconnects = {line["session"]: line for line in logged if line["event"] == "disconnect"}
    assert disconnects[holder_session]["goodbye"] is False
    assert disconnects[holder_session]["reason"]
    assert disconnects[connects["writer"]["session"]]["goodbye"] is True

    def at(name: str, session: str) -> int:
        return next(
            i
            for i, line in enumerate(logged)
            if (line["event"], line.get("session")) == (name, session)
        )

    writer_session = connects["writer"]["session"]
    assert names.index("connect") == at("connect", writer_session)
    assert at("connect", holder_session) < at("disconnect", holder_session)  # the kill
    assert at("connect", holder_session) < names.index("write_delayed")  # (either first)
    assert names.index("write_delayed") < names.index("lease_expired")
    assert names.index("lease_expired") < at("disconnect", writer_session)


def test_a_restarted_server_logs_its_restart_window(root: Path, tmp_path: Path) -> None:
    args = ("--root", str(root), "--port", "0", "--term", str(TERM), "--skew", str(SKEW))
    with serve_process(*args) as first:
        with fscache.connect(first.address) as client:
            client.write("f.txt", b"x")
        first.process.kill()  # a crash: the next start holds writes
        first.process.wait()
    log_path = tmp_path / "again.log"
    with (
        log_path.open("w") as log_file,
        serve_process(*args, "--log-format", "json", stderr=log_file),
    ):
        pass

    windows = [line for line in events(log_path) if line["event"] == "restart_window"]
    assert len(windows) == 1
    assert windows[0]["seconds"] == pytest.approx(TERM + SKEW)
    assert windows[0]["start"] < windows[0]["until"]


def test_text_logs_keep_events_quiet_and_say_the_rest(root: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "text.log"
    with (
        log_path.open("w") as log_file,
        serve_process("--root", str(root), "--port", "0", stderr=log_file) as server,
        fscache.connect(server.address) as client,
    ):
        client.write("f.txt", b"x")

    text = log_path.read_text()
    assert "connected" not in text
    assert not text.startswith("{")


@contextlib.contextmanager
def kept_events() -> Iterator[list[logging.LogRecord]]:
    """The event records logged meanwhile, at INFO and with no filter (as a JSON log
    has them), whatever the logger's own settings are; they are restored after."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    EVENTS.addHandler(handler)
    level, filters = EVENTS.level, EVENTS.filters
    EVENTS.setLevel(logging.INFO)
    EVENTS.filters = []
    try:
        yield records
    finally:
        EVENTS.removeHandler(handler)
        EVENTS.setLevel(level)
        EVENTS.filters = filters


def test_the_formatter_writes_one_object_with_the_event_and_its_fields() -> None:
    with kept_events() as records:
        event("connect", "client %s connected", "a", peer="127.0.0.1:1", session="s.1")

    line = json.loads(JsonFormatter().format(records[0]))
    assert line["event"] == "connect"
    assert line["message"] == "client a connected"
    assert line["peer"] == "127.0.0.1:1"
    assert line["session"] == "s.1"
    assert line["ts"].endswith("+00:00")
    plain = logging.LogRecord("fscache.server", logging.WARNING, "x", 1, "plain %d", (7,), None)
    assert json.loads(JsonFormatter().format(plain))["event"] == "log"
    with kept_events() as records:
        event("odd", "odd numbers", wait=math.inf, ratio=math.nan, seconds=1.5)
    strict = json.loads(  # JSON has no infinite number: strict parsers refuse them
        JsonFormatter().format(records[0]), parse_constant=lambda name: pytest.fail(name)
    )
    assert (strict["wait"], strict["ratio"], strict["seconds"]) == ("inf", "nan", 1.5)


def test_a_time_the_calendar_cannot_show_is_said_against_its_bound() -> None:
    """A restart window of 1e12 s ends in year 33,000: its event is logged all the same."""
    assert wall_time(0.0) == "1970-01-01T00:00:00.000+00:00"
    assert wall_time(253402300799.0) == "9999-12-31T23:59:59.000+00:00"
    for beyond in (1e12, 1e300, math.inf):
        assert wall_time(beyond) == "after 9999-12-31T23:59:59.999+00:00"
    for before in (-1e12, -math.inf):
        assert wall_time(before) == "before 0001-01-01T00:00:00.000+00:00"
    assert wall_time(math.nan) == "not a time"


# ---------------------------------------------------------------- exact instants, in process
async def test_the_waited_out_lease_is_logged_with_the_exact_wait(
    nursery: trio.Nursery, root: Path, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=EVENTS.name)
    cluster = Cluster(nursery, root, term=10.0, skew=SKEW)
    await cluster.start()
    async with cluster.client("seeder") as seeder:
        await seeder.write("f", b"v1")
    silent = await cluster.raw("silent")
    granted_at = trio.current_time()
    await silent.read("f")
    await trio.sleep(2.0)
    async with cluster.client("writer") as writer:
        arrived = trio.current_time()
        await writer.write("f", b"v2")
        applied = trio.current_time()
    await silent.close()

    logged = [(vars(r)["event"], vars(r)["fields"]) for r in caplog.records if "event" in vars(r)]
    delayed = [fields for name, fields in logged if name == "write_delayed"]
    expired = [fields for name, fields in logged if name == "lease_expired"]
    assert applied == pytest.approx(granted_at + 10.0 + SKEW, abs=1e-9)
    assert len(delayed) == 1 and delayed[0]["cause"] == "approvals"
    assert len(expired) == 1
    assert expired[0]["path"] == "f"
    assert expired[0]["holder"] == delayed[0]["asked"][0]
    assert expired[0]["waited_s"] == round(applied - arrived, 3) == 8.1


async def test_a_write_held_by_the_restart_window_names_it_though_holders_were_asked(
    nursery: trio.Nursery, root: Path, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=EVENTS.name)
    await Cluster(nursery, root, term=10.0, skew=SKEW).start()  # then "crashes"
    cluster = Cluster(nursery, root, term=10.0, skew=SKEW)
    assert (await cluster.start()).restart_window > 0
    (root / "g").write_bytes(b"v1")
    async with cluster.client("reader") as reader, cluster.client("writer") as writer:
        await reader.read("g")  # reads are served at once
        await writer.write("g", b"v2")  # the reader approves at once; the window holds on

    logged = [vars(r)["fields"] for r in caplog.records if vars(r).get("event") == "write_delayed"]
    assert [fields["cause"] for fields in logged] == ["restart window"]
    assert logged[0]["asked"] and logged[0]["restart_window_s"] > 0


def test_a_ctrl_c_before_the_server_starts_is_json_too(root: Path) -> None:
    """Interrupted while its settings are checked (before the server sets its log), a
    JSON-logging serve still writes only JSON to stderr: the fatal event."""
    script = (
        "import sys, fscache.server.service as service\n"
        "def interrupted(**settings): raise KeyboardInterrupt\n"
        "service.ServerSettings = interrupted\n"
        "from fscache.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    args = ("--root", str(root), "--port", "0", "--log-format", "json")
    done = subprocess.run(
        [sys.executable, "-c", script, "serve", *args], capture_output=True, timeout=60
    )
    lines = [json.loads(line) for line in done.stderr.decode().splitlines()]
    assert done.returncode == 130
    assert [(line["event"], line["error"]) for line in lines] == [("fatal", "interrupted")]


def test_a_refused_tls_handshake_is_one_text_warning_a_second(root: Path, tmp_path: Path) -> None:
    """The default text log keeps events quiet, but for a refused TLS handshake: the
    operator's to fix. A peer retrying at once makes no more lines; the next line
    counts them."""
    make_certs(tmp_path / "tls")
    log_path = tmp_path / "text.log"
    args = ("--root", str(root), "--port", "0", "--tls", str(tmp_path / "tls" / "server"))

    def plain_hello(port: int) -> None:  # no TLS record: the server's handshake fails
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"not a TLS hello\n")
            while sock.recv(4096):
                pass

    with log_path.open("w") as log_file, serve_process(*args, stderr=log_file) as server:
        for _ in range(3):
            plain_hello(server.port)
        time.sleep(1.1)  # past the throttle's second
        plain_hello(server.port)
    refused = [line for line in log_path.read_text().splitlines() if "TLS handshake" in line]
    assert len(refused) == 2, refused
    assert all(" fscache.events WARNING " in line for line in refused)
    assert refused[1].endswith("(and 2 more since the last one of these)")


def test_the_throttle_lets_one_a_second_through_and_counts_the_rest() -> None:
    throttle = Throttle(1.0)
    assert [throttle.loud(t) for t in (10.0, 10.2, 10.9, 11.0, 11.5, 13.0)] == [
        0, None, None, 2, None, 1,
    ]  # fmt: skip


def test_only_the_text_log_which_hides_throttled_events_says_it_hid_some() -> None:
    """JSON and ``-v`` have every ``tls_refused``: no line of theirs may claim that
    others were left out. The text log's filter hides the quiet ones and counts them."""
    throttle = Throttle(1.0)
    with kept_events() as records:
        for now in (10.0, 10.2, 10.5, 11.1):
            loud_event(throttle, now, "tls_refused", "%s: TLS handshake refused", "p", peer="p")

    lines = [json.loads(JsonFormatter().format(record)) for record in records]
    assert [line["message"] for line in lines] == ["p: TLS handshake refused"] * 4
    assert [line["peer"] for line in lines] == ["p"] * 4
    shown = [record for record in records if _not_quiet(record)]  # the text log's filter
    assert [record.getMessage() for record in shown] == [
        "p: TLS handshake refused",
        "p: TLS handshake refused (and 2 more since the last one of these)",
    ]


def test_a_json_server_tells_its_stop_and_a_fatal_error_as_json(root: Path, tmp_path: Path) -> None:
    """With ``--log-format json`` every line on stderr is one object, the shutdown and
    a fatal error included; stdout holds only the serving line."""
    log_path = tmp_path / "server.log"
    args = ("--root", str(root), "--port", "0", "--term", str(TERM), "--log-format", "json")
    with log_path.open("w") as log_file, serve_process(*args, stderr=log_file) as server:
        with fscache.connect(server.address) as client:
            client.write("f.txt", b"x")  # the writer's lease on it is live at the stop
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
        assert server.process.stdout is not None
        assert server.process.stdout.read() == ""  # nothing after the serving line
    with socket.socket() as listening:  # a port taken: the next server cannot listen
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        taken = subprocess.run(
            [sys.executable, "-m", "fscache", "serve", "--root", str(root),
             "--port", str(listening.getsockname()[1]), "--log-format", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    logged = {line["event"]: line for line in events(log_path)}
    assert logged["shutdown"]["signal"] == "SIGTERM"
    stopped = logged["stopped"]
    assert stopped["clean"] is False
    assert stopped["leases_live"] == 1
    assert stopped["next_restart_window_s"] == pytest.approx(TERM + SKEW)

    assert taken.returncode == 1 and taken.stdout == ""
    failed = [json.loads(line) for line in taken.stderr.splitlines()]
    assert failed[-1]["event"] == "fatal" and failed[-1]["level"] == "critical"
    assert "cannot listen on 127.0.0.1:" in failed[-1]["error"]
    assert failed[-1]["exit"] == 1


def test_every_refused_tls_handshake_is_a_warning_in_json_whatever_came_before(
    root: Path, tmp_path: Path
) -> None:
    """One rule for the level of ``tls_refused``: a warning, whatever the cause and
    however soon after another (the text log's throttle hides lines, not levels)."""
    make_certs(tmp_path / "tls", clients=["c"])
    make_certs(tmp_path / "strangers", clients=["c"])
    log_path = tmp_path / "server.log"
    args = ("--root", str(root), "--port", "0", "--log-format", "json")
    tls = ("--tls", str(tmp_path / "tls" / "server"))

    def plain_hello(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"not a TLS hello\n")
            while sock.recv(4096):
                pass

    with log_path.open("w") as log_file, serve_process(*args, *tls, stderr=log_file) as server:
        plain_hello(server.port)
        stranger = client_context(tmp_path / "strangers" / "clients" / "c")
        with pytest.raises(fscache.Unauthorized):  # at once after: once a quiet one
            fscache.connect(server.address, ssl_context=stranger)
        plain_hello(server.port)
        wait_for_events(log_path, "tls_refused", 3)

    refused = [line for line in events(log_path) if line["event"] == "tls_refused"]
    assert len(refused) == 3
    assert [line["level"] for line in refused] == ["warning"] * 3, refused
