"""The benchmarks' ``--help``: every option says its default, and a module
docstring's bullet list keeps its lines. No benchmark is run.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fscache.bench import bigfiles, checker


def _help(main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_the_checker_s_help_gives_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_help(checker.main, capsys).split())
    for shown in (
        "seconds of load (default 30.0)", "worker processes (default 4)",
        "files they share (default 3)", "0: no faults (default 3.0)",
        "lease term, seconds (default 1.0)", "skew allowance, seconds (default 0.1)",
        "write (default 0.3)", "(default 0.01)", "(default: a new one each run, printed)",
        "(default: a temporary directory, removed)",
    ):  # fmt: skip
        assert shown in text


def test_bigfiles_help_gives_the_defaults_and_keeps_the_bullets_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(bigfiles.main, capsys)
    assert "(default 2048)" in " ".join(text.split()) and "(default 200)" in text
    bullets = [line for line in text.splitlines() if line.startswith("* ")]
    assert len(bullets) == 2 and bullets[0].startswith("* a 4 KiB ranged read")
