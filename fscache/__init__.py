"""fscache: a file service with lease-based cache consistency (Gray & Cheriton, SOSP 1989).

async with fscache.open_client("127.0.0.1", 7710) as c:   # under trio
    data = await c.read("docs/a.txt")

with fscache.connect("127.0.0.1:7710") as c:              # from ordinary code
    data = c.read("docs/a.txt")

The public names (the clients load on first use, so help() lists only what is
loaded; each has its own help):

open_client(host, port, ...)    async context manager giving a Client (trio)
Client                          the async client: read, write, stat, scandir, lock ...
StatResult                      what Client.stat returns: path, version, size, is_dir
DirEntry                        an entry of Client.scandir: name, is_dir, size, version
Change                          what Client.watch yields: kind, path, version
connect(address, ...)           a BlockingClient for "HOST:PORT" or a bare "HOST"
BlockingClient, BlockingLock    the blocking client (a trio loop on a thread), its locks
tls                             fscache.tls: certificates and TLS contexts

Errors, all FscacheError: NotFound, BadPath, TooLarge, Conflict, Unavailable,
Unauthorized (and its subclass CredentialsRefused), ProtocolError, IsADirectory,
NotADirectory, NotEmpty, Exists, NotDurable, LockLost, LockTimeout, NoSpace, and
BadSetting (also a ValueError) for a setting or an address out of its range.
"""

import importlib
from typing import TYPE_CHECKING, Any

from fscache.errors import (
    BadPath,
    Conflict,
    Exists,
    FscacheError,
    IsADirectory,
    LockLost,
    LockTimeout,
    NoSpace,
    NotADirectory,
    NotDurable,
    NotEmpty,
    NotFound,
    ProtocolError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from fscache.settings import BadSetting

if TYPE_CHECKING:  # the real types for type checkers; imported lazily at run time
    from fscache.cache import DirEntry
    from fscache.client.blocking import BlockingClient, BlockingLock, connect
    from fscache.client.client import Client, StatResult, open_client
    from fscache.client.watch import Change
    from fscache.tls import CredentialsRefused

__version__ = "0.1.0"

__all__ = [
    "BadPath",
    "BadSetting",
    "BlockingClient",
    "BlockingLock",
    "Change",
    "Client",
    "Conflict",
    "CredentialsRefused",
    "DirEntry",
    "Exists",
    "FscacheError",
    "IsADirectory",
    "LockLost",
    "LockTimeout",
    "NoSpace",
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
    # The clients pull in trio, and fscache.tls cryptography; import them on first use
    # so `fscache.errors` and the sans-IO core stay importable (and fast to import)
    # without them.
    if name in ("open_client", "Client", "StatResult"):
        from fscache.client import client

        return getattr(client, name)
    if name == "DirEntry":  # fscache.cache loads dataclasses, a third of a command's start
        from fscache import cache

        return cache.DirEntry
    if name == "Change":
        from fscache.client import watch

        return watch.Change
    if name in ("connect", "BlockingClient", "BlockingLock"):
        from fscache.client import blocking

        return getattr(blocking, name)
    if name in ("tls", "CredentialsRefused"):  # cryptography: loaded when TLS is used
        # (by import_module: `from fscache import tls` would ask this function again)
        tls = importlib.import_module("fscache.tls")
        return tls if name == "tls" else tls.CredentialsRefused
    raise AttributeError(f"module 'fscache' has no attribute {name!r}")
