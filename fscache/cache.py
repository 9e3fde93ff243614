"""The client's lease cache: what a client may answer without asking the server.

Theory of operation
-------------------
An entry holds a file's data, its version and the moment (on the client's own
monotonic clock) until which the lease may be trusted. That moment is computed
from when the request was *sent*, not when the reply came back:
``expiry = t_send + term - skew``. The server counts the same lease live until
``t_grant + term + skew`` on its clock, and ``t_send <= t_grant``, so while the
two clocks run at rates within the skew allowance of each other the client
stops trusting an entry before the server stops waiting for it.

The rule for a hit is :meth:`LeaseCache.lookup` and is written nowhere else: the
entry if ``now`` is before its expiry, else nothing. On an approval request the
entry is dropped *before* the approval is sent; a version older than the one
cached is never stored over it.

Threads: one thread (the owner: the client's trio loop) stores, extends, drops
and evicts, and alone keeps the byte count; any thread may call :meth:`lookup`.
The hit path is thread-safe because it reads one immutable entry with one
``dict.get``, compares one float and records the use with one ``set.add``,
while the owner installs or removes a whole entry with one dict operation each
(and only reorders, never removes, to give a second chance), so a concurrent
lookup sees the old entry or the new one (or none), never a half-made one.

The cache is bounded by the total size of its data. Eviction is the CLOCK
approximation of least-recently-used: the owner walks entries from the oldest
stored; one used since the hand last passed it gets a second chance (moved to
the newest end), any other is evicted. Evicted paths are returned so the caller
can relinquish their leases (in batches).

No I/O and no clock here: ``now`` is always an argument.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    data: bytes
    version: int
    expiry: float  # local monotonic time until which the lease is trusted


class LeaseCache:
    def __init__(self, *, skew: float, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.skew = skew
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, Entry] = OrderedDict()  # oldest stored first
        self._used: set[str] = set()  # looked up since the eviction hand passed them
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, path: object) -> bool:
        return path in self.entries

    def lookup(self, path: str, now: float) -> Entry | None:
        """The entry of ``path`` if a trusted lease covers ``now``, else None: a hit.

        Safe to call from any thread (see the theory note)."""
        entry = self.entries.get(path)
        if entry is not None and now < entry.expiry:
            self._used.add(path)
            return entry
        return None

    def get(self, path: str) -> Entry | None:
        """The entry, trusted or not (its version serves a not-modified revalidation)."""
        return self.entries.get(path)

    def store(self, path: str, data: bytes, version: int, term: float, sent_at: float) -> list[str]:
        """Cache ``data`` under a lease of ``term`` granted to a request sent at
        ``sent_at``. Returns the paths evicted to make room (relinquish them)."""
        old = self.entries.get(path)
        if old is not None and old.version > version:
            return []  # a newer version is cached already: never go back
        expiry = self._expiry(term, sent_at)
        if expiry <= sent_at or len(data) > self.max_bytes:
            self.drop(path)  # term too short to trust (or data too big): do not cache
            return [path] if old is not None else []
        self.entries[path] = Entry(data, version, expiry)  # replaces a whole entry
        self.entries.move_to_end(path)
        self.nbytes += len(data) - (len(old.data) if old is not None else 0)
        return self._evict(keep=path) if self.nbytes > self.max_bytes else []

    def extend(self, path: str, version: int, term: float, sent_at: float) -> bool:
        """A not-modified or extension reply for ``version``: push the expiry on."""
        entry = self.entries.get(path)
        if entry is None or entry.version != version:
            return False
        expiry = self._expiry(term, sent_at)
        if expiry <= sent_at:
            self.drop(path)
            return False
        if expiry > entry.expiry:
            self.entries[path] = dataclasses.replace(entry, expiry=expiry)
        return True

    def drop(self, path: str) -> bool:
        """Forget ``path`` (approval request, relinquish, stale). True if it was cached."""
        entry = self.entries.pop(path, None)
        if entry is None:
            return False
        self._used.discard(path)
        self.nbytes -= len(entry.data)
        return True

    def clear(self) -> list[str]:
        paths = list(self.entries)
        for path in paths:
            self.drop(path)
        return paths

    def _expiry(self, term: float, sent_at: float) -> float:
        return sent_at + term - self.skew

    def _evict(self, keep: str) -> list[str]:
        evicted = []
        entries, used = self.entries, self._used
        chances = len(entries)  # bounded, though another thread may mark entries used meanwhile
        while self.nbytes > self.max_bytes:
            path = next(iter(entries))
            if path == keep or (chances > 0 and path in used):
                chances -= 1
                used.discard(path)
                entries.move_to_end(path)  # a second chance (the new entry: always)
                continue
            self.drop(path)
            self.evictions += 1
            evicted.append(path)
        return evicted
