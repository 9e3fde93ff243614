"""Locks, leadership and leader watches on the client (the rules: :mod:`fscache.locks`).

Theory of operation
-------------------
A :class:`Lock` is granted with a fencing token and a ttl. The client trusts it
until ``valid_until = t_send + ttl - skew`` on its own clock, ``t_send`` being when
it sent the acquire or renewal the server answered: the server grants the name to
no one else before ``t_receive + ttl + skew``, at least ``2 * skew`` later. One
renewer task per lock, in the client's nursery, sends a renewal every ``ttl / 3``
over the client's connection (through reconnects: the session resumes, and so
does the lock) and moves ``valid_until`` on with each answer. If ``valid_until``
comes with no newer renewal answered (the server unreachable: Chubby's jeopardy),
or the server refuses a renewal, the lock is lost: :attr:`Lock.lost` is set, and
the body of ``async with client.lock(...)`` is cancelled and the ``async with``
raises :class:`~fscache.errors.LockLost`, so no code after it runs believing it
held the lock. A lost lock is never held again; acquire anew. Closing the client
loses each lock it holds, in the same way: its goodbye releases them all, so from
the moment it closes (before the goodbye goes) none of them may be trusted.

An acquire that waited in line is granted later than it was sent, and its send
time would make the lock's trust run out early (or have run out already): one
whose grant comes a third of the ttl or more after its send is renewed at once,
and trusted from the renewal's send time.

An acquire that times out sends a release with token 0 (stop waiting). The
server answers requests in order, so if the grant went out first it arrives
first, and the client releases it at once; a grant the server has made but not
sent yet (its record is on its way to disk) the server releases itself, and never
sends: a timed-out acquire holds nothing.

A wait in line whose connection is lost goes on after the reconnect (within its
timeout): the server dropped it from the line, so the client asks again. If the
server granted the lock just as the connection went, the grant was lost with it
while the session, resumed, holds the lock: so before asking again the client
asks who holds it, and if that is its own identity with a token none of its locks
has, renews it -- the server renews only its session's lock -- and takes it up.

A leader watch subscribes on the connection; the server pushes a notice at every
grant, release and expiry of the name. The reader hands each notice to the
watches of its name (:meth:`LockWatches.notice`); after a reconnect each watch
subscribes again and reports the leader if it changed meanwhile. Notices are
ordered by ``(token, freed)``: the grant of a token comes before its end, and
anything older than what a watch has reported is ignored.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import trio

from fscache import protocol as p
from fscache.errors import FscacheError, LockLost, LockTimeout, Unavailable
from fscache.paths import normalize_argument as normalize
from fscache.settings import (
    DEFAULT_LOCK_TTL,
    BadSetting,
    check_duration,
    check_identity,
    check_lock_ttl,
)

if TYPE_CHECKING:
    from fscache.client.client import Client, _Link, _Request


class Fenced(Protocol):
    """Anything a change may be fenced with: a lock of either client."""

    @property
    def fence(self) -> p.Fence: ...


RELEASE_WAIT = 1.0  # seconds a release (or a cancelled acquire's clean-up) may take
RENEW_RETRY = 0.1  # seconds between renewals tried while the connection is down
CLOSED_WHY = ": the client was closed, and its goodbye released it"


class Lock:
    """A lock held with fencing token :attr:`token` (see the module's note)."""

    def __init__(
        self, client: Client, name: str, token: int, identity: str, ttl: float, valid_until: float
    ) -> None:
        self.name = name
        self.token = token
        self.identity = identity
        self.ttl = ttl
        self.valid_until = valid_until  # client monotonic clock
        self.lost = trio.Event()
        self.ended = trio.Event()  # set when released or lost
        self._client = client
        self._released = False
        self._why = ""  # how it was lost, when that is not a renewal's fault
        self._renewer = trio.CancelScope()
        self._body: trio.CancelScope | None = None  # an ``async with`` body to cancel

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} token={self.token} held={self.held}>"

    @property
    def held(self) -> bool:
        """Whether the lock may be trusted now (not lost, not released, not run out)."""
        return (
            not self._released
            and not self.lost.is_set()
            and self._client._clock() < self.valid_until
        )

    @property
    def fence(self) -> p.Fence:
        """What a fenced change names: ``(name, token)``."""
        return (self.name, self.token)

    async def release(self) -> None:
        """Give the lock back (at once for the next in line). Idempotent. A lost lock's
        release is sent only if the connection is up (the server may still hold it,
        its lease not yet out there), in the background: nothing waits for it, and
        ``LockLost`` is not held up by a connection that no longer answers."""
        client = self._client
        client._check_run()
        if self._released:
            return
        self._released = True
        self.ended.set()
        self._renewer.cancel()
        client._held_locks.pop((self.name, self.token), None)
        if client._closing:  # its goodbye released it
            return
        link = client._link
        if self.lost.is_set():
            if link is not None and not link.broken and client._nursery is not None:
                client._nursery.start_soon(self._send_release, RELEASE_WAIT)
            return
        if not await self._send_release(RELEASE_WAIT) and client._nursery is not None:
            # Cut off: the session, resumed, may hold it still. Release it from the next
            # connection, in the background, while it could be held.
            client._nursery.start_soon(self._send_release, self.ttl + _skew(client))

    @trio.lowlevel.enable_ki_protection  # a client task: see _background in client.py
    async def _send_release(self, within: float) -> bool:
        """Send the release, through reconnects, for at most ``within`` seconds; True
        once the server has answered it (or the client is closing)."""
        client = self._client
        with trio.move_on_after(within):
            while True:
                try:
                    link = await client._current_link()
                    await client._call(
                        link, lambda i: p.Release(id=i, name=self.name, token=self.token)
                    )
                    return True
                except Unavailable:
                    await trio.sleep(RENEW_RETRY)
                except FscacheError:  # the client is closing: its goodbye releases it
                    return True
        return False

    def raise_if_lost(self) -> None:
        """Raise :class:`LockLost` if the lock was lost while it was held."""
        if self.lost.is_set():
            raise LockLost(
                f"lock {self.name!r} (token {self.token}) was lost while it was held{self._why}"
            )

    def _lose(self, why: str = "") -> None:
        """The lock may be another's from now on: a renewal was refused or came too
        late, or (``why`` says so) the client is closing and its goodbye releases it."""
        if not self.lost.is_set():
            self._why = why
            self.lost.set()
            self.ended.set()
            self._renewer.cancel()
            self._client._held_locks.pop((self.name, self.token), None)
            if self._body is not None:
                self._body.cancel()

    @trio.lowlevel.enable_ki_protection  # a client task: see _background in client.py
    async def _renew_until_lost(self) -> None:
        """Renew every ttl/3; set :attr:`lost` at ``valid_until`` unless renewed, or
        as soon as the server refuses a renewal."""
        client = self._client
        with self._renewer:
            while True:
                with trio.move_on_at(self._at(self.valid_until)):
                    if await self._renew_once(client):
                        continue
                self._lose()  # refused, or jeopardy: valid_until came with no renewal
                return

    async def _renew_once(self, client: Client) -> bool:
        """Sleep until the next renewal is due, then renew, trying again while the
        connection is down. False if the server refused it (or the client is
        closing): the lock is gone."""
        await trio.sleep_until(self._at(self.valid_until - self.ttl + self.ttl / 3))
        while True:
            try:
                return await self._renew(client)
            except Unavailable:
                await trio.sleep(RENEW_RETRY)

    async def _renew(self, client: Client) -> bool:
        """One renewal, now: False if the server refused it (or the client is
        closing); :class:`Unavailable` if the connection is down."""
        try:
            link = await client._current_link()
            request = await client._call_request(
                link, lambda i: p.Renew(id=i, name=self.name, token=self.token)
            )
        except Unavailable:
            raise
        except FscacheError:  # refused (LockLost), or the client is closing
            return False
        reply = request.reply
        assert isinstance(reply, p.LockGranted)
        self.valid_until = max(self.valid_until, request.sent_at + reply.ttl - _skew(client))
        return True

    def _at(self, instant: float) -> float:
        """``instant`` on the client's clock as a time on trio's clock."""
        return trio.current_time() + (instant - self._client._clock())


def _skew(client: Client) -> float:
    return client._cache.skew


async def acquire(
    client: Client,
    name: str,
    ttl: float = DEFAULT_LOCK_TTL,
    *,
    timeout: float | None = None,
    identity: str | None = None,
) -> Lock:
    """Take lock ``name`` (see :meth:`fscache.client.client.Client.acquire`). A wait
    in line goes on through reconnects (see the module's note)."""
    name = normalize(name)
    ttl = check_lock_ttl(ttl, _skew(client))
    if timeout is not None and timeout != math.inf:  # (inf: no timeout)
        try:
            timeout = check_duration("timeout", timeout)
        except BadSetting:
            raise BadSetting(
                f"timeout must be a number of seconds >= 0, or inf (no timeout), not {timeout!r}"
            ) from None
    if identity is None:
        identity = client.client_id
    check_identity(identity)  # before anything is sent (the server refuses it too)
    cut = False  # a wait was cut off with its connection: its grant may have been too
    with trio.move_on_after(timeout or math.inf):  # 0: the server answers at once
        while True:
            link: _Link | None = None
            try:
                link = await client._current_link()
                taken = await _take_up(client, link, name, ttl, identity) if cut else None
                return taken or await _acquire_on(client, link, name, ttl, identity, timeout != 0)
            except Unavailable:
                lost = link is None or link.broken  # else the server said so: final
                if timeout == 0 or client._closing or not lost:
                    raise
                cut = True
                await trio.sleep(RENEW_RETRY)
    raise LockTimeout(f"lock {name!r} was not granted within {timeout} s")


async def _acquire_on(
    client: Client, link: _Link, name: str, ttl: float, identity: str, wait: bool
) -> Lock:
    """One acquire on ``link``: granted (at once or after waiting in line), or the
    server's error, or :class:`Unavailable` if the connection is lost meanwhile."""
    request = await client._begin(
        link, lambda i: p.Acquire(id=i, name=name, ttl=ttl, identity=identity, wait=wait), name
    )
    try:
        await request.wait()
        # The server's error, if it sent one. A checkpoint: a cancellation that comes
        # here, with the grant in, must give it back too.
        await client._finish(link, request)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _give_up(client, link, request, name)
        raise
    reply = request.reply
    assert isinstance(reply, p.LockGranted)
    lock = Lock(
        client, name, reply.token, identity, reply.ttl, request.sent_at + reply.ttl - _skew(client)
    )
    if client._clock() >= request.sent_at + reply.ttl / 3:  # it waited in line: see the note
        try:
            renewed = await lock._renew(client)
        except BaseException:
            with trio.CancelScope(shield=True):
                await lock.release()
            raise
        if not renewed:
            lock._released = True
            raise LockLost(f"lock {name!r} (token {lock.token}) was lost as it was granted")
    return _hold(client, lock)


async def _take_up(
    client: Client, link: _Link, name: str, ttl: float, identity: str
) -> Lock | None:
    """After a wait in line was cut off with its connection: if the server granted the
    lock as the connection went (the grant lost with it, and the session, resumed,
    holds the lock), take it up by renewing it. None if it is not ours to take."""
    state = await client._call(link, lambda i: p.LockQuery(id=i, name=name))
    assert isinstance(state, p.LockState)
    if state.identity != identity or (name, state.token) in client._held_locks:
        return None  # another's, or one this client holds already
    lock = Lock(client, name, state.token, identity, ttl, -math.inf)
    try:
        renewed = await lock._renew(client)  # the server renews only its session's lock
    except BaseException:
        lock._released = True
        raise
    if not renewed:
        lock._released = True
        return None
    return _hold(client, lock)


def _hold(client: Client, lock: Lock) -> Lock:
    """``lock`` is ours: known to the client, renewed until released or lost. (Granted
    as the client closed: the goodbye released it, and it is lost already.)"""
    if client._closing:
        lock._lose(CLOSED_WHY)
        lock.raise_if_lost()
    client._held_locks[(lock.name, lock.token)] = lock
    assert client._nursery is not None
    client._nursery.start_soon(lock._renew_until_lost)
    return lock


async def _give_up(client: Client, link: _Link, request: _Request, name: str) -> None:
    """Stop waiting for an acquire; release the lock if its grant came first."""
    try:
        with trio.move_on_after(RELEASE_WAIT), contextlib.suppress(FscacheError):
            if not request.done:
                await client._call(link, lambda i: p.Release(id=i, name=name, token=0))
            if isinstance(request.reply, p.LockGranted):
                token = request.reply.token
                await client._call(link, lambda i: p.Release(id=i, name=name, token=token))
    finally:
        link.waiting.pop(request.id, None)


@contextlib.asynccontextmanager
async def lock(
    client: Client,
    name: str,
    ttl: float = DEFAULT_LOCK_TTL,
    *,
    timeout: float | None = None,
    identity: str | None = None,
) -> AsyncIterator[Lock]:
    """Hold lock ``name`` for the body; the body is cancelled if the lock is lost, and
    then :class:`LockLost` is raised. Released on the way out."""
    held = await acquire(client, name, ttl, timeout=timeout, identity=identity)
    try:
        with trio.CancelScope() as body:
            held._body = body
            if held.lost.is_set():
                body.cancel()
            yield held
    finally:
        held._body = None
        with trio.CancelScope(shield=True):
            await held.release()
    held.raise_if_lost()


async def leader(client: Client, name: str) -> str | None:
    """The identity of who holds lock ``name`` now, or None. Takes nothing."""
    name = normalize(name)
    link = await client._current_link()
    reply = await client._call(link, lambda i: p.LockQuery(id=i, name=name))
    assert isinstance(reply, p.LockState)
    return reply.identity


def fence_of(fence: Fenced | p.Fence | None) -> p.Fence | None:
    """What a change's ``fence=`` argument names on the wire: a lock's (anything
    with a ``fence`` property), or ``(name, token)``."""
    if fence is None:
        return None
    if not isinstance(fence, tuple | list):
        fence = getattr(fence, "fence", fence)
    if not isinstance(fence, tuple | list) or len(fence) != 2:
        raise TypeError(f"fence must be a Lock or (name, token), not {fence!r}")
    name, token = fence
    if not isinstance(token, int) or isinstance(token, bool):
        raise TypeError(f"a fence's token must be an int, not {token!r}")
    if token < 1:  # (the server refuses it too: fscache.locks.LockTable.check_fence)
        raise BadSetting(f"a fence's token must be >= 1 (tokens start at 1), not {token}")
    return (normalize(name), token)


# ---------------------------------------------------------------- leader watches
_Order = tuple[int, bool]  # (token, freed): the grant of a token, then its end


class LockWatches:
    """The live leader watches of one client: the reader hands them its notices. A
    watch the caller has dropped is forgotten with it (a weak set)."""

    def __init__(self) -> None:
        self._watches: weakref.WeakSet[LeaderWatch] = weakref.WeakSet()

    def add(self, watch: LeaderWatch) -> None:
        self._watches.add(watch)

    def discard(self, watch: LeaderWatch) -> bool:
        """Forget ``watch``; True if no other watch of its name is left."""
        self._watches.discard(watch)
        return all(other.name != watch.name for other in self._watches)

    def notice(self, message: p.LockChanged) -> None:
        """A push from the server (the reader calls this, in order)."""
        for watch in self._watches:
            if watch.name == message.name:
                watch._deliver(message)

    def relinked(self) -> None:
        """A new connection: every watch subscribes again."""
        for watch in self._watches:
            watch._deliver(None)

    def closing(self) -> None:
        """The client is closing: wake every watch, whose subscribe raises that it is
        closed (a watch would otherwise wait for ever for news that cannot come)."""
        self.relinked()


class LeaderWatch:
    """``async for identity in client.watch_leader(name)``: the identity leading
    ``name`` now, then at each change (None while nobody leads), through reconnects.

    Stop it with :meth:`aclose`, or use it as ``async with client.watch_leader(name)
    as leaders``: when a client's last watch of a name stops, the server is told to
    stop sending its notices (``lock_watch`` with ``stop``). A watch left after a
    ``break`` without either is forgotten by the client when it is collected, and
    the server stops at disconnect."""

    def __init__(self, client: Client, name: str) -> None:
        self.name = normalize(name)
        self._client = client
        self._notices: deque[p.LockChanged | None] = deque([None])  # None: subscribe
        self._arrived = trio.Event()
        self._shown: _Order | None = None
        self._current: str | None = None
        self._closed = False
        client._lock_watches.add(self)

    def __aiter__(self) -> LeaderWatch:
        return self

    async def __aenter__(self) -> LeaderWatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop: the iteration ends (a wait for the next change too). Idempotent."""
        client = self._client
        client._check_run()
        if self._closed:
            return
        self._closed = True
        self._arrived.set()
        if client._lock_watches.discard(self) and not client._closing:
            link = client._link
            if link is not None and not link.broken and client._nursery is not None:
                client._nursery.start_soon(self._unsubscribe, link)  # (a new link: none)

    @trio.lowlevel.enable_ki_protection  # a client task: see _background in client.py
    async def _unsubscribe(self, link: _Link) -> None:
        with trio.move_on_after(RELEASE_WAIT), contextlib.suppress(FscacheError):
            await self._client._call(link, lambda i: p.LockWatch(id=i, name=self.name, stop=True))

    async def __anext__(self) -> str | None:
        self._client._check_run()
        while True:
            if self._closed:
                raise StopAsyncIteration
            while self._notices:
                notice = self._notices[0]
                if notice is None:  # (re)subscribe; the mark goes only once that is done
                    state = await self._subscribe()
                    if self._closed:
                        raise StopAsyncIteration
                    if state is None:  # not connected: try again
                        continue
                    self._notices.popleft()
                    news = (state.token, state.identity)
                else:
                    self._notices.popleft()
                    news = (notice.token, notice.identity)
                if self._is_change(*news):
                    return self._current
            await self._arrived.wait()
            self._arrived = trio.Event()

    def _deliver(self, notice: p.LockChanged | None) -> None:
        self._notices.append(notice)
        self._arrived.set()

    async def _subscribe(self) -> p.LockState | None:
        client = self._client
        try:
            link = await client._current_link()  # waits a while for a reconnect
            state = await client._call(link, lambda i: p.LockWatch(id=i, name=self.name))
        except Unavailable:
            return None
        assert isinstance(state, p.LockState)
        return state

    def _is_change(self, token: int, identity: str | None) -> bool:
        """Whether this news is newer than what was shown, and names another leader."""
        order = (token, identity is None)
        if self._shown is not None and order <= self._shown:
            return False
        first = self._shown is None
        self._shown = order
        if not first and identity == self._current:
            return False
        self._current = identity
        return True
