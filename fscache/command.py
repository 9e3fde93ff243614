"""The ``fscache`` command's entry point, kept apart from :mod:`fscache.cli` so that
it is loaded before the command's modules are.

A Ctrl-C while those modules load (trio, cryptography, the server: tens of
milliseconds) ends the command as one later does: one line and status 130, no
traceback. Only Python's own start-up and this package's small ``__init__`` come
before it.
"""

from __future__ import annotations

import sys


def exit_interrupted() -> int:
    """130, the exit status of a Ctrl-C handled by printing one line.

    Under ``python -m``, CPython exits by SIGINT after all, instead of with the status
    it was given, if a KeyboardInterrupt ever left an ``exec`` or ``eval`` of source
    text: it takes that for an unhandled interrupt. Dataclasses and named tuples are
    made with ``exec`` as modules import, so a Ctrl-C during start-up can land there.
    Running any source text clears that mark, so the status is 130 every time."""
    exec("")  # see above: not for its effect, for the mark it clears
    return 130


def main() -> int:
    try:
        from fscache.cli import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exit_interrupted()
    return run()
