"""The blocking client: the async client on a trio loop in a background thread.

A cache hit is answered on the caller's thread by the cache's own rule,
:meth:`fscache.cache.LeaseCache.lookup` on ``time.monotonic()``, with no lock and
no thread hop (why that is thread-safe: the cache's theory note). The loop thread
drops an entry *before* approving a write, so a hit that raced with the drop
returned data whose replacement the server had not yet applied. Everything else
crosses to the loop thread with ``trio.from_thread.run``.

Life of a client
================

* **Closing.** :meth:`BlockingClient.close` says goodbye: the server ends this
  client's leases at once, so a writer waits for nobody. A client that is dropped
  without ``close()`` is closed when it is collected, and one still open when the
  interpreter exits is closed then (``weakref.finalize``): otherwise each would keep
  its thread and socket, and its leases would hold up every writer for a term. This
  works because the loop thread holds only :class:`_Loop`, never the client itself.
  ``close()`` may be called from a trio task too (it blocks that task for the
  goodbye); the other calls refuse to, and say to use the async client there.
* **Interrupting.** A call interrupted on the caller's thread (Ctrl-C's
  ``KeyboardInterrupt``) is cancelled on the loop thread too, and waited for, so an
  interrupted ``acquire`` holds nothing, as a cancelled one does in the async client.
  A request already sent may still take effect (a write the server had received is
  applied), as with any request whose reply did not come.
* **Forking.** A child process made by ``fork`` has a copy of the parent's cache
  but not its loop thread. In the child every client the parent made is closed and
  its cache emptied (``os.register_at_fork``): reads there would otherwise be
  answered from a copy that no lease keeps current, and a miss would wait for ever.
  The child connects anew.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import ssl
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping
from functools import partial
from typing import IO, Any, TypeVar

import trio

from fscache.cache import DEFAULT_MAX_BYTES, DirEntry
from fscache.client.client import (
    _WHOLE,
    CLOSED,
    Client,
    Fencing,
    Source,
    StatResult,
    _cut,
    open_client,
    parse_address,
)
from fscache.client.locks import Lock
from fscache.client.watch import Change
from fscache.errors import FscacheError
from fscache.paths import normalize_argument as normalize
from fscache.protocol import Fence
from fscache.settings import DEFAULT_ADDRESS, DEFAULT_LOCK_TTL, check_identity

T = TypeVar("T")

# How long an interrupted call is waited for once it is cancelled on the loop thread
# (giving back what it was granted takes a round trip; a dead server, no longer).
INTERRUPTED_WAIT = 5.0

FORKED = "client was made in the parent process before a fork: connect again in this one"
IN_TRIO = (
    "a blocking client's calls block: from a trio task use fscache.open_client, or make"
    " the call in a thread (trio.to_thread.run_sync); close() works from anywhere"
)


class _Loop:
    """The loop thread's side of a client: its trio run and how to stop it. It holds
    no reference to the :class:`BlockingClient`, so that one dropped without
    ``close()`` can be collected (and closed by its finalizer)."""

    def __init__(
        self,
        host: str,
        port: int,
        client_id: str | None,
        ssl_context: ssl.SSLContext | None,
        cache_bytes: int,
        name: str,
    ) -> None:
        self._started: queue.Queue[tuple[Client, trio.lowlevel.TrioToken] | BaseException] = (
            queue.Queue()
        )
        self._stop: trio.Event | None = None
        self.thread = threading.Thread(
            target=trio.run,
            args=(self._main, host, port, client_id, ssl_context, cache_bytes),
            name=name,
            daemon=True,
        )
        self.thread.start()
        started = self._started.get()
        if isinstance(started, BaseException):
            self.thread.join()
            raise started
        self.client, self.token = started

    async def _main(
        self,
        host: str,
        port: int,
        client_id: str | None,
        ssl_context: ssl.SSLContext | None,
        cache_bytes: int,
    ) -> None:
        self._stop = trio.Event()
        try:
            async with open_client(
                host,
                port,
                client_id=client_id,
                ssl_context=ssl_context,
                cache_bytes=cache_bytes,
                clock=time.monotonic,
            ) as client:
                self._started.put((client, trio.lowlevel.current_trio_token()))
                await self._stop.wait()
        except BaseException as exc:  # handed to the constructor's thread
            if self._started.empty():
                self._started.put(exc)
            else:
                raise

    def close(self) -> None:
        """Say goodbye (the async client's close) and wait for the thread to end; when
        the collector runs this on the loop thread itself, only ask it to stop. Works
        from any other thread, a trio task's among them (``run_sync_soon`` does not
        mind being called from inside a trio run, as ``from_thread`` does): that task
        is blocked for the goodbye, as by any blocking call."""
        stop = self._stop
        if threading.current_thread() is self.thread:
            if stop is not None:
                stop.set()
            return
        if stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self.token.run_sync_soon(stop.set)
        self.thread.join()


class BlockingLock:
    """A lock of a blocking client (:meth:`BlockingClient.acquire`): the async
    :class:`~fscache.client.locks.Lock`'s attributes, with a blocking :meth:`release`
    and :attr:`lost` a plain bool. Renewed on the loop thread until released or lost.
    ``with lock:`` releases it at the end and raises :class:`LockLost` if it was lost
    meanwhile; a thread cannot be cancelled, so a body that outlives the lock runs on
    (check :attr:`held`, fence writes with ``fence=lock``)."""

    def __init__(self, client: BlockingClient, lock: Lock) -> None:
        self._client = client
        self._lock = lock

    def __repr__(self) -> str:
        return f"<BlockingLock {self.name!r} token={self.token} held={self.held}>"

    @property
    def name(self) -> str:
        return self._lock.name

    @property
    def token(self) -> int:
        return self._lock.token

    @property
    def identity(self) -> str:
        return self._lock.identity

    @property
    def ttl(self) -> float:
        return self._lock.ttl

    @property
    def valid_until(self) -> float:
        """Until when it may be trusted, on ``time.monotonic()``."""
        return self._lock.valid_until

    @property
    def held(self) -> bool:
        """Whether the lock may be trusted now (not lost, not released, not run out)."""
        return self._lock.held

    @property
    def lost(self) -> bool:
        """Whether the lock was lost while it was held."""
        return self._lock.lost.is_set()

    @property
    def fence(self) -> Fence:
        """What a fenced change names: ``(name, token)``."""
        return self._lock.fence

    def release(self) -> None:
        """Give the lock back. Idempotent; nothing to do once the client is closed (its
        goodbye released it)."""
        if self._lock._released or self._client.closed:
            return
        self._client._run(self._lock.release)

    def raise_if_lost(self) -> None:
        """Raise :class:`LockLost` if the lock was lost while it was held."""
        self._lock.raise_if_lost()

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lock is lost (True), released (False), or ``timeout``
        seconds have passed (False)."""
        lock = self._lock

        async def wait() -> bool:
            with trio.move_on_after(math.inf if timeout is None else timeout):
                await lock.ended.wait()
            return lock.lost.is_set()

        if lock.ended.is_set() or self._client.closed:
            return lock.lost.is_set()
        return self._client._run(wait)

    def __enter__(self) -> BlockingLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
        if exc_info[0] is None:
            self.raise_if_lost()


# Every open client of this process, for the fork handler below.
_OPEN: weakref.WeakSet[BlockingClient] = weakref.WeakSet()


def _close_after_fork() -> None:
    """In the child of a fork: close (without a goodbye: the connection is the
    parent's) every client the parent had open, and empty its cache."""
    for client in list(_OPEN):
        client._forked()
    _OPEN.clear()


os.register_at_fork(after_in_child=_close_after_fork)


class BlockingClient:
    """``fscache.connect(...)``: the same operations as the async client, blocking."""

    def __init__(
        self,
        address: str,
        *,
        client_id: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        cache_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        host, port = parse_address(address)
        self.address = f"{host}:{port}"
        self._closed = False
        self._closed_reason = CLOSED
        loop = _Loop(
            host, port, client_id, ssl_context, cache_bytes, f"fscache-client-{self.address}"
        )
        self._client, self._token = loop.client, loop.token
        self._cache = self._client.cache
        self._hits = 0
        self._finalizer = weakref.finalize(self, loop.close)  # also at interpreter exit
        _OPEN.add(self)

    def _forked(self) -> None:
        self._closed = True
        self._closed_reason = FORKED
        self._finalizer.detach()  # the loop thread is the parent's: nothing to stop here
        self._cache.clear()

    # ------------------------------------------------------------ the hot path
    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """:meth:`Client.read`; a small file cached whole under a lease is answered
        on this thread, a range of it too (its arguments checked as on a miss). Pass
        ``offset`` and ``length`` by keyword (see :meth:`Client.read` for why they
        are not keyword-only). No closure here: its cells would cost every hit."""
        entry = self._cache.lookup(path, time.monotonic())
        if entry is None:
            normal = normalize(path)  # another spelling of a cached path hits here too
            entry = self._cache.lookup(normal, time.monotonic()) if normal != path else None
            if entry is None:
                return self._run(partial(self._client.read, normal, offset=offset, length=length))
        self._hits += 1
        if offset is not _WHOLE or length is not None:  # (why `is`: at _WHOLE)
            return _cut(entry.data, offset, length)
        return entry.data

    # ------------------------------------------------------------ everything else
    def read_into(self, path: str, file: IO[bytes]) -> int:
        """:meth:`Client.read_into`: stream ``path`` into ``file``, bounded memory."""
        return self._run(self._client.read_into, path, file)

    def write(
        self,
        path: str,
        data: Source,
        *,
        if_version: int | None = None,
        offset: int | None = None,
        fence: Fencing = None,
        ephemeral: bool = False,
    ) -> int:
        """:meth:`Client.write`: bytes or a binary file; in place with ``offset``;
        ``ephemeral``: gone with this client's session."""
        return self._run(
            lambda: self._client.write(
                path, data, if_version=if_version, offset=offset, fence=fence, ephemeral=ephemeral
            )
        )

    def truncate(
        self, path: str, size: int, *, if_version: int | None = None, fence: Fencing = None
    ) -> int:
        """:meth:`Client.truncate` (which creates a missing file)."""
        return self._run(
            lambda: self._client.truncate(path, size, if_version=if_version, fence=fence)
        )

    def delete(self, path: str, *, if_version: int | None = None, fence: Fencing = None) -> None:
        """:meth:`Client.delete`."""
        self._run(lambda: self._client.delete(path, if_version=if_version, fence=fence))

    def rename(self, src: str, dst: str, *, fence: Fencing = None) -> int:
        """:meth:`Client.rename`."""
        return self._run(lambda: self._client.rename(src, dst, fence=fence))

    def mkdir(self, path: str, *, fence: Fencing = None) -> None:
        """:meth:`Client.mkdir`."""
        self._run(lambda: self._client.mkdir(path, fence=fence))

    def rmdir(self, path: str, *, fence: Fencing = None) -> None:
        """:meth:`Client.rmdir`."""
        self._run(lambda: self._client.rmdir(path, fence=fence))

    # ------------------------------------------------------------ locks
    def acquire(
        self,
        name: str,
        ttl: float = DEFAULT_LOCK_TTL,
        *,
        timeout: float | None = None,
        identity: str | None = None,
    ) -> BlockingLock:
        """:meth:`Client.acquire`; renewed on the loop thread until released."""
        check_identity(identity)  # before anything crosses to the loop thread
        lock = self._run(
            lambda: self._client.acquire(name, ttl, timeout=timeout, identity=identity)
        )
        return BlockingLock(self, lock)

    def release(self, lock: BlockingLock | Lock) -> None:
        """Give ``lock`` back (``lock.release()`` does the same)."""
        if isinstance(lock, BlockingLock):
            lock.release()
        else:
            self._run(lock.release)

    @contextlib.contextmanager
    def lock(
        self,
        name: str,
        ttl: float = DEFAULT_LOCK_TTL,
        *,
        timeout: float | None = None,
        identity: str | None = None,
    ) -> Iterator[BlockingLock]:
        """``with c.lock(name, ttl) as lock``: held for the body, released after. A
        thread cannot be cancelled, so a body that outlives the lock is not stopped:
        it should check ``lock.held`` (or ``lock.lost``) and fence its writes
        (``fence=lock``); the ``with`` raises :class:`~fscache.errors.LockLost` after
        a body during which it was lost."""
        held = self.acquire(name, ttl, timeout=timeout, identity=identity)
        try:
            yield held
        finally:
            held.release()
        held.raise_if_lost()

    @contextlib.contextmanager
    def leadership(
        self, name: str, *, identity: str | None = None, ttl: float = DEFAULT_LOCK_TTL
    ) -> Iterator[BlockingLock]:
        """``with c.leadership(name, identity=...) as lease``: wait to lead (no
        timeout), lead for the body (:meth:`Client.leadership`). As with :meth:`lock`,
        a thread cannot be cancelled: a body that outlives its leadership runs on, so
        it checks ``lease.held`` and fences its writes, and the ``with`` raises
        :class:`~fscache.errors.LockLost` after a body during which it was lost."""
        with self.lock(name, ttl, identity=identity) as held:
            yield held

    def leader(self, name: str) -> str | None:
        """:meth:`Client.leader`."""
        return self._run(self._client.leader, name)

    def watch_leader(self, name: str) -> Iterator[str | None]:
        """:meth:`Client.watch_leader`, as a blocking iterator: ``for leader in
        c.watch_leader(name)``, the leader now, then at each change (None while nobody
        leads). The watch runs on the loop thread; leaving the loop (or closing the
        client) stops it, and the server's notices with it."""
        if self._closed:
            raise FscacheError(self._closed_reason)
        normalize(name)  # a bad name is the caller's error, here
        leaders: queue.Queue[tuple[str | None] | Exception | None] = queue.Queue()  # None: ended
        scope = trio.CancelScope()
        client = self._client

        async def pump() -> None:
            try:
                with scope:
                    async with client.watch_leader(name) as watch:
                        async for leader in watch:
                            leaders.put((leader,))
            except Exception as exc:  # the watch's error, raised on the caller's thread
                leaders.put(exc)
            finally:
                leaders.put(None)

        nursery = client._nursery
        if nursery is None:
            raise FscacheError(CLOSED)
        self._run_sync(nursery.start_soon, pump)
        try:
            while (item := leaders.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item[0]
        finally:
            if not self._closed:
                with contextlib.suppress(trio.RunFinishedError):
                    self._run_sync(scope.cancel)

    def watch(self, path: str = "", *, initial: bool = False) -> Iterator[Change]:
        """:meth:`Client.watch`, as a blocking iterator: ``for change in c.watch(dir)``.
        The watch runs on the loop thread and hands each change over; leaving the loop
        (or closing the client) stops it."""
        if self._closed:
            raise FscacheError(self._closed_reason)
        changes: queue.Queue[Change | Exception | None] = queue.Queue()  # None: ended
        scope = trio.CancelScope()
        client = self._client

        async def pump() -> None:
            try:
                with scope:
                    async for change in client.watch(path, initial=initial):
                        changes.put(change)
            except Exception as exc:  # the watch's error, raised on the caller's thread
                changes.put(exc)
            finally:
                changes.put(None)

        nursery = client._nursery
        if nursery is None:
            raise FscacheError(CLOSED)
        self._run_sync(nursery.start_soon, pump)
        try:
            while (item := changes.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            if not self._closed:
                with contextlib.suppress(trio.RunFinishedError):
                    self._run_sync(scope.cancel)

    def stat(self, path: str) -> StatResult:
        """:meth:`Client.stat`."""
        return self._run(self._client.stat, path)

    def scandir(self, path: str = "") -> list[DirEntry]:
        """:meth:`Client.scandir`."""
        return self._run(self._client.scandir, path)

    def listdir(self, path: str = "") -> list[str]:
        """:meth:`Client.listdir`."""
        return self._run(self._client.listdir, path)

    def relinquish(self, *paths: str) -> None:
        """:meth:`Client.relinquish`."""
        self._run(self._client.relinquish, *paths)

    def extend(self, *paths: str) -> dict[str, bool]:
        """:meth:`Client.extend`."""
        return self._run(self._client.extend, *paths)

    # ------------------------------------------------------------ state, read here
    # These read the async client's state on the caller's thread, as a cache hit
    # does: no request, no hop to the loop thread, so they cost what a hit costs and
    # answer at once even while the loop thread waits on the network.
    def leased(self, path: str) -> StatResult | None:
        """:meth:`Client.leased`: the attributes of ``path`` (in normal form, as the
        cache keys it) if a trusted lease covers it now, else None; no request."""
        return self._client.leased(path)

    def lease_remaining(self, path: str) -> float:
        """:meth:`Client.lease_remaining`: seconds the lease on ``path`` (a file, or a
        directory's listing key ``dir/``) is still trusted, 0.0 if none; no request."""
        return self._client.lease_remaining(path)

    @property
    def session_id(self) -> str | None:
        """:attr:`Client.session_id`: the session the server issued (its leases are
        this session's), for logs; None before the first welcome."""
        return self._client.session_id

    @property
    def connected(self) -> bool:
        """:attr:`Client.connected`: whether a connection to the server is up now
        (False while it reconnects, and once the client is closed)."""
        return not self._closed and self._client.connected

    @property
    def epoch(self) -> str | None:
        """The server incarnation this client last connected to."""
        return self._client.epoch

    def server_stats(self) -> dict[str, Any]:
        """:meth:`Client.server_stats`."""
        return self._run(self._client.server_stats)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (or, in a child process after ``fork``,
        for every client the parent made: connect again there)."""
        return self._closed

    @property
    def stats(self) -> Mapping[str, int | float]:
        """:attr:`Client.stats`, the client's counters (a snapshot), with the hits
        answered on callers' threads counted in ``hits`` and ``hit_ratio``."""
        stats = dict(self._client.stats)
        stats["hits"] += self._hits
        lookups = stats["hits"] + stats["misses"]
        stats["hit_ratio"] = stats["hits"] / lookups if lookups else 0.0
        return stats

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(*args)`` on the loop thread; an interruption here cancels it there (see
        the module's note)."""
        if self._closed:
            raise FscacheError(self._closed_reason)
        if trio.lowlevel.in_trio_run():  # (trio's own error would not say what to do)
            raise RuntimeError(IN_TRIO)
        scope = trio.CancelScope()
        ended = threading.Event()

        async def call() -> T:
            try:
                with scope:
                    return await fn(*args)
                raise FscacheError("interrupted")  # (its caller has gone already)
            finally:
                ended.set()

        try:
            return trio.from_thread.run(call, trio_token=self._token)
        except BaseException:
            if not ended.is_set():  # interrupted on this thread, not failed there
                try:
                    trio.from_thread.run_sync(scope.cancel, trio_token=self._token)
                except trio.RunFinishedError:
                    pass  # the loop has ended: nothing of the call is left to wait for
                else:
                    ended.wait(INTERRUPTED_WAIT)
            raise

    def _run_sync(self, fn: Callable[..., object], *args: Any) -> None:
        trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def close(self) -> None:
        """Say goodbye to the server and stop the background thread."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> BlockingClient:
        if self._closed:  # as every other call on a closed client
            raise FscacheError(self._closed_reason)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def connect(
    address: str = DEFAULT_ADDRESS,
    *,
    client_id: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    cache_bytes: int = DEFAULT_MAX_BYTES,
) -> BlockingClient:
    """A blocking client connected to ``address``: ``HOST:PORT``, a bare ``HOST``
    (port 7710), or ``[IPv6]:PORT``; see :class:`BlockingClient` for the calls, and
    :func:`fscache.open_client` for ``client_id``, ``ssl_context`` and
    ``cache_bytes``.

    Raises :class:`~fscache.errors.Unavailable` if the server cannot be reached
    (:class:`~fscache.tls.CredentialsRefused` if TLS refused a certificate),
    :class:`~fscache.settings.BadSetting` (a ValueError) for an address that is
    none (a port out of 1..65535, a host name that cannot be encoded, a URL), and
    ``TypeError`` if ``address`` is no str."""
    return BlockingClient(
        address, client_id=client_id, ssl_context=ssl_context, cache_bytes=cache_bytes
    )
