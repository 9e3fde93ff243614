"""The stale-read checker: random reads and writes under a nemesis, then a history check.

    python -m fscache.bench.checker --duration 30 --clients 4 --files 3 --kill-every 3

Theory of operation
-------------------
*The run.* One server process (``fscache serve``, short term) owns a fresh root.
``--clients`` worker processes each loop over random reads and writes of a few
files, every write with a value no one else ever writes (``client/seq``). A
nemesis (this process) meanwhile strikes every ``--kill-every`` seconds on average:
it SIGKILLs and restarts a worker (a restarted worker is a new client), SIGKILLs
and restarts the server (same root, same port: the workers' clients reconnect by
themselves), or freezes a worker with SIGSTOP for 0.5-2 terms (a hung client)
before SIGCONT.

*The log.* Each worker appends one JSON line per event, with ``time.monotonic()``
(one system-wide clock on Linux, so all processes share it): a write logs
``begin`` before it is sent and ``end`` when it returns (``ok`` false if it
failed); a read logs one line when it returns. A write whose end never made it to
the log (the worker was killed) or that failed (the server died, the connection
broke) is *indeterminate*: it may have been applied, at any time after it began.

*The check* (:func:`check_history`), per file, for every read that returned a value:

1. the value was written by some write (``phantom`` otherwise);
2. that write began before the read ended (``future`` otherwise);
3. no write that began after that write ended had completed before the read began
   (``stale`` otherwise): ``docs/design.md`` section 1, "a read that starts after a write
   completed sees that write or a later one". An indeterminate write never
   completes, for this rule.
4. the same, where "completed" also counts a write *observed*: its value was
   returned by a read that ended before this read began (``stale-observed``).
   That is one-copy semantics for writes whose ``write()`` never returned (an
   acknowledgement lost to a crash) -- a value someone has seen cannot be
   replaced by an older one.

Rules 3 and 4 need no total order of writes: "began after it ended" is forced by
real time. Zero anomalies of any kind is the bar; the exit status is 1 otherwise.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fscache.bench import bounded, run_main
from fscache.bench.harness import START_TIMEOUT, serve_argv
from fscache.cli import parse_serving_line


# ---------------------------------------------------------------- the history
@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """One operation as a client saw it, on the shared monotonic clock.

    ``ok`` for a read: it returned ``value``; for a write: it was acknowledged. A
    write that is not ``ok`` may still have been applied; its ``end`` does not
    matter (it counts as +inf).
    """

    kind: str  # "read" | "write"
    file: str
    value: str | None
    start: float
    end: float
    ok: bool
    client: str = ""
    hit: bool = False  # a read answered from the client's cache

    def describe(self) -> str:
        end = "?" if math.isinf(self.end) or (self.kind == "write" and not self.ok) else self.end
        status = "" if self.ok else (" (outcome unknown)" if self.kind == "write" else " failed")
        where = " from cache" if self.hit else ""
        return (
            f"{self.client} {self.kind} {self.file}={self.value!r}{where}{status} "
            f"[{self.start:.6f} .. {end if isinstance(end, str) else f'{end:.6f}'}]"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Anomaly:
    """A read that one-copy semantics forbids (see the module docstring for kinds)."""

    kind: str  # "phantom" | "future" | "stale" | "stale-observed"
    read: Op
    write: Op | None = None  # the write whose value the read returned
    newer: Op | None = None  # the later write that had completed (or been seen)
    witness: Op | None = None  # stale-observed: the earlier read that saw ``newer``

    def describe(self) -> str:
        lines = [f"{self.kind}: {self.read.describe()}"]
        if self.write is not None:
            lines.append(f"  returned the value of   {self.write.describe()}")
        if self.newer is not None:
            lines.append(f"  but before it began:    {self.newer.describe()}")
        if self.witness is not None:
            lines.append(f"  had been seen by        {self.witness.describe()}")
        return "\n".join(lines)


def check_history(ops: Iterable[Op]) -> list[Anomaly]:
    """Every anomaly in ``ops`` (reads and writes, any order), ordered by read start.

    Failed reads are ignored. Each written value must be unique per file.
    """
    by_file: dict[str, list[Op]] = {}
    for op in ops:
        by_file.setdefault(op.file, []).append(op)
    anomalies: list[Anomaly] = []
    for file_ops in by_file.values():
        anomalies += _check_file(file_ops)
    anomalies.sort(key=lambda a: a.read.start)
    return anomalies


def _check_file(ops: list[Op]) -> list[Anomaly]:
    writes: dict[str | None, Op] = {}
    for op in ops:
        if op.kind == "write":
            if op.value in writes:
                raise ValueError(f"value {op.value!r} written twice to {op.file!r}")
            writes[op.value] = op
    reads = sorted((op for op in ops if op.kind == "read" and op.ok), key=lambda op: op.start)

    # When each write had certainly taken effect: acknowledged, or seen by a read.
    acked: list[tuple[float, Op, Op | None]] = [
        (w.end, w, None) for w in writes.values() if w.ok and not math.isinf(w.end)
    ]
    first_seen: dict[str | None, Op] = {}
    for read in reads:
        seen = first_seen.get(read.value)
        if read.value in writes and (seen is None or read.end < seen.end):
            first_seen[read.value] = read
    observed = acked + [(r.end, writes[v], r) for v, r in first_seen.items()]
    acked.sort(key=lambda item: item[0])
    observed.sort(key=lambda item: item[0])

    anomalies: list[Anomaly] = []
    latest_acked = _LatestStart(acked)
    latest_observed = _LatestStart(observed)
    for read in reads:
        write = writes.get(read.value)
        if write is None:
            anomalies.append(Anomaly("phantom", read))
            continue
        if write.start > read.end:
            anomalies.append(Anomaly("future", read, write))
            continue
        write_end = write.end if write.ok else math.inf
        newer = latest_acked.before(read.start)
        if newer is not None and newer[1].start > write_end:
            anomalies.append(Anomaly("stale", read, write, newer[1]))
            continue
        newer = latest_observed.before(read.start)
        if newer is not None and newer[1].start > write_end:
            anomalies.append(Anomaly("stale-observed", read, write, newer[1], newer[2]))
    return anomalies


class _LatestStart:
    """Over events sorted by completion time: of those completed before ``t``, the
    one whose write began last (a prefix maximum, so each query is a bisection)."""

    def __init__(self, events: list[tuple[float, Op, Op | None]]) -> None:
        self._ends = [end for end, _, _ in events]
        self._best: list[tuple[float, Op, Op | None]] = []
        for event in events:
            if not self._best or event[1].start > self._best[-1][1].start:
                self._best.append(event)
            else:
                self._best.append(self._best[-1])

    def before(self, t: float) -> tuple[float, Op, Op | None] | None:
        i = bisect.bisect_left(self._ends, t)
        return self._best[i - 1] if i else None


# ---------------------------------------------------------------- the log
def parse_log(lines: Iterable[str], *, client: str = "") -> list[Op]:
    """The operations in one worker's log. A write with a ``begin`` and no ``end`` (the
    worker died) is indeterminate; a torn last line (killed mid-write) is skipped."""
    ops: list[Op] = []
    begun: dict[str, dict[str, object]] = {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        who = str(event.get("client", client))
        if event["event"] == "read":
            ops.append(
                Op("read", event["file"], event["value"], event["start"], event["end"],
                   event["ok"], who, event.get("hit", False))
            )  # fmt: skip
        elif event["event"] == "write-begin":
            begun[event["value"]] = event
        elif event["event"] == "write-end":
            begin = begun.pop(event["value"])
            ops.append(
                Op("write", str(begin["file"]), event["value"], float(begin["start"]),  # type: ignore[arg-type]
                   event["end"] if event["ok"] else math.inf, event["ok"],
                   str(begin.get("client", client)))
            )  # fmt: skip
    for value, begin in begun.items():
        ops.append(
            Op("write", str(begin["file"]), value, float(begin["start"]), math.inf, False,  # type: ignore[arg-type]
               str(begin.get("client", client)))
        )  # fmt: skip
    return ops


class EventLog:
    """Append-only JSON lines, one ``write(2)`` each, so a SIGKILL tears at most the
    line being written and never loses one already logged."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, **event: object) -> None:
        os.write(self._fd, (json.dumps(event) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


# ---------------------------------------------------------------- a worker process
async def run_worker(
    port: int, files: Sequence[str], client_id: str, log_path: str, *,
    seed: int, write_ratio: float, think: float,
) -> None:  # fmt: skip
    """Random reads and writes forever (until killed), every one logged."""
    import trio

    from fscache.client.client import open_client
    from fscache.errors import FscacheError, Unavailable

    rng = random.Random(seed)
    log = EventLog(log_path)
    seq = 0
    while True:  # the server may be down when we start
        try:
            async with open_client("127.0.0.1", port, client_id=client_id) as client:
                while True:
                    path = rng.choice(files)
                    if rng.random() < write_ratio:
                        seq += 1
                        value = f"{client_id}/{seq}"
                        start = time.monotonic()
                        log.log(event="write-begin", client=client_id, file=path, value=value,
                                start=start)  # fmt: skip
                        try:
                            await client.write(path, value.encode())
                            ok = True
                        except FscacheError:
                            ok = False
                        log.log(event="write-end", value=value, end=time.monotonic(), ok=ok)
                    else:
                        hits = client.stats["hits"]
                        start = time.monotonic()
                        try:
                            got: str | None = (await client.read(path)).decode()
                        except FscacheError:
                            got = None
                        end = time.monotonic()
                        hit = client.stats["hits"] > hits
                        log.log(event="read", client=client_id, file=path, value=got, start=start,
                                end=end, ok=got is not None, hit=hit)  # fmt: skip
                    await trio.sleep(rng.uniform(0, think))
        except Unavailable:
            await trio.sleep(0.1)


# ---------------------------------------------------------------- the nemesis
@dataclasses.dataclass
class Report:
    duration: float
    clients: int
    files: int
    term: float
    skew: float
    ops: Counter[str]
    nemesis: Counter[str]
    anomalies: list[Anomaly]

    def format(self) -> str:
        o, n = self.ops, self.nemesis
        lines = [
            f"checker: {self.duration:.1f} s, {self.clients} clients, {self.files} files, "
            f"term {self.term:g} s, skew {self.skew:g} s",
            f"nemesis: {n['server_kill']} server kills, {n['client_kill']} client kills, "
            f"{n['client_pause']} client pauses (SIGSTOP)",
            f"reads:  {o['read_ok']} returned ({o['read_hit']} from cache), "
            f"{o['read_failed']} failed",
            f"writes: {o['write_ok']} acknowledged, {o['write_unknown']} outcome unknown",
            f"anomalies: {len(self.anomalies)}"
            + (f" ({dict(Counter(a.kind for a in self.anomalies))})" if self.anomalies else ""),
        ]
        lines += [a.describe() for a in self.anomalies[:20]]
        if len(self.anomalies) > 20:
            lines.append(f"... and {len(self.anomalies) - 20} more")
        return "\n".join(lines)


def count_ops(ops: Iterable[Op]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for op in ops:
        if op.kind == "read":
            counts["read_ok" if op.ok else "read_failed"] += 1
            counts["read_hit"] += op.ok and op.hit
        else:
            counts["write_ok" if op.ok else "write_unknown"] += 1
    return counts


class _Nemesis:
    """Starts, kills, freezes and restarts the processes of one run."""

    def __init__(self, workdir: Path, files: list[str], *, term: float, skew: float,
                 seed: int, write_ratio: float, think: float) -> None:  # fmt: skip
        self.workdir = workdir
        self.root = workdir / "root"
        self.root.mkdir()
        self.logs = workdir / "logs"
        self.logs.mkdir()
        self.files = files
        self.term, self.skew = term, skew
        self.rng = random.Random(seed)
        self.write_ratio, self.think = write_ratio, think
        self.port = 0
        self.server: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, subprocess.Popen[bytes]] = {}  # slot: process
        self.incarnations: Counter[int] = Counter()
        self.frozen: dict[int, float] = {}  # slot: when to SIGCONT it
        self.counts: Counter[str] = Counter()
        self._deck: list[str] = []
        self._outputs: list[object] = []

    def _output(self, name: str) -> int:
        f = open(self.logs / name, "ab")  # noqa: SIM115 -- closed in stop()
        self._outputs.append(f)
        return f.fileno()

    def start_server(self) -> None:
        n = self.counts["server_start"]
        self.counts["server_start"] += 1
        out_path = self.logs / f"server.{n}.out"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            out = self._output(out_path.name)
            self.server = subprocess.Popen(
                serve_argv(str(self.root), term=self.term, skew=self.skew, port=self.port),
                stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            while time.monotonic() < deadline:
                text = out_path.read_text(errors="replace")
                address = next(filter(None, map(parse_serving_line, text.splitlines())), None)
                if address is not None:
                    self.port = address[1]
                    return
                if self.server.poll() is not None:
                    break  # e.g. the port is not free yet: try again
                time.sleep(0.01)
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the server did not start; see {out_path}")
            time.sleep(0.1)

    def kill_server(self) -> None:
        assert self.server is not None
        self.server.kill()
        self.server.wait()
        self.counts["server_kill"] += 1

    def start_worker(self, slot: int) -> None:
        n = self.incarnations[slot]
        self.incarnations[slot] += 1
        client_id = f"c{slot}.{n}"
        out = self._output(f"{client_id}.out")
        self.workers[slot] = subprocess.Popen(
            [sys.executable, "-m", "fscache.bench.checker", "--worker",
             "--port", str(self.port), "--paths", ",".join(self.files),
             "--client-id", client_id, "--log", str(self.logs / f"{client_id}.jsonl"),
             "--seed", str(self.rng.randrange(2**32)), "--write-ratio", str(self.write_ratio),
             "--think", str(self.think)],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def kill_worker(self, slot: int) -> None:
        worker = self.workers[slot]
        worker.kill()
        worker.wait()
        self.frozen.pop(slot, None)
        self.counts["client_kill"] += 1
        self.start_worker(slot)

    def freeze_worker(self, slot: int) -> None:
        if slot in self.frozen:
            return
        self.workers[slot].send_signal(signal.SIGSTOP)
        self.frozen[slot] = time.monotonic() + self.rng.uniform(0.5, 2.0) * self.term
        self.counts["client_pause"] += 1

    def thaw_due(self, now: float) -> None:
        for slot, due in list(self.frozen.items()):
            if now >= due:
                self.workers[slot].send_signal(signal.SIGCONT)
                del self.frozen[slot]

    def strike(self) -> None:
        """One random fault, dealt from a shuffled deck so that every four strikes hold
        one server kill, two client kills and one client pause."""
        if not self._deck:
            self._deck = ["server", "client", "client", "pause"]
            self.rng.shuffle(self._deck)
        fault = self._deck.pop()
        if fault == "server":
            self.kill_server()
            self.start_server()
        elif fault == "client":
            self.kill_worker(self.rng.randrange(len(self.workers)))
        else:
            self.freeze_worker(self.rng.randrange(len(self.workers)))

    def stop(self) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.kill()
            worker.wait()
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        for f in self._outputs:
            f.close()  # type: ignore[attr-defined]

    def setup(self) -> list[Op]:
        """Write each file's first value (logged as the writes of client ``setup``)."""
        from fscache.client.blocking import connect

        ops = []
        with connect(f"127.0.0.1:{self.port}", client_id="setup") as client:
            for path in self.files:
                value = f"setup/{path}"
                start = time.monotonic()
                client.write(path, value.encode())
                ops.append(Op("write", path, value, start, time.monotonic(), True, "setup"))
        return ops

    def history(self) -> list[Op]:
        ops: list[Op] = []
        for log in sorted(self.logs.glob("*.jsonl")):
            with open(log) as f:
                ops += parse_log(f, client=log.stem)
        return ops


def run(
    *,
    duration: float = 30.0,
    clients: int = 4,
    files: int = 3,
    kill_every: float = 3.0,
    term: float = 1.0,
    skew: float = 0.1,
    seed: int | None = None,
    write_ratio: float = 0.3,
    think: float = 0.01,
    workdir: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> Report:
    """One checker run: start everything, strike every ``kill_every`` s on average for
    ``duration`` s, stop, check the history. Blocking; uses real processes."""
    if seed is None:
        seed = random.randrange(2**32)
    progress(f"seed {seed}")
    names = [f"f{i}" for i in range(files)]
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="fscache-checker-"))
        else:
            os.makedirs(workdir, exist_ok=False)
        nemesis = _Nemesis(Path(workdir), names, term=term, skew=skew, seed=seed,
                           write_ratio=write_ratio, think=think)  # fmt: skip
        try:
            nemesis.start_server()
            setup = nemesis.setup()
            for slot in range(clients):
                nemesis.start_worker(slot)
            began = time.monotonic()
            end = began + duration
            next_strike = began + nemesis.rng.uniform(0.5, 1.5) * kill_every
            while (now := time.monotonic()) < end:
                nemesis.thaw_due(now)
                if kill_every > 0 and now >= next_strike:
                    nemesis.strike()
                    progress(f"{now - began:6.1f} s  {dict(sorted(nemesis.counts.items()))}")
                    next_strike = time.monotonic() + nemesis.rng.uniform(0.5, 1.5) * kill_every
                time.sleep(0.02)
            nemesis.thaw_due(math.inf)
        finally:
            nemesis.stop()
        ops = setup + nemesis.history()
    return Report(
        duration=duration, clients=clients, files=files, term=term, skew=skew,
        ops=count_ops(ops), nemesis=nemesis.counts, anomalies=check_history(ops),
    )  # fmt: skip


# ---------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.checker",
        description="Random reads and writes under a nemesis that kills clients and the "
        "server; checks that no read was stale. Exit status 1 on any anomaly.",
    )
    add = parser.add_argument
    add("--duration", type=bounded(float, 0.1), default=30.0,
        help="seconds of load (default %(default)s)")  # fmt: skip
    add("--clients", type=bounded(int, 1), default=4,
        help="worker processes (default %(default)s)")  # fmt: skip
    add("--files", type=bounded(int, 1), default=3, help="files they share (default %(default)s)")
    add("--kill-every", type=bounded(float, 0.0), default=3.0,
        help="mean seconds between faults, 0: no faults (default %(default)s)")  # fmt: skip
    add("--term", type=bounded(float, 0.0), default=1.0,
        help="lease term, seconds (default %(default)s)")  # fmt: skip
    add("--skew", type=bounded(float, 0.0), default=0.1,
        help="skew allowance, seconds (default %(default)s)")  # fmt: skip
    add("--write-ratio", type=bounded(float, 0.0, 1.0), default=0.3,
        help="the share of operations that write (default %(default)s)")  # fmt: skip
    add("--think", type=bounded(float, 0.0), default=0.01,
        help="longest pause between a client's operations, seconds"
        " (default %(default)s)")  # fmt: skip
    add("--seed", type=int, help="the random seed (default: a new one each run, printed)")
    add("--keep", metavar="DIR",
        help="keep the root and logs in DIR, which must not exist (default: a temporary"
        " directory, removed)")  # fmt: skip
    # a worker process (started by the nemesis)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--client-id", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        import trio

        trio.run(lambda: run_worker(
            args.port, args.paths.split(","), args.client_id, args.log,
            seed=args.seed, write_ratio=args.write_ratio, think=args.think,
        ))  # fmt: skip
        return 0
    report = run(
        duration=args.duration, clients=args.clients, files=args.files,
        kill_every=args.kill_every, term=args.term, skew=args.skew, seed=args.seed,
        write_ratio=args.write_ratio, think=args.think, workdir=args.keep,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )  # fmt: skip
    print(report.format())
    return 1 if report.anomalies else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
