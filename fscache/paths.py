"""Path rules, shared by client and server.

A path names a file below the server's root. It is relative, uses ``/`` as the
separator, and after normalisation has no empty, ``.`` or ``..`` segment, no NUL,
no backslash and no control character. The normal form is what the lease table,
the cache and the store key on, so ``a//b``, ``./a/b`` and ``a/b/`` are one file.

Unicode.  A path is put in NFC (composed) form, so ``café`` typed as ``e`` and a
combining accent (NFD, as macOS spells names) is the same file, with one lease key,
as ``café`` with ``é``: two spellings of one name never get two leases on a file
system that treats them as one.  Normalising rather than refusing keeps clients
that hand over their file system's spelling working; the client normalises before
sending, so the wire carries the NFC form.  The store's names (:data:`RESERVED_PREFIX`)
are reserved without regard to case (``.FSCACHE``, ``.Fscache-tmp-1``): a file
system that folds case would otherwise let a client reach them.
The empty path (or ``.``) names the root itself and is allowed only where a
directory is meant (``allow_root=True``). A lease key is a path, or a directory's
path and a ``/`` for its listing (:func:`normalize_key`).
"""

from __future__ import annotations

import re
import unicodedata

from fscache.errors import BadPath
from fscache.settings import MAX_PATH_BYTES as MAX_PATH_BYTES  # re-exported
from fscache.settings import MAX_SEGMENT_BYTES as MAX_SEGMENT_BYTES

RESERVED_PREFIX = ".fscache"  # the store's temp files and the server's state directory


# A path already in normal form, in printable ASCII: the common case, checked in one
# regex match. Every segment is 1..255 characters other than '/' and '\\', is not
# '.' or '..' and does not start with the reserved prefix in any case. Printable
# ASCII is always in NFC. Anything else (and any path over MAX_PATH_BYTES) takes the
# rule-by-rule way below.
_SEGMENT = r"(?!\.\.?(?:/|\Z)|(?i:" + re.escape(RESERVED_PREFIX) + r"))[ -.0-\[\]-~]{1,255}"
_ALREADY_NORMAL = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")


def normalize(path: object, *, allow_root: bool = False) -> str:
    """The normal form of ``path``, or :class:`BadPath` saying what is wrong with it."""
    if type(path) is str:
        if len(path) <= MAX_PATH_BYTES and _already_normal(path):  # one regex match
            return path
        return _normalize_by_rules(path, allow_root)
    if isinstance(path, str):  # a str subclass: judge its plain value
        return normalize(str(path), allow_root=allow_root)
    raise BadPath(f"path must be a string, not {type(path).__name__}")


_already_normal = _ALREADY_NORMAL.fullmatch


def normalize_argument(path: object, *, allow_root: bool = False) -> str:
    """:func:`normalize` of a path a caller of the client library gave: one that is no
    str (bytes, a ``pathlib.Path``, None) is the caller's slip, a ``TypeError`` as for
    any mistyped argument, not a :class:`BadPath` (which says a string breaks the
    path rules)."""
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, not {type(path).__name__}")
    return normalize(path, allow_root=allow_root)


def normalize_key(key: object) -> str:
    """The normal form of a lease key: a file's path, or a directory's path and a ``/``
    (``docs/``; the root's is ``/``), which stands for the directory's listing."""
    if type(key) is str:
        if len(key) <= MAX_PATH_BYTES and _already_normal(key):  # a file's, as in normalize
            return key
        if key.endswith("/"):
            return normalize(key[:-1], allow_root=True) + "/"
    return normalize(key)


def is_reserved(name: str) -> bool:
    """Whether the name ``name`` (one segment) is one of the store's own, in any case."""
    return name.casefold().startswith(RESERVED_PREFIX)


def _normalize_by_rules(path: str, allow_root: bool) -> str:
    if "\x00" in path:
        raise BadPath("path contains a NUL byte")
    if path.startswith("/"):
        raise BadPath(f"path must be relative to the root: {path!r}")
    if "\\" in path:
        raise BadPath(f"path must use '/' as separator: {path!r}")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise BadPath(f"path contains a control character: {path!r}")
    try:
        encoded_length = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadPath(f"path is not valid Unicode: {path!r}") from None
    if not path.isascii():
        path = unicodedata.normalize("NFC", path)
        encoded_length = len(path.encode("utf-8"))
    if encoded_length > MAX_PATH_BYTES:
        raise BadPath(f"path is longer than {MAX_PATH_BYTES} bytes")
    segments = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            raise BadPath(f"path must not contain '..': {path!r}")
        if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise BadPath(f"path segment is longer than {MAX_SEGMENT_BYTES} bytes")
        if is_reserved(segment):
            raise BadPath(f"names starting with {RESERVED_PREFIX!r} are reserved")
        segments.append(segment)
    if not segments and not allow_root:
        raise BadPath("path is empty")
    return "/".join(segments)
