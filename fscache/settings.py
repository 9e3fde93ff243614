"""Every default a user can change, and the one check of each, in one place. No I/O.

The server's options (``fscache serve``), the lease table, the client and the command
line all take their defaults from here and check a term or a skew with
:func:`check_duration`, so a default or a rule is never written twice.
"""

from __future__ import annotations

import math

from fscache.errors import FscacheError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7710
DEFAULT_ADDRESS = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
DEFAULT_TERM = 10.0  # seconds: the knee of the paper's curve (its section 3)
DEFAULT_SKEW = 0.1  # seconds: the clock-skew allowance on both ends of a lease
DEFAULT_MAX_FRAME = 2 * 1024 * 1024  # bytes: the largest frame either end accepts (chunk + room)
CHUNK_SIZE = 1 << 20  # bytes: one ranged read's reply, one upload part (1 MiB)
DEFAULT_HOT_WRITES = 3  # writes within one term that make a file write-shared (term 0)

# Limits: no one frame, connection or client can take the server's memory or its event
# loop from the rest. Each error that enforces one names it.
MAX_CONNECTIONS = 1024  # open connections, server-wide (each holds buffers and descriptors)
MAX_CONNECTIONS_PER_IDENTITY = 256  # of one identity (every plain-TCP client is "anonymous")
MAX_IN_FLIGHT = 64  # requests one connection has waiting; at it, its socket is not read
MAX_PENDING_WRITE_BYTES = 64 * 1024 * 1024  # bytes of one session's waiting writes
MAX_PENDING_WRITE_BYTES_TOTAL = 256 * 1024 * 1024  # bytes of all sessions' waiting writes
MAX_LEASES_PER_HOLDER = 65536  # beyond it a read is served with term 0: no lease, no cache
MAX_PATHS = 256  # paths in one extend or relinquish: an extend stats each on the event loop
FRAME_TIMEOUT = 30.0  # seconds a begun frame may take to arrive whole
HANDSHAKE_TIMEOUT = 10.0  # seconds: a peer that connects and says no hello is dropped then
MAX_UPLOADS = 16  # open uploads per connection: each holds a temp file and two descriptors
MAX_SECRET = 64  # bytes: a hello's secret longer than this is refused unread
MAX_PATH_BYTES = 1024  # bytes of a whole path, UTF-8
MAX_SEGMENT_BYTES = 255  # bytes of one name, as most file systems allow
MAX_OUTBOX = 32 * 1024 * 1024  # unsent bytes per connection before it is dropped
SEND_TIMEOUT = 30.0  # a send not done by then: the peer stopped reading; drop it
LISTING_PAGE_ENTRIES = 4096  # names in one listing page (a scandir page stats each)
LISTING_PAGE_BYTES = 1024 * 1024  # bytes of names in one listing page
DEFAULT_LOCK_TTL = 10.0  # seconds: a lock's ttl when none is given (the lease term's)
MAX_LOCK_TTL = 300.0  # seconds: a lock's longest ttl, and so a restarted server's longest hold
MAX_TERM = 86400.0  # seconds: the longest lease term (and skew) a server takes; a day
MAX_IDENTITY = 256  # characters of a lock holder's identity (as of a client_id)
OUTAGE_WAIT = 120.0  # seconds a mount's request waits for an unreachable server, then EIO


class BadSetting(FscacheError, ValueError):
    """A setting out of its range; the message names the setting."""


def check_duration(name: str, value: object) -> float:
    """``value`` as a float if it is a finite number of seconds >= 0 (a term, a skew)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadSetting(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise BadSetting(f"{name} must be a finite number >= 0, not {value!r}")
    return float(value)


def check_host(name: str, host: str) -> str:
    """``host`` as the resolver takes it, if it is a host: a name or an address. An
    IPv6 address may come in brackets, as in ``HOST:PORT`` (``[::1]``): they are
    taken off. An empty host names no address."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host.strip():
        raise BadSetting(
            f"{name} must be a host name or an address, such as 127.0.0.1, ::1, localhost"
            f" or 0.0.0.0 (every interface), not {host!r}"
        )
    return host


MAX_EXTENT = 2**63 - 1  # off_t: the kernel's file offsets and sizes are signed 64-bit


def check_extent(name: str, value: int) -> int:
    """``value`` if it is an offset, length or size a file can have: an int (a bool, a
    float or a numeric string is the caller's slip, refused with ``TypeError`` rather
    than compared or sliced with), 0..2**63-1."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= MAX_EXTENT:
        raise BadSetting(f"{name} must be 0..2**63-1, not {value}")
    return value


def check_lock_ttl(ttl: object, skew: float, max_ttl: float = MAX_LOCK_TTL) -> float:
    """``ttl`` as a float if it is a lock's ttl: more than ``2 * skew`` (else its holder
    could never trust it) and at most ``max_ttl``."""
    value = check_duration("ttl", ttl)
    if not 2 * skew < value <= max_ttl:
        raise BadSetting(
            f"a lock's ttl must be > 2 * skew ({2 * skew}) and <= {max_ttl}, not {ttl!r}"
        )
    return value


def identity_problem(identity: str, what: str = "identity") -> str | None:
    """Why ``identity`` cannot name a lock's holder (or, ``what`` being
    ``client_id``, a client), or None: it must be 1..256 characters (an empty one
    would read as "nobody leads") with no control character or line break (it is
    printed on one line, by ``fscache leader`` and in the server's log, and a
    terminal would obey an escape in it)."""
    if not 1 <= len(identity) <= MAX_IDENTITY:
        return f"{what} must be 1..{MAX_IDENTITY} characters, not {len(identity)}"
    if not all(ch.isprintable() or ch == " " for ch in identity):
        return f"{what} must be printable on one line (no control character), not {identity!r}"
    return None


def check_identity(identity: object) -> None:
    """Raise :class:`BadSetting` if ``identity`` is a str no holder may have (a
    mistyped one is left to the field checks, which raise :class:`TypeError`)."""
    if isinstance(identity, str) and (problem := identity_problem(identity)) is not None:
        raise BadSetting(problem)
