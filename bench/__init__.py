"""Benchmarks: the speed figures (``speed``), the paper's workload (``workload``), the
stale-read checker (``checker``) and the crash demo (``demo``).

The benchmarks need the ``bench`` extra (numpy, matplotlib, redis, etcd3gw), which a
plain install lacks; their command lines load without it, so ``--help`` always
works, and a run first asks :func:`missing_extra` what is missing.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from fscache.cli import exit_interrupted

BENCH_EXTRA_HINT = "pip install -e '.[bench]' in the fscache checkout"


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
