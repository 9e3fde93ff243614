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
    """The path breaks the path rules (:mod:`fscache.paths`): it is absolute, has a
    ``..`` segment, a NUL, a backslash or another control character, is not valid
    Unicode, has a name the store reserves (``.fscache...``), is longer than 1024
    bytes (a name, 255), or is empty where a file is meant. Empty and ``.``
    segments are not errors: they are dropped (``a//b`` and ``./a/b`` name
    ``a/b``). The store also refuses a path that leads through a symlink, and a move
    of a directory into itself."""

    code = "bad_path"


class TooLarge(FscacheError):
    """A frame or a file is larger than the configured maximum."""

    code = "too_large"


class Conflict(FscacheError):
    """The change or read could not be made as asked, because of another's: a
    compare-and-set lost (the file's version was not ``if_version``), a fenced change
    was refused (its lock's token is no longer the newest), or a file kept changing
    while it was read, copied or listed (and a copy into a target that cannot be
    rewound saw it change)."""

    code = "conflict"


class Unavailable(FscacheError):
    """The server cannot be reached and no live lease covers the request."""

    code = "unavailable"


class Unauthorized(FscacheError):
    """The server refused a request: its access rules do not let this client's
    identity do it (or a session was resumed with a wrong secret, or by another
    identity). The credentials were accepted; a certificate refused in the TLS
    handshake is the subclass :class:`fscache.CredentialsRefused`."""

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
