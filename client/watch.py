"""Watches: the changes of a file or a directory, built on the leases a client holds.

Theory of operation
-------------------
A lease is already a promise to be told of a change: before the server applies a
write on a leased key it asks the holder to approve. So a watcher holds leases on
what it watches and treats each approval request for one of its keys (seen through
:attr:`Client.before_approval`, after the cached copy is dropped) as "look again".

* A file: a lease on the file's key (a one-byte ranged read, so no contents are
  moved), which every write, delete and rename of it must ask about. While the file
  is missing there is nothing to lease on it; the lease is on its directory's
  listing instead, which its creation must ask about.
* A directory: a lease on its listing key (``dir/``: names created, deleted or
  renamed) and one on each file in it (its modifications, which change no name).
* Renewal. A lease that is about to run out is renewed by looking again when it
  has: the client's copy is no longer trusted, so the read revalidates it with its
  version (a not-modified reply). A change made while no lease was held is found by
  that same look.
* Every second at least (:data:`LOOK_AGAIN`) the watcher looks again anyway. While
  its leases hold, that look is answered from the client's cache and sends nothing;
  it finds what no approval request announces: this client's own writes (a writer
  is never asked to approve its own write, it drops its copies) and keys with no
  lease (term 0: a write-shared file; a key whose lease was refused).
* The last state is never missed. Each look compares the state it reads with the
  last one reported and reports the difference: a file created, modified (a new
  version) or deleted. Changes between two looks are folded into one (as ZooKeeper
  and etcd compaction fold them), but the last state is always reported. A look that
  fails because the connection is lost is retried until it succeeds, so after a
  reconnect what changed meanwhile is reported. Any other error (the client closed,
  access refused) ends the watch with that error.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal

import trio

from fscache.errors import Conflict, IsADirectory, NotADirectory, NotFound, Unavailable
from fscache.names import dir_key, parent
from fscache.paths import normalize_argument as normalize

if TYPE_CHECKING:
    from fscache.client.client import Client

__all__ = ["Change", "watch"]

LOOK_AGAIN = 1.0  # s: looked at at least this often (from the cache while leases hold)
RETRY_FIRST = 0.05  # s: a look that failed is retried after this, doubling up to LOOK_AGAIN

State = dict[str, int]  # path: version, of each file (or directory) watched


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """``path`` was created, modified or deleted; ``version``: its new version (None
    when deleted)."""

    kind: Literal["created", "modified", "deleted"]
    path: str
    version: int | None


class _Watch:
    def __init__(self, client: Client, path: str) -> None:
        self.client = client
        self.path = path
        self.keys: set[str] = set()  # leased now, for the approval hook
        self.woken = trio.Event()
        self.is_dir = False

    async def on_approval(self, key: str) -> None:
        if key in self.keys:
            self.woken.set()

    async def look(self, last: State) -> State:
        """The state now, taking leases on what it read; retried while unavailable."""
        delay = RETRY_FIRST
        while True:
            try:
                return await (self._look_dir(last) if self.is_dir else self._look_file(last))
            except Unavailable:
                await trio.sleep(delay)
                delay = min(delay * 2, LOOK_AGAIN)

    async def _look_file(self, last: State) -> State:
        try:
            version = await self._lease_file(self.path)
            if version is None:  # missing: its creation changes its directory's listing
                self.keys = await self._lease_parent()
                version = await self._lease_file(self.path)  # created meanwhile?
        except IsADirectory:  # a directory now: watched as one
            self.is_dir = True
            return await self._look_dir(last)
        if version is None:
            return {}
        self.keys = {self.path}
        return {self.path: version}

    async def _lease_parent(self) -> set[str]:
        """A lease on the listing of the watched path's directory, if there is one."""
        try:
            await self.client.scandir(parent(self.path))
        except (NotFound, NotADirectory):
            return set()
        return {dir_key(parent(self.path))}

    async def _look_dir(self, last: State) -> State:
        try:
            entries = await self.client.scandir(self.path)
        except NotADirectory:  # a file now: watched as one
            self.is_dir = False
            return await self._look_file(last)
        except NotFound:
            self.keys = await self._lease_parent() if self.path else set()
            return {}
        keys = {dir_key(self.path)}
        state: State = {}
        for entry in entries:
            child = f"{self.path}/{entry.name}" if self.path else entry.name
            if entry.is_dir:  # its own version changes with its names: not watched
                state[child] = last.get(child, entry.version)
                continue
            version = None
            with contextlib.suppress(IsADirectory):  # (a directory now: seen next look)
                version = await self._lease_file(child)
            if version is not None:
                keys.add(child)
                state[child] = version
        self.keys = keys
        return state

    async def _lease_file(self, path: str) -> int | None:
        """The version of file ``path`` under a lease (None: no such file)."""
        client = self.client
        leased = client.leased(path)
        if leased is None:
            try:
                await client.read(path, offset=0, length=1)
            except (NotFound, NotADirectory):
                return None
            leased = client.leased(path) or await client.stat(path)  # term 0: not cached
        return leased.version

    async def wait(self) -> None:
        """Until an approval request for a watched key, the first lease runs out, or
        LOOK_AGAIN has passed."""
        remaining = (self.client.lease_remaining(key) for key in self.keys)
        due = min((r for r in remaining if r > 0), default=LOOK_AGAIN)
        with trio.move_on_after(min(due, LOOK_AGAIN)):
            await self.woken.wait()
        self.woken = trio.Event()


def _changes(old: State, new: State) -> list[Change]:
    changes = []
    for path in sorted(old.keys() | new.keys()):
        before, after = old.get(path), new.get(path)
        if before is None and after is not None:
            changes.append(Change("created", path, after))
        elif after is None:
            changes.append(Change("deleted", path, None))
        elif before != after:
            changes.append(Change("modified", path, after))
    return changes


async def watch(client: Client, path: str = "", *, initial: bool = False) -> AsyncIterator[Change]:
    """The changes of the file or directory ``path`` (see the module's note)."""
    path = normalize(path, allow_root=True)
    state = _Watch(client, path)
    state.is_dir = not path  # the root; else what is there now (missing: a file, for now)
    if path:
        with contextlib.suppress(NotFound):
            state.is_dir = (await client.stat(path)).is_dir
    client.before_approval.append(state.on_approval)
    try:
        seen = await state.look({})
        if initial:
            for change in _changes({}, seen):
                yield change
        while True:
            await state.wait()
            try:
                now = await state.look(seen)
            except Conflict:  # a directory that kept changing while it was listed
                continue
            for change in _changes(seen, now):
                yield change
            seen = now
    finally:
        client.before_approval.remove(state.on_approval)
