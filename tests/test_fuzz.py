"""The fuzz targets (``tests/fuzz/targets.py``): every regression input replayed, and a
short coverage-guided run of each target.

The replay runs each file of ``tests/fuzz/corpus/<target>/`` through its target in this
process; an input of a bug not yet fixed is a strict xfail (``KNOWN_BUGS``). The short
runs start ``python -m fscache.bench.fuzz`` in a real process (libFuzzer ends the
process it runs in) with a fixed seed, and any failing input goes to a temp dir.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .fuzz.targets import CORPUS, KNOWN_BUGS, TARGETS

SHORT_RUNS = {"codec": 5000, "schema": 2000, "service": 300}  # a few seconds each


def corpus_files() -> list[object]:
    params: list[object] = []
    for target in sorted(TARGETS):
        for path in sorted((CORPUS / target).glob("*")):
            marks = []
            if path.name in KNOWN_BUGS:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[path.name]))
            params.append(pytest.param(target, path, id=f"{target}/{path.name}", marks=marks))
    return params


def test_every_target_has_a_regression_corpus() -> None:
    for target in TARGETS:
        assert any((CORPUS / target).glob("*")), target


@pytest.mark.parametrize(("target", "path"), corpus_files())
def test_regression_input_passes(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_short_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "fscache.bench.fuzz", "--target", target]
    argv += ["--runs", str(SHORT_RUNS[target]), "--seed", "1", "--crashes", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"stat::number_of_executed_units: {SHORT_RUNS[target]}" in done.stderr
    assert not list(tmp_path.iterdir())
