"""Coverage-guided fuzzing of the codec and the server, with atheris (libFuzzer).

``python -m fscache.bench.fuzz --target NAME --seconds N`` (or ``--runs N``) runs one
target of ``tests/fuzz/targets.py`` (``codec``, ``schema``, ``service``) from a source
checkout, with fscache's modules instrumented for coverage. The fuzzer starts from the
target's regression corpus (``tests/fuzz/corpus/NAME/``, less the inputs of known bugs)
copied into a working directory (``--work``, a temporary one by default), where it keeps
the inputs that reach new code. An input that fails is written into the regression
corpus (``--crashes`` to put it elsewhere) and ends the run with a non-zero status; the
test suite replays every file there.

libFuzzer prints its progress and, at the end, its statistics (``number_of_executed_units``
is the number of executions).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]  # bench/ is installed in place (editable)
PER_INPUT_TIMEOUT = 60  # s: one input running longer is reported as a hang
# A service input is a script of actions: let it be long from the start, since libFuzzer
# otherwise grows its inputs from a few bytes and a short script reaches little.
TARGET_OPTIONS = {"service": ["-len_control=0", "-max_len=2048"]}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fscache.bench.fuzz", description=__doc__)
    parser.add_argument("--target", required=True, choices=("codec", "schema", "service"))
    limit = parser.add_mutually_exclusive_group(required=True)
    limit.add_argument("--seconds", type=int, help="stop after this many seconds")
    limit.add_argument("--runs", type=int, help="stop after this many executions")
    parser.add_argument("--work", type=Path, help="working corpus (default: a temp dir)")
    parser.add_argument("--crashes", type=Path, help="where failing inputs go")
    parser.add_argument("--seed", type=int, default=0, help="libFuzzer's seed (0: random)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    tests_dir = CHECKOUT / "tests" / "fuzz"
    if not tests_dir.is_dir():
        sys.exit(f"no {tests_dir}: the fuzz targets live in a source checkout")
    sys.path.insert(0, str(CHECKOUT))
    import atheris

    with atheris.instrument_imports(include=["fscache", "tests"]):
        from tests.fuzz import targets

    regression = targets.CORPUS / args.target
    crashes = args.crashes or regression
    crashes.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{args.target}-") as temp:
        work = args.work or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        for seed in sorted(regression.glob("*")) if regression.is_dir() else ():
            if seed.is_file() and seed.name not in targets.KNOWN_BUGS:
                shutil.copy(seed, work / seed.name)
        limit = f"-max_total_time={args.seconds}" if args.seconds else f"-runs={args.runs}"
        libfuzzer_args = [
            sys.argv[0],
            str(work),
            limit,
            f"-artifact_prefix={crashes}/",
            f"-timeout={PER_INPUT_TIMEOUT}",
            f"-seed={args.seed}",
            "-print_final_stats=1",
            *TARGET_OPTIONS.get(args.target, ()),
        ]
        atheris.Setup(libfuzzer_args, targets.TARGETS[args.target])
        atheris.Fuzz()


if __name__ == "__main__":
    main()
