"""fsspec integration: ``fsspec.open("fscache://127.0.0.1:7710/docs/a.txt")``.

Registered under the ``fscache`` protocol through the ``fsspec.specs`` entry point
(``pip install 'fscache[fsspec]'``). Every instance wraps one blocking client and
uses only its public operations, so reads of cached files are answered from the
lease cache like any other read.

Theory of operation
===================

Names.  As fsspec's conventions say: paths without the protocol and without
leading or trailing ``/`` (``"docs/a.txt"``; the root is ``""``), and every
listing entry is a dict with ``name``, ``size`` and ``type`` (``"file"`` or
``"directory"``), plus the file's fscache ``version``.  There is no listing cache:
every ``ls`` asks the server, so a listing is as fresh as a ``listdir``.

Directories follow the object-store convention (as s3fs's keys do): a directory
exists while a file lies somewhere below it.  The server creates directories when
a file is written under them and never removes them, so a directory with no file
below it (left behind when its last file went) is hidden: ``ls``, ``info``,
``exists``, ``find`` and ``walk`` do not show it.  ``mkdir`` and ``makedirs``
create nothing (they refuse only a path that is a file), ``rmdir`` refuses a
directory that still holds a file, and ``rm(..., recursive=True)`` deletes files;
their directories vanish with them.  The fixture class of the abstract tests says
``supports_empty_directories = False`` accordingly.

Files.  ``open(path, "rb")`` is an fsspec buffered file whose ranges come from
:meth:`FscacheFileSystem._read_range`, the one place that reads part of a file;
``cat_file(path, start, end)`` uses it too.  ``"wb"`` buffers everything and writes
the file whole on close (one durable, atomic write); ``"xb"`` does the same as a
compare-and-set against version 0 (an absent file), so an exclusive create that
loses a race raises ``FileExistsError`` instead of overwriting.

Copies and moves.  ``cp_file`` reads through the client (under a lease) and writes.
``mv`` copies and then deletes the source, so it is not atomic; it is the one
method that turns into the server's rename once the protocol has one.

Errors.  One boundary, :func:`_os_errors`, turns the client's errors into the
``OSError`` subclasses fsspec's callers expect: ``FileNotFoundError``,
``IsADirectoryError`` / ``NotADirectoryError`` (the server says ``IsADirectory``
for both directions; the operation knows which one it meant), ``FileExistsError``
for a lost exclusive create.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.spec import AbstractBufferedFile

from fscache.client.blocking import BlockingClient, connect
from fscache.client.client import DEFAULT_PORT, parse_address
from fscache.errors import Conflict, FscacheError, IsADirectory, NotFound

PROTOCOL = "fscache"

Info = dict[str, Any]


class FscacheFileSystem(AbstractFileSystem):  # type: ignore[misc]
    protocol = PROTOCOL
    root_marker = ""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, **kwargs: Any) -> None:
        client_options = {k: kwargs.pop(k) for k in ("client_id", "ssl_context") if k in kwargs}
        super().__init__(**kwargs)
        self.client: BlockingClient = connect(f"{host}:{port}", **client_options)

    # ------------------------------------------------------------ URLs
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(path)
        if text.startswith(PROTOCOL + "://"):
            text = text[len(PROTOCOL) + 3 :]
            text = text.partition("/")[2]  # drop host:port
        return text.strip("/")

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        if not path.startswith(PROTOCOL + "://"):
            return {}
        netloc = path[len(PROTOCOL) + 3 :].partition("/")[0]
        if not netloc:
            return {}
        host, port = parse_address(netloc)
        return {"host": host, "port": port}

    # ------------------------------------------------------------ listing
    def info(self, path: str, **kwargs: Any) -> Info:
        path = self._strip_protocol(path)
        if not path:
            return _directory(path)
        with _os_errors(path):
            st = self.client.stat(path)
        if not st.is_dir:
            return {"name": path, "size": st.size, "type": "file", "version": st.version}
        if not self._holds_a_file(path):
            raise FileNotFoundError(errno.ENOENT, "no file lies below this directory", path)
        return _directory(path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        try:
            entries = self._below(path, maxdepth=1, sized=detail)
        except NotADirectoryError:  # a file lists itself
            entries = {path: self.info(path)}
        if entries is None:
            if path:
                raise FileNotFoundError(errno.ENOENT, "no file lies below this directory", path)
            entries = {}
        infos = sorted(entries.values(), key=lambda info: str(info["name"]))
        return infos if detail else [info["name"] for info in infos]

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        path = self._strip_protocol(path)
        try:
            entries = self._below(path, maxdepth, sized=detail) or {}
        except NotADirectoryError:  # a file finds itself
            entries = {path: self.info(path)}
        except FileNotFoundError:
            entries = {}
        if withdirs and path and entries and path not in entries:
            entries[path] = _directory(path)
        found = {
            name: entries[name]
            for name in sorted(entries)
            if withdirs or entries[name]["type"] == "file"
        }
        return found if detail else list(found)

    def _below(self, path: str, maxdepth: int | None, *, sized: bool) -> dict[str, Info] | None:
        """Every live entry below the directory ``path`` down to ``maxdepth`` levels
        (None: all), or None if no file lies below it. ``FileNotFoundError`` if
        ``path`` does not exist, ``NotADirectoryError`` if it is a file. Files are
        stat'ed for their size and version only if ``sized``."""
        entries: dict[str, Info] = {}
        holds_a_file = False
        for name in self._listdir(path):
            full = _join(path, name.rstrip("/"))
            if name.endswith("/"):
                if maxdepth is None or maxdepth > 1:
                    depth = None if maxdepth is None else maxdepth - 1
                    below = self._below_or_none(full, depth, sized=sized)
                    if below is None:
                        continue
                    entries.update(below)
                elif not self._holds_a_file(full):
                    continue
                entries[full] = _directory(full)
            elif not sized:
                entries[full] = {"name": full, "type": "file"}
            else:
                try:
                    entries[full] = self.info(full)
                except FileNotFoundError:  # deleted since the listing
                    continue
            holds_a_file = True
        return entries if holds_a_file else None

    def _below_or_none(
        self, path: str, maxdepth: int | None, *, sized: bool
    ) -> dict[str, Info] | None:
        """:meth:`_below` of a subdirectory, which may vanish or turn into a file
        between its parent's listing and its own."""
        try:
            return self._below(path, maxdepth, sized=sized)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _holds_a_file(self, path: str) -> bool:
        """Whether a file lies somewhere below the directory ``path``: a depth-first
        search that stops at the first file."""
        try:
            names = self._listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return any(
            not name.endswith("/") or self._holds_a_file(_join(path, name[:-1])) for name in names
        )

    def _listdir(self, path: str) -> list[str]:
        with _os_errors(path, is_a_directory=NotADirectoryError):
            return self.client.listdir(path)

    # ------------------------------------------------------------ directories
    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.makedirs(path, exist_ok=True)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if not path:
            return
        try:
            info = self.info(path)
        except FileNotFoundError:
            return  # nothing to create: the directory appears with its first file
        if info["type"] == "file" or not exist_ok:
            raise FileExistsError(errno.EEXIST, "it exists", path)

    def rmdir(self, path: str) -> None:
        path = self._strip_protocol(path)
        with _os_errors(path):
            is_dir = self.client.stat(path).is_dir
        if not is_dir:
            raise NotADirectoryError(errno.ENOTDIR, "it is a file", path)
        if self._holds_a_file(path):
            raise OSError(errno.ENOTEMPTY, "a file lies below this directory", path)
        # Nothing below it: to fsspec it is gone already (see "Directories" above).

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
            except IsADirectoryError:
                if not recursive:
                    raise
                # A directory has no existence of its own: it went with its files.

    # ------------------------------------------------------------ reading and writing
    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        if (start or 0) < 0 or (end or 0) < 0:  # counted back from the end
            start, end, _ = slice(start, end).indices(self.info(path)["size"])
        return self._read_range(path, start or 0, end)

    def _read_range(self, path: str, start: int, end: int | None) -> bytes:
        """Bytes ``start`` up to ``end`` (None: to the end) of the file ``path``.

        The whole file comes from the lease cache (one server read per lease term)
        and is sliced; with ranged reads in the client this becomes one call of
        ``self.client.read(path, offset=start, length=...)``."""
        with _os_errors(path):
            return self.client.read(path)[start:end]

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self._write(self._strip_protocol(path), bytes(value), exclusive=mode == "create")

    def _write(self, path: str, data: bytes, *, exclusive: bool) -> None:
        """Write the file whole; ``exclusive``: only if no file is there yet."""
        try:
            with _os_errors(path):
                self.client.write(path, data, if_version=0 if exclusive else None)
        except IsADirectoryError:  # the path is a directory, or a parent is a file
            try:
                is_dir = self.client.stat(path).is_dir
            except FscacheError:
                is_dir = False
            if is_dir:
                raise
            raise NotADirectoryError(errno.ENOTDIR, "a parent is a file", path) from None

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        try:
            with _os_errors(path1):
                data = self.client.read(path1)
        except IsADirectoryError:
            self.makedirs(path2, exist_ok=True)  # directories come with their files
            return
        self._write(path2, data, exclusive=False)

    def mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Copy, then delete the source: not atomic. The one place to become the
        server's atomic rename once the protocol has one."""
        if path1 == path2:
            return
        self.copy(path1, path2, recursive=recursive, maxdepth=maxdepth, on_error="raise")
        self.rm(path1, recursive=recursive)

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
        return _File(
            self, path, mode, block_size, autocommit, cache_options=cache_options, **kwargs
        )


class _File(AbstractBufferedFile):  # type: ignore[misc]
    """``rb``: reads ranges through the file system's one ranged read. ``wb``/``xb``:
    keeps everything written and writes the file whole on close."""

    fs: FscacheFileSystem

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs._read_range(self.path, start, end)

    def _upload_chunk(self, final: bool = False) -> bool:
        if not final:
            return False  # keep buffering: the write happens once, on close
        self.fs._write(self.path, self.buffer.getvalue(), exclusive=self.mode == "xb")
        return True


def _directory(path: str) -> Info:
    return {"name": path, "size": 0, "type": "directory"}


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


@contextlib.contextmanager
def _os_errors(path: str, *, is_a_directory: type[OSError] = IsADirectoryError) -> Iterator[None]:
    """The client's errors as the OSErrors fsspec's callers expect. The server says
    ``IsADirectory`` for "a directory where a file was meant" and for the reverse;
    the caller names the one its operation meant."""
    try:
        yield
    except NotFound as exc:
        raise FileNotFoundError(errno.ENOENT, str(exc), path) from None
    except IsADirectory as exc:
        code = errno.EISDIR if is_a_directory is IsADirectoryError else errno.ENOTDIR
        raise is_a_directory(code, str(exc), path) from None
    except Conflict as exc:  # only exclusive creates name a version (0: no file yet)
        raise FileExistsError(errno.EEXIST, str(exc), path) from None
