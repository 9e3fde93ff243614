"""fscache: a file service with lease-based cache consistency (Gray & Cheriton, SOSP 1989).

async with fscache.open_client("127.0.0.1", 7710) as c:   # under trio
    data = await c.read("docs/a.txt")

with fscache.connect("127.0.0.1:7710") as c:              # from ordinary code
    data = c.read("docs/a.txt")
"""

from typing import TYPE_CHECKING, Any

from fscache.cache import DirEntry
from fscache.errors import (
    BadPath,
    Conflict,
    Exists,
    FscacheError,
    IsADirectory,
    LockLost,
    LockTimeout,
    NotADirectory,
    NotDurable,
    NotEmpty,
    NotFound,
    ProtocolError,
    TooLarge,
    Unauthorized,
    Unavailable,
)

if TYPE_CHECKING:  # the real types for type checkers; imported lazily at run time
    from fscache.client.blocking import BlockingClient, connect
    from fscache.client.client import Client, StatResult, open_client
    from fscache.client.watch import Change

__version__ = "0.1.0"

__all__ = [
    "BadPath",
    "BlockingClient",
    "Change",
    "Client",
    "Conflict",
    "DirEntry",
    "Exists",
    "FscacheError",
    "IsADirectory",
    "LockLost",
    "LockTimeout",
    "NotADirectory",
    "NotDurable",
    "NotEmpty",
    "NotFound",
    "ProtocolError",
    "StatResult",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "connect",
    "open_client",
]


def __getattr__(name: str) -> Any:
    # The clients pull in trio; import them on first use so `fscache.errors` and the
    # sans-IO core stay importable (and fast to import) without it.
    if name in ("open_client", "Client", "StatResult"):
        from fscache.client import client

        return getattr(client, name)
    if name == "Change":
        from fscache.client import watch

        return watch.Change
    if name in ("connect", "BlockingClient"):
        from fscache.client import blocking

        return getattr(blocking, name)
    raise AttributeError(f"module 'fscache' has no attribute {name!r}")
