"""The durable store: the server's directory tree, one plain file per fscache file.

Theory of operation
===================

Layout.  The file ``a/b`` lives at ``<root>/a/b`` and holds exactly its contents:
no side files, no database.  Its version is read from the file's own inode (the
later of ``st_mtime_ns`` and ``st_ctime_ns``: see Versions), so data and version
live in one inode and can never disagree.  The store's private files
use names starting with :data:`fscache.paths.RESERVED_PREFIX`, which clients can
never name; :meth:`Store.listdir` and :meth:`Store.scandir` hide them.  The server
keeps its own small files (:meth:`Store.save_state`) in the directory of that very
name, written like any file.

Writes (``docs/design.md``, "Guarantees", durability: "every acknowledged write, no
torn file").
:meth:`Store.write` never modifies a file in place.  It

1. creates ``.fscache-tmp-<random hex>`` in the *same directory* as the target
   (``O_CREAT | O_EXCL``; same directory means same file system, so step 4 is a
   rename, never a copy), creating missing parent directories first and fsyncing
   the parent of each directory it creates, so the new entries are durable too;
2. writes all the data, then stamps the new version with ``os.utime`` (after the
   data, so no later write can move the mtime);
3. ``fsync``\\s the temp file: its data *and* its inode, mtime included, are on disk;
4. ``os.replace``\\s it onto the target: rename is atomic, so every observer (and
   the file system after any crash) sees either the whole old inode or the whole
   new one, never a mix;
5. restamps the directory's version (see Directories) and ``fsync``\\s the
   directory, making the rename itself durable;

and only then returns, i.e. only then may the server acknowledge.  After a SIGKILL
at any instant the kernel still holds (and eventually writes) everything the
process did, so each path holds either its last acknowledged contents or those of a
write that was in flight, each complete; an unfinished write leaves at most a temp
file, which :meth:`Store.recover` deletes at the next start.  After a power loss the
fsyncs give the same result, provided the disk and the file system honour fsync.
Deletes are ``unlink``, a directory restamp and an fsync of the directory.

Uploads (a whole-file write streamed in parts, for files of any size).
:meth:`Store.upload_begin` creates the temp file of step 1 (mode ``0o600``: no one
else reads a half-sent file) beside the target, or in the root while the target's
directory is missing (the commit makes it);
:meth:`Store.upload_part` ``pwrite``\\s each part at its offset at once, so memory is
bounded by one part, whatever the file's size; :meth:`Store.upload_sync` fsyncs
the data (the slow part, which the server runs before the lease rules allow the
write); :meth:`Store.upload_commit` then does steps 2-5 under the path's lock with
``write``'s compare-and-set: stamp, mode as ``write`` gives, fsync (cheap: only the
inode is left), rename, restamp and fsync of the directory.  So an upload has
exactly ``write``'s guarantees.  The rename goes from the descriptor of the
directory the temp file was made in to the path's parent opened anew (its missing
directories made as ``write`` makes them, a file on the way :class:`IsADirectory`),
so the file lands at its path as named at commit, even if a directory on the way
was renamed meanwhile; both directories are fsynced.  A failed part or commit, and
:meth:`Store.upload_abort`, remove the temp file; after a crash ``recover`` does.

In-place writes.  :meth:`Store.write_range` (``pwrite``) and :meth:`Store.truncate`
(``ftruncate``) change the file's own inode: stamp a new version by the rule under
Versions, fsync data and inode, and only then return.  A missing file is created
(``O_EXCL``; its directory must exist), and then the directory is restamped and
fsynced too.  Like POSIX ``pwrite``, they are *not* atomic against a crash: after
a SIGKILL or power loss mid-write the bytes being written may be partly old,
partly new (every *acknowledged* write is durable).  A full disk is caught before
any byte changes where the file system can: the range is reserved first with
``posix_fallocate``.  Such writes break the rule "an inode is never written
after its rename" that Reads rely on; a read racing one could pair the old
version with new bytes.  The server never lets them race: the lease table keeps a
key's reads waiting until the write applied on it is done (``fscache.leases``).

Renames.  :meth:`Store.rename` is one ``rename(2)`` between the two parent
directories' descriptors, so it has the kernel's atomicity: a file over a file
replaces it in one step, a directory may replace an empty directory, and a crash
leaves either name set.  Then each parent is restamped and fsynced (one if they
are the same) before returning.  A renamed file keeps its inode, hence its mtime;
so that a version still never names two contents of one path, the moved inode is
first stamped (``utime`` on its descriptor, fsynced) above the version ``dst``
had and above ``dst``'s floor, if it is not already; and ``src`` gets a floor, as
after a delete.  A directory is checked again after the move (moving its ``..``
may touch it).  Files *below* a renamed directory keep their versions: a version
repeats at a new path only if two files there carry the very same mtime_ns.  An
operation that opened its parent before an ancestor was renamed acts in the moved
directory; the lease rules order such operations after the rename (its footprint
covers both subtrees), and an upload's commit opens its parent anew.

Directories.  A directory's version is its ``st_mtime_ns``.  Every change the store
makes to a directory's name set (a file created by ``write``, an upload or an
in-place write; delete; mkdir; rmdir; a rename in or out) ends with a restamp of
the directory to ``max(now, mtime + 1, floor + 1)``, where ``floor`` is the
highest version this store gave that directory (kept in memory, like the files'
floors, and kept on rmdir and rename-away so a directory made again at that path
starts above it), then an fsync.  The restamp comes *after* the change, so a
version is only ever given to a name set that already holds; the kernel moves the
mtime too (to its coarse "now"), and the floor keeps a version from going back
to one given before.  :meth:`Store.scandir` reads the version before the entries,
so a listing racing a change pairs newer entries with an older version, which
the next comparison rejects, never the reverse.  Limits: between a change and its
restamp the kernel's value shows; changes by other programs move the mtime as
the kernel does (fine); a program that *sets* mtimes can move it back; temp files
coming and going move it too (the names shown do not change).

Listing cache.  A directory too big for one listing page is listed once per
version, not once per page: its sorted names are kept (up to
:data:`_LISTING_CACHE_NAMES` names for all directories, least recently listed
dropped first) under the key ``(st_dev, st_ino, st_size, st_mtime_ns,
st_ctime_ns)`` of its ``fstat``, and a page whose directory has the same key is cut
from them. Any change of the name set moves the directory's ctime, so, by the
content cache's rule below, the names are kept only if the ctime is at least
``_RACY_NS`` older than the wall clock read before the directory was opened.
Names are sorted in short runs merged in Python (:func:`_sorted_in_runs`), so a
listing in a worker thread never holds the GIL, and with it the event loop, for
more than about a millisecond at a time.

Reads.  :meth:`Store.read` is open, fstat, read on one file descriptor.  The
descriptor pins one inode, and ``write`` never writes an inode after its rename
(in-place writes are kept apart by the lease rules: see In-place writes), so the
version (from the same ``fstat``) and the data always belong together, even if a
write replaces the file mid-read -- with one catch: replacing or deleting a file
moves the old inode's ctime, so an ``fstat`` that comes after it would give the old
bytes a new version (one the new file may have).  Such an inode has no link left
(``st_nlink`` 0), and the read opens the path again.  A renamed file's moved ctime
raises its old path's floor (see Versions).  No lock, no thread: it is the server's hot path.
The open is one ``openat2`` confined by the kernel to the root with no symlink on
the way (Linux 5.6+; see Confinement), with ``O_NOATIME`` where the kernel allows it (no
inode write per read).  Closing the descriptor and filling the content cache wait
for :meth:`Store.settle`, which the server calls once the reply is on its way.

Content cache.  Files read again and again are served from memory, validated by
one ``lstat`` per read: an entry holds the data and the key ``(st_dev, st_ino,
st_size, st_mtime_ns, st_ctime_ns)`` of the inode it was read from (the version
is the later time); a read whose ``lstat`` of ``root/path`` finds a regular file with that exact
key returns the entry, anything else (an error, another inode, a symlink, any
changed field) drops it and reads the file as above.  The key catches every
change: a write by anyone replaces the inode (new ``st_ino``) or edits it in place,
which moves ``st_ctime`` -- a field no program can set, unlike the mtime, and one
that ``utime`` itself moves.  Only a *coarse* ctime can hide a change: on a file
system that keeps whole seconds (or an in-memory clock that ticks every few
milliseconds), an edit in the same tick as the one that set the cached ctime leaves
every field as it was.  So, as with git's "racily clean" index entries, a file is
cached only if its ctime is at least ``_RACY_NS`` (2 s: one second of granularity
plus the kernel's coarse-clock lag, with room to spare) older than the wall clock
read *before* the file was opened: every later change then gets a strictly later
ctime.  That also covers an edit racing the read itself: the entry is keyed by
the ``fstat`` taken *before* reading, and the edit moves the ctime past it, so an
entry whose bytes came from after that ``fstat`` is never served.  Limits: a wall
clock stepped backwards by more than the margin, or writes through a shared
``mmap`` (the kernel updates the times lazily), can hide a change from the cache,
as they do from git and rsync.

The cache keeps the read path exactly as safe: an entry is made only from a
descriptor opened as every read is (at ``root/path`` itself, no symlink on the
way), so cached bytes were always read from inside the root,
and a later ``lstat`` that reaches anything but that same inode misses.  (One
difference: if a directory on the path is moved out of the root and replaced by a
symlink to its new place, the unchanged file keeps being served from the cache
until it changes -- bytes already read from inside the root, never new ones.)

The cache's memory is bounded by what it really takes, not by its data alone: it
holds files of at most ``_CACHE_ENTRY_MAX`` bytes, at most ``content_cache_files``
of them (32,768), and at most ``content_cache_bytes`` (64 MiB) counting for each
entry its data, its path and ``_CACHE_ENTRY_OVERHEAD`` for the rest (a test
checks with ``tracemalloc`` that nothing more is held).  It evicts the oldest
entries first (a file cached again may go at its first place).  So a million
tiny files hold it to about 11 MB as charged, not 64 MiB (about 5 MB in fact
when leases share the paths: the key is packed in one bytes object rather than a
tuple of five ints, and the order of entries is a deque of paths beside a plain
dict rather than an ``OrderedDict``).  A hit is a dict lookup, one ``lstat`` and
one compare of packed keys; all changes to the cache (filling, dropping, and the
store's own changes dropping what they replaced, only to free memory sooner)
take a lock that a hit never touches.

Versions.  A file's version is the later of its mtime and its ctime, in
nanoseconds.  The mtime is what the store sets: a write stamps the new file's mtime
to ``max(time.time_ns(), old + 1, floor + 1)``, where ``old`` is the version being
replaced (0 if none) and ``floor`` is the last version of the path if this store
deleted it (kept in memory, per path).  On a file system with coarse timestamps
the store reads the stamp back and moves it forward until it really is larger than
``old`` and ``floor``.  The ctime is the kernel's: no program can set it, and
every change of the inode moves it to "now" -- new bytes, ``utime`` itself, a
rename of the file.  So the version is read back after the store's last change to
the inode (for a write, after the rename), and:

* versions strictly increase per path across writes, across delete-and-recreate,
  and across restarts (both times are in the inode); a version never names two
  different contents of one path;
* a file created, edited or replaced by another program gets a new version, even
  one that *sets* the mtime (``touch -d``, ``cp -p``, ``rsync -t``, ``tar -x``):
  the ctime moves all the same.  So do a ``chmod`` and a new hard link, which only
  cost the caches one read.
* ``floor`` is not persisted: delete, restart, then recreate may reuse an old
  version only if the wall clock now reads earlier than the deleted version did.
  The same holds for floors dropped from memory (see ``_FLOOR_KEEP_NS``).
* One :class:`Store` per root.  Writes and deletes are serialised per path inside
  one instance (so ``if_version`` compare-and-set is atomic there), not between
  processes.
* Versions look like wall-clock times but are only identifiers to compare for
  one path; nothing may use them as time (leases never do).

Paths.  Callers pass paths already normalised by :func:`fscache.paths.normalize`;
the store still refuses (:class:`~fscache.errors.BadPath`) the root where a file
is meant, ``..``, absolute paths, NUL bytes and names with the reserved prefix.
How every operation then stays beneath the root is said under Confinement.

Confinement.  No operation can be made to act outside the root, or through a
symlink, even by another local program swapping a directory for a symlink at any
instant.  Each works on ``(descriptor of the parent directory, last name)``: the
parent is opened with ``openat2(root_fd, parent, RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS)`` (or, without ``openat2``, one ``O_NOFOLLOW`` step per name
from the root's descriptor), then the last name is used only through ``*at``
calls (``rename(src_dir_fd=, dst_dir_fd=)``, ``mkdir``/``rmdir``/``open(dir_fd=)``,
``stat(dir_fd=, follow_symlinks=False)``, ``scandir(fd)``) that never follow a
symlink in it.  The kernel checks and uses in one step, so there is no gap between
the two.  A read is the same with one ``openat2`` of the whole path.  So a symlink
anywhere on a path is refused (:class:`~fscache.errors.BadPath`), inside the root
or not: symlinks are not aliases; ``listdir`` and ``scandir`` do not show them.
(``recover``, ``load_state`` and ``append_state`` use plain paths: they run at
start, or reach the server's own state directory.)

Errors.  Every ``OSError`` becomes an :class:`~fscache.errors.FscacheError`
subclass with a message naming the path (a rename's names both paths, and says
which one is at fault).  Only programming errors (wrong argument
types, ``ValueError``/``TypeError``) and ``MemoryError`` escape untranslated.  A
failure after the change is visible (the directory fsync after a rename, unlink or
rmdir; the fsync after an in-place write to an existing file) raises
:class:`NotDurable`: the change is there and may or may not survive a crash, so the
server treats it as applied (no lease on the old contents is kept) and tells the
writer so; it was not acknowledged.
A full disk (ENOSPC) or an I/O error (EIO) leaves no temp file (a failed part or
commit ends its upload), no file or directory the failed call created, and no
torn file except as said under In-place writes.

Permissions.  Files the store creates are ``0o600`` and directories ``0o700``,
private to the server's user; with ``shared=True`` ``0o640`` and ``0o750``.  The
umask can only narrow them.

One store per root.  ``exclusive=True`` (the server) takes an ``flock`` on
``.fscache/lock`` before :meth:`recover` runs, since recovering would delete a live
server's temp files, and holds it until :meth:`close` or the process's end (SIGKILL
included); a second exclusive store on the root is refused, naming the holder's pid.
Nor may two servers' trees overlap: a server under another would change files the
other's clients hold leases on, unseen by it, and each would delete the other's temp
files.  So, once it holds its lock, an exclusive store tests the lock of every
directory above its root (the ``.fscache/lock`` of each, opened if it exists, never
made) and, in :meth:`recover`'s walk, of every state directory below, before it
touches anything in that directory; one another server holds refuses the start,
naming that root.  A test takes the lock shared with ``LOCK_NB`` and lets go at
once (a server starting on that very root in that instant is refused as if served:
the two overlap anyway).  Each store takes its own lock before it looks, so of two
overlapping servers starting at once, at least one sees the other.  Roots are
compared by real path: one reached through a bind mount is not recognised.

Threads.  Every operation but ``read``, ``settle`` and ``facts`` may block on disk;
the server calls them through ``trio.to_thread.run_sync`` and may call them from
several threads at once.  Changes lock their paths (a rename both, in sorted
order); ``read``, ``read_range``, ``stat``, ``listdir``, ``scandir`` and ``facts``
take no lock; ``read`` and ``settle`` belong to one thread (the server's event
loop).  One :class:`Upload` is driven by one caller at a time.  Call ``recover``
only while no write is in flight (it runs in ``__init__``).  POSIX only.
"""

from __future__ import annotations

import errno
import fcntl
import heapq
import os
import secrets
import stat as stat_mod
import struct
import sys
import threading
import unicodedata
import weakref
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from time import time_ns

from fscache.errors import (
    BadPath,
    Conflict,
    Exists,
    FscacheError,
    IsADirectory,
    NoSpace,
    NotADirectory,
    NotDurable,
    NotEmpty,
    NotFound,
    ProtocolError,
    TooLarge,
)
from fscache.paths import RESERVED_PREFIX, is_reserved
from fscache.settings import LISTING_PAGE_BYTES, LISTING_PAGE_ENTRIES, MAX_EXTENT

__all__ = ["LOCK_FILE", "TEMP_PREFIX", "Facts", "Store", "Upload", "listing_page"]

LOCK_FILE = "lock"
"""In the state directory: held locked (``flock``) by the one store serving the root."""
TEMP_PREFIX = RESERVED_PREFIX + "-tmp-"
"""Name prefix of the store's temp files; anything with it is garbage after a crash."""


_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: FIFOs
# Reads do not update the file's access time (no inode write per read), where the
# kernel allows it: O_NOATIME needs the file's owner; refused once, it is not asked again.
_NOATIME = getattr(os, "O_NOATIME", 0)
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
# Another root's lock, only tested; NONBLOCK: a FIFO in its place does not block.
_PROBE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
# In-place writes; NONBLOCK: a FIFO swapped in fails (ENXIO) instead of blocking.
_UPDATE_FLAGS = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
# The moved inode in a rename, opened only to restamp it (file or directory).
_STAMP_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK

_FLOOR_KEEP_NS = 3600 * 10**9
"""Floors older than this (by the wall clock) may be dropped once there are many."""
_FLOOR_PRUNE_MIN = 10_000
_MAX_STAMP_TRIES = 80
_READ_TRIES = 8  # opens of a path whose inode keeps being replaced mid-read
# A read's openat2 refused with these may be refused for O_NOATIME (EPERM: it needs
# the file's owner) or for want of openat2 (ENOSYS, or EPERM under a seccomp filter):
# the read asks again the slower way, which tells them apart.
_OPEN_AGAIN = (errno.EPERM, errno.ENOSYS)

_CACHE_ENTRY_MAX = 1 << 20
"""Files larger than this are never held in the content cache."""
_CACHE_FILES = 32_768
"""Files the content cache holds at most by default, however small: that many tiny
entries are charged about 11 MB (see "Content cache")."""
_CACHE_ENTRY_OVERHEAD = 320
"""Bytes charged per content-cache entry besides the lengths of its data and its path:
the dict and order slots, the entry, its key, and the headers of the data and the path
(``tests/test_store.py`` checks that ``tracemalloc`` finds no more)."""
_pack_key = struct.Struct("=QQqqq").pack  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns
_ORDER_SLACK = 1024  # places of dropped paths the content cache's order may keep
_RACY_NS = 2 * 10**9
"""A file is cached only if its ctime is at least this much older than the wall clock."""

_Key = bytes  # see _key

_SORT_RUN = 4096
"""Names sorted in one C call at most: see :func:`_sorted_in_runs`."""
_LISTING_CACHE_NAMES = 1_000_000
"""Names the listing cache holds, all directories together."""


class _Listings:
    """The listing cache: the sorted names of large directories, by path, each valid
    while the directory's :func:`_key` is unchanged (see "Listing cache"). Shared by
    the worker threads that list, so each step holds a lock (never on a read's path).
    """

    def __init__(self, *, min_names: int, max_names: int) -> None:
        self.min_names = min_names
        self.max_names = max_names
        self._entries: OrderedDict[str, tuple[_Key, tuple[list[str], set[str]]]] = OrderedDict()
        self._names = 0
        self._lock = threading.Lock()

    def get(self, path: str, key: _Key) -> tuple[list[str], set[str]] | None:
        with self._lock:
            entry = self._entries.get(path)
            if entry is None or entry[0] != key:
                return None
            self._entries.move_to_end(path)
            return entry[1]

    def put(self, path: str, key: _Key, listed: tuple[list[str], set[str]]) -> None:
        count = len(listed[0])
        if not self.min_names <= count <= self.max_names:
            return  # a small directory lists fast; one beyond the budget is not kept
        with self._lock:
            old = self._entries.pop(path, None)
            if old is not None:
                self._names -= len(old[1][0])
            while self._entries and self._names + count > self.max_names:
                _, (_, (victim, _)) = self._entries.popitem(last=False)
                self._names -= len(victim)
            self._entries[path] = (key, listed)
            self._names += count


class _Cached:
    """A content-cache entry: the file's data and the key that validates it."""

    __slots__ = ("data", "key")

    def __init__(self, key: _Key, data: bytes) -> None:
        self.key = key
        self.data = data

    def cost(self, path: str) -> int:
        """The bytes it is charged against the cache's budget, held for ``path``."""
        return _CACHE_ENTRY_OVERHEAD + len(path) + len(self.data)


@dataclass(frozen=True, slots=True)
class Facts:
    """What is at a path right now (:meth:`Store.facts`): the lease rules' facts."""

    exists: bool
    is_dir: bool


_ABSENT = Facts(exists=False, is_dir=False)


class Upload:
    """A streamed whole-file write in progress (see "Uploads" above).

    Made by :meth:`Store.upload_begin`; ended by :meth:`Store.upload_commit` or
    :meth:`Store.upload_abort` (or by a failed part), after which it is ``closed``.
    """

    __slots__ = ("_dir_fd", "_fd", "_temp", "path", "received")

    def __init__(self, path: str, dir_fd: int, temp: str, fd: int) -> None:
        self.path = path
        self.received = 0
        """Bytes written so far: the offset the next part must have."""
        self._dir_fd = dir_fd  # the directory the temp file was made in
        self._temp = temp  # its name there
        self._fd = fd

    @property
    def closed(self) -> bool:
        return self._fd < 0


class _PathLock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class Store:
    """The directory tree under ``root``, with versions and crash-safe writes."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_file_size: int,
        content_cache_bytes: int = 64 << 20,
        content_cache_files: int = _CACHE_FILES,
        shared: bool = False,
        exclusive: bool = False,
    ) -> None:
        if max_file_size < 0:
            raise FscacheError(f"max_file_size must be >= 0, not {max_file_size}")
        if content_cache_bytes < 0:
            raise FscacheError(f"content_cache_bytes must be >= 0, not {content_cache_bytes}")
        if content_cache_files < 0:
            raise FscacheError(f"content_cache_files must be >= 0, not {content_cache_files}")
        shown = os.fspath(root)
        try:
            real = os.path.realpath(shown)
            mode = os.stat(real).st_mode
        except OSError as exc:
            raise _translate(exc, "serve the store root", shown) from None
        except ValueError as exc:  # e.g. an embedded NUL byte
            raise BadPath(f"store root {shown!r} is not usable: {exc}") from None
        if not stat_mod.S_ISDIR(mode):
            raise FscacheError(f"store root {shown!r} is not a directory")
        # A server's store (exclusive) writes its state there; any store reads it.
        if exclusive and _on_read_only_file_system(real):  # no user could write it: say so
            raise FscacheError(
                f"store root {shown!r} is on a read-only file system (EROFS):"
                " a server writes its state there"
            )
        if not os.access(real, os.R_OK | os.X_OK | (os.W_OK if exclusive else 0)):
            may = "readable and writable" if exclusive else "readable"
            raise FscacheError(
                f"store root {shown!r} is not {may} by this user (uid {os.getuid()})"
            )
        self.root: str = real
        self.max_file_size: int = max_file_size
        self._prefix = real if real.endswith(os.sep) else real + os.sep
        self._mutex = threading.Lock()  # guards _locks and _floors
        self._locks: dict[str, _PathLock] = {}
        self._floors: dict[str, int] = {}
        self._prune_at = _FLOOR_PRUNE_MIN
        self.content_cache_bytes: int = content_cache_bytes
        self.content_cache_files: int = content_cache_files
        self.content_hits: int = 0
        """Reads served from the content cache (approximate if ``read`` runs in threads)."""
        self._content: dict[str, _Cached] = {}
        # Their paths in the order cached, oldest first (a dict cannot drop its oldest
        # item in O(1)), and paths since dropped, which eviction skips: see _cache.
        self._content_order: deque[str] = deque()
        self._content_bytes = 0  # the cost of the entries in _content
        self._content_lock = threading.Lock()  # guards every change to the three above
        self._listings = _Listings(
            min_names=LISTING_PAGE_ENTRIES + 1, max_names=_LISTING_CACHE_NAMES
        )
        # Largest cacheable file; negative (none) when the cache is off or too small.
        self._content_entry_max = (
            min(_CACHE_ENTRY_MAX, max_file_size, content_cache_bytes - _CACHE_ENTRY_OVERHEAD)
            if content_cache_files
            else -1
        )
        self._time_ns: Callable[[], int] = time_ns  # the wall clock (a seam for tests)
        # Reads whose descriptor is still open and whose data is not yet cached: settle()
        # (fd, path, fstat, data, when the open began)
        self._unsettled: list[tuple[int, str, os.stat_result, bytes, int]] = []
        self._openat2: Callable[[str, int], int] | None = _beneath_opener(real)
        self._read_flags = _READ_FLAGS | _NOATIME  # until O_NOATIME is refused
        # See "Permissions": private to the server's user, or readable by its group.
        self._file_mode = 0o640 if shared else 0o600
        self._dir_mode = 0o750 if shared else 0o700
        self._unlock: Callable[[], object] = lambda: None
        self._exclusive = exclusive
        if not exclusive:
            self.recover()
            return
        self._lock_root()  # before recover(): another server's temp files are live
        try:
            self._refuse_served_ancestor()
            self.recover()  # refuses a served root below, before touching anything in it
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ public

    def close(self) -> None:
        """Let go of the root's lock (see "One store per root"), if this store holds it.
        The process's exit, even by SIGKILL, lets go of it too."""
        self._unlock()

    def recover(self) -> int:
        """Delete temp files left by a crash anywhere under the root (the state
        directory too); return how many.

        Only safe while no write is in flight (a live write's temp file would go too).
        A server's store (exclusive) raises :class:`FscacheError` on meeting a
        directory below that another server serves, before it touches anything there
        (see "One store per root").
        """
        removed = 0
        for dirpath, dirnames, filenames in os.walk(self.root):
            if self._exclusive and RESERVED_PREFIX in dirnames and dirpath != self.root:
                self._refuse_served(dirpath, "inside")
            for name in filenames:
                if not name.startswith(TEMP_PREFIX):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    os.unlink(full)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    leftover = full[len(self._prefix) :]
                    raise _translate(exc, "remove the leftover temp file", leftover) from None
                removed += 1
        return removed

    def read(self, path: str) -> tuple[int, bytes]:
        """``(version, data)`` of the file at ``path``, both from one open descriptor.

        Or both from the content cache, if ``lstat`` shows the same unchanged inode.
        Closing the descriptor and caching the data wait for :meth:`settle`.
        """
        if self._unsettled:
            self.settle()
        entry = self._content.get(path)
        if entry is not None:
            # Only paths a read opened (checked, beneath the root) get entries: no
            # check needed here.
            try:
                st = os.stat(self._prefix + path, follow_symlinks=False)
            except OSError:
                pass
            else:
                if _key(st) == entry.key and stat_mod.S_ISREG(st.st_mode):
                    self.content_hits += 1
                    return _file_version(st), entry.data  # the key's times: the version
            self._uncache(path, entry)
        started = self._time_ns()  # before the open: see "Content cache" above
        fd, st = self._open_linked(path)
        try:
            if not stat_mod.S_ISREG(st.st_mode):
                if stat_mod.S_ISDIR(st.st_mode):
                    raise IsADirectory(f"cannot read {path!r}: it is a directory")
                raise FscacheError(f"cannot read {path!r}: not a regular file")
            size = st.st_size
            if size > self.max_file_size:
                raise TooLarge(
                    f"cannot read {path!r}: {size} bytes is more than the "
                    f"maximum file size of {self.max_file_size}"
                )
            data = os.read(fd, size)
            if len(data) < size:
                data = _read_rest(fd, data, size)
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError):
                raise _translate(exc, "read", path) from None
            raise
        # Whether to cache it is settle()'s business, off the reply's critical path.
        self._unsettled.append((fd, path, st, data, started))
        return _file_version(st), data

    def settle(self) -> None:
        """Finish the reads done since the last call: close their descriptors and cache
        their data. The server calls this once their replies are on their way, so
        neither is on a reply's critical path; the next :meth:`read` does it first
        anyway, so at most one batch of descriptors is ever left open."""
        unsettled, self._unsettled = self._unsettled, []
        for fd, path, st, data, started in unsettled:
            with suppress(OSError):
                os.close(fd)
            if (
                len(data) <= self._content_entry_max
                and st.st_ctime_ns <= started - _RACY_NS
                and len(data) == st.st_size
                and (key := _key(st)) is not None
            ):
                self._cache(path, _Cached(key, data))

    def stat(self, path: str) -> tuple[int, int, bool]:
        """``(version, size, is_dir)``; a directory's version is its mtime, its size 0."""
        if path:
            with self._in_parent(path, "stat") as (dir_fd, name):
                st = _lstat_at(dir_fd, name, "stat", path)
            if st is None:
                raise NotFound(f"cannot stat {path!r}: it does not exist")
        else:
            st = os.stat(self.root)
        if _file_or_dir(st, f"cannot stat {path!r}", path):
            return st.st_mtime_ns, 0, True
        return _file_version(st), st.st_size, False

    def capacity(self) -> dict[str, int]:
        """The size and room of the file system that holds the root (``statvfs``):
        bytes in all, free, and available to a process without privileges; files
        (inodes) in all and free. What a mount's ``statfs`` shows (``df``)."""
        st = os.statvfs(self.root)
        return {
            "disk_bytes": st.f_blocks * st.f_frsize,
            "disk_free_bytes": st.f_bfree * st.f_frsize,
            "disk_available_bytes": st.f_bavail * st.f_frsize,
            "disk_files": st.f_files,
            "disk_free_files": st.f_ffree,
        }

    def write(self, path: str, data: bytes, if_version: int | None = None) -> int:
        """Durably replace the file at ``path`` with ``data``; return the new version.

        With ``if_version`` set, write only if the current version equals it (an
        absent file has version 0), else raise :class:`Conflict` and change nothing.
        Missing parent directories are made. Returns only after data, version and
        directory entry are on disk.
        """
        if len(data) > self.max_file_size:
            raise TooLarge(
                f"cannot write {path!r}: {len(data)} bytes is more than the "
                f"maximum file size of {self.max_file_size}"
            )
        if not path:
            raise IsADirectory("cannot write the root: it is a directory")
        full = self._prefix + path
        made: list[str] = []  # directories made for it: removed if it fails
        dir_fd, name = self._open_parent(path, "write", make=True, made=made)
        try:
            with self._locked(full):
                old = self._file_version_at(dir_fd, name, "write", path)
                if if_version is not None and if_version != old:
                    raise Conflict(f"cannot write {path!r}: its version is {old}, not {if_version}")
                with self._mutex:
                    floor = self._floors.get(full, 0)
                key = self._dir_key(_parent_of(path))
                try:
                    version = self._replace_durably(
                        dir_fd, key, name, path, data, minimum=max(old, floor) + 1
                    )
                except OSError as exc:
                    raise _translate(exc, "write", path) from None
                finally:
                    self._forget(path)
                with self._mutex:
                    self._floors.pop(full, None)
                return version
        except BaseException:
            self._unmake_dirs(made)
            raise
        finally:
            os.close(dir_fd)

    def delete(self, path: str, if_version: int | None = None) -> None:
        """Durably remove the file at ``path``.

        :class:`NotFound` if it does not exist (whatever ``if_version`` says),
        :class:`Conflict` if ``if_version`` is set and differs from its version,
        :class:`IsADirectory` for a directory (:meth:`rmdir` removes those).
        """
        if not path:
            raise IsADirectory("cannot delete the root: it is a directory")
        full = self._prefix + path
        with self._in_parent(path, "delete") as (dir_fd, name), self._locked(full):
            st = _lstat_at(dir_fd, name, "delete", path)
            if st is None:
                raise NotFound(f"cannot delete {path!r}: it does not exist")
            version = _regular_file_version(st, "delete", path)
            if if_version is not None and if_version != version:
                raise Conflict(
                    f"cannot delete {path!r}: its version is {version}, not {if_version}"
                )
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError as exc:
                raise _translate(exc, "delete", path) from None
            self._forget(path)
            self._raise_floor(full, version)
            with _after_change("delete", path):
                self._dir_changed(dir_fd, self._dir_key(_parent_of(path)))

    def save_state(self, name: str, data: bytes) -> None:
        """Durably write the server's own file ``name`` in the state directory
        (``<root>/.fscache``, a reserved name no client can reach), as any write is."""
        try:
            dir_fd = self._state_dir()
            try:
                key = self._dir_key(RESERVED_PREFIX)
                self._replace_durably(dir_fd, key, name, name, data, minimum=0)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise _translate(exc, "write", name) from None

    def append_state(self, name: str, data: bytes) -> None:
        """Append ``data`` to the server's own file ``name`` (made by :meth:`save_state`:
        its directory entry is durable already) and ``fdatasync`` it."""
        try:
            path = os.path.join(self.root, RESERVED_PREFIX, name)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                _write_all(fd, data)
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise _translate(exc, "write", name) from None

    def load_state(self, name: str) -> bytes | None:
        """The contents of the server's own file ``name``, or None if there is none."""
        try:
            with open(os.path.join(self.root, RESERVED_PREFIX, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _translate(exc, "read", name) from None

    def remove_state(self, name: str) -> None:
        """Durably remove the server's own file ``name`` (if there is one)."""
        try:
            dir_fd = self._state_dir()
            try:
                with suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dir_fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise _translate(exc, "delete", name) from None

    def state_names(self, prefix: str) -> list[str]:
        """The names of the server's own files that begin with ``prefix``, sorted."""
        try:
            names = os.listdir(os.path.join(self.root, RESERVED_PREFIX))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _translate(exc, "list", RESERVED_PREFIX) from None
        return sorted(name for name in names if name.startswith(prefix))

    def listdir(self, path: str) -> list[str]:
        """Sorted names in the directory ``path`` (``""`` is the root); dirs end in
        ``/``: the names :meth:`scandir` shows, with no ``stat`` of any.
        :class:`NotADirectory` for a file, as :meth:`scandir` says."""
        with self._listed(path) as (_, _, names, dirs):
            return [name + "/" if name in dirs else name for name in names]

    def list_page(self, path: str, after: str | None) -> tuple[list[str], bool]:
        """The page of :meth:`listdir`'s names after the name ``after`` (with or without
        its ``/``), as :func:`listing_page` cuts it, and whether names are left."""
        if after is not None:
            after = after.removesuffix("/")
        with self._listed(path) as (_, _, names, dirs):
            start, stop = listing_page(names, after)
            page = [name + "/" if name in dirs else name for name in names[start:stop]]
            return page, stop < len(names)

    # ------------------------------------------------------ confined operations
    # Each opens the parent directory beneath the root (no symlink on the way) and
    # works on the last name with *at calls: see "Confinement" above.

    def facts(self, path: str) -> Facts:
        """Whether ``path`` exists now and is a directory (``""``, the root, is one).
        A symlink or special file exists and is not a directory."""
        if not path:
            return Facts(exists=True, is_dir=True)
        try:
            with self._in_parent(path, "look up") as (dir_fd, name):
                st = _lstat_at(dir_fd, name, "look up", path)
        except NotFound:
            return _ABSENT
        except OSError as exc:
            raise _translate(exc, "look up", path) from None
        if st is None:
            return _ABSENT
        return Facts(exists=True, is_dir=stat_mod.S_ISDIR(st.st_mode))

    def read_range(self, path: str, offset: int, length: int) -> tuple[int, int, bytes]:
        """``(version, size, data)``: bytes ``[offset, min(offset + length, size))`` of
        the file, its version and whole size, all from one open descriptor (see Reads)."""
        _check_extent("read", path, offset=offset, length=length)
        fd, st = self._open_linked(path)
        try:
            version = _regular_file_version(st, "read", path)
            data = _pread_all(fd, max(0, min(length, st.st_size - offset)), offset)
        except OSError as exc:
            raise _translate(exc, "read", path) from None
        finally:
            os.close(fd)
        return version, st.st_size, data

    def upload_begin(self, path: str) -> Upload:
        """Start a streamed write of the whole file ``path``: a private temp file
        beside it, or in the root while its directory is missing (the commit makes
        the directory, as :meth:`write` does). Nothing is visible until commit."""
        try:
            dir_fd, name = self._open_parent(path, "upload")
        except NotFound:  # no directory yet (or a file on the way: the commit says so)
            dir_fd, name = self._open_root("upload", path), ""
        try:
            st = _lstat_at(dir_fd, name, "upload", path) if name else None
            if st is not None and stat_mod.S_ISDIR(st.st_mode):
                raise IsADirectory(f"cannot upload {path!r}: it is a directory")
            temp = TEMP_PREFIX + secrets.token_hex(8)
            fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd)
        except BaseException as exc:
            os.close(dir_fd)
            if isinstance(exc, OSError):
                raise _translate(exc, "upload", path) from None
            raise
        return Upload(path, dir_fd, temp, fd)

    def upload_part(self, upload: Upload, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset``, which must be the bytes received so far. A
        failed part (a full disk) ends the upload and removes its temp file."""
        self._check_open(upload)
        if offset != upload.received:
            raise ProtocolError(
                f"upload of {upload.path!r}: part at offset {offset}, expected {upload.received}"
            )
        try:
            _pwrite_all(upload._fd, data, offset)
        except OSError as exc:
            self.upload_abort(upload)
            raise _translate(exc, "upload", upload.path) from None
        upload.received += len(data)

    def upload_sync(self, upload: Upload) -> None:
        """fsync the data received so far: the slow part of a commit, which may run
        before the lease rules allow the write (commit then only stamps and renames)."""
        self._check_open(upload)
        try:
            os.fsync(upload._fd)
        except OSError as exc:
            self.upload_abort(upload)
            raise _translate(exc, "upload", upload.path) from None

    def upload_commit(self, upload: Upload, if_version: int | None = None) -> int:
        """Put the upload in place of the file at its path; return the new version.

        Same order and guarantees as :meth:`write` (stamp, fsync, rename, directory
        restamp and fsync), the same compare-and-set, and missing parent directories
        are made as :meth:`write` makes them. The upload ends either way: on any error
        (:class:`Conflict`, :class:`IsADirectory`, ...) it is removed.
        """
        self._check_open(upload)
        path = upload.path
        full = self._prefix + path
        made: list[str] = []  # directories made for it: removed if it fails
        try:
            with (
                self._in_parent(path, "write", make=True, made=made) as (dir_fd, name),
                self._locked(full),
            ):
                old = self._file_version_at(dir_fd, name, "write", path)
                if if_version is not None and if_version != old:
                    raise Conflict(f"cannot write {path!r}: its version is {old}, not {if_version}")
                with self._mutex:
                    floor = self._floors.get(full, 0)
                fd, upload._fd = upload._fd, -1
                try:
                    _stamp(fd, max(old, floor) + 1)
                    os.fchmod(fd, self._file_mode)
                    os.fsync(fd)  # cheap after upload_sync: the inode only
                finally:
                    os.close(fd)
                key = self._dir_key(_parent_of(path))
                self._install(upload._dir_fd, upload._temp, dir_fd, key, name, path)
                version = self._installed_version(dir_fd, name, path)
                self._forget(path)
                with self._mutex:
                    self._floors.pop(full, None)
        except BaseException as exc:
            self.upload_abort(upload)
            self._unmake_dirs(made)
            if isinstance(exc, OSError):
                raise _translate(exc, "write", path) from None
            raise
        os.close(upload._dir_fd)
        return version

    def upload_abort(self, upload: Upload) -> None:
        """End the upload and remove its temp file; a no-op on an ended one."""
        if upload._dir_fd < 0:
            return
        if upload._fd >= 0:
            with suppress(OSError):
                os.close(upload._fd)
            upload._fd = -1
        with suppress(OSError):  # if it stays, recover() removes it at the next start
            os.unlink(upload._temp, dir_fd=upload._dir_fd)
        with suppress(OSError):
            os.close(upload._dir_fd)
        upload._dir_fd = -1

    def write_range(
        self, path: str, offset: int, data: bytes, if_version: int | None = None
    ) -> int:
        """Write ``data`` at ``offset`` in the file, in place (creating it if missing;
        its directory must exist); return the new version, once durable (see
        "In-place writes" above: not atomic against a crash)."""
        _check_extent("write", path, offset=offset)

        def change(fd: int) -> None:
            if data:
                _reserve(fd, offset, len(data))
                _pwrite_all(fd, data, offset)

        return self._update_in_place(path, "write", if_version, change)

    def truncate(self, path: str, size: int, if_version: int | None = None) -> int:
        """Cut or extend (with zeros) the file to ``size`` bytes, in place, creating it
        if missing; return the new version, once durable."""
        _check_extent("truncate", path, size=size)

        def change(fd: int) -> None:
            os.ftruncate(fd, size)

        return self._update_in_place(path, "truncate", if_version, change)

    def rename(self, src: str, dst: str) -> int:
        """Move ``src`` to ``dst`` as POSIX ``rename(2)`` does, within the root, durably;
        return the version now at ``dst`` (a file's, or the directory's).

        A file replaces a file atomically, a directory replaces an empty directory.
        :class:`NotFound` (``src``, or ``dst``'s directory, missing),
        :class:`IsADirectory` (file over directory), :class:`NotADirectory`
        (directory over file), :class:`NotEmpty`, :class:`BadPath` (the root, a
        reserved name, ``dst`` beneath ``src``). Every message names both paths,
        and the one at fault.
        """
        op = _rename_op(src)
        what = f"cannot {op} {dst!r}"
        if dst.startswith(src + "/"):
            raise BadPath(f"{what}: a directory cannot go inside itself")
        src_full, dst_full = self._prefix + src, self._prefix + dst
        with (
            self._in_rename_parent(src, dst, "source") as (src_dir, src_name),
            self._in_rename_parent(src, dst, "destination") as (dst_dir, dst_name),
            self._locked(src_full, dst_full),
        ):
            src_st = _lstat_at(src_dir, src_name, op, dst)
            if src_st is None:
                raise NotFound(f"{what}: {src!r} does not exist")
            is_dir = _file_or_dir(src_st, what, src)
            dst_st = _lstat_at(dst_dir, dst_name, op, dst)
            if src == dst:
                return _version(src_st)
            if dst_st is not None and _file_or_dir(dst_st, what, dst) != is_dir:
                if is_dir:
                    raise NotADirectory(f"{what}: {src!r} is a directory and {dst!r} is a file")
                raise IsADirectory(f"{what}: {src!r} is a file and {dst!r} is a directory")
            src_key = self._dir_key(src) if is_dir else src_full
            dst_key = self._dir_key(dst) if is_dir else dst_full
            with self._mutex:
                floor = self._floors.get(dst_key, 0)
            minimum = max(floor, _version(dst_st) if dst_st is not None else 0) + 1
            try:
                fd = os.open(src_name, _STAMP_FLAGS, dir_fd=src_dir)
                try:
                    if os.fstat(fd).st_mtime_ns < minimum:  # see "Renames" above
                        _stamp(fd, minimum)
                        os.fsync(fd)
                    os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
                    if is_dir and os.fstat(fd).st_mtime_ns < minimum:  # ".." moved it
                        _stamp(fd, minimum)
                        os.fsync(fd)
                    version = _version(os.fstat(fd))  # (a rename moves a file's ctime)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise _rename_error(exc, src, dst) from None
            self._forget(src, dst)
            self._raise_floor(src_key, version)  # what a racing read of src may have seen
            with self._mutex:
                self._floors.pop(dst_full, None)
            with _after_change(op, dst):
                self._dir_changed(src_dir, self._dir_key(_parent_of(src)))
                if _parent_of(src) != _parent_of(dst):
                    self._dir_changed(dst_dir, self._dir_key(_parent_of(dst)))
            return version

    def mkdir(self, path: str) -> int:
        """Make the directory ``path`` (its parent must exist), durably; return its
        version. :class:`Exists` if anything is there already, :class:`NotADirectory`
        if a file is on the way."""
        full = self._prefix + path
        with (
            self._in_parent(path, "mkdir", of_directory=True) as (dir_fd, name),
            self._locked(full),
        ):
            try:
                fd, version = self._mkdir_at(dir_fd, name, path)
            except OSError as exc:
                raise _translate(exc, "mkdir", path) from None
            os.close(fd)
            return version

    def rmdir(self, path: str) -> None:
        """Remove the empty directory ``path``, durably. :class:`NotEmpty`,
        :class:`NotADirectory`, :class:`NotFound`."""
        full = self._prefix + path
        with (
            self._in_parent(path, "rmdir", of_directory=True) as (dir_fd, name),
            self._locked(full),
        ):
            st = _lstat_at(dir_fd, name, "rmdir", path)
            if st is None:
                raise NotFound(f"cannot rmdir {path!r}: it does not exist")
            if not stat_mod.S_ISDIR(st.st_mode):
                raise NotADirectory(f"cannot rmdir {path!r}: it is not a directory")
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except OSError as exc:
                raise _translate(exc, "rmdir", path) from None
            self._raise_floor(self._dir_key(path), st.st_mtime_ns)
            with _after_change("rmdir", path):
                self._dir_changed(dir_fd, self._dir_key(_parent_of(path)))

    def _unmake_dirs(self, made: list[str]) -> None:
        """Remove the directories a failed write made for itself, deepest first, as
        :meth:`rmdir` does: a write that is not acknowledged leaves no stray directory.
        One that is no longer empty (another write is using it) stays, and so do the
        ones above it."""
        for rel in reversed(made):
            try:
                self.rmdir(rel)
            except FscacheError:
                return

    def scandir(
        self, path: str, after: str | None = None
    ) -> tuple[int, list[tuple[str, bool, int, int]], bool]:
        """``(version, page, more)`` of the directory ``path`` (``""`` is the root): the
        page of entries ``(name, is_dir, size, version)`` after the name ``after`` in
        sorted order (:func:`listing_page`), and whether names are left after it. A
        directory's size is 0.

        A page costs its own entries: the directory's names are listed without a
        ``stat`` (their types come from the directory itself), and only the page's
        entries are stat'ed, through the directory's descriptor without following a
        symlink. One that vanished meanwhile is left out.
        """
        entries: list[tuple[str, bool, int, int]] = []
        with self._listed(path) as (fd, version, names, _):
            start, stop = listing_page(names, after)
            for name in names[start:stop]:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat_mod.S_ISDIR(st.st_mode):
                    entries.append((name, True, 0, st.st_mtime_ns))
                elif stat_mod.S_ISREG(st.st_mode):
                    entries.append((name, False, st.st_size, _file_version(st)))
        return version, entries, stop < len(names)

    @contextmanager
    def _listed(self, path: str) -> Iterator[tuple[int, int, list[str], set[str]]]:
        """``(fd, version, names, dirs)`` of the directory ``path`` while open: its
        descriptor, its version (read before its names, see "Directories"), its sorted
        names (:func:`_names_in`, or the listing cache's) and which of them are
        directories."""
        if path:
            _check_path(path, "list")
        started = self._time_ns()  # before the open: see "Listing cache"
        try:
            fd = self._open_dir(path)
        except OSError as exc:
            if exc.errno == errno.ENOTDIR and self.facts(path).exists:
                raise NotADirectory(f"cannot list {path!r}: it is a file") from None
            raise _translate(exc, "list", path) from None
        try:
            st = os.fstat(fd)
            key = _key(st)
            listed = None if key is None else self._listings.get(path, key)
            if listed is None:
                listed = _names_in(fd)
                if key is not None and st.st_ctime_ns <= started - _RACY_NS:
                    self._listings.put(path, key, listed)
            names, dirs = listed
            yield fd, st.st_mtime_ns, names, dirs
        except OSError as exc:
            raise _translate(exc, "list", path) from None
        finally:
            os.close(fd)

    # ----------------------------------------------------------------- helpers
    def _state_dir(self) -> int:
        """A descriptor of the server's state directory, made (privately) if missing."""
        try:
            return self._open_dir(RESERVED_PREFIX)
        except FileNotFoundError:
            return self._make_dirs(RESERVED_PREFIX)

    def _lock_root(self) -> None:
        """Take the root's lock, held until :meth:`close`, or raise :class:`FscacheError`
        naming the process that holds it."""
        shown = f"{RESERVED_PREFIX}/{LOCK_FILE}"
        try:
            dir_fd = self._state_dir()
            try:
                fd = os.open(LOCK_FILE, _LOCK_FLAGS, 0o600, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise _translate(exc, "lock", shown) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it, for the message
        except BaseException as exc:
            holder = b""
            with suppress(OSError):
                holder = os.pread(fd, 32, 0).strip()
            os.close(fd)
            if isinstance(exc, BlockingIOError):
                pid = f" (pid {holder.decode(errors='replace')})" if holder else ""
                raise FscacheError(
                    f"another fscache server{pid} is serving {self.root} already:"
                    " one server per tree"
                ) from None
            if isinstance(exc, OSError):
                raise _translate(exc, "lock", shown) from None
            raise
        self._unlock = weakref.finalize(self, os.close, fd)

    def _refuse_served_ancestor(self) -> None:
        """Raise :class:`FscacheError` if a directory above the root is served."""
        below, above = self.root, os.path.dirname(self.root)
        while above != below:  # up to "/", whose parent is itself
            self._refuse_served(above, "which contains")
            below, above = above, os.path.dirname(above)

    def _refuse_served(self, other: str, relation: str) -> None:
        """Raise :class:`FscacheError` if another server holds the lock of the root
        ``other``, which is above or below this store's root (``relation`` says which)."""
        holder = _served_by(other)
        if holder is not None:
            pid = f" (pid {holder})" if holder else ""
            raise FscacheError(
                f"another fscache server{pid} is serving {other}, {relation} {self.root}:"
                " one server per tree"
            )

    def _open_dir(self, rel: str) -> int:
        """A descriptor (``O_RDONLY | O_DIRECTORY``) of the directory ``rel`` (``""``:
        the root), reached beneath the root with no symlink on the way, by the kernel
        (``openat2``) or, without it, one ``O_NOFOLLOW`` step per name. Raises OSError
        (ELOOP for a symlink on the way)."""
        if self._openat2 is not None:
            try:
                return self._openat2(rel or ".", _DIR_FLAGS)
            except OSError as exc:
                if exc.errno not in (errno.ENOSYS, errno.EPERM):
                    raise
                self._openat2 = None  # not here: never again
        fd = os.open(self.root, _DIR_FLAGS)
        for name in rel.split("/") if rel else ():
            try:
                step = _step(fd, name)
            finally:
                os.close(fd)
            fd = step
        return fd

    def _open_parent(
        self,
        path: str,
        op: str,
        *,
        make: bool = False,
        of_directory: bool = False,
        made: list[str] | None = None,
    ) -> tuple[int, str]:
        """``(descriptor of the parent directory, last name)`` of ``path`` (see
        :meth:`_open_dir`): what every confined operation works on. :class:`BadPath`
        for the root or a reserved name, :class:`NotFound` if the parent is missing
        (with ``make``, missing directories are made -- each added to ``made`` -- and a
        file on the way is :class:`IsADirectory`; for an operation ``of_directory``,
        mkdir and rmdir, a file on the way is :class:`NotADirectory`, as ENOTDIR is for
        mkdir(2))."""
        _check_path(path, op)
        head, _, name = path.rpartition("/")
        try:
            try:
                return self._open_dir(head), name
            except FileNotFoundError:
                if not make:
                    raise
                return self._make_dirs(head, made), name
        except NotADirectoryError:
            if of_directory:
                raise NotADirectory(
                    f"cannot {op} {path!r}: one of its parent directories is a file"
                ) from None
            if not make:
                raise NotFound(f"cannot {op} {path!r}: it does not exist") from None
            raise IsADirectory(
                f"cannot {op} {path!r}: one of its parent directories is a file"
            ) from None
        except OSError as exc:
            raise _translate(exc, op, path) from None

    def _open_root(self, op: str, path: str) -> int:
        """A descriptor of the root directory, for ``op`` on ``path``."""
        try:
            return self._open_dir("")
        except OSError as exc:
            raise _translate(exc, op, path) from None

    @contextmanager
    def _in_rename_parent(self, src: str, dst: str, role: str) -> Iterator[tuple[int, str]]:
        """:meth:`_in_parent` for the ``role`` (``source`` or ``destination``) of the
        rename of ``src`` to ``dst``: its errors name both and the path at fault."""
        path = src if role == "source" else dst
        op = _rename_op(src)
        what = f"cannot {op} {dst!r}"
        if not path:
            raise BadPath(f"{what}: the {role} is the root")
        if not _is_plain(path):
            raise BadPath(
                f"{what}: the {role} is not a plain path below the root, or has a reserved name"
            )
        head, _, name = path.rpartition("/")
        try:
            dir_fd = self._open_dir(head)
        except OSError as exc:
            where = f"the {role}'s directory {head!r}"
            if exc.errno == errno.ENOENT:
                raise NotFound(f"{what}: {where} does not exist") from None
            if exc.errno == errno.ENOTDIR:
                raise NotFound(
                    f"{what}: {where} is not a directory (a file is in its place or on the way)"
                ) from None
            if exc.errno == errno.ELOOP:
                raise BadPath(
                    f"{what}: {where} is or passes through a symlink, which the store never follows"
                ) from None
            raise _translate(exc, op, dst) from None
        try:
            yield dir_fd, name
        finally:
            os.close(dir_fd)

    @contextmanager
    def _in_parent(
        self,
        path: str,
        op: str,
        *,
        make: bool = False,
        of_directory: bool = False,
        made: list[str] | None = None,
    ) -> Iterator[tuple[int, str]]:
        """:meth:`_open_parent`, closed on leaving."""
        dir_fd, name = self._open_parent(path, op, make=make, of_directory=of_directory, made=made)
        try:
            yield dir_fd, name
        finally:
            os.close(dir_fd)

    def _dir_key(self, rel: str) -> str:
        """The lock and floor key of the directory ``rel``: its real path and a ``/``."""
        return os.path.join(self.root, rel, "")

    def _file_version_at(self, dir_fd: int, name: str, op: str, path: str) -> int:
        """The version of the file ``name`` in ``dir_fd``: 0 if absent; refuse others."""
        st = _lstat_at(dir_fd, name, op, path)
        return 0 if st is None else _regular_file_version(st, op, path)

    def _update_in_place(
        self, path: str, op: str, if_version: int | None, change: Callable[[int], None]
    ) -> int:
        """``change(fd)`` on the file (created if missing), a new version, fsync; the
        directory restamped and fsynced if the file is new (see "In-place writes")."""
        full = self._prefix + path
        with self._in_parent(path, op) as (dir_fd, name), self._locked(full):
            old = self._file_version_at(dir_fd, name, op, path)
            if if_version is not None and if_version != old:
                raise Conflict(f"cannot {op} {path!r}: its version is {old}, not {if_version}")
            with self._mutex:
                floor = self._floors.get(full, 0)
            created = old == 0
            try:
                flags = _UPDATE_FLAGS | (os.O_CREAT | os.O_EXCL if created else 0)
                fd = os.open(name, flags, self._file_mode, dir_fd=dir_fd)
            except OSError as exc:
                raise _translate(exc, op, path) from None
            try:
                try:
                    change(fd)
                    # The bytes are in the file now: a failure after this, on a file
                    # that was there before, leaves them in it (NotDurable).
                    with _after_change(op, path) if not created else nullcontext():
                        _stamp(fd, max(old, floor) + 1)
                        version = _file_version(os.fstat(fd))
                        os.fsync(fd)  # data and inode (the new mtime) in one go
                finally:
                    os.close(fd)
                if created:
                    self._dir_changed(dir_fd, self._dir_key(_parent_of(path)))
            except BaseException as exc:
                if created:  # no stray file: the name was never acknowledged
                    with suppress(OSError):
                        os.unlink(name, dir_fd=dir_fd)
                if isinstance(exc, OSError):
                    raise _translate(exc, op, path) from None
                raise
            finally:
                self._forget(path)
            with self._mutex:
                self._floors.pop(full, None)
            return version

    @staticmethod
    def _check_open(upload: Upload) -> None:
        if upload.closed:
            raise ProtocolError(f"the upload of {upload.path!r} has ended")

    def _open_linked(self, path: str) -> tuple[int, os.stat_result]:
        """An open descriptor of ``path`` and its ``fstat``, taken while the inode is
        still linked: one replaced or deleted between the open and the ``fstat`` has a
        moved ctime, hence a version that is not its bytes' (see Reads), so the path is
        opened again, at most :data:`_READ_TRIES` times."""
        for _ in range(_READ_TRIES):
            fd = self._open_for_read(path)
            try:
                st = os.fstat(fd)
            except OSError as exc:
                os.close(fd)
                raise _translate(exc, "read", path) from None
            if st.st_nlink:
                return fd, st
            os.close(fd)
        raise Conflict(f"cannot read {path!r}: it was replaced {_READ_TRIES} times while read")

    def _open_for_read(self, path: str) -> int:
        """An open descriptor for ``path``, reached beneath the root with no symlink on
        the way: one ``openat2`` on the hot path (Linux 5.6+), else the parent as
        every confined operation opens it, then the last name with ``O_NOFOLLOW``."""
        if not _plainly_relative(path):
            if not path:
                raise IsADirectory("cannot read the root: it is a directory")
            _check_path(path, "read")
        if self._openat2 is not None:
            try:
                return self._openat2(path, self._read_flags)  # the hot path: one call
            except OSError as exc:
                if exc.errno not in _OPEN_AGAIN:
                    raise _translate(exc, "read", path) from None
            try:  # see _OPEN_AGAIN
                return self._open_without_atime(self._openat2, path)
            except OSError as exc:
                if exc.errno not in _OPEN_AGAIN:
                    raise _translate(exc, "read", path) from None
                self._openat2 = None  # not here: never again
        with self._in_parent(path, "read") as (dir_fd, name):

            def open_at(target: str, flags: int) -> int:
                return os.open(target, flags, dir_fd=dir_fd)

            try:
                return self._open_without_atime(open_at, name)
            except OSError as exc:
                raise _translate(exc, "read", path) from None

    def _open_without_atime(self, opener: Callable[[str, int], int], target: str) -> int:
        """``opener(target, flags)`` for reading, with ``O_NOATIME`` where the kernel
        allows it. It needs the file's owner: once a plain open succeeds where it was
        refused (EPERM), this store stops asking for it."""
        flags = self._read_flags
        try:
            return opener(target, flags)
        except PermissionError:
            if flags == _READ_FLAGS:
                raise
            fd = opener(target, _READ_FLAGS)  # raises if EPERM was not O_NOATIME's
            self._read_flags = _READ_FLAGS
            return fd

    def _cache(self, path: str, entry: _Cached) -> None:
        """Hold ``entry`` for ``path``, evicting the oldest entries to stay within both
        budgets. The order keeps a path's place when it is dropped or cached again
        (it is not searched for): eviction skips a path no longer held, and evicts a
        path cached again at its first place, a little early. Once the order holds
        ``_ORDER_SLACK`` such places more than there are entries, it is made anew."""
        cost = entry.cost(path)
        with self._content_lock:
            content, order = self._content, self._content_order
            old = content.pop(path, None)
            if old is not None:
                self._content_bytes -= old.cost(path)
            budget = self.content_cache_bytes - cost
            while content and (
                self._content_bytes > budget or len(content) >= self.content_cache_files
            ):
                victim = order.popleft()
                evicted = content.pop(victim, None)
                if evicted is not None:
                    self._content_bytes -= evicted.cost(victim)
            content[path] = entry
            order.append(path)
            self._content_bytes += cost
            if len(order) > len(content) + _ORDER_SLACK:
                self._content_order = deque(content)

    def _uncache(self, path: str, entry: _Cached) -> None:
        """Drop ``entry`` if it still is the one held for ``path``."""
        with self._content_lock:
            if self._content.get(path) is entry:
                del self._content[path]
                self._content_bytes -= entry.cost(path)

    def _forget(self, *paths: str) -> None:
        """Drop the entries for files we replaced or removed (to free memory early:
        validation alone would miss them)."""
        with self._content_lock:
            for path in paths:
                entry = self._content.pop(path, None)
                if entry is not None:
                    self._content_bytes -= entry.cost(path)

    @contextmanager
    def _locked(self, *fulls: str) -> Iterator[None]:
        """Serialise the changes of each path (compare-and-set must be atomic). Several
        paths (a rename) are locked in sorted order, so two callers never deadlock."""
        keys = sorted(set(fulls))
        with self._mutex:
            entries = []
            for key in keys:
                entry = self._locks.get(key)
                if entry is None:
                    entry = self._locks[key] = _PathLock()
                entry.users += 1
                entries.append(entry)
        held: list[_PathLock] = []
        try:
            for entry in entries:
                entry.lock.acquire()
                held.append(entry)
            yield
        finally:
            for entry in reversed(held):
                entry.lock.release()
            with self._mutex:
                for key, entry in zip(keys, entries, strict=True):
                    entry.users -= 1
                    if entry.users == 0:
                        del self._locks[key]

    def _make_dirs(self, rel: str, made: list[str] | None = None) -> int:
        """Open the directory ``rel``, making it and its missing ancestors durably (see
        :meth:`_mkdir_at`), one ``O_NOFOLLOW`` step at a time from the root; adds each
        directory it made to ``made``."""
        fd = self._open_dir("")
        done = ""
        try:
            for name in rel.split("/"):
                done = f"{done}/{name}" if done else name
                try:
                    step = _step(fd, name)
                except FileNotFoundError:
                    try:
                        step = self._mkdir_at(fd, name, done)[0]
                    except FileExistsError:  # made meanwhile
                        step = _step(fd, name)
                    else:
                        if made is not None:
                            made.append(done)
                os.close(fd)
                fd = step
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _mkdir_at(self, dir_fd: int, name: str, rel: str) -> tuple[int, int]:
        """Make the directory ``name`` in ``dir_fd`` (``rel`` is its path), stamped above
        its floor and fsynced, then restamp and fsync ``dir_fd``; return the new
        directory's descriptor and version. Raises OSError, and then leaves no
        directory behind."""
        os.mkdir(name, self._dir_mode, dir_fd=dir_fd)
        try:
            fd = _step(dir_fd, name)
            try:
                version = self._restamp(fd, self._dir_key(rel))
                os.fsync(fd)
                self._dir_changed(dir_fd, self._dir_key(_parent_of(rel)))
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            with suppress(OSError):
                os.rmdir(name, dir_fd=dir_fd)
            raise
        return fd, version

    def _raise_floor(self, key: str, version: int) -> None:
        with self._mutex:
            self._raise_floor_locked(key, version)

    def _raise_floor_locked(self, key: str, version: int) -> None:
        if version > self._floors.get(key, 0):
            self._floors[key] = version
        if len(self._floors) > self._prune_at:
            cutoff = time_ns() - _FLOOR_KEEP_NS
            self._floors = {k: v for k, v in self._floors.items() if v >= cutoff}
            self._prune_at = max(_FLOOR_PRUNE_MIN, 2 * len(self._floors))

    def _restamp(self, fd: int, key: str) -> int:
        """Give the directory (or file) open as ``fd`` a version above its current
        mtime and above every version this store gave ``key`` (see "Directories")."""
        with self._mutex:
            floor = max(os.fstat(fd).st_mtime_ns, self._floors.get(key, 0))
            version = _stamp(fd, floor + 1)
            self._raise_floor_locked(key, version)
        return version

    def _dir_changed(self, dir_fd: int, key: str) -> None:
        """After a change to the names in the directory ``dir_fd`` (lock key ``key``):
        a new directory version, then fsync, so the change and the version are durable."""
        self._restamp(dir_fd, key)
        os.fsync(dir_fd)

    def _replace_durably(
        self, dir_fd: int, key: str, name: str, path: str, data: bytes, *, minimum: int
    ) -> int:
        """Steps 1-5 of a write (see "Writes" above) of ``name`` in the directory
        ``dir_fd`` (lock key ``key``; ``path``): see :func:`_fill` and :meth:`_install`."""
        temp = TEMP_PREFIX + secrets.token_hex(8)
        fd = os.open(temp, _TEMP_FLAGS, self._file_mode, dir_fd=dir_fd)
        _fill(dir_fd, temp, fd, data, minimum=minimum)
        self._install(dir_fd, temp, dir_fd, key, name, path)
        return self._installed_version(dir_fd, name, path)

    @staticmethod
    def _installed_version(dir_fd: int, name: str, path: str) -> int:
        """The version of the file just renamed onto ``name`` (under its path's lock):
        read after the rename, which moved its ctime (see Versions)."""
        with _after_change("write", path):
            return _file_version(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))

    def _install(self, tmp_dir: int, tmp: str, dir_fd: int, key: str, name: str, path: str) -> None:
        """Rename the stamped, fsynced temp file ``tmp`` (in directory ``tmp_dir``) onto
        ``name`` in ``dir_fd`` (``path``), then restamp and fsync that directory (and
        the temp's own, if another). Raises OSError before the rename (and removes the
        temp file), :class:`NotDurable` after it."""
        try:
            os.rename(tmp, name, src_dir_fd=tmp_dir, dst_dir_fd=dir_fd)
        except BaseException:
            with suppress(OSError):  # if it stays, recover() removes it at the next start
                os.unlink(tmp, dir_fd=tmp_dir)
            raise
        with _after_change("write", path):
            self._dir_changed(dir_fd, key)
            if tmp_dir != dir_fd and not os.path.samestat(os.fstat(tmp_dir), os.fstat(dir_fd)):
                os.fsync(tmp_dir)


# --------------------------------------------------------------------- functions


def _beneath_opener(root: str) -> Callable[[str, int], int] | None:
    """``open(path, flags)`` for paths relative to ``root`` through Linux's ``openat2`` with
    ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``: the kernel refuses (EXDEV, ELOOP) any
    resolution that leaves ``root`` or meets a symlink. None where ``openat2`` is
    not available (not Linux, no libc to call it through)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        syscall = ctypes.CDLL(None, use_errno=True).syscall
        # Opens of files to read call it through PyDLL, which keeps the GIL: releasing
        # and taking it back cost 0.5-1 us of the 5-14 us of the open (measured with
        # cold caches, as between requests), and freed nothing, as the event loop's
        # thread, the only one that reads, waits for the open anyway. Directories are
        # opened by worker threads too (writes): those opens let the event loop run.
        syscall_keeping_gil = ctypes.PyDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = syscall_keeping_gil.restype = ctypes.c_long

    class OpenHow(ctypes.Structure):  # struct open_how (linux/openat2.h)
        _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                    ("resolve", ctypes.c_uint64))  # fmt: skip

    resolve = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS
    hows = {  # by open flags: the three the store uses, built once
        flags: OpenHow(flags, 0, resolve)
        for flags in (_READ_FLAGS, _READ_FLAGS | _NOATIME, _DIR_FLAGS)
    }
    calls = {
        flags: (syscall if flags == _DIR_FLAGS else syscall_keeping_gil, ctypes.byref(how))
        for flags, how in hows.items()
    }
    how_size = ctypes.sizeof(OpenHow)
    root_fd = os.open(root, _DIR_FLAGS)  # held for the store's life, like its root
    get_errno = ctypes.get_errno

    def openat2(path: str, flags: int) -> int:
        call, how = calls[flags]
        fd: int = call(_SYS_OPENAT2, root_fd, path.encode(), how, how_size)
        if fd < 0:
            code = get_errno()
            raise OSError(code, os.strerror(code), path)  # EPERM makes a PermissionError
        return fd

    weakref.finalize(openat2, os.close, root_fd)
    return openat2


def _served_by(root: str) -> str | None:
    """Who serves the directory ``root``: None if no live server holds its lock, else
    the holder's pid as it wrote it ("" if unknown). Only looks: it makes nothing, and
    holds the lock (shared) only for the instant of the test."""
    try:
        fd = os.open(os.path.join(root, RESERVED_PREFIX, LOCK_FILE), _PROBE_FLAGS)
    except OSError:
        return None  # no lock file, or none this user may open: no server it can know of
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            with suppress(OSError):
                return os.pread(fd, 32, 0).strip().decode(errors="replace")
            return ""
        except OSError:
            return None
        return None
    finally:
        os.close(fd)


def _on_read_only_file_system(path: str) -> bool:
    """Whether ``path`` is on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False  # the checks that follow name what is wrong


def _plainly_relative(path: str) -> bool:
    """Cheap test that ``path`` may take the fast read path (the slow one judges the rest)."""
    return (
        path[:1] not in ("", "/")
        and ".." not in path
        and "\0" not in path
        and path.isascii()
        and RESERVED_PREFIX not in path.lower()
    )


def _check_extent(op: str, path: str, **values: int) -> None:
    """Refuse an offset, length or size the kernel cannot take (negative, or past
    ``off_t``) before any call sees it: Python would raise OverflowError instead."""
    for name, value in values.items():
        if not 0 <= value <= MAX_EXTENT:
            raise ProtocolError(f"cannot {op} {path!r}: {name} must be 0..2**63-1, not {value}")


def _key(st: os.stat_result) -> _Key | None:
    """What a content-cache or listing-cache entry is validated by (see "Content
    cache" above), packed in one object; None (not cached) for an inode whose times
    do not fit 64 bits of nanoseconds (set beyond the year 2262)."""
    try:
        return _pack_key(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except struct.error:
        return None


def _regular_file_version(st: os.stat_result, op: str, path: str) -> int:
    """The version of a regular file; IsADirectory or FscacheError for anything else."""
    if not stat_mod.S_ISREG(st.st_mode) and _file_or_dir(st, f"cannot {op} {path!r}", path):
        raise IsADirectory(f"cannot {op} {path!r}: it is a directory")
    return _file_version(st)


def _file_version(st: os.stat_result) -> int:
    """A regular file's version: the later of its mtime and its ctime (see Versions)."""
    return max(st.st_mtime_ns, st.st_ctime_ns)


def _version(st: os.stat_result) -> int:
    """The version of a file (:func:`_file_version`) or a directory (its mtime)."""
    return st.st_mtime_ns if stat_mod.S_ISDIR(st.st_mode) else _file_version(st)


@contextmanager
def _after_change(op: str, path: str) -> Iterator[None]:
    """Around the steps that make a change already visible durable: an OSError there
    becomes :class:`NotDurable`, which says the change may or may not be kept."""
    try:
        yield
    except OSError as exc:
        cause = _translate(exc, op, path)
        raise NotDurable(f"{cause}; the change is visible but may or may not be durable") from None


def _translate(exc: OSError, op: str, path: str) -> FscacheError:
    """The fscache error for an OSError raised while doing ``op`` on ``path``."""
    code = exc.errno
    if code in (errno.ENOENT, errno.ENOTDIR):
        return NotFound(f"cannot {op} {path!r}: it does not exist")
    if code == errno.EISDIR:
        return IsADirectory(f"cannot {op} {path!r}: it is a directory")
    if code in (errno.ENOTEMPTY, errno.EEXIST):
        if code == errno.EEXIST:
            return Exists(f"cannot {op} {path!r}: it exists")
        return NotEmpty(f"cannot {op} {path!r}: the directory is not empty")
    if code == errno.EFBIG:
        return TooLarge(f"cannot {op} {path!r}: larger than the file system allows")
    if code == errno.ELOOP:  # the store never follows a symlink: no other loop is met
        return BadPath(
            f"cannot {op} {path!r}: it is or passes through a symlink, which the store never"
            " follows"
        )
    if code == errno.ENAMETOOLONG:
        return BadPath(f"cannot {op} {path!r}: {exc.strerror}")
    if code == errno.ENOSPC:
        return NoSpace(f"cannot {op} {path!r}: the store's disk is full")
    if code == errno.EDQUOT:
        return NoSpace(f"cannot {op} {path!r}: the store's disk is full (quota exceeded)")
    if code == errno.EIO:
        return FscacheError(f"cannot {op} {path!r}: the store's disk failed (I/O error)")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return FscacheError(f"cannot {op} {path!r}: not permitted ({exc.strerror})")
    return FscacheError(f"cannot {op} {path!r}: {exc.strerror or exc} (errno {code})")


def _read_rest(fd: int, data: bytes, size: int) -> bytes:
    chunks = [data]
    got = len(data)
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _stamp(fd: int, minimum: int) -> int:
    """Set the file's mtime to a new version >= ``minimum`` and return what it stored.

    Reads the stamp back: a file system with coarse timestamps rounds it down, in
    which case we move forward (doubling the step) until it is large enough.
    """
    target = max(time_ns(), minimum)
    step = 1
    for _ in range(_MAX_STAMP_TRIES):
        os.utime(fd, ns=(target, target))
        stored = os.fstat(fd).st_mtime_ns
        if stored >= minimum:
            return stored
        step = max(step * 2, minimum - stored)
        target += step
    raise FscacheError("the store's file system cannot record a new version (mtime)")


def _fill(dir_fd: int, temp: str, fd: int, data: bytes, *, minimum: int) -> None:
    """Steps 2-3 of a write (see "Writes" above): ``data`` into the temp file ``temp``
    in ``dir_fd``, open as ``fd`` (closed here), an mtime stamp >= ``minimum``, fsync.
    Raises OSError, and then leaves no temp file behind."""
    try:
        try:
            _write_all(fd, data)
            _stamp(fd, minimum)
            os.fsync(fd)  # data and inode (the new mtime) in one go
        finally:
            os.close(fd)
    except BaseException:
        with suppress(OSError):  # if it stays, recover() removes it at the next start
            os.unlink(temp, dir_fd=dir_fd)
        raise


def listing_page(names: list[str], after: str | None) -> tuple[int, int]:
    """The slice ``[start, stop)`` of the sorted ``names`` that makes the page after the
    name ``after``: at most LISTING_PAGE_ENTRIES names or LISTING_PAGE_BYTES of them."""
    start = 0 if after is None else bisect_right(names, after)
    stop = min(len(names), start + LISTING_PAGE_ENTRIES)
    size = 0
    for i in range(start, stop):
        size += len(names[i]) + 32  # the name's head, and an entry's other fields
        if size > LISTING_PAGE_BYTES and i > start:
            return start, i
    return start, stop


def _names_in(fd: int) -> tuple[list[str], set[str]]:
    """The sorted names a client may see in the directory open at ``fd`` (files and
    directories, not the store's own names, symlinks or special files), and which
    are directories: from the directory's entries and their types, with no ``stat``
    (unless the file system does not record types)."""
    names: list[str] = []
    dirs: set[str] = set()
    with os.scandir(fd) as found:
        for entry in found:
            name = entry.name
            if is_reserved(name) or not _is_client_name(name):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    dirs.add(name)
                elif not entry.is_file(follow_symlinks=False):
                    continue
            except OSError:  # vanished while we looked
                continue
            names.append(name)
    return _sorted_in_runs(names), dirs


def _sorted_in_runs(names: list[str]) -> list[str]:
    """``names`` sorted, holding the GIL only briefly at a time.

    ``list.sort`` is one C call that no other thread interrupts: sorting a
    100,000-name directory in a worker thread (about 40 ms) would stall the event
    loop for all of it. Runs of :data:`_SORT_RUN` names sort in about a millisecond
    each, and :func:`heapq.merge` is Python code, which lets the event loop take
    the GIL at every switch interval. About three times the CPU of one sort, in a
    thread, and only for directories too big for one page."""
    if len(names) <= _SORT_RUN:
        names.sort()
        return names
    runs = [sorted(names[i : i + _SORT_RUN]) for i in range(0, len(names), _SORT_RUN)]
    return list(heapq.merge(*runs))


def _is_client_name(name: str) -> bool:
    """Whether a client can name ``name``: valid UTF-8 in NFC (see :mod:`fscache.paths`)."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return unicodedata.is_normalized("NFC", name)


def _lstat_at(dir_fd: int, name: str, op: str, path: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in the directory ``dir_fd``; None if there is nothing."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _translate(exc, op, path) from None


def _step(dir_fd: int, name: str) -> int:
    """Open the directory ``name`` in ``dir_fd``, never through a symlink: ELOOP for
    one (the kernel says ENOTDIR when ``O_DIRECTORY`` meets it), as ``openat2`` does."""
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    except NotADirectoryError:
        if stat_mod.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def _check_path(path: str, op: str) -> None:
    """:class:`BadPath` unless ``path`` is a plain relative path below the root with no
    reserved name (every normalised path but ``""`` is)."""
    if not path:
        raise BadPath(f"cannot {op} the root")
    if not _is_plain(path):
        raise BadPath(f"cannot {op} {path!r}: not a plain path below the root, or a reserved name")


def _is_plain(path: str) -> bool:
    """Whether ``path``, not the root, is a plain relative path below the root with no
    reserved name."""
    return _plainly_relative(path) or not (
        "\0" in path
        or path.startswith("/")
        or any(part in ("", ".", "..") or is_reserved(part) for part in path.split("/"))
    )


def _file_or_dir(st: os.stat_result, what: str, path: str) -> bool:
    """Whether ``st``, of ``path``, is a directory; BadPath for a symlink (never
    followed: see Confinement), FscacheError for anything else but a regular file.
    ``what`` begins the error's message (``"cannot stat 'a'"``)."""
    if stat_mod.S_ISDIR(st.st_mode):
        return True
    if stat_mod.S_ISREG(st.st_mode):
        return False
    if stat_mod.S_ISLNK(st.st_mode):
        raise BadPath(f"{what}: {path!r} is a symlink, which the store never follows")
    raise FscacheError(f"{what}: {path!r} is not a regular file or directory")


def _parent_of(path: str) -> str:
    return path.rpartition("/")[0]


def _rename_error(exc: OSError, src: str, dst: str) -> FscacheError:
    """The fscache error for an OSError of ``rename(2)``, or of opening and stamping
    ``src`` just before it: the class :func:`_translate` gives, with a message that
    names both paths and the one at fault. (The names were checked before, under
    the paths' locks: these are races with other programs, or the disk.)"""
    op = _rename_op(src)
    what = f"cannot {op} {dst!r}"
    code = exc.errno
    if code == errno.ENOTDIR:
        return NotADirectory(f"{what}: {src!r} is a directory and {dst!r} is not")
    if code == errno.EISDIR:
        return IsADirectory(f"{what}: {dst!r} is a directory and {src!r} is not")
    if code == errno.ENOTEMPTY:
        return NotEmpty(f"{what}: {dst!r} is a directory that is not empty")
    if code == errno.EEXIST:  # rename(2)'s other spelling of ENOTEMPTY
        return Exists(f"{what}: {dst!r} is a directory that is not empty")
    if code == errno.ENOENT:
        return NotFound(f"{what}: {src!r}, or the directory of {dst!r}, is gone")
    if code == errno.ELOOP:  # O_NOFOLLOW met a symlink put in place of src
        return BadPath(f"{what}: {src!r} is a symlink, which the store never follows")
    if code == errno.EINVAL:
        return BadPath(f"{what}: a directory cannot go inside itself")
    if code == errno.EXDEV:
        return FscacheError(f"{what}: they are on two file systems")
    return _translate(exc, op, dst)  # the other reasons name no path


def _rename_op(src: str) -> str:
    """The ``op`` of a rename of ``src``: with the destination as the path,
    :func:`_translate` and :func:`_after_change` say ``cannot rename SRC to DST:
    <reason>``; used only for errors whose reason names no path (a full disk, an
    I/O error)."""
    return f"rename {src!r} to"


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` (fewer only at the end of the file)."""
    data = os.pread(fd, size, offset)
    if len(data) < size:
        chunks = [data]
        got = len(data)
        while got < size:
            chunk = os.pread(fd, size - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
    return data


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _reserve(fd: int, offset: int, length: int) -> None:
    """Allocate the blocks ``[offset, offset + length)`` first, so a full disk fails
    the write before any byte of the file changes (where the file system can)."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
