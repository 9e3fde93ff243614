"""Wire messages and the frame codec. No I/O: bytes in, messages out, and back.

Frame layout. A frame is a 4-byte big-endian length (:data:`HEADER`) and one CBOR map
(RFC 8949). The map's first key is ``t``, the message type; then come the fields of the
message class registered for that type, in class order. Requests carry an ``id`` chosen
by the client so that many can be in flight on one connection; the reply carries the
same ``id``. The server also pushes :class:`ApprovalRequest` frames on the connection.
A Data reply of 100 bytes, for example::

    00 00 00 98                     length: 152 bytes
    a5                              map of 5 pairs
    61 74 64 64 61 74 61            "t": "data"
    62 69 64 19 04 d2               "id": 1234
    67 76 65 72 73 69 6f 6e 1b ..   "version": an 8-byte unsigned integer
    64 74 65 72 6d fb ..            "term": an 8-byte double
    64 64 61 74 61 58 64 ..         "data": 100 bytes

The generic path encodes every message with ``cbor2.dumps`` and decodes every frame
with cbor2 and then the message type's field checks (:class:`_Schema`, derived from
the dataclass fields): no other key than ``t`` and the fields; every field without a
default present; each value of exactly its annotated type (an int is not a bool; a
float field takes an int and makes it a float, and refuses inf and nan, which would
make a cache trust its copy forever; an int fits CBOR's 64-bit range); a list's items
and the free-form counters map checked all the way down. CBOR tags (major type 6: a
fraction, a decimal, a regular expression, a bignum, a datetime, a shared reference
...) are outside the protocol and are refused before cbor2 sees the frame: a scan of
the frame's heads (:func:`_refuse_tags`) steps over byte and text strings by their
length, so it costs a few steps even for a 16 MiB data frame, and cbor2 never builds
what a tag names. Bytes after the map, bytes that are not CBOR, or a frame longer
than the maximum raise :class:`ProtocolError` (or :class:`TooLarge`) and nothing
else: :func:`decode_message` is the one place where the codec's own exceptions
become ours.

The read path -- :class:`Read` from the client on every miss, :class:`Data` or
:class:`NotModified` back, and :class:`Written` for a write -- and a write's fan-out --
:class:`ApprovalRequest` to every holder, :class:`Approve` back -- have hand-written codecs
below (``_push_*`` and ``_pull_*`` and one function per message, after aioquic's
``buffer.py``): a few ``struct`` calls instead of a trip through cbor2. Even in a hot
loop they take a third of the time of cbor2 and the field checks; on a server, cbor2's
larger code is also cold in the CPU's caches each time a request arrives. Their rule:
they write exactly cbor2's bytes, and decode to exactly what the generic path decodes.
A writer given a value outside its layout (a negative or huge integer, a bool, a term
that is an int or not finite, text that is not UTF-8) hands the message to the generic
path. A reader takes the layout its writer writes for the values the service sends (a
version is a file's mtime or ctime in ns: an 8-byte integer), and for anything else it does not
recognise (another key order, an optional field left out, a small version, a
half-precision float, a tag ...) raises :class:`_Unrecognised`: the generic path then
decodes the frame or makes the error. The tests hold both to cbor2 and to the generic
path, byte for byte and value for value.

A directory listing's page, :class:`Entries` (up to 4,096 names with their types,
sizes and versions), is written by cbor2 on the server, in a millisecond, and read by
hand: the generic path's walk over every head and its check of every item took
fourteen times as long, per page, as the hand-written reader does.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import struct
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import cbor2

from fscache.errors import ProtocolError, TooLarge
from fscache.settings import DEFAULT_MAX_FRAME as DEFAULT_MAX_FRAME  # re-exported
from fscache.settings import BadSetting

PROTOCOL_VERSION = 2  # 2: sessions in the hello and the welcome
HEADER = struct.Struct(">I")


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    TYPE: ClassVar[str] = ""


# An optional field is left out of the frame while it holds its default, so a message
# that does not use it has the bytes of one without the field; a frame without it
# decodes to the default.
_LEFT_OUT_AT_DEFAULT = {"wire": "left out at default"}


# A fenced change names a lock and a token: the server applies it only while the
# token is the newest granted for that lock (fscache.locks). An optional field of
# every write-like message.
Fence = tuple[str, int]


def _optional_field() -> Any:
    """An optional field: None, and then not in the frame."""
    return dataclasses.field(default=None, metadata=_LEFT_OUT_AT_DEFAULT)


# ---------------------------------------------------------------- client to server
@dataclasses.dataclass(frozen=True, slots=True)
class Hello(Message):
    """First frame of a connection: which protocol the client speaks, its label
    (``client_id``, for logs) and, when it reconnects, the session it resumes
    (see :mod:`fscache.sessions`)."""

    TYPE: ClassVar[str] = "hello"
    version: int
    client_id: str
    session: str | None = None
    secret: bytes | None = dataclasses.field(default=None, repr=False)


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
    """Replace ``path`` with ``data``. ``ephemeral``: the file is tied to the writer's
    session and deleted when it ends (:mod:`fscache.ephemeral`)."""

    TYPE: ClassVar[str] = "write"
    id: int
    path: str
    data: bytes
    if_version: int | None = None
    fence: tuple[str, int] | None = _optional_field()
    ephemeral: bool = dataclasses.field(default=False, metadata=_LEFT_OUT_AT_DEFAULT)


@dataclasses.dataclass(frozen=True, slots=True)
class Delete(Message):
    TYPE: ClassVar[str] = "delete"
    id: int
    path: str
    if_version: int | None = None
    fence: tuple[str, int] | None = _optional_field()


@dataclasses.dataclass(frozen=True, slots=True)
class Stat(Message):
    TYPE: ClassVar[str] = "stat"
    id: int
    path: str


@dataclasses.dataclass(frozen=True, slots=True)
class ListDir(Message):
    """List directory ``path``: the names after ``after`` (all when None), one page of
    :class:`Listing` at a time."""

    TYPE: ClassVar[str] = "listdir"
    id: int
    path: str
    after: str | None = _optional_field()


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
    """The answer to a hello: the server's incarnation and limits, and the client's
    session (``resumed``: the one its hello named; False: a new one)."""

    TYPE: ClassVar[str] = "welcome"
    version: int
    epoch: str
    term: float
    skew: float
    max_frame: int
    session: str
    secret: bytes = dataclasses.field(repr=False)
    resumed: bool


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
    """One page of a directory's sorted names; ``more``: ask again ``after`` the last."""

    TYPE: ClassVar[str] = "listing"
    id: int
    names: list[str]
    more: bool = dataclasses.field(default=False, metadata=_LEFT_OUT_AT_DEFAULT)


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


# ------------------------------------------------ client to server: names, directories, ranges
@dataclasses.dataclass(frozen=True, slots=True)
class ReadRange(Message):
    """Read ``length`` bytes of ``path`` from ``offset`` under the file's read lease (the
    same lease as :class:`Read`). Answered with :class:`Chunk`, or :class:`NotModified`
    when ``have`` is the current version (every cached chunk of it stays good)."""

    TYPE: ClassVar[str] = "read_range"
    id: int
    path: str
    offset: int
    length: int
    have: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class UploadBegin(Message):
    """Open an upload to ``path``: a private temp file beside it, owned by this
    connection and named by this request's ``id`` (the upload id). Answered with Done."""

    TYPE: ClassVar[str] = "upload_begin"
    id: int
    path: str


@dataclasses.dataclass(frozen=True, slots=True)
class UploadPart(Message):
    """Append ``data`` to upload ``upload``; ``offset`` is the bytes sent before it.
    Answered with Done once the bytes are in the temp file."""

    TYPE: ClassVar[str] = "upload_part"
    id: int
    upload: int
    offset: int
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class UploadCommit(Message):
    """Apply upload ``upload`` as one atomic whole-file write under the lease rules
    (compare-and-set with ``if_version``; ``ephemeral`` as for :class:`Write`).
    Answered with Written."""

    TYPE: ClassVar[str] = "upload_commit"
    id: int
    upload: int
    if_version: int | None = None
    fence: tuple[str, int] | None = _optional_field()
    ephemeral: bool = dataclasses.field(default=False, metadata=_LEFT_OUT_AT_DEFAULT)


@dataclasses.dataclass(frozen=True, slots=True)
class UploadAbort(Message):
    """Drop upload ``upload`` and its temp file. Answered with Done."""

    TYPE: ClassVar[str] = "upload_abort"
    id: int
    upload: int


@dataclasses.dataclass(frozen=True, slots=True)
class WriteRange(Message):
    """Write ``data`` into ``path`` at ``offset``, in place, under the lease rules;
    durable before the Written reply. Creates the file if it is missing."""

    TYPE: ClassVar[str] = "write_range"
    id: int
    path: str
    offset: int
    data: bytes
    if_version: int | None = None
    fence: tuple[str, int] | None = _optional_field()


@dataclasses.dataclass(frozen=True, slots=True)
class Truncate(Message):
    """Cut or extend ``path`` to ``size`` bytes under the lease rules. Answered with Written."""

    TYPE: ClassVar[str] = "truncate"
    id: int
    path: str
    size: int
    if_version: int | None = None
    fence: tuple[str, int] | None = _optional_field()


@dataclasses.dataclass(frozen=True, slots=True)
class Rename(Message):
    """Move ``src`` to ``dst`` atomically, as POSIX ``rename(2)``: a write on both names
    and on the directories whose listings change. Answered with Written (dst's version)."""

    TYPE: ClassVar[str] = "rename"
    id: int
    src: str
    dst: str
    fence: tuple[str, int] | None = _optional_field()


@dataclasses.dataclass(frozen=True, slots=True)
class MkDir(Message):
    TYPE: ClassVar[str] = "mkdir"
    id: int
    path: str
    fence: tuple[str, int] | None = _optional_field()


@dataclasses.dataclass(frozen=True, slots=True)
class RmDir(Message):
    TYPE: ClassVar[str] = "rmdir"
    id: int
    path: str
    fence: tuple[str, int] | None = _optional_field()


@dataclasses.dataclass(frozen=True, slots=True)
class ScanDir(Message):
    """List directory ``path`` and take a lease on its listing (the directory key).
    Answered with :class:`Entries`, or :class:`NotModified` when ``have`` is current."""

    TYPE: ClassVar[str] = "scandir"
    id: int
    path: str
    have: int | None = None
    after: str | None = _optional_field()


# ------------------------------------------------ server to client: names, directories, ranges
@dataclasses.dataclass(frozen=True, slots=True)
class Chunk(Message):
    """Bytes ``[offset, offset + len(data))`` of a file of ``size`` bytes at ``version``,
    with a read lease of ``term`` (the reply to :class:`ReadRange`, and to :class:`Read`
    of a file larger than one chunk: then ``data`` is its first chunk)."""

    TYPE: ClassVar[str] = "chunk"
    id: int
    version: int
    term: float
    size: int
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Entries(Message):
    """A directory's listing at ``version`` under a lease of ``term`` on it; parallel
    arrays sorted by name. One page of it: ``more`` says ask again ``after`` the last
    name (and expect the same ``version``, else the directory changed between pages)."""

    TYPE: ClassVar[str] = "entries"
    id: int
    version: int
    term: float
    names: list[str]
    dirs: list[bool]
    sizes: list[int]
    versions: list[int]
    more: bool = dataclasses.field(default=False, metadata=_LEFT_OUT_AT_DEFAULT)


# ------------------------------------------------ client to server: locks (fscache.locks)
@dataclasses.dataclass(frozen=True, slots=True)
class Acquire(Message):
    """Take the lock ``name`` for ``ttl`` seconds, announcing ``identity`` (who leads,
    for :class:`LockQuery`). ``wait``: queue until it is free; else answered at once.
    Answered with :class:`LockGranted`, or the error ``lock_timeout`` (not ``wait``)."""

    TYPE: ClassVar[str] = "acquire"
    id: int
    name: str
    ttl: float
    identity: str
    wait: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Renew(Message):
    """Renew lock ``name`` held with ``token`` for its ttl from now. Answered with
    :class:`LockGranted`, or the error ``lock_lost``."""

    TYPE: ClassVar[str] = "renew"
    id: int
    name: str
    token: int


@dataclasses.dataclass(frozen=True, slots=True)
class Release(Message):
    """Release lock ``name`` held with ``token``; token 0: stop waiting for it (an
    acquire that timed out; that acquire is answered ``lock_timeout``). Answered with
    Done."""

    TYPE: ClassVar[str] = "release"
    id: int
    name: str
    token: int


@dataclasses.dataclass(frozen=True, slots=True)
class LockQuery(Message):
    """Who holds lock ``name``; takes nothing. Answered with :class:`LockState`."""

    TYPE: ClassVar[str] = "lock_query"
    id: int
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class LockWatch(Message):
    """Who holds lock ``name`` (:class:`LockState`), and from then on a
    :class:`LockChanged` at every grant, release and expiry of it, on this connection.
    ``stop`` (optional): still who holds it, but no more notices of it on this
    connection (the client's last watch of the name has ended)."""

    TYPE: ClassVar[str] = "lock_watch"
    id: int
    name: str
    stop: bool = dataclasses.field(default=False, metadata=_LEFT_OUT_AT_DEFAULT)


# ------------------------------------------------ server to client: locks
@dataclasses.dataclass(frozen=True, slots=True)
class LockGranted(Message):
    """The lock is the requester's with fencing ``token`` for ``ttl`` seconds from when
    it sent the request (less the skew)."""

    TYPE: ClassVar[str] = "lock_granted"
    id: int
    token: int
    ttl: float


@dataclasses.dataclass(frozen=True, slots=True)
class LockState(Message):
    """Who holds the lock: ``identity`` with ``token``, or no one (``identity`` None,
    ``token`` the newest ever granted, 0 for none)."""

    TYPE: ClassVar[str] = "lock_state"
    id: int
    token: int
    identity: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class LockChanged(Message):
    """Server push to a watcher of lock ``name``: it now has this holder (as
    :class:`LockState`)."""

    TYPE: ClassVar[str] = "lock_changed"
    name: str
    token: int
    identity: str | None


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
    ReadRange,
    UploadBegin,
    UploadPart,
    UploadCommit,
    UploadAbort,
    WriteRange,
    Truncate,
    Rename,
    MkDir,
    RmDir,
    ScanDir,
    Acquire,
    Renew,
    Release,
    LockQuery,
    LockWatch,
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
    Chunk,
    Entries,
    LockGranted,
    LockState,
    LockChanged,
)

# ---------------------------------------------------------------- the generic path: field checks
Check = Callable[[Any], Any]  # returns the (possibly converted) value or raises _Mismatch


class _Mismatch(Exception):
    pass


class _OutOfRange(_Mismatch):
    """The value is of the right type, outside what the field takes."""


def _exact(kind: type) -> Check:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            raise _Mismatch(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return check


_UINT_LIMIT = 2**64  # CBOR encodes integers in -2**64 .. 2**64 - 1 without a bignum tag
_CBOR_INTS = range(-_UINT_LIMIT, _UINT_LIMIT)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise _Mismatch(f"expected int, got {type(value).__name__}")
    if not -_UINT_LIMIT <= value < _UINT_LIMIT:  # a bignum: CBOR's own integers stop there
        raise _OutOfRange("integer out of range")
    return value


def _number(value: Any) -> float:
    """A finite number: a term of inf would make a cache trust its copy forever."""
    if type(value) is int:
        value = float(_int(value))
    if type(value) is not float:
        raise _Mismatch(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise _OutOfRange(f"expected a finite number, got {value!r}")
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


def _tuple_of(items: tuple[Check, ...]) -> Check:
    def check(value: Any) -> Any:  # a list as decoded, a tuple as sent (check_fields)
        if type(value) not in (list, tuple) or len(value) != len(items):
            raise _Mismatch(f"expected an array of {len(items)}")
        return tuple(inner(item) for inner, item in zip(items, value, strict=True))

    return check


def _nullable(annotation: Any) -> Any:
    """``X`` for an annotation ``X | None``, else None."""
    args = typing.get_args(annotation)
    if (
        typing.get_origin(annotation) in (types.UnionType, typing.Union)
        and len(args) == 2
        and type(None) in args
    ):
        return next(a for a in args if a is not type(None))
    return None


def _check_for(annotation: Any) -> Check:
    if annotation is float:
        return _number
    if annotation is int:
        return _int
    if annotation in (str, bytes, bool):
        return _exact(annotation)
    inner = _nullable(annotation)
    if inner is not None:
        return _optional(_check_for(inner))
    origin = typing.get_origin(annotation)
    if origin is list:
        return _list_of(_check_for(typing.get_args(annotation)[0]))
    if origin is dict:
        return _any_map
    if origin is tuple:
        return _tuple_of(tuple(_check_for(item) for item in typing.get_args(annotation)))
    raise TypeError(f"no wire check for {annotation!r}")


_PLAIN = frozenset({str, int, float, bool, type(None)})  # what JSON can print (fscache stats)


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
            if kind is dict and not all(type(key) is str for key in value):
                raise ProtocolError("a free-form map's keys must be text")
            stack.extend(value if kind is list else value.values())
        elif kind not in _PLAIN or (kind is int and value not in _CBOR_INTS):
            raise ProtocolError(f"CBOR tag decoding to {kind.__name__} is not allowed")


Setter = Callable[[Message, Any], None]


def _slot_setters(cls: type[Message]) -> tuple[Setter, ...]:
    """Per field of ``cls``, in order, the function that sets it on a blank instance.

    A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__``, which
    for a slotted class ends in the slot's descriptor: the decoders call that directly
    on ``object.__new__(cls)``, which costs half as much."""
    setters = []
    for field in dataclasses.fields(cls):
        slot = cls.__dict__[field.name]
        if not isinstance(slot, types.MemberDescriptorType) or hasattr(cls, "__post_init__"):
            raise TypeError(f"{cls.__name__}.{field.name} is not a plain slot")
        setters.append(slot.__set__)
    return tuple(setters)


_new = object.__new__


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    check: Check
    required: bool  # else optional, and its default when left out
    set: Setter
    default: Any = None
    left_out_at_default: bool = False  # a later field: not written while at its default


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    """One message type's field checks, derived from its dataclass fields."""

    cls: type[Message]
    fields: tuple[_Field, ...]
    names: tuple[str, ...]  # the field names, in class order (the wire order too)


def _schema(cls: type[Message]) -> _Schema:
    hints = typing.get_type_hints(cls)
    fields = []
    for field, setter in zip(dataclasses.fields(cls), _slot_setters(cls), strict=True):
        required = field.default is dataclasses.MISSING
        later = dict(field.metadata) == _LEFT_OUT_AT_DEFAULT
        if (
            not required
            and not later
            and (field.default is not None or _nullable(hints[field.name]) is None)
        ):
            raise TypeError(f"{cls.__name__}.{field.name}: an optional field defaults to None")
        default = None if required else field.default
        check = _check_for(hints[field.name])
        fields.append(_Field(field.name, check, required, setter, default, later))
    return _Schema(cls, tuple(fields), tuple(f.name for f in fields))


_ALL_MESSAGES = CLIENT_MESSAGES + SERVER_MESSAGES
_SCHEMAS: dict[str, _Schema] = {cls.TYPE: _schema(cls) for cls in _ALL_MESSAGES}
_SCHEMA_OF: dict[type[Message], _Schema] = {schema.cls: schema for schema in _SCHEMAS.values()}


def _check_body(body: Any) -> Message:
    """The message a decoded frame describes, every field checked for its exact type."""
    if type(body) is not dict:
        raise ProtocolError("frame must hold a CBOR map")
    kind = body.get("t")
    schema = _SCHEMAS.get(kind) if type(kind) is str else None
    if schema is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    message = _new(schema.cls)
    present = 1  # "t"
    for field in schema.fields:
        if field.name in body:
            present += 1
            try:
                value = field.check(body[field.name])
            except _Mismatch as exc:
                raise ProtocolError(f"{kind}.{field.name}: {exc}") from None
        elif field.required:
            raise ProtocolError(f"{kind}: missing field {field.name!r}")
        else:
            value = field.default
        field.set(message, value)
    if present != len(body):
        extra = body.keys() - {"t", *schema.names}
        raise ProtocolError(f"{kind}: unexpected fields {sorted(map(str, extra))}")
    if type(message) is Entries:
        _check_columns(len(message.names), message)
    return message


def check_fields(message: Message) -> None:
    """Refuse ``message`` as its peer's field checks would, before it is sent:
    :class:`TypeError` for a field of the wrong type, :class:`BadSetting` (a
    ValueError) for one out of range. A caller's bad argument is then the caller's
    error, instead of a frame the peer answers by closing the connection."""
    kind = message.TYPE
    for field in _SCHEMA_OF[type(message)].fields:
        try:
            field.check(getattr(message, field.name))
        except _OutOfRange as exc:
            raise BadSetting(f"{kind}.{field.name}: {exc}") from None
        except _Mismatch as exc:
            raise TypeError(f"{kind}.{field.name}: {exc}") from None


def _check_columns(count: int, entries: Entries) -> None:
    """An Entries page's four arrays are columns of ``count`` rows: one per name."""
    if not len(entries.dirs) == len(entries.sizes) == len(entries.versions) == count:
        raise ProtocolError("entries: names, dirs, sizes and versions differ in length")


_TAG = 6  # CBOR's major type 6: a tag, whose meaning the decoder builds (RFC 8949, 3.4)
_STRINGS = (2, 3)  # major types 2 and 3: byte and text strings, skipped by length
_INDEFINITE = 31  # a string, array or map of chunks or items up to a break (0xff)
_ARGUMENT_SIZE = {24: 1, 25: 2, 26: 4, 27: 8}  # additional info: bytes of argument


def _refuse_tags(payload: bytes) -> None:
    """Raise :class:`ProtocolError` if any data item in ``payload`` is a tag, before
    anything decodes it. CBOR is a prefix code of heads: each head is followed by its
    argument and, for a byte or text string, by that many bytes, which are skipped
    unread; the items of an array or a map are just the heads that follow. So one walk
    over the heads meets every tag, however deeply nested. Malformed or truncated CBOR
    is left for cbor2 to refuse."""
    end = len(payload)
    pos = 0
    while pos < end:
        head = payload[pos]
        major = head >> 5
        if major == _TAG:
            raise ProtocolError(f"CBOR tags are not allowed (a tag at byte {pos})")
        info = head & 0x1F
        pos += 1
        if info < 24:
            length = info
        elif info == _INDEFINITE:
            continue
        else:
            size = _ARGUMENT_SIZE.get(info)
            if size is None:
                raise ProtocolError(f"frame is not valid CBOR: reserved head at byte {pos - 1}")
            length = int.from_bytes(payload[pos : pos + size], "big")
            pos += size
        if major in _STRINGS:
            pos += length


def _decode_generic(payload: bytes) -> Message:
    """The message in ``payload`` by cbor2 and the field checks: what every frame means."""
    _refuse_tags(payload)
    stream = io.BytesIO(payload)
    try:
        body = cbor2.load(stream)
    except ProtocolError:
        raise
    except Exception as exc:  # cbor2 raises several types, and RecursionError on deep nesting
        raise ProtocolError(f"frame is not valid CBOR: {exc}") from None
    if stream.tell() != len(payload):  # (cbor2.loads would silently ignore them)
        raise ProtocolError("frame holds bytes after its CBOR map")
    return _check_body(body)


_pack_header = HEADER.pack


def _frame(payload: bytes) -> bytes:
    return _pack_header(len(payload)) + payload


def _encode_generic(message: Message) -> bytes:
    """The frame of ``message`` written by cbor2: a map of ``t``, then the fields."""
    body: dict[str, Any] = {"t": message.TYPE}
    for field in _SCHEMA_OF[type(message)].fields:
        value = getattr(message, field.name)
        if not (field.left_out_at_default and value == field.default):
            body[field.name] = value
    return _frame(cbor2.dumps(body))


# ---------------------------------------------------------------- the read path, by hand
# CBOR's data items (RFC 8949, section 3): a head byte holds the major type in its top
# three bits and, below, either the argument itself (0-23) or how many bytes of it follow.
_UINT = 0x00  # major type 0: an unsigned integer
_BYTES = 0x40  # major type 2: a byte string of argument bytes
_TEXT = 0x60  # major type 3: UTF-8 text of argument bytes
_MAP = 0xA0  # major type 5: a map of argument pairs
_NULL, _FLOAT64 = 0xF6, 0xFB  # major type 7: null, and a double in the next 8 bytes
_ARG_1, _ARG_2, _ARG_4, _ARG_8 = 24, 25, 26, 27  # the argument follows in 1, 2, 4, 8 bytes

_pack_u8 = struct.Struct(">BB").pack
_pack_u16 = struct.Struct(">BH").pack
_pack_u32 = struct.Struct(">BI").pack
_pack_u64 = struct.Struct(">BQ").pack
_pack_float64 = struct.Struct(">Bd").pack
_unpack_u16 = struct.Struct(">H").unpack_from
_unpack_u32 = struct.Struct(">I").unpack_from
_unpack_u64 = struct.Struct(">Q").unpack_from
_unpack_float64 = struct.Struct(">d").unpack_from
_BYTE = [bytes((i,)) for i in range(256)]
_isfinite = math.isfinite


class _Unrecognised(Exception):
    """A value or bytes outside a hand-written codec's layout: the generic path decides."""


def _push_head(major: int, n: int) -> bytes:
    """The shortest head of ``major`` with argument ``n``, as cbor2 writes it: for an
    unsigned integer the whole item, for text or bytes what precedes their bytes."""
    if type(n) is not int or n < 0:
        raise _Unrecognised  # a bool, a negative integer: cbor2 writes those otherwise
    if n < _ARG_1:
        return _BYTE[major | n]
    if n < 0x100:
        return _pack_u8(major | _ARG_1, n)
    if n < 0x10000:
        return _pack_u16(major | _ARG_2, n)
    if n < 0x100000000:
        return _pack_u32(major | _ARG_4, n)
    if n < _UINT_LIMIT:
        return _pack_u64(major | _ARG_8, n)
    raise _Unrecognised  # a bignum


def _push_float(x: float) -> bytes:
    if type(x) is not float or not _isfinite(x):
        raise _Unrecognised  # cbor2 writes an int as an int, inf and nan in half precision
    return _pack_float64(_FLOAT64, x)


def _push_text(text: str) -> bytes:
    if type(text) is not str:
        raise _Unrecognised
    utf8 = text.encode()  # a lone surrogate raises: the generic path lets cbor2 refuse it
    return _push_head(_TEXT, len(utf8)) + utf8


def _prefix(cls: type[Message]) -> bytes:
    """How every frame payload of ``cls`` begins: its map head, ``"t"`` and its type."""
    pairs = 1 + len(dataclasses.fields(cls))
    return _push_head(_MAP, pairs) + _push_text("t") + _push_text(cls.TYPE)


def _pull_head(b: bytes, pos: int, key: bytes, major: int) -> tuple[int, int]:
    """After the map key ``key``, which must be at ``pos``, a head of ``major``: its
    argument, and the position after the head."""
    if not b.startswith(key, pos):
        raise _Unrecognised
    pos += len(key)
    arg = b[pos] - major
    if 0 <= arg < _ARG_1:
        return arg, pos + 1
    if arg == _ARG_1:
        return b[pos + 1], pos + 2
    if arg == _ARG_2:
        return _unpack_u16(b, pos + 1)[0], pos + 3
    if arg == _ARG_4:
        return _unpack_u32(b, pos + 1)[0], pos + 5
    if arg == _ARG_8:
        return _unpack_u64(b, pos + 1)[0], pos + 9
    raise _Unrecognised  # another major type, or an indefinite length


# Each reader below takes a payload that starts with its message type's prefix (the
# caller looked it up by that) and ends with its last field; a slice past the end of a
# short payload is short, and then pos != len(b) refuses it.
#
# A version is a time in ns (a file's mtime or ctime), which cbor2 writes as an
# 8-byte integer: the readers take a version in that form only, and with the term
# after it (a double) in one struct call. Another form (a version below 2**32, a
# term of another precision or an int) is the generic path's to decode.
_K_ID, _K_PATH, _K_HAVE, _K_VERSION, _K_TERM, _K_DATA = map(
    _push_text, ("id", "path", "have", "version", "term", "data")
)
_UINT64 = _UINT | _ARG_8
_NULL_BYTE = _BYTE[_NULL]
_K_HAVE_NULL = _K_HAVE + _NULL_BYTE
_K_HAVE_UINT64 = _K_HAVE + _BYTE[_UINT64]
_VERSION_AND_TERM = struct.Struct(f">{len(_K_VERSION)}sBQ{len(_K_TERM)}sBd")
_pack_version_and_term = _VERSION_AND_TERM.pack
_UINT32_LIMIT = 2**32  # from here on, an unsigned integer takes the eight-byte form


def _pull_version_and_term(b: bytes, pos: int) -> tuple[int, float, int]:
    """The version and the term at ``pos`` (see above), and the position after them."""
    key_v, head_v, version, key_t, head_t, term = _VERSION_AND_TERM.unpack_from(b, pos)
    if (
        key_v != _K_VERSION
        or head_v != _UINT64
        or key_t != _K_TERM
        or head_t != _FLOAT64
        or not _isfinite(term)  # the generic path makes the error
    ):
        raise _Unrecognised
    return version, term, pos + _VERSION_AND_TERM.size


def _push_version_and_term(version: int, term: float) -> bytes:
    """The version and the term as cbor2 writes them after their keys: in one struct
    call when they have the form above, else item by item."""
    if (
        type(version) is int
        and _UINT32_LIMIT <= version < _UINT_LIMIT
        and type(term) is float
        and _isfinite(term)
    ):
        return _pack_version_and_term(_K_VERSION, _UINT64, version, _K_TERM, _FLOAT64, term)
    return b"".join((_K_VERSION, _push_head(_UINT, version), _K_TERM, _push_float(term)))


_READ = _prefix(Read)
_DATA = _prefix(Data)
_NOT_MODIFIED = _prefix(NotModified)
_WRITTEN = _prefix(Written)
_set_read_id, _set_read_path, _set_read_have = _slot_setters(Read)
_set_data_id, _set_data_version, _set_data_term, _set_data_data = _slot_setters(Data)


def read_frame(id: int, path: str, have: int | None = None) -> bytes:
    """``encode(Read(id, path, have))`` without building the message: the client's
    request on every miss."""
    try:
        payload = b"".join((
            _READ, _K_ID, _push_head(_UINT, id), _K_PATH, _push_text(path),
            _K_HAVE, _NULL_BYTE if have is None else _push_head(_UINT, have),
        ))  # fmt: skip
    except (_Unrecognised, UnicodeEncodeError):
        return _encode_generic(Read(id, path, have))
    return _pack_header(len(payload)) + payload


def _pull_read(b: bytes) -> Read:
    id, pos = _pull_head(b, len(_READ), _K_ID, _UINT)
    n, pos = _pull_head(b, pos, _K_PATH, _TEXT)
    path, pos = b[pos : pos + n].decode(), pos + n
    if b.startswith(_K_HAVE_NULL, pos):
        have, pos = None, pos + len(_K_HAVE_NULL)
    elif b.startswith(_K_HAVE_UINT64, pos):
        (have,) = _unpack_u64(b, pos + len(_K_HAVE_UINT64))
        pos += len(_K_HAVE_UINT64) + 8
    else:
        raise _Unrecognised
    if pos != len(b):
        raise _Unrecognised
    message = _new(Read)
    _set_read_id(message, id)
    _set_read_path(message, path)
    _set_read_have(message, have)
    return message


def data_frame(id: int, version: int, term: float, data: bytes) -> bytes:
    """``encode(Data(id, version, term, data))`` without building the message: the
    server's reply to almost every read."""
    try:
        if type(data) is not bytes:
            raise _Unrecognised
        payload = b"".join((
            _DATA, _K_ID, _push_head(_UINT, id), _push_version_and_term(version, term),
            _K_DATA, _push_head(_BYTES, len(data)), data,
        ))  # fmt: skip
    except _Unrecognised:
        return _encode_generic(Data(id, version, term, data))
    return _pack_header(len(payload)) + payload


def _pull_data(b: bytes) -> Data:
    id, pos = _pull_head(b, len(_DATA), _K_ID, _UINT)
    version, term, pos = _pull_version_and_term(b, pos)
    n, pos = _pull_head(b, pos, _K_DATA, _BYTES)
    data, pos = b[pos : pos + n], pos + n
    if pos != len(b):
        raise _Unrecognised
    message = _new(Data)
    _set_data_id(message, id)
    _set_data_version(message, version)
    _set_data_term(message, term)
    _set_data_data(message, data)
    return message


def _version_frame(prefix: bytes, message: NotModified | Written) -> bytes:
    """The frame of a NotModified or a Written: both are (id, version, term)."""
    try:
        payload = b"".join((
            prefix, _K_ID, _push_head(_UINT, message.id),
            _push_version_and_term(message.version, message.term),
        ))  # fmt: skip
    except _Unrecognised:
        return _encode_generic(message)
    return _pack_header(len(payload)) + payload


def _pull_versioned(cls: type[NotModified | Written], b: bytes) -> Message:
    """A NotModified or a Written (``cls``): both are (id, version, term)."""
    id, pos = _pull_head(b, _PREFIX_LENGTH[cls], _K_ID, _UINT)
    version, term, pos = _pull_version_and_term(b, pos)
    if pos != len(b):
        raise _Unrecognised
    set_id, set_version, set_term = _VERSIONED_SETTERS[cls]
    message = _new(cls)
    set_id(message, id)
    set_version(message, version)
    set_term(message, term)
    return message


# A write's fan-out: the server asks every holder of the file (one ApprovalRequest,
# encoded once, sent to each), and each holder answers at once (an Approve). With
# thousands of holders these two are as hot as the read path, at both ends.
_APPROVAL_REQUEST = _prefix(ApprovalRequest)
_APPROVE = _prefix(Approve)
_K_WRITE = _push_text("write")


def _approval_frame(prefix: bytes, message: ApprovalRequest | Approve) -> bytes:
    """The frame of an ApprovalRequest or an Approve: both are (path, write)."""
    try:
        payload = b"".join((
            prefix, _K_PATH, _push_text(message.path), _K_WRITE, _push_head(_UINT, message.write),
        ))  # fmt: skip
    except (_Unrecognised, UnicodeEncodeError):
        return _encode_generic(message)
    return _pack_header(len(payload)) + payload


def approve_frame(path: str, write: int) -> bytes:
    """``encode(Approve(path, write))`` without building the message: every holder's
    answer to a write's fan-out."""
    try:
        payload = b"".join(
            (_APPROVE, _K_PATH, _push_text(path), _K_WRITE, _push_head(_UINT, write))
        )
    except (_Unrecognised, UnicodeEncodeError):
        return _encode_generic(Approve(path, write))
    return _pack_header(len(payload)) + payload


def _approval_reader(cls: type[ApprovalRequest | Approve]) -> Callable[[bytes], Message]:
    """The reader of an ApprovalRequest or an Approve (``cls``): both are (path, write).
    One function per type, so that a fan-out's thousands of approvals look up nothing
    per frame."""
    start = len(_prefix(cls))
    set_path, set_write = _slot_setters(cls)

    def pull(b: bytes) -> Message:
        n, pos = _pull_head(b, start, _K_PATH, _TEXT)
        path, pos = b[pos : pos + n].decode(), pos + n
        write, pos = _pull_head(b, pos, _K_WRITE, _UINT)
        if pos != len(b):
            raise _Unrecognised
        message = _new(cls)
        set_path(message, path)
        set_write(message, write)
        return message

    return pull


# A directory listing's page. The server writes it with cbor2 (one frame per thousands
# of names: the generic writer's cost is small beside the page's stat calls); the
# client reads it here. The page after which none is left leaves ``more`` out (it is
# False), so its map has one pair less and a prefix of its own.
_ENTRIES = _prefix(Entries)
_LAST_ENTRIES = _push_head(_MAP, len(dataclasses.fields(Entries))) + _ENTRIES[1:]
_ARRAY = 0x80  # major type 4: an array of argument items
_FALSE, _TRUE = 0xF4, 0xF5
_BOOLS = bytes((_FALSE, _TRUE))
_K_NAMES, _K_DIRS, _K_SIZES, _K_VERSIONS, _K_MORE = map(
    _push_text, ("names", "dirs", "sizes", "versions", "more")
)
_NO_KEY = b""  # _pull_head of an array's item: no key before it
_ENTRIES_SETTERS = _slot_setters(Entries)


def _pull_entries(last: bool, b: bytes) -> Entries:
    """An Entries page; ``last``: its map has no ``more`` (the page after which none is
    left). Its columns hold thousands of items, so their loops read the common heads
    inline (a name shorter than 24 bytes, a one-byte or eight-byte integer) and hand
    the rest to :func:`_pull_head`; the ``dirs`` column, one byte per name, false or
    true, is read as one slice."""
    id, pos = _pull_head(b, len(_ENTRIES), _K_ID, _UINT)
    version, term, pos = _pull_version_and_term(b, pos)
    count, pos = _pull_head(b, pos, _K_NAMES, _ARRAY)
    names = []
    for _ in range(count):
        n = b[pos] - _TEXT
        if 0 <= n < _ARG_1:
            pos += 1
        else:
            n, pos = _pull_head(b, pos, _NO_KEY, _TEXT)
        names.append(b[pos : pos + n].decode())
        pos += n
    dirs_count, pos = _pull_head(b, pos, _K_DIRS, _ARRAY)
    flags = b[pos : pos + dirs_count]
    if len(flags) != dirs_count or flags.translate(None, _BOOLS):
        raise _Unrecognised  # short, or not all bools
    dirs = [flag == _TRUE for flag in flags]
    sizes, pos = _pull_uints(b, pos + dirs_count, _K_SIZES)
    versions, pos = _pull_uints(b, pos, _K_VERSIONS)
    more = False
    if not last:
        if not b.startswith(_K_MORE, pos) or b[pos + len(_K_MORE)] not in _BOOLS:
            raise _Unrecognised
        more, pos = b[pos + len(_K_MORE)] == _TRUE, pos + len(_K_MORE) + 1
    if pos != len(b):
        raise _Unrecognised
    message = _new(Entries)
    for setter, value in zip(
        _ENTRIES_SETTERS, (id, version, term, names, dirs, sizes, versions, more), strict=True
    ):
        setter(message, value)
    _check_columns(count, message)
    return message


def _pull_uints(b: bytes, pos: int, key: bytes) -> tuple[list[int], int]:
    """After ``key`` at ``pos``, an array of unsigned integers: its items, and the
    position after it. A column of versions (times in ns) is all eight-byte integers:
    then one ``struct`` call reads them all (a tenth of the loop's time)."""
    count, pos = _pull_head(b, pos, key, _ARRAY)
    end = pos + 9 * count
    if b[pos:end:9] == _UINT64_HEAD * count:  # (past the end: struct.error)
        return list(_uint64_column(count).unpack_from(b, pos)), end
    items = []
    for _ in range(count):
        head = b[pos]
        if head < _ARG_1:
            items.append(head)
            pos += 1
        else:
            size = _UINT_ARGUMENT_SIZE[head]  # KeyError: not an unsigned integer
            pos += 1 + size
            items.append(int.from_bytes(b[pos - size : pos]))
    return items, pos


_UINT64_HEAD = _BYTE[_UINT64]
_UINT_ARGUMENT_SIZE = {_UINT | _ARG_1: 1, _UINT | _ARG_2: 2, _UINT | _ARG_4: 4, _UINT64: 8}


@functools.lru_cache(maxsize=4)  # a listing's pages are all full but the last
def _uint64_column(count: int) -> struct.Struct:
    """``count`` eight-byte integers, each after its head byte."""
    return struct.Struct(">" + "xQ" * count)


_PREFIX_LENGTH = {NotModified: len(_NOT_MODIFIED), Written: len(_WRITTEN)}
_VERSIONED_SETTERS = {cls: _slot_setters(cls) for cls in (NotModified, Written)}
# The hand-written readers, by the prefix of the frames they read.
_PULL: dict[bytes, Callable[[bytes], Message]] = {
    _READ: _pull_read,
    _DATA: _pull_data,
    _NOT_MODIFIED: functools.partial(_pull_versioned, NotModified),
    _WRITTEN: functools.partial(_pull_versioned, Written),
    _APPROVAL_REQUEST: _approval_reader(ApprovalRequest),
    _APPROVE: _approval_reader(Approve),
    _ENTRIES: functools.partial(_pull_entries, False),
    _LAST_ENTRIES: functools.partial(_pull_entries, True),
}
# In a payload that starts with a map head and "t", the type name's head is here; for a
# short name it holds the name's length (head - _TEXT), and the prefix ends after it.
_TYPE_HEAD_AT = len(_push_head(_MAP, 1) + _push_text("t"))


# ---------------------------------------------------------------- encode / decode
def encode(message: Message) -> bytes:
    """One frame: the length header and the CBOR map of ``message``: ``t``, then the
    fields in their order."""
    if type(message) is NotModified:
        return _version_frame(_NOT_MODIFIED, message)
    if type(message) is Written:
        return _version_frame(_WRITTEN, message)
    if type(message) is Data:
        return data_frame(message.id, message.version, message.term, message.data)
    if type(message) is Read:
        return read_frame(message.id, message.path, message.have)
    if type(message) is Approve:
        return _approval_frame(_APPROVE, message)
    if type(message) is ApprovalRequest:
        return _approval_frame(_APPROVAL_REQUEST, message)
    return _encode_generic(message)


def decode_message(payload: bytes) -> Message:
    """The message in one frame's payload (header already removed), or ProtocolError."""
    if type(payload) is bytes and len(payload) > _TYPE_HEAD_AT:
        pull = _PULL.get(payload[: _TYPE_HEAD_AT + 1 + payload[_TYPE_HEAD_AT] - _TEXT])
        if pull is not None:
            try:
                return pull(payload)
            except (_Unrecognised, IndexError, KeyError, struct.error, UnicodeDecodeError):
                pass  # the generic path decodes it or makes the error
    return _decode_generic(payload)


_HEADER_SIZE = HEADER.size
_unpack_header = HEADER.unpack_from
# Up to this size slicing the buffer (two copies) is cheaper than a memoryview (one).
_SMALL_FRAME = 2048


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
        if len(buffer) < _HEADER_SIZE:
            return None
        (length,) = _unpack_header(buffer)
        if length > self.max_frame:  # before the body arrives
            raise TooLarge(f"frame of {length} bytes exceeds the maximum of {self.max_frame}")
        end = _HEADER_SIZE + length
        if len(buffer) < end:
            return None
        if length <= _SMALL_FRAME:
            payload = bytes(buffer[_HEADER_SIZE:end])
        else:
            with memoryview(buffer)[_HEADER_SIZE:end] as view:
                payload = view.tobytes()
        del buffer[:end]
        return decode_message(payload)

    def __iter__(self) -> Iterator[Message]:
        while (message := self.next_message()) is not None:
            yield message
