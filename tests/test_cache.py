"""The client's lease cache: what a client may answer without asking the server.

Every time here is the client's own monotonic clock, passed in explicitly. The skew
is 0.1 s; a lease of ``term`` granted to a request sent at ``sent_at`` is trusted
until ``sent_at + term - skew`` exactly, and not an instant longer.
"""

from __future__ import annotations

import math
import random
import sys
import threading
import time

import pytest

from fscache import cache as cache_module
from fscache.cache import LISTING_NAME_BYTES, Chunks, DirEntry, LeaseCache, dir_entries

SKEW = 0.1


def just_before(t: float) -> float:
    return math.nextafter(t, -math.inf)


def cache(max_bytes: int = 1 << 20) -> LeaseCache:
    return LeaseCache(skew=SKEW, max_bytes=max_bytes)


def hit(c: LeaseCache, path: str, now: float) -> bytes | None:
    entry = c.lookup(path, now)
    return None if entry is None else entry.data


def expiry_of(c: LeaseCache, path: str) -> float:
    entry = c.get(path)
    assert entry is not None
    return entry.expiry


# ---------------------------------------------------------------- expiry
def test_expiry_is_sent_at_plus_term_minus_skew_exactly() -> None:
    c = cache()

    assert c.store("p", b"data", version=1, term=10.0, sent_at=5.0) == []
    entry = c.get("p")
    assert entry is not None
    assert (entry.data, entry.version, entry.expiry) == (b"data", 1, 14.9)


def test_lookup_hits_before_expiry_and_misses_at_and_after_it() -> None:
    c = cache()
    c.store("p", b"data", version=1, term=10.0, sent_at=5.0)

    assert hit(c, "p", now=5.0) == b"data"
    assert hit(c, "p", now=just_before(14.9)) == b"data"
    assert hit(c, "p", now=14.9) is None
    assert hit(c, "p", now=20.0) is None
    assert hit(c, "other", now=5.0) is None


def test_an_expired_entry_is_kept_for_revalidation() -> None:
    c = cache()
    c.store("p", b"data", version=3, term=10.0, sent_at=0.0)

    assert hit(c, "p", now=30.0) is None
    entry = c.get("p")
    assert entry is not None and entry.version == 3  # its version goes in the next read


@pytest.mark.parametrize("term", [0.0, 0.05, SKEW])
def test_a_term_not_longer_than_the_skew_is_not_cached(term: float) -> None:
    c = cache()

    assert c.store("p", b"data", version=1, term=term, sent_at=5.0) == []
    assert "p" not in c
    assert hit(c, "p", now=5.0) is None
    assert c.nbytes == 0


def test_a_term_not_longer_than_the_skew_also_drops_the_copy_cached_before() -> None:
    c = cache()
    c.store("p", b"old", version=1, term=10.0, sent_at=0.0)

    c.store("p", b"new", version=2, term=0.0, sent_at=1.0)  # the path became write-shared
    assert "p" not in c
    assert c.nbytes == 0


def test_a_term_just_over_the_skew_is_cached_briefly() -> None:
    c = cache()
    c.store("p", b"data", version=1, term=0.25, sent_at=1.0)

    entry = c.get("p")
    assert entry is not None and entry.expiry == 1.0 + 0.25 - SKEW
    assert hit(c, "p", now=1.1) == b"data"
    assert hit(c, "p", now=1.15) is None


# ---------------------------------------------------------------- versions and extension
def test_an_older_version_never_overwrites_a_newer_one() -> None:
    c = cache()
    c.store("p", b"v2", version=2, term=10.0, sent_at=1.0)

    assert c.store("p", b"v1", version=1, term=10.0, sent_at=2.0) == []  # a late reply
    assert hit(c, "p", now=2.0) == b"v2"
    entry = c.get("p")
    assert entry is not None and (entry.version, entry.expiry) == (2, 10.9)


def test_the_same_or_a_newer_version_replaces_the_entry() -> None:
    c = cache()
    c.store("p", b"v1", version=1, term=10.0, sent_at=0.0)

    c.store("p", b"v1", version=1, term=10.0, sent_at=4.0)
    assert expiry_of(c, "p") == 13.9
    c.store("p", b"v2!", version=2, term=10.0, sent_at=5.0)
    assert hit(c, "p", now=5.0) == b"v2!"
    assert c.nbytes == 3


def test_extend_pushes_the_expiry_on_for_the_same_version_only() -> None:
    c = cache()
    c.store("p", b"data", version=1, term=10.0, sent_at=0.0)

    assert c.extend("p", version=1, term=10.0, sent_at=5.0) is True
    assert expiry_of(c, "p") == 14.9
    assert c.extend("p", version=2, term=10.0, sent_at=6.0) is False
    assert expiry_of(c, "p") == 14.9
    assert c.extend("missing", version=1, term=10.0, sent_at=6.0) is False
    assert "missing" not in c


def test_extend_never_shortens_a_lease() -> None:
    c = cache()
    c.store("p", b"data", version=1, term=10.0, sent_at=5.0)

    assert c.extend("p", version=1, term=10.0, sent_at=1.0) is True  # an older request
    assert expiry_of(c, "p") == 14.9


def test_extend_with_a_term_not_longer_than_the_skew_drops_the_entry() -> None:
    c = cache()
    c.store("p", b"data", version=1, term=10.0, sent_at=0.0)

    assert c.extend("p", version=1, term=0.0, sent_at=1.0) is False
    assert "p" not in c


# ---------------------------------------------------------------- size bound
def test_eviction_is_by_bytes_and_returns_the_evicted_paths_in_lru_order() -> None:
    c = cache(max_bytes=10)
    assert c.store("a", b"aaaa", version=1, term=10.0, sent_at=0.0) == []
    assert c.store("b", b"bbbb", version=1, term=10.0, sent_at=0.0) == []
    assert c.store("c", b"cc", version=1, term=10.0, sent_at=0.0) == []  # exactly full

    assert c.store("d", b"ddddd", version=1, term=10.0, sent_at=0.0) == ["a", "b"]
    assert list(c.entries) == ["c", "d"]
    assert (c.nbytes, c.evictions, len(c)) == (7, 2, 2)


def test_a_hit_makes_an_entry_most_recently_used() -> None:
    c = cache(max_bytes=10)
    c.store("a", b"aaaa", version=1, term=10.0, sent_at=0.0)
    c.store("b", b"bbbb", version=1, term=10.0, sent_at=0.0)
    c.store("c", b"cc", version=1, term=10.0, sent_at=0.0)

    assert hit(c, "a", now=1.0) == b"aaaa"
    assert c.store("d", b"ddddd", version=1, term=10.0, sent_at=1.0) == ["b", "c"]
    assert list(c.entries) == ["d", "a"]  # "a" got its second chance after "d" came


def test_a_second_chance_is_spent_once() -> None:
    c = cache(max_bytes=8)
    c.store("a", b"aaaa", version=1, term=10.0, sent_at=0.0)
    c.store("b", b"bbbb", version=1, term=10.0, sent_at=0.0)
    assert hit(c, "a", now=1.0) == b"aaaa"

    assert c.store("c", b"cc", version=1, term=10.0, sent_at=1.0) == ["b"]
    assert c.store("d", b"ddddd", version=1, term=10.0, sent_at=1.0) == ["c", "a"]


def test_a_miss_does_not_refresh_recency() -> None:
    c = cache(max_bytes=8)
    c.store("a", b"aaaa", version=1, term=1.0, sent_at=0.0)
    c.store("b", b"bbbb", version=1, term=10.0, sent_at=0.0)

    assert hit(c, "a", now=5.0) is None  # expired
    assert c.store("c", b"c", version=1, term=10.0, sent_at=5.0) == ["a"]


def test_data_larger_than_the_whole_cache_is_not_cached_and_evicts_nothing() -> None:
    c = cache(max_bytes=4)
    c.store("a", b"aaaa", version=1, term=10.0, sent_at=0.0)

    assert c.store("big", b"12345", version=1, term=10.0, sent_at=0.0) == []
    assert list(c.entries) == ["a"]


def test_a_growing_entry_is_counted_at_its_new_size() -> None:
    c = cache(max_bytes=10)
    c.store("a", b"aaaa", version=1, term=10.0, sent_at=0.0)
    c.store("b", b"bb", version=1, term=10.0, sent_at=0.0)

    assert c.store("a", b"a" * 9, version=2, term=10.0, sent_at=1.0) == ["b"]
    assert (c.nbytes, list(c.entries)) == (9, ["a"])


def test_max_bytes_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        LeaseCache(skew=SKEW, max_bytes=-1)


# ---------------------------------------------------------------- drop, clear
def test_drop_forgets_a_path_and_says_whether_it_was_cached() -> None:
    c = cache()
    c.store("p", b"data", version=1, term=10.0, sent_at=0.0)

    assert c.drop("p") is True
    assert c.drop("p") is False
    assert hit(c, "p", now=0.0) is None
    assert (c.nbytes, len(c)) == (0, 0)


def test_clear_forgets_everything_and_returns_the_paths() -> None:
    c = cache()
    c.store("a", b"a", version=1, term=10.0, sent_at=0.0)
    c.store("b", b"b", version=1, term=10.0, sent_at=0.0)

    assert c.clear() == ["a", "b"]
    assert (c.nbytes, len(c)) == (0, 0)


# ---------------------------------------------------------------- threads
def test_hits_on_one_thread_race_stores_evictions_and_drops_on_another_safely() -> None:
    """The blocking client's situation: its caller's thread answers hits while the
    loop thread stores, evicts and drops. For several seconds, with the interpreter
    switching threads as often as it can: no exception, every entry whole, no entry
    of a version dropped before the lookup began, and the byte count exact at the end."""
    paths = [f"f{i}" for i in range(32)]
    c = cache(max_bytes=16 * 20)  # room for about half of them: evictions all along
    dropped = dict.fromkeys(paths, 0)  # path: the newest version dropped (published after)
    stop = threading.Event()
    problems: list[str] = []
    hits = 0

    def body(path: str, version: int) -> bytes:
        return f"{path}:{version}".encode().ljust(16 + version % 8, b".")

    def hammer_hits() -> None:
        nonlocal hits
        try:
            while not stop.is_set():
                for path in paths:
                    floor = dropped[path]
                    entry = c.lookup(path, time.monotonic())
                    if entry is None:
                        continue
                    hits += 1
                    if entry.version <= floor:
                        problems.append(f"{path} v{entry.version} after v{floor} was dropped")
                    if entry.data != body(path, entry.version):
                        problems.append(f"{path} v{entry.version} holds {entry.data!r}")
        except Exception as exc:  # pragma: no cover - the failure this test looks for
            problems.append(repr(exc))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=hammer_hits)
    reader.start()
    version = dict.fromkeys(paths, 0)
    stores = drops = 0
    rng = random.Random(7)
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not problems:
            path = rng.choice(paths)
            if rng.random() < 0.25:
                if c.drop(path):  # an approval request: drop, then publish
                    dropped[path] = version[path]
                    drops += 1
            else:
                version[path] += 1
                c.store(path, body(path, version[path]), version[path], 10.0, time.monotonic())
                stores += 1
    finally:
        stop.set()
        reader.join()
        sys.setswitchinterval(switch)

    assert problems == []
    assert stores > 10_000 and drops > 1_000 and c.evictions > 1_000 and hits > 10_000
    assert c.nbytes == sum(len(entry.data) for entry in c.entries.values()) <= c.max_bytes
    assert all(entry.data == body(path, entry.version) for path, entry in c.entries.items())


def test_when_every_older_entry_was_used_the_new_one_still_stays_and_the_bound_holds() -> None:
    c = cache(max_bytes=8)
    c.store("a", b"aaaa", version=1, term=10.0, sent_at=0.0)
    c.store("b", b"bbbb", version=1, term=10.0, sent_at=0.0)
    assert hit(c, "a", now=1.0) == b"aaaa" and hit(c, "b", now=1.0) == b"bbbb"

    assert c.store("c", b"cc", version=1, term=10.0, sent_at=1.0) == ["a"]
    assert (list(c.entries), c.nbytes) == (["b", "c"], 6)


# ---------------------------------------------------------------- chunks and listings
def chunk(c: LeaseCache, path: str, index: int, now: float) -> bytes | None:
    entry = c.lookup_chunk(path, index, now)
    return None if entry is None else entry.data


def test_chunks_are_trusted_until_the_files_lease_runs_out_exactly() -> None:
    c = cache()
    c.store_chunk("f", 0, b"aa", version=3, size=5, term=10.0, sent_at=100.0)
    c.store_chunk("f", 1, b"bbb", version=3, size=5, term=10.0, sent_at=101.0)
    assert c.chunks("f") == Chunks(version=3, size=5, expiry=111.0 - SKEW, indices={0, 1})
    assert chunk(c, "f", 0, just_before(111.0 - SKEW)) == b"aa"  # the later grant counts
    assert chunk(c, "f", 1, 111.0 - SKEW) is None
    assert c.lookup("f", 100.0) is None  # chunks are never a whole-file hit
    assert c.nbytes == 5 and "f" in c


def test_a_newer_version_replaces_every_chunk_an_older_one_is_refused() -> None:
    c = cache()
    c.store_chunk("f", 0, b"old", version=2, size=6, term=10.0, sent_at=0.0)
    c.store_chunk("f", 1, b"old", version=2, size=6, term=10.0, sent_at=0.0)
    assert c.store_chunk("f", 1, b"ancient", version=1, size=9, term=10.0, sent_at=0.0) == []
    c.store_chunk("f", 1, b"new", version=3, size=6, term=10.0, sent_at=0.0)
    chunks = c.chunks("f")
    assert chunks is not None and (chunks.version, chunks.indices) == (3, {1})
    assert chunk(c, "f", 0, 1.0) is None and c.nbytes == 3


def test_dropping_a_file_drops_its_whole_entry_or_all_its_chunks() -> None:
    c = cache()
    c.store_chunk("f", 0, b"x" * 4, version=1, size=8, term=10.0, sent_at=0.0)
    c.store_chunk("f", 1, b"y" * 4, version=1, size=8, term=10.0, sent_at=0.0)
    c.store("g", b"whole", 1, 10.0, 0.0)
    assert c.drop("f") and c.chunks("f") is None and c.nbytes == 5 and len(c) == 1
    c.store_chunk("g", 0, b"wh", version=2, size=5, term=10.0, sent_at=0.0)
    assert c.get("g") is None and c.nbytes == 2  # chunks of a newer version replace it


def test_a_file_is_reported_evicted_when_its_last_chunk_goes() -> None:
    c = cache(max_bytes=8)
    c.store_chunk("f", 0, b"1234", version=1, size=8, term=10.0, sent_at=0.0)
    c.store_chunk("f", 1, b"5678", version=1, size=8, term=10.0, sent_at=0.0)
    assert c.store_chunk("g", 0, b"abcd", version=1, size=4, term=10.0, sent_at=0.0) == []
    assert c.chunks("f") is not None and c.chunks("f").indices == {1}  # type: ignore[union-attr]
    assert c.store_chunk("g", 1, b"efgh", version=1, size=8, term=10.0, sent_at=0.0) == ["f"]
    assert c.nbytes == 8 and c.chunks("f") is None


def test_a_listing_is_trusted_until_its_lease_runs_out_and_dropped_by_its_key() -> None:
    c = cache()
    entries = (DirEntry("a", False, 1, 7), DirEntry("sub", True, 0, 9))
    c.store_listing("docs/", entries, 4, 10.0, 50.0)
    listing = c.lookup_listing("docs/", just_before(60.0 - SKEW))
    assert listing is not None and listing.entries == entries
    assert c.lookup_listing("docs/", 60.0 - SKEW) is None
    assert c.extend("docs/", 4, 10.0, 55.0) and c.lookup_listing("docs/", 60.0) is not None
    assert not c.extend("docs/", 5, 10.0, 55.0) and c.get_listing("docs/") is None  # stale
    c.store_listing("docs/", entries, 4, 10.0, 50.0)
    assert c.drop("docs/") and c.get_listing("docs/") is None
    assert c.nbytes == 0  # listings are outside the byte bound


def names(n: int) -> tuple[DirEntry, ...]:
    return tuple(DirEntry(f"n{i}", False, 0, 1) for i in range(n))


def test_listings_have_a_budget_of_their_own_and_the_oldest_go_first(monkeypatch) -> None:
    monkeypatch.setattr(cache_module, "MIN_LISTING_BYTES", 0)
    c = cache(max_bytes=5 * LISTING_NAME_BYTES)
    assert c.store_listing("a/", names(2), 1, 10.0, 0.0) == []
    assert c.store_listing("b/", names(2), 1, 10.0, 0.0) == []
    assert c.listing_bytes == 4 * LISTING_NAME_BYTES and c.nbytes == 0
    assert c.store_listing("a/", names(2), 2, 10.0, 0.0) == []  # stored again: the newest
    assert c.store_listing("c/", names(2), 1, 10.0, 0.0) == ["b/"]  # the oldest, given back
    assert list(c.listings) == ["a/", "c/"] and c.listing_bytes == 4 * LISTING_NAME_BYTES
    assert c.store_listing("big/", names(6), 1, 10.0, 0.0) == ["big/"]  # over all of it
    assert c.get_listing("big/") is None and list(c.listings) == ["a/", "c/"]
    assert c.store_listing("d/", names(5), 1, 10.0, 0.0) == ["a/", "c/"]
    assert c.drop("d/") and c.listing_bytes == 0 and not c.listings
    assert c.store_listing("e/", names(1), 1, 0.05, 0.0) == []  # a term under the skew
    assert c.listing_bytes == 0 and not c.listings


def test_the_listings_budget_is_never_below_its_floor() -> None:
    c = cache(max_bytes=0)  # no data cached, as the command line's client
    assert c.store_listing("a/", names(1000), 1, 10.0, 0.0) == []
    assert c.lookup_listing("a/", 1.0) is not None
    assert c.listing_bytes == 1000 * LISTING_NAME_BYTES


def test_drop_beneath_forgets_everything_below_a_directory_key() -> None:
    c = cache()
    c.store("d/a", b"1", 1, 10.0, 0.0)
    c.store_chunk("d/e/big", 0, b"22", version=1, size=9, term=10.0, sent_at=0.0)
    c.store_listing("d/e/", (), 1, 10.0, 0.0)
    c.store("dx", b"3", 1, 10.0, 0.0)
    assert c.drop_beneath("d/") == ["d/a", "d/e/", "d/e/big"]
    assert list(c.entries) == ["dx"] and c.nbytes == 1


# ---------------------------------------------------------------- pieces of chunks
def piece(c: LeaseCache, path: str, index: int, now: float, start: int, end: int) -> bytes | None:
    entry = c.lookup_chunk(path, index, now, start, end)
    return None if entry is None else entry.data[start - entry.start : end - entry.start]


def test_a_piece_answers_only_the_bytes_it_covers_until_the_lease_runs_out() -> None:
    c = cache()
    c.store_chunk("f", 2, b"cdef", version=5, size=100, term=10.0, sent_at=50.0, start=2)
    assert c.chunks("f") == Chunks(version=5, size=100, expiry=60.0 - SKEW, indices={2})
    assert piece(c, "f", 2, 51.0, 2, 6) == b"cdef"
    assert piece(c, "f", 2, just_before(60.0 - SKEW), 3, 5) == b"de"
    assert piece(c, "f", 2, 60.0 - SKEW, 3, 5) is None  # the lease ran out
    assert piece(c, "f", 2, 51.0, 1, 5) is None  # starts before the piece
    assert piece(c, "f", 2, 51.0, 3, 7) is None  # ends after it
    assert c.lookup_chunk("f", 2, 51.0) is None  # not the whole chunk
    assert c.chunk("f", 2, 3, 5) is not None and c.chunk("f", 2, 0, 5) is None  # untrusted too
    assert c.nbytes == 4


def test_a_piece_replaces_a_smaller_one_never_one_that_covers_it() -> None:
    c = cache()
    c.store_chunk("f", 0, b"cd", version=1, size=9, term=10.0, sent_at=0.0, start=2)
    c.store_chunk("f", 0, b"bcde", version=1, size=9, term=10.0, sent_at=1.0, start=1)
    assert c.chunk("f", 0, 1, 5) is not None and c.nbytes == 4
    assert c.store_chunk("f", 0, b"c", version=1, size=9, term=10.0, sent_at=2.0, start=2) == []
    assert piece(c, "f", 0, 11.0, 1, 5) == b"bcde" and c.nbytes == 4  # kept; the lease moved on
    c.store_chunk("f", 0, b"gh", version=1, size=9, term=10.0, sent_at=2.0, start=6)  # disjoint
    assert piece(c, "f", 0, 3.0, 6, 8) == b"gh" and c.chunk("f", 0, 1, 5) is None
    c.store_chunk("f", 0, b"abcdefghi", version=1, size=9, term=10.0, sent_at=2.0)
    assert c.lookup_chunk("f", 0, 3.0) is not None and c.nbytes == 9  # the whole chunk


def test_a_piece_of_another_version_never_joins_the_record() -> None:
    c = cache()
    c.store_chunk("f", 0, b"old", version=2, size=9, term=10.0, sent_at=0.0)
    assert c.store_chunk("f", 1, b"x", version=1, size=9, term=10.0, sent_at=0.0, start=3) == []
    assert c.chunks("f").indices == {0}  # type: ignore[union-attr]
    c.store_chunk("f", 1, b"new", version=3, size=9, term=10.0, sent_at=0.0, start=3)
    assert c.chunks("f").indices == {1} and c.nbytes == 3  # type: ignore[union-attr]


def test_pieces_are_dropped_with_their_file_and_counted_and_evicted_by_their_size() -> None:
    c = cache(max_bytes=6)
    c.store_chunk("f", 0, b"ab", version=1, size=99, term=10.0, sent_at=0.0, start=10)
    c.store_chunk("f", 3, b"cd", version=1, size=99, term=10.0, sent_at=0.0, start=20)
    assert c.nbytes == 4
    assert c.store_chunk("g", 0, b"efg", version=1, size=3, term=10.0, sent_at=0.0) == []
    assert c.chunks("f").indices == {3} and c.nbytes == 5  # type: ignore[union-attr]
    assert c.store_chunk("g", 1, b"hi", version=1, size=5, term=10.0, sent_at=0.0) == ["f"]
    assert c.nbytes == 5 and c.chunks("f") is None
    c.store_chunk("h", 0, b"z", version=1, size=9, term=10.0, sent_at=0.0, start=4)
    assert c.drop("h") and c.chunks("h") is None and c.nbytes == 5


# ---------------------------------------------------------------- scans
def test_a_scan_keeps_the_chunks_of_a_file_of_at_most_a_quarter_of_the_bound() -> None:
    c = cache(max_bytes=40)
    assert c.keeps_scan(10) and not c.keeps_scan(11)  # 40 // SCAN_SHARE
    for index in range(2):
        c.store_chunk(
            "small", index, b"s" * 5, version=1, size=10, term=10.0, sent_at=0.0, scan=True
        )
    assert chunk(c, "small", 1, 1.0) == b"s" * 5 and c.nbytes == 10
    for index in range(3):
        stored = c.store_chunk(
            "big", index, b"b" * 4, version=1, size=11, term=10.0, sent_at=0.0, scan=True
        )
        assert stored == []
    assert "big" not in c and c.chunks("big") is None and c.nbytes == 10


def test_a_scan_of_a_file_larger_than_the_bound_evicts_nothing() -> None:
    c = cache(max_bytes=16)
    c.store("other", b"o" * 8, 1, 10.0, 0.0)
    for index in range(100):  # 100 chunks of 4 bytes through a 16-byte cache
        stored = c.store_chunk(
            "huge", index, b"h" * 4, version=1, size=400, term=10.0, sent_at=0.0, scan=True
        )
        assert stored == []
    assert hit(c, "other", 1.0) == b"o" * 8
    assert (c.nbytes, c.evictions, len(c)) == (8, 0, 1)


def test_a_scan_reads_but_leaves_the_chunks_a_ranged_read_cached() -> None:
    c = cache(max_bytes=16)
    c.store_chunk("big", 2, b"rr", version=5, size=400, term=10.0, sent_at=0.0, start=1)
    c.store_chunk("big", 2, b"scan", version=5, size=400, term=20.0, sent_at=0.0, scan=True)
    assert piece(c, "big", 2, 1.0, 1, 3) == b"rr"  # the same version: kept as it was
    assert c.chunks("big") == Chunks(version=5, size=400, expiry=10.0 - SKEW, indices={2})
    c.store_chunk("big", 3, b"newr", version=6, size=400, term=10.0, sent_at=0.0, scan=True)
    assert "big" not in c and c.nbytes == 0  # a newer version: the old copy goes


def test_reads_that_are_not_scans_keep_the_chunks_of_any_file_under_the_bound() -> None:
    c = cache(max_bytes=16)
    assert c.store_chunk("big", 7, b"r" * 4, version=1, size=400, term=10.0, sent_at=0.0) == []
    assert chunk(c, "big", 7, 1.0) == b"r" * 4 and c.nbytes == 4


def test_a_listings_rows_are_made_from_its_columns() -> None:
    rows = dir_entries(["a", "b"], [False, True], [3, 0], [10, 11])

    assert rows == (DirEntry("a", False, 3, 10), DirEntry("b", True, 0, 11))
    assert dir_entries([], [], [], []) == ()
    with pytest.raises(ValueError, match="differ in length"):
        dir_entries(["a"], [False], [3], [])
