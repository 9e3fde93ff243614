"""Benchmarks: the speed figures (``speed``), the paper's workload (``workload``), the
stale-read checker (``checker``) and the crash demo (``demo``).

The benchmarks need the ``bench`` extra (numpy, matplotlib, redis, etcd3gw), which a
plain install lacks; their command lines load without it, so ``--help`` always
works, and a run first asks :func:`missing_extra` what is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from fscache.command import exit_interrupted

BENCH_EXTRA_HINT = "pip install -e '.[bench]' in the fscache checkout"
Number = TypeVar("Number", int, float)


def missing_extra(*modules: str) -> str | None:
    """One line naming the first of ``modules`` that is not installed and how to get
    it, or None when all of them are there. Asked before a run, not at import, so a
    missing extra is one clear line rather than a traceback from deep inside."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed; the benchmarks need it: {BENCH_EXTRA_HINT}"
    return None


def run_main(main: Callable[..., int | None], *args: Any) -> int:
    """A benchmark's ``python -m`` entry: ``main(*args)``'s exit status, and for a
    Ctrl-C one line and 130. Its children have been stopped by the ``with`` and
    ``finally`` blocks the interrupt went through; its workers ignore Ctrl-C."""
    try:
        return main(*args) or 0
    except BaseException as error:
        if not interrupted(error):
            raise
        print("interrupted", file=sys.stderr)
        return exit_interrupted()


def interrupted(error: BaseException) -> bool:
    """Whether ``error`` is a Ctrl-C: a KeyboardInterrupt, or a group holding one, as
    trio raises it from a nursery whose task the interrupt landed in. What else the
    group holds (a child's broken connection, say) followed from the interrupt."""
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(KeyboardInterrupt) is not None
    return isinstance(error, KeyboardInterrupt)


def bounded(
    kind: type[Number], least: Number, most: Number | None = None
) -> Callable[[str], Number]:
    """An argparse type: a number of ``kind`` from ``least`` to ``most`` (no upper bound
    if None), else bad usage. A count of 0 or a duration of nan or infinity would
    otherwise start a run that waits for ever or fails deep inside."""
    span = f", {shown(least)} or more" if most is None else f" from {shown(least)} to {shown(most)}"
    nature = "a whole number" if kind is int else "a number"

    def check(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {nature}{span}, not {text!r}") from None
        if not (math.isfinite(value) and least <= value and (most is None or value <= most)):
            raise argparse.ArgumentTypeError(f"must be {nature}{span}, not {text}")
        return value

    return check


def shown(value: float) -> str:
    """A number as typed: a whole one in full (1048576, not 1.04858e+06)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
