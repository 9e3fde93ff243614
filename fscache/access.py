"""Access rules: which identity may read or write which paths. No I/O.

Theory of operation
-------------------
An *identity* is the name on a client's certificate (:func:`fscache.tls.peer_identity`);
a connection without TLS is :data:`ANONYMOUS`. An access file (TOML) grants one of
three levels -- ``none``, ``read``, ``read-write`` -- per identity and path prefix::

    default = "read"                # identities with a certificate, where no rule of theirs applies

    [[rule]]
    identity = "alice"
    prefix = "projects/alice"       # whole segments: covers projects/alice/x, not projects/alicex
    access = "read-write"

The rules:

1. For a path, the rule of the requesting identity with the longest prefix covering it
   decides (prefix ``""`` covers the whole tree). An identity and a prefix are named
   by at most one rule.
2. With no such rule, ``default`` decides for an identity with a certificate (``none``
   when the file does not say); :data:`ANONYMOUS` gets ``none``: a plain-TCP client
   gets only what rules naming ``anonymous`` grant it.
3. Every request message maps to the paths it touches and the level it needs
   (:func:`need`): reads, ranged reads, stats, listings and lease extensions need
   ``read`` on their path; writes, deletes, uploads, in-place writes, truncates,
   renames (both names), mkdir and rmdir need ``read-write``. Messages that touch
   no named path -- hello, ping, stats, approve, relinquish, goodbye, and an upload's
   parts, commit and abort (its path was checked when it began) -- need nothing.
4. A request that needs more than its identity has on any of its paths is refused
   with :class:`~fscache.errors.Unauthorized`, naming the path and the identity,
   before it has any effect.

:func:`parse` refuses a bad file with a :class:`BadAccessFile` giving the line
(tomllib's, for a syntax error) or the key and table at fault.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import tomllib
from collections.abc import Callable, Iterable
from typing import Any

from fscache import protocol as p
from fscache.errors import BadPath, FscacheError, ProtocolError, Unauthorized
from fscache.paths import normalize

ANONYMOUS = "anonymous"  # the identity of a connection without TLS


class Access(enum.IntEnum):
    """What a rule grants; each level includes the ones below it."""

    NONE = 0
    READ = 1
    READ_WRITE = 2


_LEVELS = {"none": Access.NONE, "read": Access.READ, "read-write": Access.READ_WRITE}
_WORDS = {level: word for word, level in _LEVELS.items()}


class BadAccessFile(FscacheError):
    """An access file that does not follow the rules; the message says where and why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Need:
    """What a request needs: ``access`` on every one of ``paths`` (normal form)."""

    access: Access
    paths: tuple[str, ...]


def _on(access: Access, *fields: str) -> Callable[[Any], Need]:
    def need_of(message: Any) -> Need:
        return Need(access, tuple(normalize(getattr(message, f), allow_root=True) for f in fields))

    return need_of


def _extend(message: p.Extend) -> Need:
    return Need(Access.READ, tuple(normalize(path, allow_root=True) for path in message.paths))


def _nothing(message: p.Message) -> None:
    return None


# Every message a client may send, and what it needs (a test checks none is missing).
_NEEDS: dict[type[p.Message], Callable[[Any], Need | None]] = {
    p.Hello: _nothing,
    p.Read: _on(Access.READ, "path"),
    p.Write: _on(Access.READ_WRITE, "path"),
    p.Delete: _on(Access.READ_WRITE, "path"),
    p.Stat: _on(Access.READ, "path"),
    p.ListDir: _on(Access.READ, "path"),
    p.Relinquish: _nothing,  # giving a lease back only ever narrows what is cached
    p.Extend: _extend,
    p.Approve: _nothing,  # the answer to the server's own approval request
    p.GetStats: _nothing,
    p.Ping: _nothing,
    p.Goodbye: _nothing,
    p.ReadRange: _on(Access.READ, "path"),
    p.UploadBegin: _on(Access.READ_WRITE, "path"),
    p.UploadPart: _nothing,  # the upload is this connection's, begun under the check
    p.UploadCommit: _nothing,
    p.UploadAbort: _nothing,
    p.WriteRange: _on(Access.READ_WRITE, "path"),
    p.Truncate: _on(Access.READ_WRITE, "path"),
    p.Rename: _on(Access.READ_WRITE, "src", "dst"),
    p.MkDir: _on(Access.READ_WRITE, "path"),
    p.RmDir: _on(Access.READ_WRITE, "path"),
    p.ScanDir: _on(Access.READ, "path"),
    p.Acquire: _on(Access.READ_WRITE, "name"),  # a lock's name is ruled as a path is
    p.Renew: _on(Access.READ_WRITE, "name"),
    p.Release: _on(Access.READ_WRITE, "name"),
    p.LockQuery: _on(Access.READ, "name"),
    p.LockWatch: _on(Access.READ, "name"),
}


def need(message: p.Message) -> Need | None:
    """The access ``message`` needs, or None if it names no path. A message type with
    no entry is refused: a new request is denied until its need is written down."""
    need_of = _NEEDS.get(type(message))
    if need_of is None:
        raise ProtocolError(f"{message.TYPE}: no access rule for this request")
    return need_of(message)


def _covers(prefix: str, path: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + "/")


@dataclasses.dataclass(frozen=True, slots=True)
class AccessRules:
    """Parsed rules: per identity, its ``(prefix, access)`` pairs, longest prefix first."""

    default: Access
    rules: dict[str, tuple[tuple[str, Access], ...]]

    def level(self, identity: str, path: str) -> Access:
        """What ``identity`` may do to ``path`` (normal form), by rules 1 and 2."""
        for prefix, access in self.rules.get(identity, ()):
            if _covers(prefix, path):
                return access
        return Access.NONE if identity == ANONYMOUS else self.default

    def check(self, identity: str, access: Access, paths: Iterable[str]) -> None:
        """Return if ``identity`` has ``access`` on every one of ``paths``, else raise
        :class:`Unauthorized` naming the first path it lacks it on."""
        for path in paths:
            if self.level(identity, path) < access:
                verb = "read" if access is Access.READ else "write"
                raise Unauthorized(f"{identity!r} may not {verb} {path or '/'!r}")

    def check_request(self, identity: str, message: p.Message) -> None:
        """:meth:`check` what ``message`` needs (:func:`need`)."""
        required = need(message)
        if required is not None:
            self.check(identity, required.access, required.paths)


# ---------------------------------------------------------------- the file
_TOP_KEYS = frozenset({"default", "rule"})
_RULE_KEYS = ("identity", "prefix", "access")
_RULE_HEADER = r"\s*\[\[\s*rule\s*\]\]"


_TABLE_HEADER = r"\s*\["  # any table's header: where a [[rule]] table's keys end


def _line_of(text: str, pattern: str, nth: int = 0) -> str:
    """' (line N)' for the ``nth`` line matching ``pattern``, or '' if there is none."""
    found = [i for i, line in enumerate(text.splitlines(), 1) if re.match(pattern, line)]
    return f" (line {found[nth]})" if nth < len(found) else ""


def _key_line(text: str, nth: int, key: str) -> str:
    """' (line N)' for ``key``'s line in the ``nth`` ``[[rule]]`` table, or '' if it
    cannot be found (a rule written inline). tomllib gives parsed values no positions,
    so the text is searched: from the table's header to the next table's."""
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if re.match(_RULE_HEADER, line)]
    if nth >= len(headers):
        return ""
    assignment = r"\s*[\"']?" + re.escape(key) + r"[\"']?\s*="
    for i in range(headers[nth] + 1, len(lines)):
        if re.match(_TABLE_HEADER, lines[i]):
            break
        if re.match(assignment, lines[i]):
            return f" (line {i + 1})"
    return ""


def _level(value: object, where: str) -> Access:
    if not isinstance(value, str) or value not in _LEVELS:
        words = ", ".join(_LEVELS)
        raise BadAccessFile(f"{where}: {value!r} is not one of {words}")
    return _LEVELS[value]


def parse(text: str, source: str = "access file") -> AccessRules:
    """The rules in ``text`` (TOML), or :class:`BadAccessFile` saying where and why."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line L, column C)"
        raise BadAccessFile(f"{source}: {exc}") from None
    for key in data:
        if key not in _TOP_KEYS:
            line = _line_of(text, r"\s*[\"'\[]*" + re.escape(key))
            raise BadAccessFile(
                f"{source}{line}: unknown key {key!r} (expected default and [[rule]] tables)"
            )
    default_line = _line_of(text, r"\s*default\s*=")
    default = _level(data.get("default", "none"), f"{source}{default_line}: default")
    entries = data.get("rule", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BadAccessFile(f"{source}: rule must be an array of tables, written [[rule]]")
    seen: dict[tuple[str, str], int] = {}
    by_identity: dict[str, list[tuple[str, Access]]] = {}
    for i, entry in enumerate(entries):
        # A rule's own faults point at its header, a value's at the value's line.
        where = f"{source}{_line_of(text, _RULE_HEADER, i)}: rule[{i}]"

        def at(key: str, i: int = i) -> str:
            return f"{source}{_key_line(text, i, key)}: rule[{i}]"

        for key in entry:
            if key not in _RULE_KEYS:
                raise BadAccessFile(f"{at(key)}: unknown key {key!r} (expected {_RULE_KEYS})")
        for key in _RULE_KEYS:
            if key not in entry:
                raise BadAccessFile(f"{where}: missing key {key!r}")
        identity = entry["identity"]
        if not isinstance(identity, str) or not identity:
            raise BadAccessFile(f"{at('identity')}.identity: must be a non-empty string")
        if not isinstance(entry["prefix"], str):
            raise BadAccessFile(f"{at('prefix')}.prefix: must be a string")
        try:
            prefix = normalize(entry["prefix"], allow_root=True)
        except BadPath as exc:
            raise BadAccessFile(f"{at('prefix')}.prefix: {exc}") from None
        access = _level(entry["access"], f"{at('access')}.access")
        first = seen.setdefault((identity, prefix), i)
        if first != i:
            raise BadAccessFile(
                f"{where}: repeats identity {identity!r} and prefix {prefix!r} of rule[{first}]"
            )
        by_identity.setdefault(identity, []).append((prefix, access))
    rules = {
        identity: tuple(sorted(pairs, key=lambda pair: len(pair[0]), reverse=True))
        for identity, pairs in by_identity.items()
    }
    return AccessRules(default, rules)


def describe(rules: AccessRules) -> str:
    """One line summing ``rules`` up, for the log."""
    count = sum(len(pairs) for pairs in rules.rules.values())
    return f"{count} rule(s) for {len(rules.rules)} identit(ies), default {_WORDS[rules.default]}"
