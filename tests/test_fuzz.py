"""The fuzz targets (``tests/fuzz/targets.py``): every regression input replayed, a
short coverage-guided run of each target, and the service target's invariants on
scripts written by hand.

The replay runs each file of ``tests/fuzz/corpus/<target>/`` through its target in
this process; an input of a bug not yet fixed is a strict xfail (``KNOWN_BUGS``). The
hand-written scripts show a hostile one the server must survive, and servers broken on
purpose that the target must catch. The short runs start ``python -m
fscache.bench.fuzz`` in a real process (libFuzzer ends the process it runs in) with a
fixed seed, and any failing input goes to a temp dir. A bug found beside the targets
is a strict xfail of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest

from fscache import protocol as p
from fscache.errors import ProtocolError
from fscache.server.service import FileService

from .fuzz.targets import CORPUS, GOOD, KNOWN_BUGS, TARGETS, GoodDoes, PeerDoes, Send, Sleep, play

SHORT_RUNS = {"codec": 5000, "schema": 300, "service": 100}  # a few seconds each


def corpus_files() -> list[object]:
    params: list[object] = []
    for target in sorted(TARGETS):
        for path in sorted((CORPUS / target).glob("*")):
            marks = []
            if path.name in KNOWN_BUGS:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[path.name]))
            params.append(pytest.param(target, path, id=f"{target}/{path.name}", marks=marks))
    return params


def test_every_target_has_a_regression_corpus() -> None:
    for target in TARGETS:
        assert any((CORPUS / target).glob("*")), target


@pytest.mark.parametrize(("target", "path"), corpus_files())
def test_regression_input_passes(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())


@pytest.mark.parametrize(
    "counters",
    [{"reads": b"x"}, {"a": {True: 1, "b": 2}}, {"a": {b"k": 1}}],
    ids=["bytes-value", "mixed-keys", "bytes-key"],
)
def test_server_counters_the_codec_accepts_print_as_json(counters: dict[str, object]) -> None:
    """Found by the schema target's free-form maps: what `fscache stats` does with them."""
    payload = cbor2.dumps({"t": "stats_result", "id": 1, "counters": counters})
    try:
        message = p.decode_message(payload)
    except ProtocolError:
        return  # refused: nothing reaches the command
    assert isinstance(message, p.StatsResult)
    json.dumps(message.counters, indent=2, sort_keys=True)  # as the command prints them


def test_the_server_survives_a_hostile_script() -> None:
    play([
        Send(0, p.Approve(path="a", write=99)),  # a write never asked
        Send(0, p.Relinquish(id=1, paths=[GOOD, "x"])),  # leases never held
        Send(0, p.Extend(id=2, paths=["nope", GOOD], versions=[1, 2**64 - 1])),
        Send(1, p.Read(id=7, path="a")),
        Send(1, p.Read(id=7, path="a")),  # the same id twice
        Send(0, p.Write(id=3, path="a", data=b"x")),  # waits out peer 1's lease
        GoodDoes("hold"),
        GoodDoes("write"),  # waits out the reader's lease, whatever peer 2 approves
        Send(2, p.Approve(path=GOOD, write=1)),
        Send(2, p.Approve(path=GOOD, write=2)),
        GoodDoes("read"),
        Send(1, p.Goodbye()),
        Send(1, p.Read(id=8, path="a")),  # after goodbye
        Send(2, p.Extend(id=4, paths=["a"], versions=[])),  # lengths differ: a typed error
        Send(0, p.ReadRange(id=5, path="a", offset=2**63, length=1)),
        PeerDoes(0, "reconnect"),
        Send(0, p.Stat(id=6, path="../x")),
        Sleep(5.0),
        GoodDoes("read"),
    ])  # fmt: skip


def _ping_handled_by(monkeypatch: pytest.MonkeyPatch, handler: object) -> None:
    handlers = {**FileService._handlers, p.Ping: handler}
    monkeypatch.setattr(FileService, "_handlers", handlers)


def test_the_service_target_catches_a_request_left_without_a_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _ping_handled_by(monkeypatch, lambda service, connection, message: None)
    with pytest.raises(ExceptionGroup) as caught:
        play([Send(0, p.Ping(id=1))])
    assert caught.group_contains(AssertionError, match="requests without a reply")


def test_the_service_target_catches_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(service: object, connection: object, message: object) -> None:
        raise RuntimeError("a bug")

    _ping_handled_by(monkeypatch, broken)
    with pytest.raises(ExceptionGroup) as caught:
        play([Send(0, p.Ping(id=1))])
    assert caught.group_contains(AssertionError, match="closed a link without a typed error")


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_short_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "fscache.bench.fuzz", "--target", target]
    argv += ["--runs", str(SHORT_RUNS[target]), "--seed", "1", "--crashes", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"stat::number_of_executed_units: {SHORT_RUNS[target]}" in done.stderr
    assert not list(tmp_path.iterdir())
