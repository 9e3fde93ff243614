"""A history checker for fscache's locks: holder processes, a nemesis, and the rules
the recorded history must obey.

``python -m fscache.bench.lock_history [--processes 4] [--duration 20] [--ttl 0.6]
[--seed S]`` starts a server and ``--processes`` holders
(:mod:`fscache.bench.lock_holder` ``--run``), all contending for one lock and
writing, fenced with it, to one file. Meanwhile a nemesis picks a holder about
every half second and either SIGKILLs it (and starts a new process in its place)
or SIGSTOPs it for longer than the lock's ttl plus skew, so that the lock passes
on while it sleeps, then SIGCONTs it. Every holder logs its events (stamped with
``time.monotonic()``, one clock for the machine) to a file of its own, and
:func:`check` reads them all at the end:

1. **Mutual exclusion of belief.** A holder believes it holds the lock from the
   grant's arrival until the last ``valid_until`` it was told, or until it sent its
   release or learnt of the loss, if earlier. No two such intervals overlap.
2. **Tokens follow grant order.** No token is granted twice, and of two believed
   intervals, the later has the larger token.
3. **Fencing.** The applied fenced writes, in the order the server applied them
   (their versions increase strictly with each write of the file), carry tokens
   that never decrease: no write with an older token landed after one with a
   newer token.

A holder killed while a write was in flight may have had it applied without
logging it; the checks hold for every write that was logged, and the unlogged
ones are what the kill hides, not something the checks assume.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

from fscache.bench import run_main
from fscache.bench.harness import fscache_server
from fscache.bench.procs import stop_command

LOCK = "history/lock"
FENCED = "history/fenced.log"
NEMESIS_EVERY = 0.5
START_TIMEOUT = 20.0


@dataclasses.dataclass(frozen=True, slots=True)
class Belief:
    """One holding of the lock, as its holder saw it."""

    process: str
    token: int
    start: float  # the grant arrived
    end: float  # it stopped believing: last valid_until, or release / loss if earlier


@dataclasses.dataclass(frozen=True, slots=True)
class AppliedWrite:
    process: str
    token: int
    version: int


@dataclasses.dataclass
class Verdict:
    beliefs: list[Belief]
    applied: list[AppliedWrite]
    refused: int
    problems: list[str]


def beliefs_of(process: str, events: Iterable[dict[str, Any]]) -> list[Belief]:
    """The holdings one process's log records, in order."""
    found: list[Belief] = []
    token: int | None = None
    start = end = 0.0

    def close(at: float) -> None:
        nonlocal token
        if token is not None:
            found.append(Belief(process, token, start, min(end, at)))
        token = None

    for event in events:
        kind = event["event"]
        if kind == "acquired":
            close(event["t"])
            token, start, end = event["token"], event["t"], event["valid_until"]
        elif kind == "renewed" and event["token"] == token:
            end = max(end, event["valid_until"])
        elif kind in ("release", "lost") and event["token"] == token:
            close(event["t"])
    close(float("inf"))
    return found


def check(logs: dict[str, list[dict[str, Any]]]) -> Verdict:
    """Judge the logs of every holder process (name -> events, in logged order)."""
    beliefs = [b for name, events in logs.items() for b in beliefs_of(name, events)]
    writes = [(name, e) for name, events in logs.items() for e in events if e["event"] == "write"]
    applied = sorted(
        (
            AppliedWrite(name, e["token"], e["version"])
            for name, e in writes
            if e["outcome"] == "applied"
        ),
        key=lambda w: w.version,
    )
    problems: list[str] = []

    granted: dict[int, str] = {}
    for b in beliefs:
        if b.token in granted:
            problems.append(f"token {b.token} granted twice: to {granted[b.token]} and {b.process}")
        granted[b.token] = b.process

    held = sorted((b for b in beliefs if b.end > b.start), key=lambda b: b.start)
    for before, after in itertools.pairwise(held):
        if after.token <= before.token:
            problems.append(
                f"token {after.token} ({after.process}) was granted after"
                f" token {before.token} ({before.process})"
            )
    longest: Belief | None = None  # of the beliefs begun so far, the one that lasts longest
    for b in held:
        if longest is not None and b.start < longest.end:
            problems.append(
                f"{longest.process} (token {longest.token}) believed it held the lock until"
                f" {longest.end:.6f}, but {b.process} (token {b.token}) believed so"
                f" from {b.start:.6f}"
            )
        if longest is None or b.end > longest.end:
            longest = b

    for earlier, later in itertools.pairwise(applied):
        if later.version == earlier.version:
            problems.append(f"two applied writes share version {later.version}")
        if later.token < earlier.token:
            problems.append(
                f"a write with token {later.token} ({later.process}) was applied after"
                f" one with token {earlier.token} ({earlier.process})"
            )
    return Verdict(
        beliefs=beliefs,
        applied=applied,
        refused=sum(1 for _, e in writes if e["outcome"] == "refused"),
        problems=problems,
    )


def read_log(path: str) -> list[dict[str, Any]]:
    """A holder's events; a line cut short by a SIGKILL ends the log."""
    events = []
    with open(path) as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except ValueError:
                break
    return events


# ---------------------------------------------------------------- the run
@dataclasses.dataclass
class Nemesis:
    kills: int = 0
    pauses: int = 0


class HistoryRun:
    """Holder processes, each logging to a file of its own, and the nemesis."""

    def __init__(self, port: int, logs: str, ttl: float, skew: float, seed: int) -> None:
        self.port = port
        self.logs = logs
        self.ttl = ttl
        self.skew = skew
        self.rng = random.Random(seed)
        self.incarnations = 0
        self.live: list[subprocess.Popen[bytes]] = []
        self.nemesis = Nemesis()

    def start(self, seconds: float) -> subprocess.Popen[bytes]:
        self.incarnations += 1
        name = f"holder-{self.incarnations}"
        argv = [
            sys.executable, "-m", "fscache.bench.lock_holder", "--port", str(self.port),
            "--lock", LOCK, "--ttl", repr(self.ttl), "--identity", name, "--fenced", FENCED,
            "--run", repr(seconds), "--seed", str(self.rng.randrange(2**31)),
        ]  # fmt: skip
        with open(os.path.join(self.logs, f"{name}.jsonl"), "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.DEVNULL)
        return proc

    def run(self, processes: int, duration: float) -> None:
        end = time.monotonic() + duration
        self.live = [self.start(duration) for _ in range(processes)]
        try:
            while time.monotonic() < end - 2 * self.ttl:
                time.sleep(self.rng.uniform(0.5, 1.5) * NEMESIS_EVERY)
                i = self.rng.randrange(len(self.live))
                if self.rng.random() < 0.5:
                    self.live[i].kill()
                    self.live[i].wait()
                    self.nemesis.kills += 1
                    self.live[i] = self.start(max(0.1, end - time.monotonic()))
                else:
                    self.live[i].send_signal(signal.SIGSTOP)
                    time.sleep(self.ttl + self.skew + self.rng.uniform(0.1, 0.5))
                    self.live[i].send_signal(signal.SIGCONT)
                    self.nemesis.pauses += 1
            for proc in self.live:  # each stops by itself at the end of its run
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(1.0, end - time.monotonic()) + START_TIMEOUT)
        finally:
            for proc in self.live:
                stop_command(proc, 1.0)

    def histories(self) -> dict[str, list[dict[str, Any]]]:
        return {
            name.removesuffix(".jsonl"): read_log(os.path.join(self.logs, name))
            for name in sorted(os.listdir(self.logs))
        }


def run_history(
    *, processes: int, duration: float, ttl: float, skew: float = 0.1, seed: int = 0
) -> tuple[Verdict, Nemesis]:
    """Start a server and the holders, run the nemesis for ``duration`` s, judge."""
    with tempfile.TemporaryDirectory(prefix="fscache-lock-history-") as temp:
        root, logs = os.path.join(temp, "root"), os.path.join(temp, "logs")
        os.mkdir(root)
        os.mkdir(logs)
        # term = ttl: a paused holder's read lease on the fenced file (every writer
        # gets one) holds the others' writes back no longer than its lock does
        with fscache_server(root, term=ttl, skew=skew) as server:
            history = HistoryRun(server.port, logs, ttl, skew, seed)
            history.run(processes, duration)
        return check(history.histories()), history.nemesis


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fscache.bench.lock_history")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--ttl", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args(argv)
    verdict, nemesis = run_history(
        processes=args.processes, duration=args.duration, ttl=args.ttl, seed=args.seed
    )
    print(
        f"seed {args.seed}: {nemesis.kills} kills, {nemesis.pauses} pauses;"
        f" {len(verdict.beliefs)} grants, {len(verdict.applied)} fenced writes applied,"
        f" {verdict.refused} refused by the server"
    )
    for problem in verdict.problems:
        print(f"ANOMALY: {problem}")
    print("0 anomalies" if not verdict.problems else f"{len(verdict.problems)} anomalies")
    return 1 if verdict.problems else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
