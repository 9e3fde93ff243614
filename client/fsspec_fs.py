"""fsspec integration: ``fsspec.open("fscache://127.0.0.1:7710/docs/a.txt")``.

Registered under the ``fscache`` protocol through the ``fsspec.specs`` entry point
(``pip install 'fscache[fsspec]'``). Every instance wraps one blocking client and
uses only its public operations, so what the client caches under a lease (files,
their chunks, directory listings) is answered from the cache here too.

Theory of operation
===================

Names.  As fsspec's conventions say: paths without the protocol and without
leading or trailing ``/`` (``"docs/a.txt"``; the root is ``""``), and every
listing entry is a dict with ``name``, ``size``, ``type`` (``"file"`` or
``"directory"``), the entry's fscache ``version`` and ``mtime`` (the version, the
later of the file's mtime and ctime on the server, in seconds: close to what
LocalFileSystem gives). A path is a ``str`` or an ``os.PathLike`` (a list of them
where fsspec takes several); anything else (``None``, a number, ``bytes``) is a
``TypeError``, never a file named after it.
A URL names its server (``fscache://host:port/path``); an instance refuses
(``ValueError``) a URL that names another server than its own, as written (so
``localhost`` is not ``127.0.0.1``; the spellings of one IPv6 address are one
server), and :meth:`FscacheFileSystem.unstrip_protocol` puts its own back, so a
name it hands out opens the same file again.  It writes an IPv6 address out
without ``::`` (``fscache://[0:0:0:0:0:0:0:1]:7710/a`` for ``::1``): fsspec cuts
URLs at ``::``, its chaining separator.  The instance ``fsspec.open(url)`` makes
is on the URL's server (``url_server``); a ``host`` or ``port`` given with the URL
(``fsspec.open(url, port=...)``) must name that server too, else ``ValueError``.

Freshness of listings.  fsspec's own listing cache is not used: the client's
listings are leased, so the *names* in a listing are never stale (a create,
delete or rename in a directory waits until every cached listing of it is
dropped).  The sizes and versions in ``ls(detail=True)``, ``find(detail=True)``
and ``walk(detail=True)`` are as of the listing: the listing's lease covers the
name set, and a file rewritten in place by another client does not touch it, so for
up to a lease term a cached listing may show the size and version the file had
when it was listed.  ``info``, ``size``, ``modified`` and opening a file are one
``stat`` each, answered from the cache only while the file itself is leased, so
they are exact; so is ``du``, as fsspec's calls ``info`` for each file it finds.
Making every listed size exact would cost a ``stat`` per file whose data is not
leased, one round trip each: listing a directory of 1,000 such files took
12-14 ms from the cached listing and 0.55-0.81 s with a ``stat`` per file
(loopback, the 2-core test machine at load average 4-5), so it is not done: call
``info`` for the files whose size must be exact.

Directories are the server's real directories.  ``mkdir``, ``makedirs`` and
``rmdir`` create and remove them (``create_parents`` and ``exist_ok`` as in
fsspec's local file system); an empty directory exists and is listed.  ``ls`` is
one ``scandir`` (one request per directory, or none while its listing is leased:
names, types, sizes and versions together); fsspec's ``walk``, ``find`` and
``glob`` are built on it unchanged, and its ``du`` on ``find`` and an ``info`` per
file.  ``info`` is one ``stat``.
``rm(..., recursive=True)`` deletes the files and then the emptied directories,
deepest first.

Moves.  ``mv`` is the server's atomic rename, one per source: a file or a whole
tree changes its name at once, in every cache.  Like the shell's ``mv``, a source
moved onto an existing directory goes inside it under its own name; several
sources (a list or a glob) go inside ``path2``, and so does one source whose
``path2`` ends in ``/`` (fsspec's convention, as for ``cp``): that directory is made
if it is missing.  A directory moves whole, so ``recursive`` and ``maxdepth``
change nothing.  The destination's parent must exist.  ``cp_file`` streams the
file through a temporary file (the server has no copy).

Files.  ``open(path, "rb")`` is an fsspec buffered file whose ranges are ranged
reads (:meth:`FscacheFileSystem._read_range`, the one place that reads part of
a file); the client fetches only the chunks a range covers and caches them under
the file's lease.  An open file is pinned to the version it was opened at: after
each ranged fetch it checks the file's ``stat`` (no request while the file is leased,
which the fetch has just made it) and raises :class:`FileExpired` if the version
has changed or the file is gone, so its reads never mix two versions.  Versions
are times in ns from the files' inodes and only increase, so a version seen after a fetch
that matches the one at open means the fetch read that version.  (A file set back
in time behind the server's back, by ``touch -d`` say, could defeat that.)
``cat_file(path, start, end)`` is one ranged read, of one version, and needs no
pin; a limit counted back from the end (negative) is counted from the size a
``stat`` gives, and the version is checked after the read as an open file's is:
if it changed, the read is made again, and a small file that keeps changing is read
whole (:meth:`FscacheFileSystem._read_counted_back`).
``head`` and ``tail`` are such reads too, not an open file, so another client
rewriting the file makes them read the new version, not raise ``FileExpired``.
``readline`` (and so ``for line in f``) finds lines in a piece of 64 KiB it reads
ahead, not in a block read for every line as fsspec's own does.
``"wb"`` keeps up to a block in memory and spools the rest to an anonymous
temporary file; on close the whole is uploaded in parts and replaces the file
atomically (readers see the old or the new contents, never a mix).  A ``with
fs.open(path, "wb") as f:`` whose body raises writes nothing, as if it had been
discarded: the file keeps its old contents, and with ``autocommit=False`` no
temporary name is left (fsspec's own file publishes what was written).  fsspec's
``with fsspec.open(url, "wb")`` is fsspec's ``OpenFile``, which closes the file
however its body ended and does not say how: there the part written is published,
so use ``fs.open`` or a transaction where that matters.  ``"xb"`` does
the same as a compare-and-set against version 0 (an absent file), so an exclusive
create that loses a race raises ``FileExistsError`` instead of overwriting.
``get_file`` streams into the local file (``read_into``); ``put_file`` streams
from it.  Every write, small or an upload, creates missing parent directories on
the server.

Transactions.  Inside ``with fs.transaction:`` (and for a file opened with
``autocommit=False``) a write does not touch its target: it is written whole to a
hidden name beside it, ``.fsspec-tmp-<uuid>.<name>`` (never one of the store's
reserved ``.fscache`` names; the uuid keeps writers apart), and ``commit`` renames
that over the target (the server's rename is atomic: readers see the old file or
the new one), ``discard`` deletes it.  The transaction commits its files when its
body ends without an exception and discards them otherwise, one rename at a time
(a reader may see some of them before the others); ``pipe_file``, ``put_file``
and ``cp_file`` in a transaction are deferred the same way.  Moves, deletes and
directories are not deferred (nor are they in fsspec's local file system).
While deferred, the temporary name is visible in listings, and the parent
directories a write made stay after a discard.  ``"xb"`` checks at open and
again at commit that the target does not exist, but the server's rename has no
"do not replace" form, so a file created between that check and the rename is
replaced: an exclusive create in a transaction is not atomic (outside one it is).

Errors.  One boundary, :func:`_os_errors`, turns the client's errors into the
exceptions fsspec's callers expect (the table :data:`_OS_ERRORS`), the client's
error kept as ``__cause__``: ``OSError`` subclasses for what is wrong with a
file, ``PermissionError`` for refused credentials, ``ConnectionError`` (or
``TimeoutError``, when waiting ran out) for a server out of reach, and
``ValueError`` for a path the server cannot take (as LocalFileSystem raises for
one with a NUL).  The server says ``IsADirectory`` for a write whose path is a
directory and for one below a file; :meth:`FscacheFileSystem._write_now` tells
the two apart.  ``exists`` is False only for a path that is missing (or below a
file); any other error is raised.  Where fsspec's own file systems differ:
``rm`` of a directory without ``recursive`` raises ``IsADirectoryError``, as
``rm_file`` and ``os.remove`` do (LocalFileSystem's ``rm`` raises ``ValueError``,
MemoryFileSystem's removes an empty one); ``info`` of a path below a file raises
``FileNotFoundError``, as MemoryFileSystem's does (LocalFileSystem's
``NotADirectoryError`` is no ``FileNotFoundError``, which callers catch, fsspec's
own among them, and telling the two apart would cost a request per missing path);
and ``cat_file`` with ``start`` past ``end`` gives ``b""``, as the slice that
fsspec says its limits are (LocalFileSystem's raises ``ValueError``).

The client.  fsspec keeps its instances (one per set of arguments, per process,
per thread) and hands the same one back for as long as the process lives, so an
instance must outlive its client: :attr:`FscacheFileSystem.client` connects a
new blocking client (same address, TLS context and options) whenever the one it
holds is closed, by ``fs.client.close()`` or because this process is a child
forked after it was made (in the child the blocking client closes every client
of the parent: their loop threads did not cross the fork).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import io
import ipaddress
import operator
import os
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import IO, Any

import trio
from fsspec import AbstractFileSystem
from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.spec import AbstractBufferedFile
from fsspec.utils import isfilelike

from fscache import errors
from fscache.cache import DirEntry
from fscache.client.blocking import BlockingClient, connect
from fscache.client.client import DEFAULT_PORT, READ_ATTEMPTS, Source, parse_address
from fscache.errors import FscacheError
from fscache.net import is_ipv6, shown_address
from fscache.paths import MAX_SEGMENT_BYTES
from fscache.settings import CHUNK_SIZE, DEFAULT_HOST, BadSetting

PROTOCOL = "fscache"
TEMP_PREFIX = ".fsspec-tmp-"  # a deferred write's name: this, a uuid, ".", the target's name
LINE_PIECE = 64 * 1024  # bytes an open file's readline reads at a time (see _File.readline)

Info = dict[str, Any]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class FileExpired(OSError):
    """The file open for reading changed (or went away) on the server after it was
    opened, so reading on would mix two versions (or a read of one version could
    not be had: the file changed under every attempt). s3fs raises an exception of this
    name when an object changes under an open file; fsspec itself defines none."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.ESTALE, why, path)


class _Default:
    """A host or port not given: its default, unless a URL names the server."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


_DEFAULT_HOST: Any = _Default(DEFAULT_HOST)
_DEFAULT_PORT: Any = _Default(DEFAULT_PORT)


# Held while an instance connects a new client. A forked child gets a new one: a
# thread of the parent may have held it at the fork.
_reconnecting = threading.Lock()


def _after_fork_in_child() -> None:
    global _reconnecting
    _reconnecting = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class FscacheFileSystem(AbstractFileSystem):  # type: ignore[misc]
    protocol = PROTOCOL
    root_marker = ""

    def __init__(
        self,
        host: str = _DEFAULT_HOST,
        port: int | str = _DEFAULT_PORT,
        *,
        url_server: str | None = None,
        **kwargs: Any,
    ) -> None:
        """A file system on the server at ``host`` (a name or an address; an IPv6 one
        may come in brackets) and ``port`` (an int, or a string of digits), or the one
        a URL names: fsspec passes it as ``url_server`` (``HOST:PORT``, see
        :meth:`_get_kwargs_from_urls`), and a ``host`` or ``port`` given as well must
        name the same server (``ValueError``). :class:`~fscache.BadSetting` names a
        host or port that is not one."""
        self._client_options = {
            k: kwargs.pop(k) for k in ("client_id", "ssl_context") if k in kwargs
        }
        super().__init__(**kwargs)
        self.host, self.port = _server_for(host, port, url_server)
        self.netloc = shown_address(self.host, self.port)
        self._client = self._connect()
        # fsspec calls _strip_protocol on the class too, before any instance exists
        # (only to strip); an instance's own also checks the server a URL names.
        self._strip_protocol = self._strip_own_url  # type: ignore[method-assign]

    # ------------------------------------------------------------ the client
    @property
    def client(self) -> BlockingClient:
        """The blocking client; a new one if the one held is closed (see "The
        client" above)."""
        client = self._client
        if client.closed:
            with _reconnecting:
                client = self._client
                if client.closed:
                    client = self._client = self._connect()
        return client

    def _connect(self) -> BlockingClient:
        with _os_errors(self.netloc):
            return connect(self.netloc, **self._client_options)

    # ------------------------------------------------------------ URLs
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = _path_text(path)
        if text.startswith(PROTOCOL + "://"):
            text = text[len(PROTOCOL) + 3 :]
            text = text.partition("/")[2]  # drop host:port
        return text.strip("/")

    def _strip_own_url(self, path: Any) -> Any:
        """:meth:`_strip_protocol` for this instance: ``ValueError`` for a URL that
        names another server than this instance's."""
        if isinstance(path, list):
            return [self._strip_own_url(p) for p in path]
        text = _path_text(path)
        server = _server_of(text)
        if server is not None and server != (self.host, self.port):
            raise ValueError(
                f"{text!r} names the server {shown_address(*server)}, but this file"
                f" system is on {self.netloc}"
            )
        return type(self)._strip_protocol(text)

    def expand_path(self, path: Any, *args: Any, **kwargs: Any) -> list[str]:
        """fsspec's, but a ``path`` that is neither a path nor a collection of paths
        is a ``TypeError`` here: fsspec would iterate over it (``None`` is "not
        iterable", the bytes of ``b"a/b"`` become numbers)."""
        if not isinstance(path, str | os.PathLike) and (
            isinstance(path, bytes | bytearray) or not isinstance(path, Iterable)
        ):
            raise TypeError(
                "path must be a string, an os.PathLike or a list of them,"
                f" not {type(path).__name__}"
            )
        return super().expand_path(path, *args, **kwargs)  # type: ignore[no-any-return]

    def unstrip_protocol(self, name: str) -> str:
        """``name`` as a URL naming this instance's server, so that it opens the
        same file again (``fsspec.open_files(...)[0].full_name``); an IPv6 address
        written out without ``::`` (see :func:`_url_host`)."""
        host = _url_host(self.host)
        return f"{PROTOCOL}://{shown_address(host, self.port)}/{self._strip_protocol(name)}"

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        """The server a URL names, as ``url_server``. Not as ``host`` and ``port``:
        fsspec merges what this gives with the caller's own keyword arguments in one
        ``dict()``, so ``fsspec.open(url, port=...)`` with a port other than the URL's
        would be a ``TypeError`` ("got multiple values for keyword argument") before
        this file system could say what is wrong. ``__init__`` checks that the two
        agree."""
        server = _server_of(path)
        return {} if server is None else {"url_server": shown_address(*server)}

    # ------------------------------------------------------------ listing
    def info(self, path: str, **kwargs: Any) -> Info:
        path = self._strip_protocol(path)
        with _os_errors(path):
            st = self.client.stat(path)
        return _info(path, st.is_dir, st.size, st.version)

    def _info_if_there(self, path: str) -> Info | None:
        """``info(path)``, or None for a path that is missing (or below a file). Any
        other error (the server out of reach, access refused) is raised: it says
        nothing about the path."""
        try:
            return self.info(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def exists(self, path: str, **kwargs: Any) -> bool:
        """Whether ``path`` exists (errors: :meth:`_info_if_there`)."""
        return self._info_if_there(path) is not None

    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory (errors: :meth:`_info_if_there`)."""
        info = self._info_if_there(path)
        return info is not None and info["type"] == "directory"

    def isfile(self, path: str) -> bool:
        """Whether ``path`` is a file (errors: :meth:`_info_if_there`)."""
        info = self._info_if_there(path)
        return info is not None and info["type"] == "file"

    def modified(self, path: str) -> datetime.datetime:
        """When ``path`` last changed, in UTC: its version, the later of its
        mtime and ctime on the server (to the microsecond)."""
        return _EPOCH + datetime.timedelta(microseconds=self.info(path)["version"] // 1000)

    def created(self, path: str) -> datetime.datetime:
        """Not known: the server keeps no creation time (a file's one time is its
        version, :meth:`modified`)."""
        raise NotImplementedError("fscache keeps no creation time; see modified()")

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        try:
            with _os_errors(path):
                entries = self.client.scandir(path)
        except NotADirectoryError:  # a file lists itself
            return [self.info(path) if detail else path]
        if not detail:
            return [_join(path, e.name) for e in entries]
        return [_entry(path, e) for e in entries]

    # ------------------------------------------------------------ directories
    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if create_parents:
            self.makedirs(path, exist_ok=False)
            return
        with _os_errors(path):
            self.client.mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        try:
            if not path:
                raise FileExistsError(errno.EEXIST, "the root exists", path)
            try:
                with _os_errors(path):
                    self.client.mkdir(path)
            except FileNotFoundError:  # a parent is missing (or is a file)
                self._make_parents(path)
                with _os_errors(path):
                    self.client.mkdir(path)
        except FileExistsError:
            if not exist_ok or not self.isdir(path):
                raise

    def _make_parents(self, path: str) -> None:
        """Make every missing directory above ``path``: ``FileNotFoundError`` for a
        path at the root (it has none to make), ``NotADirectoryError`` if one is a
        file."""
        above = self._parent(path)
        if not above:
            raise FileNotFoundError(errno.ENOENT, "it does not exist", path)
        try:
            self.makedirs(above, exist_ok=True)
        except FileExistsError:
            raise NotADirectoryError(errno.ENOTDIR, "a parent is a file", path) from None

    def rmdir(self, path: str) -> None:
        path = self._strip_protocol(path)
        with _os_errors(path):
            self.client.rmdir(path)

    # ------------------------------------------------------------ deleting
    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)
        with _os_errors(path):
            self.client.delete(path)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        for name in reversed(self.expand_path(path, recursive=recursive, maxdepth=maxdepth)):
            try:
                self.rm_file(name)
            except IsADirectoryError as exc:
                if not recursive:
                    exc.strerror = f"{exc.strerror} (rm(path, recursive=True) deletes one)"
                    raise
                self.rmdir(name)  # emptied already: its entries sort after it

    # ------------------------------------------------------------ moving and copying
    def mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """One atomic rename per source (see "Moves" above)."""
        if path1 == path2:
            return
        if isinstance(path1, list) and isinstance(path2, list):
            pairs = list(zip(self._strip_protocol(path1), self._strip_protocol(path2), strict=True))
        else:
            target = self._strip_protocol(path2)
            sources = self.expand_path(path1)
            one = (
                isinstance(path1, str)
                and len(sources) == 1
                and sources[0] == self._strip_protocol(path1)
            )
            into_new = isinstance(path2, str) and path2.endswith("/")  # a directory, as for cp
            if one and not into_new and not self.isdir(target):
                self._mv_file(sources[0], target)
                return
            if not one or into_new:
                try:
                    self.makedirs(target, exist_ok=True)
                except FileExistsError:  # a file
                    raise NotADirectoryError(errno.ENOTDIR, "it is a file", target) from None
            pairs = [(source, _join(target, source.rpartition("/")[2])) for source in sources]
        for source, destination in pairs:
            self._mv_file(source, destination)

    def _mv_file(self, path1: str, path2: str) -> None:
        """Rename ``path1`` to ``path2`` atomically (POSIX ``rename``)."""
        with _os_errors(path1, path2):
            self.client.rename(path1, path2)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        with tempfile.SpooledTemporaryFile(max_size=CHUNK_SIZE) as spool:
            try:
                with _read_errors(path1):
                    self.client.read_into(path1, spool)
            except IsADirectoryError:
                self.makedirs(path2, exist_ok=True)
                return
            spool.seek(0)
            self._write(path2, spool, exclusive=False)

    # ------------------------------------------------------------ reading and writing
    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes ``start`` up to ``end`` of one version of ``path``, the limits as a
        slice's: a limit counted back from the end (negative) is counted from the
        size of the version read (see :meth:`_read_counted_back`)."""
        path = self._strip_protocol(path)
        if (start or 0) < 0 or (end or 0) < 0:
            return self._read_counted_back(path, start, end)
        return self._read_range(path, start or 0, end)

    def head(self, path: str, size: int = 1024) -> bytes:
        """The first ``size`` bytes of one version of ``path`` (all of it if ``size``
        is negative, as ``read(-1)``): one ranged read, as :meth:`cat_file`'s. fsspec's
        own opens the file, pinned to one version, and so raises :class:`FileExpired`
        when another client rewrites it between the open and the read."""
        size = operator.index(size)
        return self.cat_file(path, 0, size if size >= 0 else None)

    def tail(self, path: str, size: int = 1024) -> bytes:
        """The last ``size`` bytes of one version of ``path`` (nothing if ``size`` is
        not positive, as fsspec's own): :meth:`cat_file` counted back from the end,
        for the reason :meth:`head` gives."""
        size = operator.index(size)
        return self.cat_file(path, -size) if size > 0 else self.cat_file(path, 0, 0)

    def _read_counted_back(self, path: str, start: int | None, end: int | None) -> bytes:
        """``cat_file`` with a limit counted back from the end: the size (and
        version) from ``info``, one ranged read, then ``info`` again. The same
        version after the read means the read was of it (versions only increase, as
        for an open file's reads); another one means the file changed in between, so
        the bytes may be the end of no version: read again, counting from the size
        just seen. A file that changed under each of :data:`READ_ATTEMPTS` reads is
        read whole if it was small (one chunk: one request, of one version, its
        limits counted from what came), else that is :class:`FileExpired`."""
        info = self.info(path)
        for _ in range(READ_ATTEMPTS):
            first, last, _ = slice(start, end).indices(info["size"])
            data = self._read_range(path, first, last)
            seen, info = info, self.info(path)
            if info["version"] == seen["version"]:
                return data
        if info["size"] > CHUNK_SIZE:
            raise FileExpired(path, f"the file changed under each of {READ_ATTEMPTS} reads")
        data = self._read_range(path, 0, None)
        first, last, _ = slice(start, end).indices(len(data))
        return data[first:last]

    def _read_range(self, path: str, start: int, end: int | None) -> bytes:
        """Bytes ``start`` up to ``end`` (None: to the end) of the file ``path``: a
        whole read when that is the whole file, else a ranged one."""
        with _read_errors(path):
            if start == 0 and end is None:
                return self.client.read(path)
            length = None if end is None else max(end - start, 0)
            return self.client.read(path, offset=start, length=length)

    def get_file(
        self,
        rpath: str,
        lpath: Any,
        callback: Callback = DEFAULT_CALLBACK,
        outfile: IO[bytes] | None = None,
        **kwargs: Any,
    ) -> None:
        """Stream the file ``rpath`` into the local ``lpath`` (or ``outfile``)."""
        rpath = self._strip_protocol(rpath)
        if outfile is None and isfilelike(lpath):
            outfile = lpath
        info = self.info(rpath)
        if info["type"] == "directory":
            if outfile is None:
                os.makedirs(lpath, exist_ok=True)
            return
        callback.set_size(info["size"])
        with contextlib.ExitStack() as stack:
            if outfile is None:
                os.makedirs(os.path.dirname(lpath) or ".", exist_ok=True)
                outfile = stack.enter_context(open(lpath, "wb"))
            with _read_errors(rpath):
                copied = self.client.read_into(rpath, outfile)
        callback.relative_update(copied)

    def put_file(
        self,
        lpath: Any,
        rpath: str,
        callback: Callback = DEFAULT_CALLBACK,
        mode: str = "overwrite",
        **kwargs: Any,
    ) -> None:
        """Stream the local file ``lpath`` to ``rpath``: one atomic replacement."""
        rpath = self._strip_protocol(rpath)
        exclusive = _exclusive(mode)  # (a bad mode is refused before anything is made)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        with open(lpath, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            callback.set_size(size)
            self._write(rpath, f, exclusive=exclusive)
        callback.relative_update(size)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        """Make ``path`` an empty file: with ``truncate`` (the default) whatever is
        there, and without it only if nothing is (an exclusive create, so a file
        made meanwhile by another client is not emptied); an existing file or
        directory is then left as it is. fscache cannot set a file's times (the
        server has no such request, and a file's version changes only with its
        contents), so that touch does not change its ``modified``."""
        path = self._strip_protocol(path)
        if truncate:
            self._write(path, b"", exclusive=False)
            return
        with contextlib.suppress(FileExistsError, IsADirectoryError):  # (a directory)
            self._write(path, b"", exclusive=True)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Replace ``path`` with ``value``, which is bytes-like (``bytes``,
        ``bytearray``, ``memoryview``): anything else is a ``TypeError``, since
        ``bytes()`` of it would write something else (five zero bytes for ``5``, ``b"AB"``
        for ``[65, 66]``). ``mode="create"``: only if nothing is there (see "xb")."""
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(
                f"value must be bytes, bytearray or memoryview, not {type(value).__name__}"
            )
        data = value if isinstance(value, bytes) else bytes(value)
        self._write(self._strip_protocol(path), data, exclusive=_exclusive(mode))

    def _write(self, path: str, data: Source, *, exclusive: bool) -> None:
        """Replace the file ``path`` with ``data`` now, or, inside a transaction,
        under a temporary name until the transaction commits (see Transactions)."""
        if not self._intrans:
            self._write_now(path, data, exclusive=exclusive)
            return
        if exclusive and self.exists(path):
            raise FileExistsError(errno.EEXIST, "it exists", path)
        self.transaction.files.append(_Deferred(self, path, data, exclusive=exclusive))

    def _write_now(
        self, path: str, data: Source, *, exclusive: bool, into: str | None = None
    ) -> None:
        """Replace the file ``path`` with ``data`` (bytes, or a binary file read from
        where it stands); ``exclusive``: only if no file is there yet. ``into``: write
        that name instead (a deferred write's temporary name beside ``path``), errors
        naming ``path`` still. The server makes missing parent directories."""
        target = path if into is None else into
        try:
            with _os_errors(path):
                self.client.write(target, data, if_version=0 if exclusive else None)
        except IsADirectoryError:  # the path is a directory, or a parent is a file
            try:
                is_dir = self.client.stat(target).is_dir
            except FscacheError:
                is_dir = False
            if is_dir:
                raise
            raise NotADirectoryError(errno.ENOTDIR, "a parent is a file", path) from None

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> _File:
        path = self._strip_protocol(path)
        _check_block_size(block_size)
        info = None
        if mode == "rb":
            info = self.info(path)
            if info["type"] == "directory":
                raise IsADirectoryError(errno.EISDIR, "it is a directory", path)
            kwargs["size"] = info["size"]
        elif mode == "xb":
            if self.exists(path):
                raise FileExistsError(errno.EEXIST, "it exists", path)
        elif mode != "wb":
            raise ValueError(f"mode {mode!r} is not supported (rb, wb, xb)")
        f = _File(self, path, mode, block_size, autocommit, cache_options=cache_options, **kwargs)
        if info is not None:
            f.details = info  # its version is the one every read is checked against
        return f


class _File(AbstractBufferedFile):  # type: ignore[misc]
    """``rb``: reads ranges through the file system's one ranged read, each of the
    version seen at open (see Files). ``wb``/``xb``: spools each full block to a
    temporary file and uploads the whole on close; with ``autocommit=False`` under a
    temporary name, published by :meth:`commit` (see Transactions)."""

    fs: FscacheFileSystem
    closed: bool
    loc: int
    _spool: IO[bytes] | None = None
    _deferred: _Deferred | None = None
    _piece = b""  # what readline read ahead: bytes of the file from _piece_at on
    _piece_at = 0

    def readline(self, size: int | None = -1) -> bytes:
        """The bytes from here through the next ``\\n`` (or to the end of the file, or
        ``size`` bytes at most). fsspec's own reads a whole block (5 MiB by default)
        for every line and seeks back to the line's end, copying the block each time:
        a loop over the lines of a 7 MB file took 37 s. This one reads
        :data:`LINE_PIECE` bytes at a time through :meth:`read` (of the version the
        file was opened at, as every read) and finds the lines in that piece, which
        stays good for the file's life (its bytes never change): each line is copied
        once, and each piece read once."""
        at = self.loc - self._piece_at
        if size == -1 and at >= 0:  # the common case: a whole line in the piece
            newline = self._piece.find(b"\n", at)  # (the piece is empty once closed)
            if newline >= 0:
                self.loc += newline + 1 - at
                return self._piece[at : newline + 1]
        if self.mode != "rb":
            raise ValueError("File not in read mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        size = -1 if size is None else operator.index(size)
        left = self.size - self.loc if size < 0 else size
        parts = []
        while left > 0:
            at = self.loc - self._piece_at
            if not 0 <= at < len(self._piece):
                start = self.loc
                self._piece = self.read(LINE_PIECE)
                self._piece_at, self.loc, at = start, start, 0
                if not self._piece:
                    break
            stop = min(len(self._piece), at + left)
            newline = self._piece.find(b"\n", at, stop)
            if newline >= 0:
                stop = newline + 1
            parts.append(self._piece[at:stop])
            self.loc += stop - at
            left -= stop - at
            if newline >= 0:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        self._piece = b""
        super().close()

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        """Close the file; but a write whose ``with`` body raised is dropped
        unwritten: the file keeps its old contents, and nothing is left under a
        temporary name (see Files). fsspec's own closes, which publishes the part
        written before the exception."""
        if exc_type is not None and self.mode != "rb":
            self._drop()
        else:
            self.close()

    def _fetch_range(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end``, of the version this file was opened at: the
        version is checked after the read (:class:`FileExpired` if it changed)."""
        version = self.details["version"]
        try:
            data = self.fs._read_range(self.path, start, end)
            now = self.fs.info(self.path)["version"]
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):  # gone
            now = None
        if now != version:
            why = f"the file changed after it was opened at version {version}"
            raise FileExpired(self.path, why)
        return data

    def _upload_chunk(self, final: bool = False) -> bool:
        if self._spool is None and not final:
            self._spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed after the upload)
        if self._spool is not None:
            with self.buffer.getbuffer() as block:
                self._spool.write(block)
        if not final:
            return True
        source: Source = self.buffer.getvalue() if self._spool is None else self._spool
        exclusive = self.mode == "xb"
        try:
            if self._spool is not None:
                self._spool.seek(0)
            if self.autocommit:
                self.fs._write_now(self.path, source, exclusive=exclusive)
            else:
                self._deferred = _Deferred(self.fs, self.path, source, exclusive=exclusive)
        finally:
            self._close_spool()
        return True

    def commit(self) -> None:
        """Publish the file (``autocommit=False``): close it, which writes it under
        its temporary name, then rename that over the target."""
        if self.autocommit:
            raise RuntimeError("Can only commit if not already set to autocommit")
        self.close()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            deferred.commit()

    def discard(self) -> None:
        """Drop the file (``autocommit=False``): nothing is written if it is still
        open, and what was written under the temporary name is deleted."""
        if self.autocommit:
            raise RuntimeError("Cannot discard if set to autocommit")
        self._drop()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            deferred.discard()

    def _drop(self) -> None:
        """Close the file without writing anything (if it is still open)."""
        if not self.closed:
            self.closed = True
            self._close_spool()
            self.buffer = io.BytesIO()

    def _close_spool(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None


class _Deferred:
    """A write held back until a commit: made now, whole, under a temporary name
    beside ``path``; :meth:`commit` renames it over ``path`` and :meth:`discard`
    deletes it (see Transactions). fsspec's transaction calls one or the other."""

    def __init__(self, fs: FscacheFileSystem, path: str, data: Source, *, exclusive: bool) -> None:
        self.fs, self.path, self.exclusive = fs, path, exclusive
        self.temp = _temp_name(path)
        fs._write_now(path, data, exclusive=True, into=self.temp)

    def commit(self) -> None:
        if self.exclusive and self.fs.exists(self.path):  # not atomic: see Transactions
            self.discard()
            raise FileExistsError(errno.EEXIST, "it was created before the commit", self.path)
        with _os_errors(self.path):
            self.fs.client.rename(self.temp, self.path)

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError), _os_errors(self.temp):
            self.fs.client.delete(self.temp)


def _check_block_size(block_size: object) -> None:
    """Refuse a ``block_size`` that is not a number of bytes > 0 (None or
    ``"default"``: fsspec's default). fsspec's own file takes any: its read-ahead
    cache drops the last byte of a file with -1, and its "bytes" cache divides by 0."""
    if block_size is None or (isinstance(block_size, str) and block_size == "default"):
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, not {type(block_size).__name__}")
    if block_size <= 0:
        raise ValueError(f"block_size must be a number of bytes > 0, not {block_size}")


def _exclusive(mode: str) -> bool:
    """Whether fsspec's write ``mode`` is an exclusive create: ``"create"`` is,
    ``"overwrite"`` is not, and anything else is a ``ValueError``."""
    if mode not in ("overwrite", "create"):
        raise ValueError(f"mode must be 'overwrite' or 'create', not {mode!r}")
    return mode == "create"


def _temp_name(path: str) -> str:
    """A hidden name beside ``path`` that no other writer picks and that is none of
    the store's reserved names: :data:`TEMP_PREFIX`, a uuid, then as much of the
    target's name as one name may hold (to tell what a leftover was for)."""
    parent, _, name = path.rpartition("/")
    head = f"{TEMP_PREFIX}{uuid.uuid4().hex}."
    tail = name.encode()[: MAX_SEGMENT_BYTES - len(head)].decode(errors="ignore")
    return _join(parent, head + tail)


def _path_text(path: object) -> str:
    """``path`` as text: a str, or what an ``os.PathLike`` stands for if that is a
    str. Anything else is a ``TypeError``, as fscache's clients refuse a path that is
    not a string: ``str()`` of ``None``, ``3.5`` or ``b"x"`` would name a file
    ``None``, ``3.5`` or ``b'x'``."""
    if isinstance(path, str):
        return path
    if isinstance(path, os.PathLike):
        text = os.fspath(path)
        if isinstance(text, str):
            return text
        raise TypeError(
            f"path must be a string, not {type(path).__name__} of {type(text).__name__}"
        )
    raise TypeError(f"path must be a string or an os.PathLike, not {type(path).__name__}")


def _server_for(host: object, port: object, url_server: str | None) -> tuple[str, int]:
    """The ``(host, port)`` a file system is on: ``host`` and ``port`` (their defaults
    if not given), or ``url_server``, the server a URL names, if there is one; then a
    ``host`` or ``port`` given as well must be that server's (``ValueError``)."""
    checked = (
        DEFAULT_HOST if host is _DEFAULT_HOST else _check_host(host),
        DEFAULT_PORT if port is _DEFAULT_PORT else _check_port(port),
    )
    if url_server is None:
        return checked
    named = _parse_server(url_server)
    given = []
    if host is not _DEFAULT_HOST and checked[0] != named[0]:
        given.append(f"host={host!r}")
    if port is not _DEFAULT_PORT and checked[1] != named[1]:
        given.append(f"port={port!r}")
    if given:
        raise ValueError(
            f"the URL names the server {shown_address(*named)}, which"
            f" {' and '.join(given)} contradict{'s' if len(given) == 1 else ''}"
        )
    return named


def _check_host(host: object) -> str:
    """``host`` if it is a host name or an address (brackets taken off an IPv6 one),
    else :class:`~fscache.BadSetting`."""
    if not isinstance(host, str):
        raise BadSetting(f"host must be a host name or an address (a str), not {host!r}")
    bare = host[1:-1] if host[:1] == "[" and host[-1:] == "]" and is_ipv6(host[1:-1]) else host
    try:
        bare, _ = _parse_server(shown_address(bare, DEFAULT_PORT))
    except BadSetting:
        raise BadSetting(
            f"host must be a host name or an address, such as 127.0.0.1, ::1 or localhost,"
            f" not {host!r}"
        ) from None
    return bare


def _check_port(port: object) -> int:
    """``port`` as an int if it is a TCP port (1..65535), given as an int or as a
    string of digits, else :class:`~fscache.BadSetting` (a bool, a float, ``None``:
    ``int()`` would take some of them as ports)."""
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise BadSetting(f"port must be 1..65535 (an int or a string of digits), not {port!r}")
    return port


def _server_of(url: str) -> tuple[str, int] | None:
    """The ``(host, port)`` an ``fscache://`` URL names (see :func:`_parse_server`),
    or None if it names none."""
    if not url.startswith(PROTOCOL + "://"):
        return None
    netloc = url[len(PROTOCOL) + 3 :].partition("/")[0]
    if not netloc:
        return None
    if netloc.startswith("[") and "]" not in netloc:  # fsspec cut the URL at a "::"
        raise ValueError(
            f"{url!r} is a URL cut at '::', which fsspec takes for a chain of URLs: write"
            " an IPv6 address out without '::' ([0:0:0:0:0:0:0:1] for [::1])"
        )
    try:
        return _parse_server(netloc)
    except FscacheError as exc:
        raise ValueError(str(exc)) from exc


def _parse_server(address: str) -> tuple[str, int]:
    """``parse_address``, an IPv6 host in one spelling (``::1`` for
    ``0:0:0:0:0:0:0:1``), so that the spellings of a server compare equal."""
    host, port = parse_address(address)
    return (str(ipaddress.ip_address(host)) if is_ipv6(host) else host), port


def _url_host(host: str) -> str:
    """``host`` as a URL names it: an IPv6 address with each of its eight groups
    written out (``0:0:0:0:0:0:0:1`` for ``::1``), as fsspec cuts URLs at ``::``
    (it chains file systems with it), and ``fsspec.open`` would then get the URL
    ``fscache://[`` (:func:`_parse_server` reads it back as the same server)."""
    if not is_ipv6(host):
        return host
    address = ipaddress.IPv6Address(host)
    packed = address.packed
    groups = ":".join(f"{int.from_bytes(packed[i : i + 2], 'big'):x}" for i in range(0, 16, 2))
    return groups if address.scope_id is None else f"{groups}%{address.scope_id}"


def _info(name: str, is_dir: bool, size: int, version: int) -> Info:
    return {
        "name": name,
        "size": 0 if is_dir else size,
        "type": "directory" if is_dir else "file",
        "version": version,
        "mtime": version / 1e9,
    }


def _entry(parent: str, entry: DirEntry) -> Info:
    return _info(_join(parent, entry.name), entry.is_dir, entry.size, entry.version)


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


_OS_ERRORS: dict[type[FscacheError], tuple[type[OSError], int]] = {
    errors.NotFound: (FileNotFoundError, errno.ENOENT),
    errors.IsADirectory: (IsADirectoryError, errno.EISDIR),
    errors.NotADirectory: (NotADirectoryError, errno.ENOTDIR),
    errors.NotEmpty: (OSError, errno.ENOTEMPTY),
    errors.NoSpace: (OSError, errno.ENOSPC),  # the server's disk is full
    errors.Exists: (FileExistsError, errno.EEXIST),
    errors.Conflict: (FileExistsError, errno.EEXIST),  # only exclusive creates name a version (0)
    errors.Unauthorized: (PermissionError, errno.EACCES),
    errors.Unavailable: (ConnectionError, errno.ENOTCONN),  # TimeoutError if a wait ran out
}


@contextlib.contextmanager
def _os_errors(path: str, path2: str | None = None) -> Iterator[None]:
    """The client's errors as the exceptions fsspec's callers expect, naming
    ``path`` (and ``path2``, a move's destination, as ``os.rename``'s errors do),
    with the client's error as ``__cause__``: a bad path is a ``ValueError``, as
    LocalFileSystem's is; the rest are in :data:`_OS_ERRORS`."""
    try:
        yield
    except errors.BadPath as exc:
        raise ValueError(f"bad path {path!r}: {exc}") from exc
    except FscacheError as exc:
        mapped = _OS_ERRORS.get(type(exc))
        if mapped is None:
            raise
        kind, code = mapped
        if kind is ConnectionError and _timed_out(exc):
            kind, code = TimeoutError, errno.ETIMEDOUT
        raise kind(code, str(exc), path, None, path2) from exc


@contextlib.contextmanager
def _read_errors(path: str) -> Iterator[None]:
    """:func:`_os_errors` around a read, where a file read by chunks that kept changing
    between them (:class:`~fscache.errors.Conflict`) is :class:`FileExpired`, as an
    open file's change is."""
    with _os_errors(path):
        try:
            yield
        except errors.Conflict as exc:
            raise FileExpired(path, str(exc)) from exc


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` came of a wait that ran out: a connect or handshake that
    took too long, a socket's ETIMEDOUT. The client raises its error ``from None``
    or ``from`` the cause, and either way the cause stays in the chain."""
    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if isinstance(seen, TimeoutError | trio.TooSlowError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
