"""``fscache serve --config FILE``: the serve options from a TOML file.

The file's keys are the serve command's long options without their dashes
(``session-ttl = 15``), read off the command's own parser, so every option the
command line has is a key and no other is. A key's value is checked as its option
is: the same parser function, after a check of the TOML type (a number of seconds
is an integer or a float, a port an integer, a switch a boolean, the rest strings).
Paths (options whose metavar is ``DIR`` or ``FILE``) are relative to the file's
directory. The command line overrides the file: the file's values become the
parser's defaults. Errors name the file and the key as the file spells it, and for
an unknown key the nearest known.

Settings that must agree (``max-outbox`` at least the maximum frame) are checked
where the server's settings are (:class:`~fscache.server.service.ServerSettings`),
with the file's values over the defaults, and its message is given the file's
spelling of each key. So a file is checked on its own, as each of its values is: a
flag that mends it does not make it right.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import pathlib
import re
import tomllib
from typing import Any

from fscache.settings import BadSetting

PATH_METAVARS = frozenset({"DIR", "FILE"})
NOT_IN_FILE = frozenset({"help", "config"})  # what a file cannot set


class BadConfig(BadSetting):
    """The configuration file cannot be used; the message names the file and the key."""


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The keys a configuration file for ``parser`` may set, and their options."""
    keys = {}
    for action in parser._actions:
        long = [name for name in action.option_strings if name.startswith("--")]
        if long and action.dest not in NOT_IN_FILE:
            keys[long[0].removeprefix("--")] = action
    return keys


def expected_type(action: argparse.Action) -> type:
    """The TOML type an option takes: what its parser makes of ``"1024"`` (a value every
    number option takes: a port, seconds, a count, a limit), a boolean for a switch,
    else a string."""
    if action.nargs == 0:
        return bool
    if action.type is None or action.choices is not None:
        return str
    assert callable(action.type)
    return type(action.type("1024"))


def load(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The options the TOML file at ``path`` sets, by ``dest``, checked and with paths
    made absolute; :class:`BadConfig` says what is wrong."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as exc:
        raise BadConfig(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadConfig(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8
        raise BadConfig(f"{path}: not UTF-8 (at byte offset {exc.start}: {exc.reason})") from None
    return check(table, parser, base=pathlib.Path(path).resolve().parent, source=path)


def check(
    table: dict[str, Any], parser: argparse.ArgumentParser, *, base: pathlib.Path, source: str
) -> dict[str, Any]:
    """``table`` (parsed TOML) as ``dest: value``; ``base`` is where relative paths start."""
    known = options(parser)
    values: dict[str, Any] = {}
    for key, value in table.items():
        action = known.get(key)
        if action is None:
            nearest = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
            raise BadConfig(f"{source}: unknown key {key!r}{hint}")
        values[action.dest] = _value(key, value, action, base, source)
    _check_together(values, known, source)
    return values


def _check_together(values: dict[str, Any], known: dict[str, argparse.Action], source: str) -> None:
    """Raise :class:`BadConfig` if the file's values, over the defaults, are wrong
    together, in the words of the server's own check with the file's keys."""
    from fscache.server.service import ServerSettings

    fields = {field.name for field in dataclasses.fields(ServerSettings)}
    settings = {
        action.dest: values.get(action.dest, action.default)
        for action in known.values()
        if action.dest in fields
    }
    settings["root"] = settings.get("root") or "."  # not checked there; may come by flag
    try:
        ServerSettings(**settings)
    except BadSetting as exc:
        spelled = {action.dest: key for key, action in known.items()}
        message = re.sub(r"\b\w+\b", lambda word: spelled.get(word[0], word[0]), str(exc))
        raise BadConfig(f"{source}: {message}") from None


def _value(
    key: str, value: object, action: argparse.Action, base: pathlib.Path, source: str
) -> object:
    expected = expected_type(action)
    if expected is float:
        fits = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        fits = type(value) is expected
    if not fits:
        wrong = f"{type(value).__name__} {value!r}"
        raise BadConfig(f"{source}: {key} must be {_TYPE_NAMES[expected]}, not {wrong}")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise BadConfig(f"{source}: {key} must be one of {choices}, not {value!r}")
    if expected is not bool and action.type is not None:
        assert callable(action.type)
        try:
            value = action.type(str(value))
        except argparse.ArgumentTypeError as exc:
            raise BadConfig(f"{source}: {key}: {exc}") from None
    if action.metavar in PATH_METAVARS:
        assert isinstance(value, str)
        value = str(base / pathlib.Path(value).expanduser())
    return value


_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
}
