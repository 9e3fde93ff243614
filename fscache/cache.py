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

Files larger than one chunk (and ranges of any file) are cached chunk by chunk:
each chunk is an entry of its own under the key ``path NUL index`` (no path holds a
NUL), so chunks count against the byte bound and are evicted like any entry, and a
:class:`Chunks` record per file holds what they share: one version, the file's
size and the lease's expiry. A chunk of another version never joins a record: an
older one is refused, a newer one replaces the record. Dropping a file (approval
request, relinquish) drops its whole entry, its record and every chunk; a file is
reported evicted when its last entry goes. Only the owner touches chunks.

A chunk's entry may be a *piece* of it: bytes ``[start, start + len(data))`` of
the chunk (``Entry.start``; a whole chunk starts at 0), so a small ranged read
caches only what it fetched. A piece answers a read only of bytes it covers
(:meth:`LeaseCache.lookup_chunk` takes the chunk-relative bounds asked for), and
so only such a read may revalidate it. A chunk holds one piece: a new piece of the
same version replaces the cached one unless the cached one covers it already.

Scans. A streaming copy (the client's ``read_into``) reads each chunk of a file
once, in order, and hands it on: a *scan*. Its chunks of a file larger than a
quarter of the byte bound (``size > max_bytes // SCAN_SHARE``) are not kept:
:meth:`LeaseCache.store_chunk` with ``scan=True`` stores nothing of such a file
(an older version's copy is still dropped), so a copy of any size evicts nothing
and leaves no chunk that no one will read again (kept, the chunks of a 2 GiB
copy would fill a 64 MiB bound and push every other entry out). Chunks of that
file already cached are left as they are, and the scan reads them as hits; when
the copy ends with nothing of the file cached, the client gives its lease back.
A file of at most a quarter of the bound is cached by a scan as by any read, so
copying it again is cheap and costs the cache at most a quarter. (PostgreSQL
reads a table larger than a quarter of its buffer pool through a small ring for
the same reason.) Whole and ranged reads (``read``) are not scans: a file read
in ranges (the mount, fsspec) is read again, so their chunks are kept under the
lease.

A directory's listing is cached under the directory's key (its path and ``/``,
as :mod:`fscache.names` spells it) with the same expiry rule, and is dropped by
the same :meth:`LeaseCache.drop` of that key. Listings have a byte budget of their
own, apart from the data's: ``max(max_bytes, MIN_LISTING_BYTES)``, each name
counted at ``LISTING_NAME_BYTES`` (about what its entry holds in memory). A
listing stays after its lease runs out, for its version to revalidate it; past
the budget the oldest stored go first, and :meth:`LeaseCache.store_listing`
returns their keys so that their leases are given back. A listing over the whole
budget is not kept. The floor keeps the listings of a client with a small data
bound (the mount's, whose pages the kernel holds; the command line's, none):
the kernel does not cache listings, and a big directory listed again would be
read again in full.

No I/O and no clock here: ``now`` is always an argument.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import NamedTuple

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
SCAN_SHARE = 4
"""A scan keeps the chunks of files of at most ``max_bytes // SCAN_SHARE`` bytes (see
Scans in the theory note)."""
LISTING_NAME_BYTES = 200  # one name of a cached listing (tracemalloc: about 208 for a
# 15-character name with its entry, size and version)
MIN_LISTING_BYTES = 64 * 1024 * 1024  # the listings' budget is never less than this
_CHUNK_MARK = "\0"  # between a path and a chunk index in a chunk's key


def _chunk_key(path: str, index: int) -> str:
    return f"{path}{_CHUNK_MARK}{index}"


class Entry(NamedTuple):
    """A cached file, or a piece of one of its chunks: replaced whole, never changed
    (the blocking client reads entries on its caller's thread). A named tuple because
    one is made on every miss, and a tuple is made in a third of a frozen dataclass's
    time."""

    data: bytes
    version: int
    expiry: float  # local monotonic time until which the lease is trusted
    start: int = 0  # a chunk's piece: where ``data`` begins in its chunk

    def covers(self, start: int, end: int) -> bool:
        """Whether this piece holds chunk-relative bytes ``[start, end)``."""
        return self.start <= start and end <= self.start + len(self.data)


@dataclasses.dataclass(slots=True)
class Chunks:
    """What the cached chunks of one file share (changed by the owner only)."""

    version: int
    size: int  # the whole file's size at this version
    expiry: float
    indices: set[int]


@dataclasses.dataclass(frozen=True, slots=True)
class DirEntry:
    """One name in a directory listing: the size and version of a file (a
    directory's own version for a directory) as of the listing's version."""

    name: str
    is_dir: bool
    size: int
    version: int


def dir_entries(
    names: Sequence[str], dirs: Sequence[bool], sizes: Sequence[int], versions: Sequence[int]
) -> tuple[DirEntry, ...]:
    """The rows of a listing's columns, one :class:`DirEntry` per name.

    A listing's page holds thousands of rows, and a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``. So the rows are made blank and
    each slot is set column by column, through the slot's own descriptor: a third of
    the time of calling ``DirEntry`` per row."""
    if not len(dirs) == len(sizes) == len(versions) == len(names):
        raise ValueError("a listing's columns differ in length")
    rows = [_new_entry(DirEntry) for _ in names]
    for set_field, column in zip(_ENTRY_SLOTS, (names, dirs, sizes, versions), strict=True):
        deque(map(set_field, rows, column), maxlen=0)  # runs the setters, keeps nothing
    return tuple(rows)


_new_entry = object.__new__
_ENTRY_SLOTS = tuple(DirEntry.__dict__[f.name].__set__ for f in dataclasses.fields(DirEntry))


@dataclasses.dataclass(frozen=True, slots=True)
class Listing:
    entries: tuple[DirEntry, ...]
    version: int
    expiry: float


class LeaseCache:
    def __init__(self, *, skew: float, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.skew = skew
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, Entry] = OrderedDict()  # oldest stored first
        self._used: set[str] = set()  # looked up since the eviction hand passed them
        self.files: dict[str, Chunks] = {}  # files cached by chunks
        self.listings: dict[str, Listing] = {}  # by directory key, oldest stored first
        self.listing_bytes = 0  # the listings' names, at LISTING_NAME_BYTES each
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries) + len(self.listings)

    def __contains__(self, path: object) -> bool:
        return path in self.entries or path in self.files or path in self.listings

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
        if path in self.files:
            if self.files[path].version > version:
                return []
            self._drop_chunks(path)
        expiry = self.expiry(term, sent_at)
        if expiry <= sent_at or len(data) > self.max_bytes:
            self.drop(path)  # term too short to trust (or data too big): do not cache
            return [path] if old is not None else []
        self.entries[path] = Entry(data, version, expiry)  # replaces a whole entry
        if old is None:  # (a new key is stored last already)
            self.nbytes += len(data)
        else:
            self.entries.move_to_end(path)
            self.nbytes += len(data) - len(old.data)
        return self._evict(keep=path) if self.nbytes > self.max_bytes else []

    def extend(self, path: str, version: int, term: float, sent_at: float) -> bool:
        """A not-modified or extension reply for ``version``: push the expiry on (of
        a whole entry, a file's chunks or a listing, whichever ``path`` keys)."""
        chunks = self.files.get(path)
        if chunks is not None and path not in self.entries:
            return self._extend_chunks(path, chunks, version, term, sent_at)
        listing = self.listings.get(path)
        if listing is not None:
            expiry = self.expiry(term, sent_at)
            if listing.version != version or expiry <= sent_at:
                self.drop(path)
                return False
            if expiry > listing.expiry:
                self.listings[path] = dataclasses.replace(listing, expiry=expiry)
            return True
        entry = self.entries.get(path)
        if entry is None or entry.version != version:
            return False
        expiry = self.expiry(term, sent_at)
        if expiry <= sent_at:
            self.drop(path)
            return False
        if expiry > entry.expiry:
            self.entries[path] = entry._replace(expiry=expiry)
        return True

    def drop(self, path: str) -> bool:
        """Forget ``path`` (approval request, relinquish, stale): a file's whole entry
        and chunks, or a directory key's listing. True if it was cached."""
        entry = self.entries.pop(path, None)
        dropped = entry is not None
        if entry is not None:
            self._used.discard(path)
            self.nbytes -= len(entry.data)
        if self.files and path in self.files:
            self._drop_chunks(path)
            dropped = True
        if self.listings and self._drop_listing(path):
            dropped = True
        return dropped

    def drop_beneath(self, prefix: str) -> list[str]:
        """Drop every file and listing whose key starts with ``prefix`` (a directory
        key: everything below a renamed directory). Returns what was cached."""
        names = {key.partition(_CHUNK_MARK)[0] for key in self.entries if key.startswith(prefix)}
        names.update(key for key in self.listings if key.startswith(prefix))
        for name in names:
            self.drop(name)
        return sorted(names)

    def clear(self) -> list[str]:
        paths = list(dict.fromkeys([*self.entries, *self.files, *self.listings]))
        paths = [path for path in paths if _CHUNK_MARK not in path]
        for path in paths:
            self.drop(path)
        return paths

    # ------------------------------------------------------------ chunks
    def chunks(self, path: str) -> Chunks | None:
        """The chunk record of ``path``, trusted or not (its version revalidates)."""
        return self.files.get(path)

    def lookup_chunk(
        self, path: str, index: int, now: float, start: int = 0, end: int = 0
    ) -> Entry | None:
        """The piece of chunk ``index`` of ``path`` if a trusted lease covers ``now``
        and the piece holds the chunk's bytes ``[start, end)``, else None."""
        chunks = self.files.get(path)
        if chunks is None or now >= chunks.expiry or index not in chunks.indices:
            return None
        key = _chunk_key(path, index)
        entry = self.entries[key]
        if not entry.covers(start, end):
            return None
        self._used.add(key)
        return entry

    def chunk(self, path: str, index: int, start: int = 0, end: int = 0) -> Entry | None:
        """The piece of chunk ``index`` of ``path`` holding its bytes ``[start, end)``,
        trusted or not (its version revalidates exactly those bytes)."""
        chunks = self.files.get(path)
        if chunks is None or index not in chunks.indices:
            return None
        entry = self.entries[_chunk_key(path, index)]
        return entry if entry.covers(start, end) else None

    def store_chunk(
        self,
        path: str,
        index: int,
        data: bytes,
        *,
        version: int,
        size: int,
        term: float,
        sent_at: float,
        start: int = 0,
        scan: bool = False,
    ) -> list[str]:
        """Cache chunk ``index`` of ``path`` (``size`` bytes at ``version``), or the
        piece of it from ``start``, under a lease of ``term`` granted to a request
        sent at ``sent_at``. Returns the paths evicted to make room (relinquish them).
        ``scan``: read by a streaming copy, kept only if :meth:`keeps_scan` says so."""
        whole = self.entries.get(path)
        chunks = self.files.get(path)
        if (whole is not None and whole.version > version) or (
            chunks is not None and chunks.version > version
        ):
            return []  # a newer version is cached already: never go back
        if scan and not self.keeps_scan(size):
            if (whole is not None and whole.version < version) or (
                chunks is not None and chunks.version < version
            ):
                self.drop(path)  # an older version: the file changed
            return []
        expiry = self.expiry(term, sent_at)
        if expiry <= sent_at or len(data) > self.max_bytes:
            return [path] if self.drop(path) else []
        if whole is not None:
            self.drop(path)
            chunks = None
        if chunks is not None and chunks.version != version:
            self._drop_chunks(path)
            chunks = None
        if chunks is None:
            chunks = self.files[path] = Chunks(version, size, expiry, set())
        else:
            chunks.expiry = max(chunks.expiry, expiry)
        key = _chunk_key(path, index)
        old = self.entries.get(key)
        if old is not None and old.covers(start, start + len(data)):
            return []  # the cached piece holds these bytes already (and the same version)
        self.entries[key] = Entry(data, version, expiry, start)
        self.entries.move_to_end(key)
        chunks.indices.add(index)
        self.nbytes += len(data) - (len(old.data) if old is not None else 0)
        return self._evict(keep=key) if self.nbytes > self.max_bytes else []

    def keeps_scan(self, size: int) -> bool:
        """Whether a scan keeps the chunks of a file of ``size`` bytes (see Scans)."""
        return size <= self.max_bytes // SCAN_SHARE

    def _extend_chunks(
        self, path: str, chunks: Chunks, version: int, term: float, sent_at: float
    ) -> bool:
        expiry = self.expiry(term, sent_at)
        if chunks.version != version or expiry <= sent_at:
            self.drop(path)
            return False
        chunks.expiry = max(chunks.expiry, expiry)
        return True

    def _drop_chunks(self, path: str) -> None:
        chunks = self.files.pop(path)
        for index in chunks.indices:
            key = _chunk_key(path, index)
            entry = self.entries.pop(key)
            self._used.discard(key)
            self.nbytes -= len(entry.data)

    # ------------------------------------------------------------ listings
    def lookup_listing(self, key: str, now: float) -> Listing | None:
        """The listing cached under directory ``key`` if a trusted lease covers ``now``."""
        listing = self.listings.get(key)
        if listing is not None and now < listing.expiry:
            return listing
        return None

    def get_listing(self, key: str) -> Listing | None:
        """The listing, trusted or not (its version serves a revalidation)."""
        return self.listings.get(key)

    def store_listing(
        self, key: str, entries: tuple[DirEntry, ...], version: int, term: float, sent_at: float
    ) -> list[str]:
        """Cache the listing of directory ``key`` under a lease of ``term``. Returns the
        keys of the listings dropped to keep within the budget (relinquish them),
        ``key`` itself if its listing is over the whole budget."""
        old = self.listings.get(key)
        if old is not None and old.version > version:
            return []
        self._drop_listing(key)  # stored again below, if at all: it becomes the newest
        expiry = self.expiry(term, sent_at)
        if expiry <= sent_at:
            return []
        size = len(entries) * LISTING_NAME_BYTES
        budget = max(self.max_bytes, MIN_LISTING_BYTES)
        if size > budget:
            return [key]
        self.listings[key] = Listing(entries, version, expiry)
        self.listing_bytes += size
        evicted = []
        while self.listing_bytes > budget:
            oldest = next(iter(self.listings))
            self._drop_listing(oldest)
            evicted.append(oldest)
        return evicted

    def _drop_listing(self, key: str) -> bool:
        listing = self.listings.pop(key, None)
        if listing is None:
            return False
        self.listing_bytes -= len(listing.entries) * LISTING_NAME_BYTES
        return True

    def expiry(self, term: float, sent_at: float) -> float:
        """When a lease of ``term`` on a request sent at ``sent_at`` stops being
        trusted, on this client's clock: the one rule of every cached entry."""
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
            self.evictions += 1
            name, mark, index = path.partition(_CHUNK_MARK)
            if not mark:
                self.drop(path)
                evicted.append(path)
                continue
            entry = entries.pop(path)  # one chunk: its file goes when its last chunk does
            used.discard(path)
            self.nbytes -= len(entry.data)
            chunks = self.files[name]
            chunks.indices.discard(int(index))
            if not chunks.indices:
                del self.files[name]
                if name not in entries:
                    evicted.append(name)
        return evicted
