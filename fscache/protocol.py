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

Every request costs one decode and one encode, so both run code generated per message
type from its fields: a message of scalar fields is written and read by ``struct`` in
exactly cbor2's layout (:func:`_framer`, :func:`_reader`), any other by cbor2 and a
generated checker (:func:`_fast_check`, :func:`_encoder`). The generic field checks
remain the definition, and decoding falls back on them for anything unusual.
"""

from __future__ import annotations

import dataclasses
import io
import math
import struct
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NoReturn

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

# ---------------------------------------------------------------- field checking (the reference)
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


_ALL_MESSAGES = CLIENT_MESSAGES + SERVER_MESSAGES
_SCHEMAS: dict[str, _Schema] = {cls.TYPE: _schema(cls) for cls in _ALL_MESSAGES}


def _reject_tag(*_: Any) -> NoReturn:
    """The tag hook, called for the tags cbor2 does not decode itself. (cbor2 5 passes
    ``(decoder, tag)``, cbor2 6 ``(tag, immutable)`` and wraps what the hook raises in
    an error naming the tag: either way the frame is refused.)"""
    raise ProtocolError("CBOR tags are not allowed")


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


def _decode_item(payload: bytes) -> Any:
    """The one CBOR item in ``payload``, read by a stream decoder so that bytes after
    it are seen (``cbor2.loads`` ignores them)."""
    stream = io.BytesIO(payload)
    try:
        body = cbor2.CBORDecoder(stream, tag_hook=_reject_tag).decode()
    except ProtocolError:
        raise
    except Exception as exc:  # cbor2 raises several types, and RecursionError on deep nesting
        raise ProtocolError(f"frame is not valid CBOR: {exc}") from None
    if stream.tell() != len(payload):
        raise ProtocolError("frame holds bytes after its CBOR map")
    return body


def _check_body(body: Any) -> Message:
    """The message a decoded frame describes, every field checked for its exact type.

    Whatever cbor2 made of a tag it knows (datetime, set, shared reference ...) is
    refused here; only the free-form counters map is walked (_any_map)."""
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


def _decode_reference(payload: bytes) -> Message:
    """What :func:`decode_message` means, written plainly (it is the original decoder):
    the tests check that the two agree on every payload."""
    return _check_body(_decode_item(payload))


# ---------------------------------------------------------------- generated fast paths
# Each message type gets a checker and an encoder generated from its fields: straight-line
# code that touches each field once. A checker returns only a message the generic checks
# above would return too, and None for anything else (a missing, extra or mistyped
# field ...), whereupon the generic checks decide and make the error.
FastCheck = Callable[[dict[Any, Any]], Message | None]
_SIMPLE = (int, float, str, bytes, bool)


def _field_test(var: str, annotation: Any, namespace: dict[str, Any]) -> list[str]:
    """Lines that leave ``var`` checked (and converted) as :func:`_check_for` would,
    or return None."""
    in_range = f"{-(2**64)} <= {var} < {2**64}"  # what _int accepts
    if annotation is int:
        return [f"if type({var}) is not int or not {in_range}:", "    return None"]
    if annotation in (str, bytes, bool):
        return [f"if type({var}) is not {annotation.__name__}:", "    return None"]
    if annotation is float:
        return [
            f"if type({var}) is float:",
            f"    if not _isfinite({var}):",
            "        return None",
            f"elif type({var}) is int and {in_range}:",
            f"    {var} = float({var})",
            "else:",
            "    return None",
        ]
    inner = _nullable(annotation)
    if inner in _SIMPLE:
        return [f"if {var} is not None:", *(f"    {x}" for x in _field_test(var, inner, namespace))]
    namespace[f"_check_{var}"] = _check_for(annotation)  # lists and maps: the generic check
    return ["try:", f"    {var} = _check_{var}({var})", "except _Mismatch:", "    return None"]


def _compile(source: str, name: str, namespace: dict[str, Any]) -> Any:
    """The function ``name`` that ``source`` defines; its docstring is ``source``."""
    exec(compile(source, f"<fscache.protocol {name}>", "exec"), namespace)
    function = namespace[name]
    function.__doc__ = source
    return function


def _fast_check(cls: type[Message]) -> FastCheck:
    """The checker for ``cls``, for a body whose ``t`` the caller has found to be
    ``cls.TYPE``. Its source is its docstring."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    optional = [f.name for f in fields if f.default is not dataclasses.MISSING]
    for field in fields:  # what the code generated below relies on
        slot = cls.__dict__.get(field.name)
        if (
            not field.name.isidentifier()
            or not field.init
            or field.default_factory is not dataclasses.MISSING
            or (field.name in optional and field.default is not None)  # body.get() is the default
            or (field.name in optional and _nullable(hints[field.name]) is None)
            or not isinstance(slot, types.MemberDescriptorType)
            or hasattr(cls, "__post_init__")
        ):
            raise TypeError(f"{cls.__name__}.{field.name}: not a plain slot, required or None")
    namespace: dict[str, Any] = {"_cls": cls, "_isfinite": math.isfinite, "_Mismatch": _Mismatch}
    # exactly the fields' keys and "t": no other keys
    count = " + ".join([str(1 + len(required)), *(f"({name!r} in body)" for name in optional)])
    lines = [f"if len(body) != {count}:", "    return None"]
    if required:
        lines += ["try:", *(f"    f_{name} = body[{name!r}]" for name in required)]
        lines += ["except KeyError:", "    return None"]
    lines += [f"f_{name} = body.get({name!r})" for name in optional]
    for field in fields:
        lines += _field_test(f"f_{field.name}", hints[field.name], namespace)
    # A frozen dataclass's __init__ sets each field with object.__setattr__, which for a
    # slotted class ends in the slot's descriptor: calling that directly is cheaper.
    namespace["_new"] = object.__new__
    lines.append("message = _new(_cls)")
    for field in fields:
        namespace[f"_set_{field.name}"] = cls.__dict__[field.name].__set__
        lines.append(f"_set_{field.name}(message, f_{field.name})")
    lines.append("return message")
    source = "def check(body):\n" + "".join(f"    {line}\n" for line in lines)
    check: FastCheck = _compile(source, "check", namespace)
    return check


def _by_cbor2(cls: type[Message], prefix: str) -> list[str]:
    """Lines that return the frame of ``cls`` written by cbor2: a literal map of "t" and
    then the fields in class order, each field's value in ``{prefix}{name}``."""
    fields = (f"{f.name!r}: {prefix}{f.name}" for f in dataclasses.fields(cls))
    items = ", ".join([f'"t": {cls.TYPE!r}', *fields])
    return [f"payload = _dumps({{{items}}})", "return _pack(len(payload)) + payload"]


def _encoder(cls: type[Message]) -> Callable[[Any], bytes]:
    """The encoder for ``cls``: its framer (below) if it has one, else a literal map and
    one ``cbor2.dumps``. Its source is its docstring."""
    framer = _FRAMERS.get(cls)
    if framer is not None:
        fields = ", ".join(f"m.{f.name}" for f in dataclasses.fields(cls))
        source = f"def encode(m):\n    return _frame({fields})\n"
        by_framer: Callable[[Any], bytes] = _compile(source, "encode", {"_frame": framer})
        return by_framer
    source = "def encode(m):\n" + "".join(f"    {line}\n" for line in _by_cbor2(cls, "m."))
    encode: Callable[[Any], bytes] = _compile(
        source, "encode", {"_dumps": cbor2.dumps, "_pack": HEADER.pack}
    )
    return encode


# ---------------------------------------------------------------- scalar frames by struct
# A message whose fields are all scalars (int, float, str, bytes, bool, each maybe None)
# is written here without cbor2, in exactly the bytes cbor2 writes for it: a map of "t"
# and then the fields in class order, integers and lengths in their shortest form,
# floats as doubles. Reading takes that same layout back the same way. Both are a few
# struct calls instead of a trip through cbor2, which costs more on the path of every
# request than its work suggests: right after a wake-up its code is cold in the CPU's
# caches. Anything outside the layout (another key order, a tag, a negative or huge
# integer, a half-precision float, bad UTF-8, ...) goes to cbor2 and the generated
# checker: the fast reader returns None, the fast writer calls cbor2. The tests hold
# both to cbor2 and to the reference decoder, byte for byte and value for value.
_ONE_BYTE = [bytes((i,)) for i in range(256)]
_pack_BB = struct.Struct(">BB").pack
_pack_BH = struct.Struct(">BH").pack
_pack_BI = struct.Struct(">BI").pack
_pack_BQ = struct.Struct(">BQ").pack
_unpack_H = struct.Struct(">H").unpack_from
_unpack_I = struct.Struct(">I").unpack_from
_unpack_Q = struct.Struct(">Q").unpack_from
_pack_double = struct.Struct(">d").pack
_unpack_double = struct.Struct(">d").unpack_from


def _head(major: int, n: int) -> bytes:
    """The shortest CBOR head of major type ``major`` (0x00 unsigned, 0x40 bytes, 0x60
    text) for ``0 <= n < 2**64``."""
    if n < 24:
        return _ONE_BYTE[major | n]
    if n < 0x100:
        return _pack_BB(major | 24, n)
    if n < 0x10000:
        return _pack_BH(major | 25, n)
    if n < 0x100000000:
        return _pack_BI(major | 26, n)
    return _pack_BQ(major | 27, n)


def _scalar_fields(cls: type[Message]) -> _Fields | None:
    """``(name, type, may be None)`` per field, or None if a field is not a scalar."""
    hints = typing.get_type_hints(cls)
    fields = []
    for field in dataclasses.fields(cls):
        annotation = hints[field.name]
        inner = _nullable(annotation)
        kind = inner if inner is not None else annotation
        if kind not in _SIMPLE:
            return None
        fields.append((field.name, kind, inner is not None))
    return fields


def _prefix(cls: type[Message]) -> bytes:
    """The bytes every frame payload of ``cls`` starts with: map head, "t", its type."""
    count = 1 + len(dataclasses.fields(cls))
    return _ONE_BYTE[0xA0 | count] + cbor2.dumps("t") + cbor2.dumps(cls.TYPE)


# What a field's value becomes, in the fast writer: (test for the value, parts of bytes)
_WRITE = {
    int: ("type({v}) is int and 0 <= {v} < 18446744073709551616", "_head(0, {v})"),
    float: ("type({v}) is float and _isfinite({v})", "b'\\xfb', _pack_double({v})"),
    str: ("type({v}) is str", "_head(0x60, len({v}_utf8)), {v}_utf8"),
    bytes: ("type({v}) is bytes", "_head(0x40, len({v})), {v}"),
    bool: ("type({v}) is bool", "b'\\xf5' if {v} else b'\\xf4'"),
}


def _framer(cls: type[Message], fields: _Fields) -> Callable[..., bytes]:
    """``frame(field, ...)``: the frame of ``cls(field=..., ...)``, byte for byte what
    cbor2 writes for it, without building the message. Its source is its docstring."""
    params = ", ".join(
        f"{name}=None" if f.default is None else name
        for (name, _, _), f in zip(fields, dataclasses.fields(cls), strict=True)
    )
    lines = []
    parts = ["_PREFIX"]
    for name, kind, nullable in fields:
        test, written = (x.format(v=name) for x in _WRITE[kind])
        block = [f"if not ({test}):", "    return _slow()"]
        if kind is str:  # UTF-8 first: what cbor2 cannot encode, it refuses (so _slow does)
            block += [
                "try:",
                f"    {name}_utf8 = {name}.encode()",
                "except UnicodeEncodeError:",
                "    return _slow()",
            ]
        if nullable:
            block = [f"if {name} is not None:", *(f"    {line}" for line in block)]
            parts.append(f"_KEY_{name}, *((b'\\xf6',) if {name} is None else ({written},))")
        else:
            parts.append(f"_KEY_{name}, {written}")
        lines += block
    names = ", ".join(name for name, _, _ in fields)
    lines = [line.replace("_slow()", f"_slow({names})") for line in lines]
    body = [
        f"def _slow({names}):",
        *(f"    {line}" for line in _by_cbor2(cls, "")),
        "",
        f"def frame({params}):",
        *(f"    {line}" for line in lines),
        f"    payload = b''.join(({', '.join(parts)},))",
        "    return _pack(len(payload)) + payload",
    ]
    namespace: dict[str, Any] = {
        "_PREFIX": _prefix(cls), "_dumps": cbor2.dumps, "_pack": HEADER.pack, "_head": _head,
        "_pack_double": _pack_double, "_isfinite": math.isfinite,
        **{f"_KEY_{name}": cbor2.dumps(name) for name, _, _ in fields},
    }  # fmt: skip
    frame: Callable[..., bytes] = _compile("\n".join(body) + "\n", "frame", namespace)
    return frame


def _head_lines(v: str, major: int) -> list[str]:
    """Lines of the fast reader that take a head of major type ``major`` at ``pos`` into
    ``v`` (written out: this runs for every field of every frame)."""
    return [
        f"h = b[pos] - {major}",
        "if 0 <= h < 24:",
        f"    {v} = h",
        "    pos += 1",
        "elif h == 25:",
        f"    {v} = _unpack_H(b, pos + 1)[0]",
        "    pos += 3",
        "elif h == 26:",
        f"    {v} = _unpack_I(b, pos + 1)[0]",
        "    pos += 5",
        "elif h == 27:",
        f"    {v} = _unpack_Q(b, pos + 1)[0]",
        "    pos += 9",
        "elif h == 24:",
        f"    {v} = b[pos + 1]",
        "    pos += 2",
        "else:",
        "    return None",
    ]


def _read_lines(kind: type, v: str) -> list[str]:
    """Lines of the fast reader that take a value of ``kind`` at ``pos`` into ``v``."""
    if kind is int:
        return _head_lines(v, 0x00)
    if kind is float:
        return [
            "if b[pos] != 0xFB:",
            "    return None",
            f"{v} = _unpack_double(b, pos + 1)[0]",
            f"if not _isfinite({v}):",
            "    return None",
            "pos += 9",
        ]
    if kind is str or kind is bytes:
        take = "b[pos:end].decode()" if kind is str else "b[pos:end]"
        return [
            *_head_lines("n", 0x60 if kind is str else 0x40),
            "end = pos + n",
            f"{v} = {take}",  # short if the frame is: then pos != len(b) below
            "pos = end",
        ]
    assert kind is bool
    return [
        "if b[pos] == 0xF5:",
        f"    {v} = True",
        "elif b[pos] == 0xF4:",
        f"    {v} = False",
        "else:",
        "    return None",
        "pos += 1",
    ]


_Fields = list[tuple[str, type, bool]]  # (name, scalar type, may be None) per field
_Reader = Callable[[bytes], Message | None]


def _reader(cls: type[Message], fields: _Fields) -> _Reader:
    """``read(payload)``: the message in a payload that starts with ``cls``'s prefix and
    is laid out as :func:`_framer` writes it, else None. Its source is its docstring."""
    lines = [f"pos = {len(_prefix(cls))}"]
    for name, kind, nullable in fields:
        skip = len(cbor2.dumps(name))
        lines += [f"if not b.startswith(_KEY_{name}, pos):", "    return None", f"pos += {skip}"]
        value = [f"    {line}" for line in _read_lines(kind, f"v_{name}")]
        if nullable:
            lines += ["if b[pos] == 0xF6:", f"    v_{name} = None", "    pos += 1", "else:", *value]
        else:
            lines += [line[4:] for line in value]
    lines += ["if pos != len(b):", "    return None", "message = _new(_cls)"]
    lines += [f"_set_{name}(message, v_{name})" for name, _, _ in fields]
    lines.append("return message")
    source = (
        "def read(b):\n    try:\n"
        + "".join(f"        {line}\n" for line in lines)
        + "    except (IndexError, struct_error, UnicodeDecodeError):\n        return None\n"
    )
    namespace: dict[str, Any] = {
        "_cls": cls, "_new": object.__new__, "_isfinite": math.isfinite,
        "_unpack_H": _unpack_H, "_unpack_I": _unpack_I, "_unpack_Q": _unpack_Q,
        "_unpack_double": _unpack_double, "struct_error": struct.error,
        **{f"_KEY_{name}": cbor2.dumps(name) for name, _, _ in fields},
        **{f"_set_{name}": cls.__dict__[name].__set__ for name, _, _ in fields},
    }  # fmt: skip
    read: _Reader = _compile(source, "read", namespace)
    return read


_FAST_CHECKS: dict[str, FastCheck] = {cls.TYPE: _fast_check(cls) for cls in _ALL_MESSAGES}
_SCALAR_FIELDS = {cls: _scalar_fields(cls) for cls in _ALL_MESSAGES}
_SCALAR = {cls: fields for cls, fields in _SCALAR_FIELDS.items() if fields is not None}
_FRAMERS: dict[type[Message], Callable[..., bytes]] = {
    cls: _framer(cls, fields) for cls, fields in _SCALAR.items()
}
_READERS: dict[bytes, _Reader] = {
    _prefix(cls): _reader(cls, fields) for cls, fields in _SCALAR.items()
}
_ENCODERS: dict[type[Message], Callable[[Any], bytes]] = {
    cls: _encoder(cls) for cls in _ALL_MESSAGES
}


# ---------------------------------------------------------------- encode / decode
def encode(message: Message) -> bytes:
    """One frame: the length header and the CBOR map of ``message``: ``t``, then the
    fields in their order."""
    return _ENCODERS[type(message)](message)


data_frame: Callable[[int, int, float, bytes], bytes] = _FRAMERS[Data]
"""``data_frame(id, version, term, data)`` is ``encode(Data(...))`` without building the
message first: the server's reply to almost every read."""

read_frame: Callable[..., bytes] = _FRAMERS[Read]
"""``read_frame(id, path, have=None)`` is ``encode(Read(...))`` without building the
message first: the client's request on every miss."""


_dumps = cbor2.dumps
_pack = HEADER.pack
_BytesIO = io.BytesIO
_load = cbor2.load


def decode_message(payload: bytes) -> Message:
    """The message in one frame's payload (header already removed).

    :func:`_decode_reference`, only faster: ``cbor2.load`` is the cheaper spelling of
    its stream decoder, and the message type's generated checker stands in for the
    generic checks, which run only when it declines (and then make the error).
    """
    if len(payload) > 3 and type(payload) is bytes:  # the fast reader for its prefix, if any
        read = _READERS.get(payload[: payload[3] - 0x5C])  # map head, "t", the type's name
        if read is not None:
            message = read(payload)
            if message is not None:
                return message
    stream = _BytesIO(payload)
    try:
        body = _load(stream, tag_hook=_reject_tag)
    except ProtocolError:
        raise
    except Exception as exc:  # cbor2 raises several types, and RecursionError on deep nesting
        raise ProtocolError(f"frame is not valid CBOR: {exc}") from None
    if stream.tell() != len(payload):  # (cbor2.loads would silently ignore them)
        raise ProtocolError("frame holds bytes after its CBOR map")
    if type(body) is dict:
        kind = body.get("t")
        if type(kind) is str:
            check = _FAST_CHECKS.get(kind)
            if check is not None:
                message = check(body)
                if message is not None:
                    return message
    return _check_body(body)


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
