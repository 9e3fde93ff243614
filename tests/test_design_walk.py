"""``docs/design.md``'s "The path of one read" names real code, in the order it runs.

The section is a newcomer's map from ``Client.read`` to the reply and back. Each
name it gives in backquotes that looks like code (``Class.method``, ``function``)
must still be defined where the section says, so that a rename breaks this test
rather than the map.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
SOURCES = ("fscache", "client", "server")


def walk_section() -> str:
    text = DESIGN.read_text()
    start = text.index("## The path of one read\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def defined_names() -> set[str]:
    """Every ``def`` and ``class`` in the sources, bare and as ``Class.member``; and the
    attributes a class's methods set on ``self``, as ``Class.attribute``."""
    names: set[str] = set()
    for folder in SOURCES:
        for source in (ROOT / folder).glob("*.py"):
            tree = ast.parse(source.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    names.add(node.name)
                    for member in node.body:
                        if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                            names.add(f"{node.name}.{member.name}")
                    for inner in ast.walk(node):
                        if (
                            isinstance(inner, ast.Attribute)
                            and isinstance(inner.ctx, ast.Store)
                            and isinstance(inner.value, ast.Name)
                            and inner.value.id == "self"
                        ):
                            names.add(f"{node.name}.{inner.attr}")
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(node.name)
    return names


def code_names(section: str) -> list[str]:
    """The backquoted names of functions and classes: ``LeaseTable.read(...)`` gives
    ``LeaseTable.read``; a module prefix (``protocol.``, ``fscache.paths.``) is cut."""
    found = []
    for quoted in re.findall(r"`([^`]+)`", section):
        match = re.fullmatch(r"([A-Za-z_][\w.]*)(\(.*\))?", quoted)
        if match is None or "/" in quoted:
            continue
        name = match.group(1)
        for prefix in ("fscache.paths.", "fscache.", "protocol."):
            name = name.removeprefix(prefix)
        prefixed = name != match.group(1)
        if prefixed or name[0] == "_" or name[0].isupper() or match.group(2) or "." in name:
            found.append(name)
    return found


def test_the_walk_names_code_that_exists() -> None:
    names = code_names(walk_section())
    assert len(names) >= 25  # the parser still finds the walk's names
    defined = defined_names()
    missing = [name for name in names if name not in defined]
    assert not missing, f"docs/design.md names code that is not defined: {missing}"
