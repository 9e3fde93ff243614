"""fsspec integration: ``fsspec.open("fscache://127.0.0.1:7710/docs/a.txt")``.

Registered under the ``fscache`` protocol through the ``fsspec.specs`` entry point
(``pip install 'fscache[fsspec]'``). Every instance wraps one blocking client, so
reads of cached files are answered from the lease cache like any other read.
Directories are implicit (a write creates its parents), so ``mkdir`` does nothing.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

from fsspec import AbstractFileSystem

from fscache.client.blocking import BlockingClient, connect
from fscache.client.client import DEFAULT_PORT, parse_address
from fscache.errors import NotFound

PROTOCOL = "fscache"


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

    # ------------------------------------------------------------ the operations
    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        names = self.client.listdir(path)
        full = [f"{path}/{name}".lstrip("/") if path else name for name in names]
        if not detail:
            return [name.rstrip("/") for name in full]
        return [self.info(name.rstrip("/")) for name in full]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        with _not_found_as_os_error(path):
            st = self.client.stat(path)
        return {
            "name": path,
            "size": st.size,
            "type": "directory" if st.is_dir else "file",
            "version": st.version,
        }

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        with _not_found_as_os_error(path):
            data = self.client.read(self._strip_protocol(path))
        return data[start:end] if start is not None or end is not None else data

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self.client.write(self._strip_protocol(path), bytes(value))

    def rm_file(self, path: str) -> None:
        with _not_found_as_os_error(path):
            self.client.delete(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        pass  # directories are implicit

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> io.IOBase:
        path = self._strip_protocol(path)
        if mode == "rb":
            return io.BytesIO(self.cat_file(path))
        if mode in ("wb", "xb"):
            if mode == "xb" and self.exists(path):
                raise FileExistsError(path)
            return _WriteOnClose(self, path)
        raise ValueError(f"mode {mode!r} is not supported (rb, wb, xb)")


class _WriteOnClose(io.BytesIO):
    """A write-mode file: the whole contents are written (durably) on close."""

    def __init__(self, fs: FscacheFileSystem, path: str) -> None:
        super().__init__()
        self._fs = fs
        self._path = path

    def close(self) -> None:
        if not self.closed:
            self._fs.pipe_file(self._path, self.getvalue())
        super().close()


@contextlib.contextmanager
def _not_found_as_os_error(path: str) -> Iterator[None]:
    """fsspec's callers expect FileNotFoundError for a missing file."""
    try:
        yield
    except NotFound:
        raise FileNotFoundError(path) from None
