"""``fscache demo crash``: kill a lease holder and watch the writer wait out its lease.

This module checks the options, sets up the temporary directory and the child
processes, runs the script (:mod:`fscache.bench.demo_script`) and prints its
verdict. Every child runs in its own session (a Ctrl-C at the terminal reaches
only the demo), and every path out of :func:`run_crash_demo` stops them and
removes the temporary directory.
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import TextIO, TypeVar

import trio

from fscache.bench import procs
from fscache.bench.demo_console import Console
from fscache.bench.demo_options import CRASH_CLIENTS, CRASH_TERM, check_crash
from fscache.bench.demo_reader import Abort
from fscache.bench.demo_script import CrashDemo, Interrupted, Tolerances
from fscache.command import exit_interrupted
from fscache.errors import FscacheError


def _leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside ``exc`` (trio nests them in groups)."""
    while isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if isinstance(inner, KeyboardInterrupt | Interrupted | Abort | FscacheError):
                return _leaf(inner)
        exc = exc.exceptions[0]
    return exc


Demo = TypeVar("Demo", bound=CrashDemo)


def play(
    console: Console,
    title: str,
    intro: str,
    make: Callable[[procs.Commands], Demo],
    verdict: Callable[[Demo], str],
) -> int:
    """Print the title and intro; make a demo whose children log to a temporary
    directory, run its script with a server root there, stop the children and print
    the checks. The exit status: 0 (after ``verdict(demo)``) if every check passed."""
    c = console
    c.line(c.paint(title, "bold"))
    for line in textwrap.wrap(intro, 88):
        c.line(line)
    c.line()
    with tempfile.TemporaryDirectory(prefix="fscache-demo-") as temp:
        root, logs = os.path.join(temp, "root"), os.path.join(temp, "logs")
        os.mkdir(root)
        os.mkdir(logs)
        demo = make(procs.Commands(logs))
        status = _play(demo, root)
    if status is not None:
        return status
    c.line(c.paint(verdict(demo), "green"))
    return 0


def _play(demo: CrashDemo, root: str) -> int | None:
    c = demo.c
    try:
        try:
            trio.run(demo.run, root)
        except BaseException as exc:
            leaf = _leaf(exc)
            if isinstance(leaf, KeyboardInterrupt):
                c.clear_status()
                c.line(f"\ninterrupted: stopping the server and the {demo.children_name}")
                return exit_interrupted()
            if isinstance(leaf, Interrupted):
                c.clear_status()
                c.line(f"\n{leaf}: stopping the server and the {demo.children_name}")
                return 128 + leaf.signum
            if not isinstance(leaf, Abort | FscacheError):
                raise
            c.clear_status()
            why = str(leaf) if isinstance(leaf, Abort) else f"{type(leaf).__name__}: {leaf}"
            demo.check("demo stopped", why, False)
    finally:
        demo.children.stop_all()
    if demo.checks:
        demo.summary()
    problems = demo.problems
    c.line()
    if not problems:
        return None
    for name, path in demo.logs():
        tail = procs.tail(path)
        if tail:
            c.line(f"last lines of the {name}'s log:")
            for line in tail:
                c.line(f"    {line}")
    c.line(c.paint(f"FAIL: {problems[0]}", "red"))
    for problem in problems[1:]:
        c.line(c.paint(f"      {problem}", "red"))
    return 1


def run_crash_demo(
    *,
    term: float = CRASH_TERM,
    skew: float = 0.1,
    clients: int = CRASH_CLIENTS,
    out: TextIO | None = None,
    tolerances: Tolerances | None = None,
) -> int:
    """Run the crash demonstration; 0 if everything behaved as the lease rules say
    (measured times within ``tolerances`` of the rules' instants)."""
    check_crash(term=term, skew=skew, clients=clients)
    console = Console(time.monotonic(), out or sys.stdout)
    title = (
        f"fscache crash demo: {clients} reader processes, lease term {term:g} s, skew {skew:g} s"
    )
    intro = (
        "Reader 0 is killed with SIGKILL while it holds a lease. The live readers approve the"
        " next write at once; the dead one cannot, so the server waits until its lease runs"
        " out (grant + term + skew). Times are seconds since the start, on the machine's"
        " monotonic clock, which every process shares."
    )

    def make(children: procs.Commands) -> CrashDemo:
        return CrashDemo(
            term=term,
            skew=skew,
            clients=clients,
            tolerances=tolerances or Tolerances(),
            console=console,
            children=children,
        )

    def verdict(demo: CrashDemo) -> str:
        return (
            f"OK: the writer waited {demo.wait_measured:.2f} s for the dead client's lease"
            f" (expected {demo.wait_expected:.2f} s); live clients approved at once;"
            " no stale read; nothing lost"
        )

    return play(console, title, intro, make, verdict)


__all__ = ["Tolerances", "run_crash_demo"]
