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

A hit is one dict lookup and one comparison with ``now``; nothing else. The
entries live in an ``OrderedDict`` in least-recently-used order, bounded by the
total size of their data. Evicted paths are returned so the caller can
relinquish their leases (in batches). On an approval request the entry is
dropped *before* the approval is sent; a version older than the one cached is
never stored over it.

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
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, path: object) -> bool:
        return path in self.entries

    def lookup(self, path: str, now: float) -> bytes | None:
        """The cached data if a trusted lease covers ``now``, else None."""
        entry = self.entries.get(path)
        if entry is not None and now < entry.expiry:
            self.entries.move_to_end(path)
            self.hits += 1
            return entry.data
        return None

    def get(self, path: str) -> Entry | None:
        """The entry, trusted or not (its version serves a not-modified revalidation)."""
        return self.entries.get(path)

    def expiry_for(self, term: float, sent_at: float) -> float:
        return sent_at + term - self.skew

    def store(self, path: str, data: bytes, version: int, term: float, sent_at: float) -> list[str]:
        """Cache ``data`` under a lease of ``term`` granted to a request sent at
        ``sent_at``. Returns the paths evicted to make room (relinquish them)."""
        old = self.entries.get(path)
        if old is not None and old.version > version:
            return []  # a newer version is cached already: never go back
        expiry = self.expiry_for(term, sent_at)
        if expiry <= sent_at or len(data) > self.max_bytes:
            self.drop(path)  # term too short to trust (or data too big): do not cache
            return [path] if old is not None else []
        self._put(path, Entry(data, version, expiry))
        return self._evict(keep=path)

    def extend(self, path: str, version: int, term: float, sent_at: float) -> bool:
        """A not-modified or extension reply for ``version``: push the expiry on."""
        entry = self.entries.get(path)
        if entry is None or entry.version != version:
            return False
        expiry = self.expiry_for(term, sent_at)
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
        self.nbytes -= len(entry.data)
        return True

    def clear(self) -> list[str]:
        paths = list(self.entries)
        self.entries.clear()
        self.nbytes = 0
        return paths

    def expired(self, now: float) -> list[str]:
        """Paths whose lease is no longer trusted."""
        return [path for path, entry in self.entries.items() if now >= entry.expiry]

    def _put(self, path: str, entry: Entry) -> None:
        old = self.entries.pop(path, None)
        if old is not None:
            self.nbytes -= len(old.data)
        self.entries[path] = entry
        self.nbytes += len(entry.data)

    def _evict(self, keep: str) -> list[str]:
        evicted = []
        while self.nbytes > self.max_bytes:
            path = next(iter(self.entries))
            if path == keep:
                break
            self.drop(path)
            self.evictions += 1
            evicted.append(path)
        return evicted
