"""Wire messages and the frame codec. No I/O: bytes in, messages out, and back.

A frame is a 4-byte big-endian length followed by one CBOR map. The map's ``t``
key names the message type; its other keys are the fields of the message class
registered for that type. Requests carry an ``id`` chosen by the client so that
many can be in flight on one connection; the reply carries the same ``id``. The
server also pushes :class:`ApprovalRequest` frames on the same connection.

Decoding is strict: an unknown type, a missing, extra or mistyped field, a frame
longer than the maximum, or bytes that are not CBOR raise :class:`ProtocolError`
(or :class:`TooLarge`), and nothing else -- :func:`decode_message` is the one
boundary where the codec's own exceptions become ours.
"""

from __future__ import annotations

import dataclasses
import io
import math
import struct
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import cbor2

from fscache.errors import ProtocolError, TooLarge

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
HEADER = struct.Struct(">I")


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    TYPE: ClassVar[str] = ""


# ---------------------------------------------------------------- client to server
@dataclasses.dataclass(frozen=True, slots=True)
class Hello(Message):
    """First frame of a connection: who the client is and which protocol it speaks."""

    TYPE: ClassVar[str] = "hello"
    version: int
    client_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class Read(Message):
    """Read ``path`` and take a lease on it. ``have`` is the version already cached, if any:
    when it is still current the reply is :class:`NotModified` (a cheap extension)."""

    TYPE: ClassVar[str] = "read"
    id: int
    path: str
    have: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Write(Message):
    TYPE: ClassVar[str] = "write"
    id: int
    path: str
    data: bytes
    if_version: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Delete(Message):
    TYPE: ClassVar[str] = "delete"
    id: int
    path: str
    if_version: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Stat(Message):
    TYPE: ClassVar[str] = "stat"
    id: int
    path: str


@dataclasses.dataclass(frozen=True, slots=True)
class ListDir(Message):
    TYPE: ClassVar[str] = "listdir"
    id: int
    path: str


@dataclasses.dataclass(frozen=True, slots=True)
class Relinquish(Message):
    TYPE: ClassVar[str] = "relinquish"
    id: int
    paths: list[str]


@dataclasses.dataclass(frozen=True, slots=True)
class Extend(Message):
    """Extend every named lease at once; ``versions[i]`` is the cached version of ``paths[i]``."""

    TYPE: ClassVar[str] = "extend"
    id: int
    paths: list[str]
    versions: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class Approve(Message):
    """The client has dropped ``path`` from its cache for the pending write ``write``."""

    TYPE: ClassVar[str] = "approve"
    path: str
    write: int


@dataclasses.dataclass(frozen=True, slots=True)
class GetStats(Message):
    TYPE: ClassVar[str] = "stats"
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Ping(Message):
    """Liveness probe while requests are outstanding; answered with :class:`Done`."""

    TYPE: ClassVar[str] = "ping"
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Goodbye(Message):
    """The client is closing on purpose: its leases are relinquished."""

    TYPE: ClassVar[str] = "bye"


# ---------------------------------------------------------------- server to client
@dataclasses.dataclass(frozen=True, slots=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    version: int
    epoch: str
    term: float
    skew: float
    max_frame: int


@dataclasses.dataclass(frozen=True, slots=True)
class Data(Message):
    TYPE: ClassVar[str] = "data"
    id: int
    version: int
    term: float
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class NotModified(Message):
    TYPE: ClassVar[str] = "not_modified"
    id: int
    version: int
    term: float


@dataclasses.dataclass(frozen=True, slots=True)
class Written(Message):
    """A write (or delete, then ``version`` is the tombstone's) is durable; ``term`` is
    the writer's lease on the new contents."""

    TYPE: ClassVar[str] = "written"
    id: int
    version: int
    term: float


@dataclasses.dataclass(frozen=True, slots=True)
class Done(Message):
    TYPE: ClassVar[str] = "done"
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class StatResult(Message):
    TYPE: ClassVar[str] = "stat_result"
    id: int
    version: int
    size: int
    is_dir: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Listing(Message):
    TYPE: ClassVar[str] = "listing"
    id: int
    names: list[str]


@dataclasses.dataclass(frozen=True, slots=True)
class Extended(Message):
    """Per path of the request, in order: the new term, or ``None`` for stale."""

    TYPE: ClassVar[str] = "extended"
    id: int
    terms: list[float | None]


@dataclasses.dataclass(frozen=True, slots=True)
class StatsResult(Message):
    TYPE: ClassVar[str] = "stats_result"
    id: int
    counters: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Error(Message):
    """A request failed (``id`` set) or the connection is being closed (``id`` is None)."""

    TYPE: ClassVar[str] = "error"
    id: int | None
    code: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class ApprovalRequest(Message):
    """Server push: drop ``path`` from your cache and answer with :class:`Approve`."""

    TYPE: ClassVar[str] = "approval_request"
    path: str
    write: int


CLIENT_MESSAGES: tuple[type[Message], ...] = (
    Hello,
    Read,
    Write,
    Delete,
    Stat,
    ListDir,
    Relinquish,
    Extend,
    Approve,
    GetStats,
    Ping,
    Goodbye,
)
SERVER_MESSAGES: tuple[type[Message], ...] = (
    Welcome,
    Data,
    NotModified,
    Written,
    Done,
    StatResult,
    Listing,
    Extended,
    StatsResult,
    Error,
    ApprovalRequest,
)

# ---------------------------------------------------------------- field checking
Check = Callable[[Any], Any]  # returns the (possibly converted) value or raises _Mismatch


class _Mismatch(Exception):
    pass


def _exact(kind: type) -> Check:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            raise _Mismatch(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return check


def _int(value: Any) -> int:
    if type(value) is not int:
        raise _Mismatch(f"expected int, got {type(value).__name__}")
    if not -(2**64) <= value < 2**64:  # a bignum: CBOR's own integers stop there
        raise _Mismatch("integer out of range")
    return value


def _number(value: Any) -> float:
    """A finite number: a term of inf would make a cache trust its copy forever."""
    if type(value) is int:
        value = float(_int(value))
    if type(value) is not float:
        raise _Mismatch(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise _Mismatch(f"expected a finite number, got {value!r}")
    return value


def _any_map(value: Any) -> Any:
    """A free-form map (server counters): plain data only, checked all the way down."""
    if type(value) is not dict or not all(type(k) is str for k in value):
        raise _Mismatch("expected a map with string keys")
    try:
        _check_plain(value)
    except ProtocolError as exc:
        raise _Mismatch(str(exc)) from None
    return value


def _optional(inner: Check) -> Check:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    return check


def _list_of(inner: Check) -> Check:
    def check(value: Any) -> Any:
        if type(value) is not list:
            raise _Mismatch(f"expected an array, got {type(value).__name__}")
        return [inner(item) for item in value]

    return check


def _check_for(annotation: Any) -> Check:
    if annotation is float:
        return _number
    if annotation is int:
        return _int
    if annotation in (str, bytes, bool):
        return _exact(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        return _optional(_check_for(next(a for a in args if a is not type(None))))
    if origin is list:
        return _list_of(_check_for(args[0]))
    if origin is dict:
        return _any_map
    raise TypeError(f"no wire check for {annotation!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    cls: type[Message]
    required: tuple[tuple[str, Check], ...]
    optional: tuple[tuple[str, Check], ...]
    names: frozenset[str]


def _schema(cls: type[Message]) -> _Schema:
    hints = typing.get_type_hints(cls)
    required: list[tuple[str, Check]] = []
    optional: list[tuple[str, Check]] = []
    for field in dataclasses.fields(cls):
        entry = (field.name, _check_for(hints[field.name]))
        has_default = field.default is not dataclasses.MISSING
        (optional if has_default else required).append(entry)
    names = frozenset(f.name for f in dataclasses.fields(cls)) | {"t"}
    return _Schema(cls, tuple(required), tuple(optional), names)


_SCHEMAS: dict[str, _Schema] = {cls.TYPE: _schema(cls) for cls in CLIENT_MESSAGES + SERVER_MESSAGES}
_FIELD_NAMES: dict[type[Message], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in CLIENT_MESSAGES + SERVER_MESSAGES
}


# ---------------------------------------------------------------- encode / decode
def encode(message: Message) -> bytes:
    """One frame: the length header and the CBOR map of ``message``."""
    body: dict[str, Any] = {"t": message.TYPE}
    for name in _FIELD_NAMES[type(message)]:
        body[name] = getattr(message, name)
    payload = cbor2.dumps(body)
    return HEADER.pack(len(payload)) + payload


def _reject_tag(decoder: Any, tag: Any) -> Any:
    raise ProtocolError(f"CBOR tag {tag.tag} is not allowed")


_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})
_CBOR_INTS = range(-(2**64), 2**64)  # what CBOR encodes without a bignum tag


def _check_plain(body: Any) -> None:
    """cbor2 decodes the tags it knows (datetime, bignum, set, shared reference, ...)
    itself, without calling the tag hook: refuse whatever they produce."""
    stack = [body]
    seen: set[int] = set()
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is dict or kind is list:
            if id(value) in seen:
                raise ProtocolError("CBOR shared references are not allowed")
            seen.add(id(value))
            stack.extend(value if kind is list else (*value.keys(), *value.values()))
        elif kind not in _PLAIN or (kind is int and value not in _CBOR_INTS):
            raise ProtocolError(f"CBOR tag decoding to {kind.__name__} is not allowed")


def decode_message(payload: bytes) -> Message:
    """The message in one frame's payload (header already removed)."""
    stream = io.BytesIO(payload)
    try:
        body = cbor2.CBORDecoder(stream, tag_hook=_reject_tag).decode()
    except ProtocolError:
        raise
    except Exception as exc:  # cbor2 raises several types, and RecursionError on deep nesting
        raise ProtocolError(f"frame is not valid CBOR: {exc}") from None
    if stream.tell() != len(payload):
        raise ProtocolError("frame holds bytes after its CBOR map")
    # Every field is checked for its exact type below, so whatever cbor2 made of a
    # tag it knows (datetime, set, shared reference ...) is refused there; only the
    # free-form counters map is walked (_any_map).
    if type(body) is not dict:
        raise ProtocolError("frame must hold a CBOR map")
    kind = body.get("t")
    schema = _SCHEMAS.get(kind) if type(kind) is str else None
    if schema is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    extra = body.keys() - schema.names
    if extra:
        raise ProtocolError(f"{kind}: unexpected fields {sorted(map(str, extra))}")
    values = {}
    try:
        for name, check in schema.required:
            if name not in body:
                raise ProtocolError(f"{kind}: missing field {name!r}")
            values[name] = check(body[name])
        for name, check in schema.optional:
            if name in body:
                values[name] = check(body[name])
    except _Mismatch as exc:
        raise ProtocolError(f"{kind}.{name}: {exc}") from None
    return schema.cls(**values)


class FrameDecoder:
    """Incremental decoder: feed it byte chunks of any size, take whole messages out."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def next_message(self) -> Message | None:
        """The next whole message, or None until more bytes arrive."""
        buffer = self._buffer
        if len(buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(buffer)
        if length > self.max_frame:
            raise TooLarge(f"frame of {length} bytes exceeds the maximum of {self.max_frame}")
        end = HEADER.size + length
        if len(buffer) < end:
            return None
        payload = bytes(buffer[HEADER.size : end])
        del buffer[:end]
        return decode_message(payload)

    def __iter__(self) -> Iterator[Message]:
        while (message := self.next_message()) is not None:
            yield message
