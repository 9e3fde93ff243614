"""``fscache demo election``: kill the leader and watch the leadership pass on.

A server process and N candidate processes (:mod:`fscache.bench.election_candidate`),
each running ``async with c.leadership("demo/leader", identity=...)`` and, while
it leads, writing a heartbeat file fenced with its leadership's token. Once one
leads and has renewed its leadership at least once, it is killed with SIGKILL.
Nobody tells the server: it grants the leadership to the next candidate only when
the dead leader's lock runs out, ``last renewal + ttl + skew`` (the renewal's
send time is where the leader's own ``valid_until`` comes from: ``t_send + ttl -
skew``). The demo prints that instant beside the measured ones (the new leader's
election, its first fenced write), checks that the dead leader stopped believing
before the new one was elected, and that a write fenced with the old token is
refused with :class:`fscache.Conflict`.

It reuses the crash demo's parts: the console, the server process, the JSON-lines
child handle, the checks and their table. Times are ``time.monotonic()`` in every
process, one clock for the machine.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any, TextIO

import trio

import fscache
from fscache.bench import procs
from fscache.bench.demo import play
from fscache.bench.demo_console import Console
from fscache.bench.demo_options import ELECTION_CANDIDATES, ELECTION_TTL, check_election
from fscache.bench.demo_reader import STEP_TIMEOUT, Abort, Reader
from fscache.bench.demo_script import START_TIMEOUT, CrashDemo, Tolerances

ELECTION = "demo/leader"
HEARTBEAT = "demo/heartbeat"


class ElectionDemo(CrashDemo):
    """The election's script; the crash demo's server, checks and summary."""

    children_name = "candidates"

    def __init__(
        self,
        *,
        ttl: float,
        skew: float,
        candidates: int,
        tolerances: Tolerances,
        console: Console,
        children: procs.Commands,
    ) -> None:
        super().__init__(
            term=ttl,
            skew=skew,
            clients=candidates,
            tolerances=tolerances,
            console=console,
            children=children,
        )
        self.ttl = ttl
        self.handover = 0.0  # kill to the new leader's election
        self.first_write: dict[str, Any] = {}

    async def run(self, root: str) -> None:
        self.root = root
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_signals)
            await self._start_server(nursery)
            async with fscache.open_client(self.host, self.port, client_id="demo-observer") as c:
                self._writer = c
                await self._script(nursery)
            await self._stop_readers()
            await self._stop_server()
            nursery.cancel_scope.cancel()

    async def _script(self, nursery: trio.Nursery) -> None:
        c = self.c
        c.section(f"1. {self.clients} candidates run for {ELECTION}")
        await self._start_candidates(nursery)
        leader, elected = await self._first_election()
        renewed = await self._renewal(leader, elected)

        c.section("2. The leader is killed")
        t_kill = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)
        leader.killed_at = t_kill
        await leader.take("exit")  # all it said before it died has been read
        last = max(
            [renewed, *(e for e in leader.inbox if e["event"] == "renewed")],
            key=lambda e: float(e["valid_until"]),
        )
        server_end = last["valid_until"] + 2 * self.skew  # = t_send + ttl + skew
        c.event(
            t_kill,
            leader.name,
            f"KILLED with SIGKILL (pid {leader.proc.pid}); its last renewal was sent at"
            f" {c.rel(server_end - self.ttl - self.skew)}, so the server counts it leader"
            f" until {c.rel(server_end)}",
            "red",
        )

        c.section("3. The leadership passes on")
        await self._handover(leader, elected, last, t_kill, server_end)

    # ------------------------------------------------------------ processes
    async def _start_candidates(self, nursery: trio.Nursery) -> None:
        for i in range(self.clients):
            argv = [
                sys.executable, "-m", "fscache.bench.election_candidate",
                "--port", str(self.port), "--election", ELECTION,
                "--identity", f"candidate-{i}", "--ttl", repr(self.ttl), "--heartbeat", HEARTBEAT,
            ]  # fmt: skip
            proc, log_path = self.children.start(f"candidate-{i}", argv)
            candidate = Reader(i, proc, log_path)
            candidate.name = f"candidate {i}"
            self.readers.append(candidate)
            nursery.start_soon(candidate.pump)
        ready = [await r.take("ready", timeout=START_TIMEOUT) for r in self.readers]
        for candidate, event in sorted(zip(self.readers, ready, strict=True), key=_at):
            self.c.event(event["t"], candidate.name, f"connected (pid {candidate.proc.pid})")

    async def _next(self, kind: str, candidates: list[Reader], since: float, timeout: float) -> Any:
        """The first ``kind`` event, stamped at or after ``since``, from any of ``candidates``."""
        with trio.move_on_after(timeout):
            while True:
                found = [
                    (e["t"], r)
                    for r in candidates
                    for e in r.inbox
                    if e["event"] == kind and e["t"] >= since
                ]
                if found:
                    _t, candidate = min(found, key=lambda x: x[0])
                    return candidate, await candidate.take(kind, since=since)
                await trio.sleep(0.005)
        raise Abort(f"no candidate reported {kind!r} within {timeout:g} s")

    # ------------------------------------------------------------ phases
    async def _first_election(self) -> tuple[Reader, dict[str, Any]]:
        c = self.c
        leader, elected = await self._next("elected", self.readers, 0.0, START_TIMEOUT)
        c.event(
            elected["t"],
            leader.name,
            f"elected leader, token {elected['token']}; believes it leads until"
            f" {c.rel(elected['valid_until'])} unless it renews",
            "green",
        )
        _, write = await self._next("write", [leader], elected["t"], STEP_TIMEOUT)
        self.first_write = write
        c.event(
            write["t"],
            leader.name,
            f"first heartbeat write fenced with token {write['token']}: {write['outcome']}",
        )
        named = await self.writer.leader(ELECTION)
        c.event(time.monotonic(), "observer", f"leader({ELECTION!r}) answers {named!r}")
        self.check(
            "first leader",
            f"{leader.name} elected with token {elected['token']}; leader() names {named!r}",
            named == f"candidate-{leader.index}" and write["outcome"] == "applied",
        )
        return leader, elected

    async def _renewal(self, leader: Reader, elected: dict[str, Any]) -> dict[str, Any]:
        """The leader's next renewal from now; the demo kills it right after."""
        since = time.monotonic()
        _, renewed = await self._next("renewed", [leader], since, self.ttl + STEP_TIMEOUT)
        sent = renewed["valid_until"] - self.ttl + self.skew
        self.c.event(
            renewed["t"],
            leader.name,
            f"renewed its leadership (request sent at {self.c.rel(sent)});"
            f" believes it leads until {self.c.rel(renewed['valid_until'])}",
        )
        return dict(renewed)

    async def _handover(
        self,
        old: Reader,
        elected: dict[str, Any],
        last: dict[str, Any],
        t_kill: float,
        server_end: float,
    ) -> None:
        c = self.c
        believed = last["valid_until"]
        c.event(believed, old.name, "(dead) would have stopped believing it leads here", "dim")
        # Its heartbeat writes left it a read lease on the file, as every writer gets one,
        # which the server also waits out: the new leader's first write lands after both.
        wrote = max([self.first_write["t_send"]] + [
            e["t_send"] for e in old.inbox if e["event"] == "write" and e["outcome"] == "applied"
        ])  # fmt: skip
        file_end = wrote + self.term + self.skew
        c.event(
            file_end,
            old.name,
            f"(dead) its read lease on {HEARTBEAT}, from its last write at {c.rel(wrote)},"
            f" runs out on the server here (+ term {self.term:g} + skew {self.skew:g})",
            "dim",
        )
        rest = [r for r in self.readers if r is not old]
        timeout = server_end - time.monotonic() + self.tolerances.late + STEP_TIMEOUT
        new, won = await self._next("elected", rest, t_kill, timeout)
        t_won = won["t"]
        self.handover = t_won - t_kill
        c.event(
            t_won,
            new.name,
            f"elected leader, token {won['token']}: expected at {c.rel(server_end)},"
            f" measured {c.rel(t_won)} ({_ms(t_won - server_end)});"
            f" {self.handover:.3f} s after the kill; believes it leads until"
            f" {c.rel(won['valid_until'])}",
            "green",
        )
        write_expected = max(t_won, file_end)
        _, write = await self._next("write", [new], t_won, file_end - t_won + STEP_TIMEOUT)
        for e in new.inbox:
            if e["event"] == "deposed" and e["t"] <= write["t"]:
                c.event(e["t"], new.name, f"deposed: {e['why']}", "red")
        c.event(
            write["t"],
            new.name,
            f"first heartbeat write fenced with token {write['token']}: {write['outcome']};"
            f" expected from {c.rel(write_expected)}, measured {c.rel(write['t'])}"
            f" ({_ms(write['t'] - write_expected)})",
        )
        stale = await self._stale_write(elected["token"])

        self.check(
            "hand-over not early",
            f"expected from {c.rel(server_end)} ({old.name}'s last renewal"
            f" {c.rel(server_end - self.ttl - self.skew)} + ttl {self.ttl:g} + skew"
            f" {self.skew:g}), elected {c.rel(t_won)} ({_ms(t_won - server_end)})",
            t_won >= server_end - self.tolerances.early,
        )
        self.check(
            "hand-over prompt",
            f"{_ms(t_won - server_end)} after the dead leader's lock ran out",
            t_won <= server_end + self.tolerances.late,
        )
        self.check(
            "one leader at a time",
            f"{old.name} believed until {c.rel(believed)}, {new.name} from {c.rel(t_won)}",
            believed < t_won,
        )
        self.check(
            "tokens increase",
            f"token {elected['token']} then {won['token']}",
            won["token"] > elected["token"],
        )
        self.check(
            "new leader's fenced write",
            f"{write['outcome']} at {c.rel(write['t'])} with token {write['token']}"
            f" (elected with {won['token']})",
            write["outcome"] == "applied"
            and write["token"] == won["token"]
            and write["t"] >= write_expected - self.tolerances.early,
        )
        self.check("old token refused", stale, stale.startswith("Conflict"))

    async def _stale_write(self, token: int) -> str:
        """A write fenced with the dead leader's token, as a paused leader would send it."""
        t = time.monotonic()
        try:
            await self.writer.write(HEARTBEAT, b"stale\n", fence=(ELECTION, token))
        except fscache.Conflict as exc:
            outcome = f"Conflict: {exc}"
            style = None
        else:
            outcome = "applied"
            style = "red"
        self.c.event(
            t, "observer", f"writes {HEARTBEAT} fenced with the old token {token}: {outcome}", style
        )
        return outcome


def _at(pair: tuple[Reader, dict[str, Any]]) -> float:
    return float(pair[1]["t"])


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:+.0f} ms"


def run_election_demo(
    *,
    ttl: float = ELECTION_TTL,
    skew: float = 0.1,
    candidates: int = ELECTION_CANDIDATES,
    out: TextIO | None = None,
    tolerances: Tolerances | None = None,
) -> int:
    """Run the election demonstration; 0 if every check passed."""
    check_election(ttl=ttl, skew=skew, candidates=candidates)
    console = Console(
        time.monotonic(), out or sys.stdout, who_width=len("candidate 10"), in_time_order=True
    )
    title = (
        f"fscache election demo: {candidates} candidate processes, lock ttl {ttl:g} s,"
        f" skew {skew:g} s"
    )
    intro = (
        "The leader is killed with SIGKILL. Nobody tells the server; it hands the leadership"
        " on when the dead leader's lock runs out (last renewal + ttl + skew), and the new"
        " leader's writes carry a newer fencing token, so a write with the old one is refused."
        " Times are seconds since the start, on the machine's monotonic clock."
    )

    def make(children: procs.Commands) -> ElectionDemo:
        return ElectionDemo(
            ttl=ttl,
            skew=skew,
            candidates=candidates,
            tolerances=tolerances or Tolerances(),
            console=console,
            children=children,
        )

    def verdict(demo: ElectionDemo) -> str:
        return (
            f"OK: the leadership passed {demo.handover:.2f} s after the kill, once the dead"
            " leader's lock had run out; the old token was refused"
        )

    return play(console, title, intro, make, verdict)


__all__ = ["run_election_demo"]
