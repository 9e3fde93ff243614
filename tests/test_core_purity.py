"""The core has no I/O and no clock (``docs/design.md``, "Repository layout").

Every module in ``fscache/`` is parsed, not imported, and its imports are checked:
the lease table, the cache, the codec, the path rules, the errors and the settings
must not reach for trio, sockets, threads, the file system or the clock; time is
always an argument.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import fscache

PACKAGE = pathlib.Path(fscache.__file__).parent

FORBIDDEN = frozenset({"trio", "socket", "time", "asyncio", "threading", "os", "selectors", "ssl"})
# The command line and the package's entry points do I/O by nature (the demo and the
# benchmarks they start live in bench/); net.py is the socket layer both ends share,
# the one I/O module beside the core, which server/ and client/ import.
EXEMPT = frozenset({"__init__.py", "__main__.py", "cli.py", "net.py"})
# TLS material is read from and written to files, but it needs no event loop and no clock.
ALLOWED_EXTRA = {"tls.py": frozenset({"os", "ssl"})}
CORE = ("leases.py", "cache.py", "protocol.py", "paths.py", "errors.py", "settings.py")


def imported_modules(source: pathlib.Path) -> set[str]:
    """Top-level names of every module ``source`` imports, anywhere in the file,
    including ``__import__("x")`` and ``importlib.import_module("x")``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"), str(source))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value.split(".")[0])
    return names


def checked_modules() -> list[pathlib.Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if path.name not in EXEMPT and "__pycache__" not in path.parts
    )


def test_the_core_modules_are_among_those_checked() -> None:
    names = {path.name for path in checked_modules()}

    assert set(CORE) <= names


@pytest.mark.parametrize(
    "module", checked_modules(), ids=lambda path: str(path.relative_to(PACKAGE))
)
def test_module_imports_no_io_and_no_clock(module: pathlib.Path) -> None:
    allowed = ALLOWED_EXTRA.get(module.name, frozenset())

    assert imported_modules(module) & (FORBIDDEN - allowed) == set()


def test_the_checker_sees_every_form_of_import(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "import os.path\n"
        "from time import monotonic\n"
        "def f():\n"
        "    import trio\n"
        "    __import__('socket')\n"
        "    importlib.import_module('asyncio.tasks')\n"
        "from . import sibling\n"
    )

    assert imported_modules(source) == {"os", "time", "trio", "socket", "asyncio"}
