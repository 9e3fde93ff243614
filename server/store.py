"""The durable store: the server's directory tree, one plain file per fscache file.

Theory of operation
===================

Layout.  The file ``a/b`` lives at ``<root>/a/b`` and holds exactly its contents:
no side files, no database.  Its version is the file's own ``st_mtime_ns``, so data
and version live in one inode and can never disagree.  The store's private files
use names starting with :data:`fscache.paths.RESERVED_PREFIX`, which clients can
never name; :meth:`Store.listdir` hides them.  The server keeps its own small files
(:meth:`Store.save_state`) in the directory of that very name, written like any file.

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
5. ``fsync``\\s the directory, making the rename itself durable;

and only then returns, i.e. only then may the server acknowledge.  After a SIGKILL
at any instant the kernel still holds (and eventually writes) everything the
process did, so each path holds either its last acknowledged contents or those of a
write that was in flight, each complete; an unfinished write leaves at most a temp
file, which :meth:`Store.recover` deletes at the next start.  After a power loss the
fsyncs give the same result, provided the disk and the file system honour fsync.
Deletes are ``unlink`` followed by an fsync of the directory.

Reads.  :meth:`Store.read` is open, fstat, read on one file descriptor.  The
descriptor pins one inode, and inodes are never written after their rename, so the
version (``fstat().st_mtime_ns``) and the data always belong together, even if a
write replaces the file mid-read.  No lock, no thread: it is the server's hot path.
The open is one ``openat2`` confined by the kernel to the root with no symlink on
the way (Linux 5.6+; see Paths), with ``O_NOATIME`` where the kernel allows it (no
inode write per read).  Closing the descriptor and filling the content cache wait
for :meth:`Store.settle`, which the server calls once the reply is on its way.

Content cache.  Files read again and again are served from memory, validated by
one ``lstat`` per read: an entry holds the data, its version and the key
``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` of the inode it was read
from; a read whose ``lstat`` of ``root/path`` finds a regular file with that exact
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
descriptor that landed at ``root/path`` itself (no symlink anywhere on the way,
checked as for any read), so cached bytes were always read from inside the root,
and a later ``lstat`` that reaches anything but that same inode misses.  (One
difference: if a directory on the path is moved out of the root and replaced by a
symlink to its new place, the unchanged file keeps being served from the cache
until it changes -- bytes already read from inside the root, never new ones.)  The
cache holds at most ``content_cache_bytes`` (data plus a per-entry overhead
estimate), files of at most ``_CACHE_ENTRY_MAX`` bytes, and evicts the oldest
entries first.  A hit is a dict lookup, one ``lstat`` and one tuple compare; all
changes to the cache (filling, dropping, and :meth:`Store.write` and
:meth:`Store.delete` dropping what they replaced, only to free memory sooner) take
a lock that a hit never touches.  Entries are cached for the paths as given, so
an alias path simply has its own entry.

Versions.  A write sets the new file's mtime to
``max(time.time_ns(), old + 1, floor + 1)``, where ``old`` is the version being
replaced (0 if none) and ``floor`` is the last version of the path if this store
deleted it (kept in memory, per path).  So versions strictly increase per path
across writes, across delete-and-recreate, and across restarts (the version is in
the inode), and a version never names two different contents of one path.  On a
file system with coarse timestamps the store reads the stamp back and moves it
forward until it really is larger than ``old`` and ``floor``.  Limits:

* A file created, edited or replaced by another program simply gets a new version
  (the kernel sets its mtime to "now").  A program that *sets* mtimes (``touch -d``,
  ``cp -p``, ``rsync -t``, ``tar -x``) can make a version go backwards or repeat.
* ``floor`` is not persisted: delete, restart, then recreate may reuse an old
  version only if the wall clock now reads earlier than the deleted version did.
  The same holds for floors dropped from memory (see ``_FLOOR_KEEP_NS``).
* One :class:`Store` per root.  Writes and deletes are serialised per path inside
  one instance (so ``if_version`` compare-and-set is atomic there), not between
  processes.
* Versions look like wall-clock times but are only identifiers to compare for
  one path; nothing may use them as time (leases never do).

Paths.  Callers pass paths already normalised by :func:`fscache.paths.normalize`.
A read first tries ``openat2(root_fd, path, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)``
(or, without ``openat2``, opens ``root/path`` and asks ``/proc/self/fd`` where the
descriptor landed): both are free of check-then-open races.  Any path that meets a
symlink, and every write, stat and listdir, is resolved with ``os.path.realpath``
and refused (:class:`~fscache.errors.BadPath`) if it ends up outside the root or on
a reserved name.  Symlinks inside the root that stay inside the root act as aliases
(a write through one replaces the file it points to).  That resolving check is not
proof against another local program swapping directories for symlinks between the
check and the open (the final component is opened with ``O_NOFOLLOW``); the root
is meant to belong to the server alone.

Errors.  Every ``OSError`` becomes an :class:`~fscache.errors.FscacheError`
subclass with a message naming the path.  Only programming errors (wrong argument
types, ``ValueError``/``TypeError``) and ``MemoryError`` escape untranslated.  A
write or delete that raises may or may not have taken effect (e.g. the directory
fsync failed after the rename), as with any storage system; it was not acknowledged.

Threads.  ``write``, ``delete`` and ``recover`` block on disk; the server calls
``write`` and ``delete`` through ``trio.to_thread.run_sync`` and may call them from
several threads at once.  ``read``, ``stat`` and ``listdir`` take no lock; ``read``
and ``settle`` belong to one thread (the server's event loop).  Call ``recover``
only while no write is in flight (it runs in ``__init__``).  POSIX only.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat as stat_mod
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from time import time_ns

from fscache.errors import BadPath, Conflict, FscacheError, IsADirectory, NotFound, TooLarge
from fscache.paths import RESERVED_PREFIX

__all__ = ["TEMP_PREFIX", "Store"]

TEMP_PREFIX = RESERVED_PREFIX + "-tmp-"
"""Name prefix of the store's temp files; anything with it is garbage after a crash."""

# Where the kernel names each open descriptor's file (Linux); None: resolve paths instead.
_PROC_FD = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None
_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: FIFOs
# Reads do not update the file's access time (no inode write per read), where the
# kernel allows it: O_NOATIME needs the file's owner; refused once, it is not asked again.
_NOATIME = getattr(os, "O_NOATIME", 0)
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY

_FLOOR_KEEP_NS = 3600 * 10**9
"""Floors older than this (by the wall clock) may be dropped once there are many."""
_FLOOR_PRUNE_MIN = 10_000
_MAX_STAMP_TRIES = 80

_CACHE_ENTRY_MAX = 1 << 20
"""Files larger than this are never held in the content cache."""
_CACHE_ENTRY_OVERHEAD = 512
"""Bytes charged per cache entry on top of its data (key, path, dict slot): rough."""
_RACY_NS = 2 * 10**9
"""A file is cached only if its ctime is at least this much older than the wall clock."""

_Key = tuple[int, int, int, int, int]


class _Cached:
    """A content-cache entry: the file's data and version, and the key that validates it."""

    __slots__ = ("data", "key", "version")

    def __init__(self, key: _Key, data: bytes) -> None:
        self.key = key
        self.version = key[3]  # st_mtime_ns
        self.data = data


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
    ) -> None:
        if max_file_size < 0:
            raise FscacheError(f"max_file_size must be >= 0, not {max_file_size}")
        if content_cache_bytes < 0:
            raise FscacheError(f"content_cache_bytes must be >= 0, not {content_cache_bytes}")
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
        self.root: str = real
        self.max_file_size: int = max_file_size
        self._prefix = real if real.endswith(os.sep) else real + os.sep
        self._mutex = threading.Lock()  # guards _locks and _floors
        self._locks: dict[str, _PathLock] = {}
        self._floors: dict[str, int] = {}
        self._prune_at = _FLOOR_PRUNE_MIN
        self.content_cache_bytes: int = content_cache_bytes
        self.content_hits: int = 0
        """Reads served from the content cache (approximate if ``read`` runs in threads)."""
        self._content: OrderedDict[str, _Cached] = OrderedDict()  # oldest first
        self._content_bytes = 0  # data + overhead of the entries in _content
        self._content_lock = threading.Lock()  # guards every change to the two above
        # Largest cacheable file; negative (none) when the cache is off or too small.
        self._content_entry_max = min(
            _CACHE_ENTRY_MAX, max_file_size, content_cache_bytes - _CACHE_ENTRY_OVERHEAD
        )
        self._time_ns: Callable[[], int] = time_ns  # the wall clock (a seam for tests)
        # Reads whose descriptor is still open and whose data is not yet cached: settle()
        # (fd, path, fstat, data, when the open began or None if not cacheable)
        self._unsettled: list[tuple[int, str, os.stat_result, bytes, int | None]] = []
        self._openat2: Callable[[str, int], int] | None = _beneath_opener(real)
        self._read_flags = _READ_FLAGS | _NOATIME  # until O_NOATIME is refused
        self.recover()

    # ------------------------------------------------------------------ public

    def recover(self) -> int:
        """Delete temp files left by a crash anywhere under the root (the state
        directory too); return how many.

        Only safe while no write is in flight (a live write's temp file would go too).
        """
        removed = 0
        for dirpath, _, filenames in os.walk(self.root):
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
            # Only paths whose descriptor landed at exactly root/path get entries, so
            # ``path`` is plainly relative and canonical here: no check needed.
            try:
                st = os.stat(self._prefix + path, follow_symlinks=False)
            except OSError:
                pass
            else:
                if _key(st) == entry.key and stat_mod.S_ISREG(st.st_mode):
                    self.content_hits += 1
                    return entry.version, entry.data
            self._uncache(path, entry)
        started = self._time_ns()  # before the open: see "Content cache" above
        fd, landed_plainly = self._open_for_read(path)
        try:
            st = os.fstat(fd)
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
        self._unsettled.append((fd, path, st, data, started if landed_plainly else None))
        return st.st_mtime_ns, data

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
                started is not None  # it landed at root/path itself
                and len(data) <= self._content_entry_max
                and st.st_ctime_ns <= started - _RACY_NS
                and len(data) == st.st_size
            ):
                self._cache(path, _Cached(_key(st), data))

    def stat(self, path: str) -> tuple[int, int, bool]:
        """``(version, size, is_dir)``; a directory's version is its mtime, its size 0."""
        full = self._resolve(path)
        try:
            st = os.stat(full)
        except OSError as exc:
            raise _translate(exc, "stat", path) from None
        if stat_mod.S_ISDIR(st.st_mode):
            return st.st_mtime_ns, 0, True
        if stat_mod.S_ISREG(st.st_mode):
            return st.st_mtime_ns, st.st_size, False
        raise FscacheError(f"cannot stat {path!r}: not a regular file or directory")

    def write(self, path: str, data: bytes, if_version: int | None = None) -> int:
        """Durably replace the file at ``path`` with ``data``; return the new version.

        With ``if_version`` set, write only if the current version equals it (an
        absent file has version 0), else raise :class:`Conflict` and change nothing.
        Returns only after data, version and directory entry are on disk.
        """
        if len(data) > self.max_file_size:
            raise TooLarge(
                f"cannot write {path!r}: {len(data)} bytes is more than the "
                f"maximum file size of {self.max_file_size}"
            )
        full = self._resolve(path)
        if full == self.root:
            raise IsADirectory("cannot write the root: it is a directory")
        with self._locked(full):
            old = self._version_for_write(full, path)
            if if_version is not None and if_version != old:
                raise Conflict(f"cannot write {path!r}: its version is {old}, not {if_version}")
            with self._mutex:
                floor = self._floors.get(full, 0)
            tmp, fd = self._open_temp(os.path.dirname(full), path)
            try:
                version = _replace_durably(tmp, fd, full, data, minimum=max(old, floor) + 1)
            except OSError as exc:
                raise _translate(exc, "write", path) from None
            finally:
                self._forget(path, full)
            with self._mutex:
                self._floors.pop(full, None)
            return version

    def delete(self, path: str, if_version: int | None = None) -> None:
        """Durably remove the file at ``path``.

        :class:`NotFound` if it does not exist (whatever ``if_version`` says),
        :class:`Conflict` if ``if_version`` is set and differs from its version,
        :class:`IsADirectory` for a directory (directories are never removed).
        """
        full = self._resolve(path)
        if full == self.root:
            raise IsADirectory("cannot delete the root: it is a directory")
        with self._locked(full):
            try:
                st = os.stat(full)
            except OSError as exc:
                raise _translate(exc, "delete", path) from None
            _regular_file_version(st, "delete", path)
            if if_version is not None and if_version != st.st_mtime_ns:
                raise Conflict(
                    f"cannot delete {path!r}: its version is {st.st_mtime_ns}, not {if_version}"
                )
            try:
                os.unlink(full)
            except OSError as exc:
                raise _translate(exc, "delete", path) from None
            self._forget(path, full)
            self._raise_floor(full, st.st_mtime_ns)
            try:
                _fsync_dir(os.path.dirname(full))
            except OSError as exc:
                raise _translate(exc, "delete", path) from None

    def save_state(self, name: str, data: bytes) -> None:
        """Durably write the server's own file ``name`` in the state directory
        (``<root>/.fscache``, a reserved name no client can reach), as any write is."""
        state = os.path.join(self.root, RESERVED_PREFIX)
        tmp, fd = self._open_temp(state, name)
        try:
            _replace_durably(tmp, fd, os.path.join(state, name), data, minimum=0)
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

    def listdir(self, path: str) -> list[str]:
        """Sorted names in the directory ``path`` (``""`` is the root); dirs end in ``/``.

        Hidden: the store's own files, names that are not valid UTF-8, symlinks that
        leave the root, dangling symlinks and special files (FIFOs, sockets, devices).
        """
        full = self._resolve(path)
        names: list[str] = []
        try:
            with os.scandir(full) as entries:
                for entry in entries:
                    name = entry.name
                    if name.startswith(RESERVED_PREFIX) or not _is_utf8(name):
                        continue
                    try:
                        if entry.is_symlink() and not self._inside(os.path.realpath(entry.path)):
                            continue
                        if entry.is_dir():
                            names.append(name + "/")
                        elif entry.is_file():
                            names.append(name)
                    except OSError:  # vanished while we looked
                        continue
        except NotADirectoryError:
            if os.path.isfile(full):
                raise IsADirectory(f"cannot list {path!r}: it is a file") from None
            raise NotFound(f"cannot list {path!r}: it does not exist") from None
        except OSError as exc:
            raise _translate(exc, "list", path) from None
        names.sort()
        return names

    # ----------------------------------------------------------------- helpers

    def _open_for_read(self, path: str) -> tuple[int, bool]:
        """An open descriptor for ``path``, known to lie under the root, and whether
        it is known to be ``root/path`` itself (no symlink on the way: cacheable).

        The hot path is one ``openat2`` that the kernel itself confines to the root
        with no symlink on the way (Linux 5.6+); else ``root/path`` is opened
        directly and the kernel asked where the descriptor landed
        (``/proc/self/fd``). Either is free of check-then-open races. Only a path
        that crosses a symlink takes the slow, resolving way."""
        if _plainly_relative(path):
            if self._openat2 is not None:
                try:
                    return self._open_without_atime(self._openat2, path), True
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.EXDEV, errno.ENOSYS, errno.EPERM):
                        raise _translate(exc, "read", path) from None
                    if exc.errno in (errno.ENOSYS, errno.EPERM):  # not here: never again
                        self._openat2 = None
            elif _PROC_FD is not None:
                expected = self._prefix + path
                try:
                    fd = self._open_without_atime(os.open, expected)
                except OSError as exc:
                    if exc.errno != errno.ELOOP:  # ELOOP: the last component is a symlink
                        raise _translate(exc, "read", path) from None
                else:
                    try:
                        landed = os.readlink(f"{_PROC_FD}/{fd}")
                    except OSError:
                        landed = None
                    if landed == expected:
                        return fd, True
                    os.close(fd)  # a symlink on the way: judge it by the slow path
        full = self._resolve(path)
        try:
            return self._open_without_atime(os.open, full), full == self._prefix + path
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
        """Hold ``entry`` for ``path``, evicting the oldest entries to stay in budget."""
        cost = len(entry.data) + _CACHE_ENTRY_OVERHEAD
        with self._content_lock:
            old = self._content.pop(path, None)
            if old is not None:
                self._content_bytes -= len(old.data) + _CACHE_ENTRY_OVERHEAD
            budget = self.content_cache_bytes - cost
            while self._content and self._content_bytes > budget:
                _, victim = self._content.popitem(last=False)
                self._content_bytes -= len(victim.data) + _CACHE_ENTRY_OVERHEAD
            self._content[path] = entry
            self._content_bytes += cost

    def _uncache(self, path: str, entry: _Cached) -> None:
        """Drop ``entry`` if it still is the one held for ``path``."""
        with self._content_lock:
            if self._content.get(path) is entry:
                del self._content[path]
                self._content_bytes -= len(entry.data) + _CACHE_ENTRY_OVERHEAD

    def _forget(self, path: str, full: str) -> None:
        """Drop the entries for a file we replaced or removed (to free memory early:
        validation alone would miss them).  ``full`` covers ``path`` being an alias."""
        with self._content_lock:
            for key in {path, full[len(self._prefix) :]}:
                entry = self._content.pop(key, None)
                if entry is not None:
                    self._content_bytes -= len(entry.data) + _CACHE_ENTRY_OVERHEAD

    def _inside(self, full: str) -> bool:
        return full == self.root or full.startswith(self._prefix)

    def _resolve(self, path: str) -> str:
        """The real absolute path of ``path`` under the root, or :class:`BadPath`."""
        try:
            full = os.path.realpath(os.path.join(self.root, path))
        except (OSError, ValueError) as exc:  # e.g. an embedded NUL byte
            raise BadPath(f"bad path {path!r}: {exc}") from None
        if not self._inside(full):
            raise BadPath(f"path {path!r} leads outside the store's root")
        if RESERVED_PREFIX in full[len(self._prefix) :] and any(
            part.startswith(RESERVED_PREFIX) for part in full[len(self._prefix) :].split(os.sep)
        ):
            raise BadPath(f"path {path!r} leads to a name reserved for the store")
        return full

    @contextmanager
    def _locked(self, full: str) -> Iterator[None]:
        """Serialise writes and deletes of one path (compare-and-set must be atomic)."""
        with self._mutex:
            entry = self._locks.get(full)
            if entry is None:
                entry = self._locks[full] = _PathLock()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._mutex:
                entry.users -= 1
                if entry.users == 0:
                    del self._locks[full]

    def _version_for_write(self, full: str, path: str) -> int:
        """The version ``write`` replaces: 0 if absent; refuse directories."""
        try:
            st = os.stat(full)
        except FileNotFoundError:
            return 0
        except NotADirectoryError:
            raise IsADirectory(
                f"cannot write {path!r}: one of its parent directories is a file"
            ) from None
        except OSError as exc:
            raise _translate(exc, "write", path) from None
        return _regular_file_version(st, "write", path)

    def _open_temp(self, parent: str, path: str) -> tuple[str, int]:
        """Create a fresh temp file in ``parent`` (making directories as needed)."""
        name = os.path.join(parent, TEMP_PREFIX + secrets.token_hex(8))
        try:
            try:
                return name, os.open(name, _TEMP_FLAGS, 0o666)
            except FileNotFoundError:
                self._make_dirs(parent, path)
                return name, os.open(name, _TEMP_FLAGS, 0o666)
        except OSError as exc:
            raise _translate(exc, "write", path) from None

    def _make_dirs(self, parent: str, path: str) -> None:
        """Create ``parent`` and its missing ancestors below the root, durably."""
        current = self.root
        for part in parent[len(self._prefix) :].split(os.sep):
            child = os.path.join(current, part)
            try:
                os.mkdir(child, 0o777)
            except FileExistsError:
                if not os.path.isdir(child):
                    raise IsADirectory(
                        f"cannot write {path!r}: "
                        f"{child[len(self._prefix) :]!r} is a file, not a directory"
                    ) from None
            else:
                _fsync_dir(current)  # the new entry in ``current`` is durable
            current = child

    def _raise_floor(self, full: str, version: int) -> None:
        with self._mutex:
            if version > self._floors.get(full, 0):
                self._floors[full] = version
            if len(self._floors) > self._prune_at:
                cutoff = time_ns() - _FLOOR_KEEP_NS
                self._floors = {k: v for k, v in self._floors.items() if v >= cutoff}
                self._prune_at = max(_FLOOR_PRUNE_MIN, 2 * len(self._floors))


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

        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long

    class OpenHow(ctypes.Structure):  # struct open_how (linux/openat2.h)
        _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                    ("resolve", ctypes.c_uint64))  # fmt: skip

    resolve = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS
    hows = {  # by open flags: the two the store uses, built once
        flags: OpenHow(flags, 0, resolve) for flags in (_READ_FLAGS, _READ_FLAGS | _NOATIME)
    }
    refs = {flags: ctypes.byref(how) for flags, how in hows.items()}
    how_size = ctypes.sizeof(OpenHow)
    root_fd = os.open(root, _DIR_FLAGS)  # held for the store's life, like its root
    get_errno = ctypes.get_errno

    def openat2(path: str, flags: int) -> int:
        fd: int = syscall(_SYS_OPENAT2, root_fd, path.encode(), refs[flags], how_size)
        if fd < 0:
            code = get_errno()
            raise OSError(code, os.strerror(code), path)  # EPERM makes a PermissionError
        return fd

    weakref.finalize(openat2, os.close, root_fd)
    return openat2


def _plainly_relative(path: str) -> bool:
    """Cheap test that ``path`` may take the fast read path (the slow one judges the rest)."""
    return (
        path[:1] not in ("", "/")
        and ".." not in path
        and "\0" not in path
        and RESERVED_PREFIX not in path
    )


def _key(st: os.stat_result) -> _Key:
    """What a content-cache entry is validated by (see "Content cache" above)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _regular_file_version(st: os.stat_result, op: str, path: str) -> int:
    """The version of a regular file; IsADirectory or FscacheError for anything else."""
    if stat_mod.S_ISDIR(st.st_mode):
        raise IsADirectory(f"cannot {op} {path!r}: it is a directory")
    if not stat_mod.S_ISREG(st.st_mode):
        raise FscacheError(f"cannot {op} {path!r}: not a regular file")
    return st.st_mtime_ns


def _translate(exc: OSError, op: str, path: str) -> FscacheError:
    """The fscache error for an OSError raised while doing ``op`` on ``path``."""
    code = exc.errno
    if code in (errno.ENOENT, errno.ENOTDIR):
        return NotFound(f"cannot {op} {path!r}: it does not exist")
    if code == errno.EISDIR:
        return IsADirectory(f"cannot {op} {path!r}: it is a directory")
    if code in (errno.ELOOP, errno.ENAMETOOLONG):
        return BadPath(f"cannot {op} {path!r}: {exc.strerror}")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return FscacheError(f"cannot {op} {path!r}: the store's disk is full")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return FscacheError(f"cannot {op} {path!r}: the store may not ({exc.strerror})")
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


def _replace_durably(tmp: str, fd: int, full: str, data: bytes, *, minimum: int) -> int:
    """Steps 2-5 of a write (see "Writes" above): ``data`` into the temp file ``tmp``
    open as ``fd`` (closed here), a version stamp >= ``minimum``, fsync, rename onto
    ``full``, fsync of the directory. Returns the version; raises OSError, and then
    leaves no temp file behind."""
    try:
        try:
            _write_all(fd, data)
            version = _stamp(fd, minimum)
            os.fsync(fd)  # data and inode (the new mtime) in one go
        finally:
            os.close(fd)
        os.replace(tmp, full)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    _fsync_dir(os.path.dirname(full))
    return version


def _fsync_dir(path: str) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    with suppress(OSError):  # if it stays, recover() removes it at the next start
        os.unlink(path)


def _is_utf8(name: str) -> bool:
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
