"""Fuzz targets: each takes one input (bytes) and raises only when it finds a bug.

* ``codec``: arbitrary bytes, as one frame payload and as a stream of frames fed in
  chunks. Decoding raises ProtocolError or TooLarge and nothing else; the hand-written
  read path decodes exactly what the generic path decodes (or both refuse); whatever
  decodes re-encodes to a frame that decodes to an equal message and encodes to the
  same bytes again.
* ``schema``: CBOR maps built from the input with the protocol's type and field names
  and values of any type (CBOR tags, bignums, floats that are not finite, nested and
  huge containers, shared references). Besides the codec's rules: a decoded message
  holds exactly what the map said, each field of exactly its annotated type.
* ``service``: one in-process server (memory streams, the mock clock) fed a script of
  well-formed but hostile messages from three raw peers -- approvals of writes never
  asked, relinquishes and extends of leases never held, requests after goodbye,
  duplicate ids, odd paths and offsets, messages the server does not handle --
  interleaved with reconnects, cut links, time passing, and the writes and reads of
  two well-behaved clients on a path no hostile peer may change. The server never
  logs an internal error or raises out of its tasks; every request on a link that
  stays open gets a reply, and a link closes only on a typed error or at the peer's
  own word; the well-behaved clients always read the last acknowledged write. (A
  request the server does not handle, like a malformed one, gets the connection's
  typed error -- an Error without an id -- and the link closes; what was in flight on
  it is then owed nothing.)

Each target is a plain function of bytes: the same code runs under atheris
(``python -m fscache.bench.fuzz``), in the test suite's short runs, and in the replay
of ``corpus/<target>/``.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import fractions
import logging
import math
import os
import tempfile
import typing
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import atheris
import cbor2
import trio
import trio.testing

from fscache import protocol as p
from fscache.errors import ProtocolError, TooLarge

from ..harness import Cluster, RawPeer

CORPUS = Path(__file__).parent / "corpus"

# Corpus files that show a bug not yet fixed: replayed as strict xfails, never used as
# seeds (a seed that fails stops the fuzzer before it starts). Name -> the bug.
KNOWN_BUGS: dict[str, str] = {}

_MAX_FRAME = 64 * 1024


def _pick(fdp: atheris.FuzzedDataProvider, choices: Sequence[Any]) -> Any:
    return choices[fdp.ConsumeIntInRange(0, len(choices) - 1)]


# ---------------------------------------------------------------- codec
def codec(data: bytes) -> None:
    _check_payload(data)
    if not data:
        return
    step = data[0] + 1  # the first byte picks the chunk size
    decoder = p.FrameDecoder(_MAX_FRAME)
    try:
        for start in range(1, len(data), step):
            decoder.feed(data[start : start + step])
            for message in decoder:
                _check_round_trip(message)
    except (ProtocolError, TooLarge):
        pass


def _outcome(decode: Callable[[bytes], p.Message], payload: bytes) -> str:
    """What ``decode`` makes of ``payload``, exactly: the message's repr (which tells
    1 from 1.0 and True, and 0.0 from -0.0) or "refused"."""
    try:
        return repr(decode(payload))
    except (ProtocolError, TooLarge):
        return "refused"


def _check_payload(payload: bytes) -> p.Message | None:
    fast = _outcome(p.decode_message, payload)
    generic = _outcome(p._decode_generic, payload)
    assert fast == generic, (fast, generic)
    if fast == "refused":
        return None
    message = p.decode_message(payload)
    _check_round_trip(message)
    return message


def _check_round_trip(message: p.Message) -> None:
    frame = p.encode(message)
    (length,) = p.HEADER.unpack_from(frame)
    assert length == len(frame) - p.HEADER.size
    again = p.decode_message(frame[p.HEADER.size :])
    assert repr(again) == repr(message), (again, message)
    assert p.encode(again) == frame
    assert _outcome(p._decode_generic, frame[p.HEADER.size :]) == repr(message)


# ---------------------------------------------------------------- schema
_MESSAGES = {cls.TYPE: cls for cls in p.CLIENT_MESSAGES + p.SERVER_MESSAGES}
_TYPE_NAMES = sorted(_MESSAGES)
_FIELD_NAMES = sorted({f.name for cls in _MESSAGES.values() for f in dataclasses.fields(cls)})
_EDGE_INTS = (
    0, 1, 23, 24, 255, 256, 2**16, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
    2**64, 2**100, -1, -24, -25, -(2**63), -(2**64), -(2**64) - 1, -(2**100),
)  # fmt: skip
_EDGE_FLOATS = (0.0, -0.0, 0.5, 1e308, 5e-324, math.inf, -math.inf, math.nan, 65504.0, 1e-8)
_TAGS = (0, 1, 2, 3, 4, 5, 21, 24, 25, 28, 29, 30, 32, 35, 36, 37, 256, 258, 260, 261, 55799)
_UTC = datetime.UTC
_TAGGED = (  # what cbor2 writes as a tag of its own
    datetime.datetime(2020, 1, 2, tzinfo=_UTC),
    datetime.date(2020, 1, 2),
    decimal.Decimal("1.5"),
    fractions.Fraction(1, 3),
    uuid.UUID(int=7),
    frozenset({1, 2}),
    {1, 2},
    ("a", 1),
)


def schema(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    kind = _pick(fdp, [*_TYPE_NAMES, "nope"]) if fdp.ConsumeBool() else _value(fdp, 1)
    body: dict[Any, Any] = {"t": kind}
    cls = _MESSAGES.get(kind) if type(kind) is str else None
    hints = typing.get_type_hints(cls) if cls is not None else {}
    for field in dataclasses.fields(cls) if cls is not None else ():
        if fdp.ConsumeProbability() < 0.9:
            well_typed = fdp.ConsumeProbability() < 0.6
            body[field.name] = _typed(fdp, hints[field.name]) if well_typed else _value(fdp, 3)
    for _ in range(fdp.ConsumeIntInRange(0, 3) if fdp.ConsumeProbability() < 0.2 else 0):
        key = _pick(fdp, _FIELD_NAMES) if fdp.ConsumeBool() else _value(fdp, 0)
        body[key] = _value(fdp, 3)
    try:
        payload = cbor2.dumps(
            body, value_sharing=fdp.ConsumeBool(), canonical=fdp.ConsumeBool(), timezone=_UTC
        )
    except (cbor2.CBOREncodeError, RecursionError, TypeError, ValueError, OverflowError):
        return  # the builder's limit, not the codec's
    message = _check_payload(payload)
    decoder = p.FrameDecoder(_MAX_FRAME)
    decoder.feed(p.HEADER.pack(len(payload)) + payload)
    try:
        streamed = decoder.next_message()
    except TooLarge:
        assert len(payload) > _MAX_FRAME
        return
    except ProtocolError:
        assert message is None
        return
    assert repr(streamed) == repr(message)
    if message is not None:
        _check_holds(message, cbor2.loads(payload))


def _check_holds(message: p.Message, body: dict[str, Any]) -> None:
    """``message`` holds exactly what ``body`` said, each field of its annotated type."""
    assert body["t"] == message.TYPE
    hints = typing.get_type_hints(type(message))
    fields = {f.name: f for f in dataclasses.fields(message)}
    names = set(fields)
    assert set(body) <= names | {"t"}, set(body) - names
    for name in names:
        value = getattr(message, name)
        assert _conforms(value, hints[name]), (name, value, hints[name])
        said = body[name] if name in body else fields[name].default  # left out: its default
        # repr: a NaN inside the free-form counters map is equal to itself only there
        if type(value) is tuple:
            value = list(value)  # decoded from an array
        assert value == said or repr(value) == repr(said), (name, said)
        assert type(said) is not float or math.isfinite(said), (name, said)


def _conforms(value: Any, annotation: Any) -> bool:
    if annotation is int:
        return type(value) is int and -(2**64) <= value < 2**64
    if annotation is float:
        return type(value) is float and math.isfinite(value)
    if annotation in (str, bytes, bool):
        return type(value) is annotation
    args = typing.get_args(annotation)
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return value is None or _conforms(value, inner)
    if typing.get_origin(annotation) is list:
        return type(value) is list and all(_conforms(item, args[0]) for item in value)
    if typing.get_origin(annotation) is tuple:  # an array of fixed shape (a fence)
        return type(value) is tuple and len(value) == len(args) and all(map(_conforms, value, args))
    if typing.get_origin(annotation) is dict:
        return type(value) is dict and _plain(value)
    raise AssertionError(f"no oracle for {annotation!r}")


def _plain(value: Any) -> bool:
    if type(value) in (list, dict):
        items = value if type(value) is list else (*value.keys(), *value.values())
        return all(_plain(item) for item in items)
    if type(value) is int:
        return -(2**64) <= value < 2**64
    return type(value) in (str, bytes, float, bool, type(None))


def _typed(fdp: atheris.FuzzedDataProvider, annotation: Any) -> Any:
    """A value of ``annotation``'s type (to reach the checks after the first field)."""
    if annotation is int:
        return _pick(fdp, _EDGE_INTS) if fdp.ConsumeBool() else fdp.ConsumeInt(4)
    if annotation is float:
        return _pick(fdp, _EDGE_FLOATS) if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if annotation is str:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40))
    if annotation is bytes:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    if annotation is bool:
        return fdp.ConsumeBool()
    args = typing.get_args(annotation)
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return None if fdp.ConsumeBool() else _typed(fdp, inner)
    if typing.get_origin(annotation) is list:
        return [_typed(fdp, args[0]) for _ in range(fdp.ConsumeIntInRange(0, 5))]
    if typing.get_origin(annotation) is tuple:
        return [_typed(fdp, arg) for arg in args]
    return {str(i): _value(fdp, 2) for i in range(fdp.ConsumeIntInRange(0, 4))}


def _value(fdp: atheris.FuzzedDataProvider, depth: int) -> Any:
    """A value of any type cbor2 can write."""
    choice = fdp.ConsumeIntInRange(0, 16 if depth > 0 else 8)
    if choice == 0:
        return fdp.ConsumeIntInRange(-30, 30)
    if choice == 1:
        return _pick(fdp, _EDGE_INTS)
    if choice == 2:
        return _pick(fdp, _EDGE_FLOATS) if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if choice == 3:
        return fdp.ConsumeBool()
    if choice == 4:
        return None
    if choice == 5:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 20))
    if choice == 6:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 20))
    if choice == 7:
        return cbor2.CBORSimpleValue(_pick(fdp, [0, 19, 32, 255]))
    if choice == 8:
        return cbor2.undefined
    if choice == 9:
        return [_value(fdp, depth - 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    if choice == 10:
        return {_value(fdp, 0): _value(fdp, depth - 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    if choice == 11:
        return cbor2.CBORTag(_pick(fdp, _TAGS), _value(fdp, depth - 1))
    if choice == 12:
        return cbor2.CBORTag(fdp.ConsumeIntInRange(0, 2**64 - 1), _value(fdp, depth - 1))
    if choice == 13:
        return [_value(fdp, 0)] * fdp.ConsumeIntInRange(0, 100_000)  # a huge list
    if choice == 14:
        nested: Any = _value(fdp, 0)
        for _ in range(fdp.ConsumeIntInRange(0, 3000)):
            nested = [nested]
        return nested
    if choice == 15:
        shared = [_value(fdp, 0)]
        return [shared, shared]  # a shared reference when value_sharing is on
    return _pick(fdp, _TAGGED)


# ---------------------------------------------------------------- service
TERM, SKEW = 1.0, 0.1
GOOD = "good/f"  # the well-behaved clients' path: no hostile peer may change it
_HOSTILE = ("h0", "h1", "h2")
_MUTATING = (
    p.Write, p.Delete, p.WriteRange, p.Truncate, p.Rename, p.MkDir, p.RmDir, p.UploadBegin,
)  # fmt: skip
_PATHS = (
    "a", "b", "d", "d/a", "d/e/f", "", ".", "..", "/", "/a", "a/../b", "a//b", "d/", "./a",
    "a\x00b", "a\\b", "a\nb", "ü", "x" * 300, "y/" * 200, GOOD, "good",
)  # fmt: skip
_INTS = (0, 1, 2, 3, 4, 5, 7, 8, 100, 4096, 2**31, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1)
_SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # tmpfs: fsync is cheap
_DEADLINE = 3600.0  # virtual seconds: a script still running then is a hang


@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    peer: int
    message: p.Message


@dataclasses.dataclass(frozen=True, slots=True)
class PeerDoes:
    """A hostile peer's ``act``: "approve" the last approval request it received, as a
    client should; "reconnect" under the same client id (the server drops the old
    link); "cut" its link without a word."""

    peer: int
    act: typing.Literal["approve", "reconnect", "cut"]


@dataclasses.dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class GoodDoes:
    """The well-behaved clients' ``act``: the writer "write"s the next generation; the
    reader "read"s it; or "hold" the server's frames to the reader until its next read
    (a write must then wait out the reader's lease, whatever anyone else approves)."""

    act: typing.Literal["write", "read", "hold"]


Action = Send | PeerDoes | Sleep | GoodDoes


def service(data: bytes) -> None:
    play(_script(atheris.FuzzedDataProvider(data)))


def play(script: Sequence[Action]) -> None:
    """Run ``script`` against a fresh server and check the invariants (see above)."""
    internal_errors = _ErrorLog()
    logger = logging.getLogger("fscache")
    logger.addHandler(internal_errors)
    try:
        with tempfile.TemporaryDirectory(dir=_SCRATCH) as tmp:
            root = Path(tmp) / "root"
            root.mkdir()
            clock = trio.testing.MockClock(autojump_threshold=0)
            trio.run(_play, root, script, clock=clock)
    finally:
        logger.removeHandler(internal_errors)
    assert not internal_errors.records, internal_errors.records


class _ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


def _script(fdp: atheris.FuzzedDataProvider) -> list[Action]:
    actions: list[Action] = []
    while fdp.remaining_bytes() and len(actions) < 64:
        peer = fdp.ConsumeIntInRange(0, len(_HOSTILE) - 1)
        choice = fdp.ConsumeIntInRange(0, 19)
        if choice < 12:
            actions.append(Send(peer, _message(fdp)))
        elif choice < 15:
            actions.append(PeerDoes(peer, _pick(fdp, ("approve", "reconnect", "cut"))))
        elif choice == 15:
            actions.append(Sleep(_pick(fdp, [0.0, 0.5, TERM - SKEW, TERM + SKEW, 5.0])))
        else:
            actions.append(GoodDoes(_pick(fdp, ("hold", "read", "write", "write"))))
    return actions


def _message(fdp: atheris.FuzzedDataProvider) -> p.Message:
    cls = _pick(fdp, p.CLIENT_MESSAGES)
    hints = typing.get_type_hints(cls)
    values = {f.name: _field(fdp, hints[f.name]) for f in dataclasses.fields(cls)}
    if issubclass(cls, _MUTATING):  # GOOD is the well-behaved clients' alone
        values = {k: "a" if type(v) is str and "good" in v else v for k, v in values.items()}
    return typing.cast(p.Message, cls(**values))


def _field(fdp: atheris.FuzzedDataProvider, annotation: Any) -> Any:
    if annotation is int:
        return _pick(fdp, _INTS)
    if annotation is bool:
        return fdp.ConsumeBool()
    if annotation is str:
        if fdp.ConsumeProbability() < 0.8:
            return _pick(fdp, _PATHS)
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 24))
    if annotation is bytes:
        return fdp.ConsumeBytes(_pick(fdp, [0, 1, 5, 100, 5000]))
    if annotation is float:
        return _pick(fdp, (*_EDGE_FLOATS, 0.3, 1.0, 5.0, 300.0))
    if annotation is bool:
        return fdp.ConsumeBool()
    args = typing.get_args(annotation)
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return None if fdp.ConsumeBool() else _field(fdp, inner)
    if typing.get_origin(annotation) is tuple:
        return tuple(_field(fdp, arg) for arg in args)
    assert typing.get_origin(annotation) is list, annotation
    return [_field(fdp, args[0]) for _ in range(fdp.ConsumeIntInRange(0, 4))]


@dataclasses.dataclass(eq=False)
class _Link:
    """One hostile connection and what it is owed: a reply per request it sent, and no
    close without a typed error, unless it is *excused* (it said goodbye, was cut, was
    replaced, or the server closed it with a typed error)."""

    peer: RawPeer
    sent: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    answered: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    excused: bool = False
    closed: bool = False
    approval: p.ApprovalRequest | None = None
    scope: trio.CancelScope = dataclasses.field(default_factory=trio.CancelScope)
    done: trio.Event = dataclasses.field(default_factory=trio.Event)

    async def send(self, message: p.Message) -> None:
        if self.closed:
            return
        request_id = getattr(message, "id", None)
        try:
            await self.peer.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True
            return
        if isinstance(message, p.Goodbye):
            self.excused = True
        elif request_id is not None:
            self.sent[request_id] += 1

    async def receive_all(self) -> None:
        try:
            with self.scope:
                await self._receive_all()
        finally:
            self.done.set()

    async def retire(self) -> None:
        """Stop reading: the client id's next link shares this one's gate (harness)."""
        self.excused = True
        self.scope.cancel()
        await self.done.wait()

    async def _receive_all(self) -> None:
        try:
            while (message := await self.peer.receive()) is not None:
                if isinstance(message, p.ApprovalRequest):
                    self.approval = message
                elif isinstance(message, p.LockChanged):
                    pass  # a push to a lock watcher
                elif isinstance(message, p.Error) and message.id is None:
                    self.excused = True  # a typed error, and the connection closes
                else:
                    request_id: int = getattr(message, "id", -1)
                    assert request_id in self.sent, f"a reply to no request: {message}"
                    self.answered[request_id] += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.closed = True

    def check(self) -> None:
        if self.excused:
            return
        assert not self.closed, "the server closed a link without a typed error"
        unanswered = self.sent - self.answered
        assert not unanswered, f"requests without a reply: {dict(unanswered)}"
        extra = self.answered - self.sent
        assert not extra, f"more replies than requests: {dict(extra)}"


async def _play(root: Path, script: Sequence[Action]) -> None:
    with trio.fail_after(_DEADLINE):
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, root, term=TERM, skew=SKEW)
            service = await cluster.start()
            links: dict[int, _Link] = {}
            every_link: list[_Link] = []

            async def link(peer: int) -> _Link:
                current = links.get(peer)
                if current is None or current.closed or current.excused:
                    if current is not None:
                        await current.retire()
                    current = _Link(await cluster.raw(_HOSTILE[peer]))
                    links[peer] = current
                    every_link.append(current)
                    nursery.start_soon(current.receive_all)
                return current

            async with cluster.client("writer") as writer, cluster.client("reader") as reader:
                generation = 0
                await writer.write(GOOD, b"0")
                assert await reader.read(GOOD) == b"0"
                for action in script:
                    if isinstance(action, Send):
                        await (await link(action.peer)).send(action.message)
                    elif isinstance(action, PeerDoes) and action.act == "approve":
                        hostile = await link(action.peer)
                        if hostile.approval is not None:
                            request = hostile.approval
                            await hostile.send(p.Approve(path=request.path, write=request.write))
                    elif isinstance(action, PeerDoes):
                        if action.peer in links:
                            old = links.pop(action.peer)
                            await old.retire()
                            if action.act == "cut":
                                await old.peer.close()
                        if action.act == "reconnect":
                            await link(action.peer)
                    elif isinstance(action, Sleep):
                        await trio.sleep(action.seconds)
                    elif action.act == "hold":
                        cluster.hold("reader")
                    elif action.act == "write":
                        generation += 1
                        await writer.write(GOOD, str(generation).encode())
                    else:
                        cluster.release("reader")
                        assert await reader.read(GOOD) == str(generation).encode()
                cluster.release("reader")
                await trio.sleep(SKEW)  # every frame sent is handled (autojump waits for that)
                while service.table.pending_writes():  # writes waiting out silent holders
                    await trio.sleep(SKEW)
                while service.locks.waiting():  # acquires waiting out silent holders
                    await trio.sleep(SKEW)
                await trio.sleep(SKEW)  # the replies are delivered
                for each in every_link:
                    each.check()
                assert await reader.read(GOOD) == str(generation).encode()
            async with cluster.client("fresh") as fresh:
                assert await fresh.read(GOOD) == str(generation).encode()
            nursery.cancel_scope.cancel()


TARGETS: dict[str, Callable[[bytes], None]] = {
    "codec": codec,
    "schema": schema,
    "service": service,
}
