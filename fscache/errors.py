"""One flat family of exceptions, shared by the client, the server and the wire.

Every error that crosses the wire carries a ``code``; :func:`error_for_code` turns a
code received from the peer back into the same exception type on the other side.
"""

from __future__ import annotations


class FscacheError(Exception):
    """Base class of every error fscache raises on purpose."""

    code = "error"


class NotFound(FscacheError):
    """The path does not exist."""

    code = "not_found"


class BadPath(FscacheError):
    """The path is absolute, escapes the root, has a NUL, an empty segment, or is too long."""

    code = "bad_path"


class TooLarge(FscacheError):
    """A frame or a file is larger than the configured maximum."""

    code = "too_large"


class Conflict(FscacheError):
    """A compare-and-set write or delete lost: the file's version was not ``if_version``."""

    code = "conflict"


class Unavailable(FscacheError):
    """The server cannot be reached and no live lease covers the request."""

    code = "unavailable"


class Unauthorized(FscacheError):
    """The peer refused our credentials (TLS) or we refused theirs."""

    code = "unauthorized"


class ProtocolError(FscacheError):
    """A frame or message that does not follow the wire protocol."""

    code = "protocol"


class IsADirectory(FscacheError):
    """The path names a directory where a file was expected (or the reverse)."""

    code = "is_a_directory"


class NotADirectory(FscacheError):
    """The path names a file (or nothing a directory can be) where a directory was expected."""

    code = "not_a_directory"


class NotEmpty(FscacheError):
    """The directory still holds entries (rmdir, or a rename over it)."""

    code = "not_empty"


class Exists(FscacheError):
    """The path already exists (mkdir)."""

    code = "exists"


class NotDurable(FscacheError):
    """A change is visible in the tree, but making it durable failed (the directory
    fsync after a rename, the fsync after an in-place write): it may or may not
    survive a crash. The old contents are gone; no one may go on trusting them."""

    code = "not_durable"


class LockLost(FscacheError):
    """A lock was lost: its lease ran out (or the server refused its renewal) before
    it was released, so another holder may have it now. Raised by the ``async with``
    of a lock whose body was cancelled for it."""

    code = "lock_lost"


class LockTimeout(FscacheError):
    """An acquire's timeout passed (or, with timeout 0, the lock was held)."""

    code = "lock_timeout"


class NoSpace(FscacheError):
    """The server's disk, or its user's quota, is full (``ENOSPC``, ``EDQUOT``): the
    change was not made. The operator's to fix; the same request may succeed once
    there is room."""

    code = "no_space"


_BY_CODE: dict[str, type[FscacheError]] = {
    cls.code: cls
    for cls in (
        FscacheError,
        NotFound,
        BadPath,
        TooLarge,
        Conflict,
        Unavailable,
        Unauthorized,
        ProtocolError,
        IsADirectory,
        NotADirectory,
        NotEmpty,
        Exists,
        NotDurable,
        LockLost,
        LockTimeout,
        NoSpace,
    )
}


def error_for_code(code: str, message: str) -> FscacheError:
    """The exception a peer meant by ``code``; unknown codes become a plain FscacheError."""
    return _BY_CODE.get(code, FscacheError)(message)
