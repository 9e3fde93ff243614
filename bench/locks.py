"""fscache's locks beside etcd's, measured in one run with the passes interleaved.

``python -m fscache.bench.locks [--quick] [--rounds N] [--handovers N] [--ttl T]
[--out FILE]`` starts Debian's etcd (``/usr/bin/etcd``, one member, a temporary
data directory, ports the kernel picks) and an fscache server, each in its own
process, and measures both systems the same way:

1. **Acquire + release, uncontended.** One client takes and frees a lock
   ``--rounds`` times; a round times one fscache pair and one etcd pair, in
   alternating order. fscache: ``acquire(name, ttl)`` then ``release()``. etcd:
   the v3 lock API through its JSON gateway (``/v3/lock/lock`` then
   ``/v3/lock/unlock``), with one lease granted beforehand and kept for the whole
   run, as etcd's own ``concurrency.Mutex`` keeps its session's lease; so each
   system pays two round trips per pair. The client is ``etcd3gw``
   (synchronous HTTP), the only Python client of etcd's gateway that is
   maintained; etcd3gw's ``Lock`` recipe (a put-if-absent transaction) cannot
   wait for a held lock, so the lock API is called through its ``post``.
2. **Hand-over after a SIGKILL.** A holder process takes the lock with ttl
   ``--ttl`` and keeps it alive (fscache renews by itself; the etcd holder sends a
   keep-alive every ttl/3), a waiter in this process asks for the same lock, and
   the holder is killed with SIGKILL. The figure is the time from the kill to the
   waiter's grant. It cannot be shorter than what is left of the holder's lease at
   the kill: fscache grants at ``last renewal + ttl + skew``; etcd revokes an
   expired lease on its next check (every 500 ms), then grants.

The two systems differ in what a grant costs: etcd commits every lock change
through Raft to its write-ahead log (one member here: an fsync per change);
fscache keeps locks in memory and makes only a name's newest fencing token
durable, once per grant. Nothing here is asserted by tests: the numbers belong to
the machine they were taken on.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import trio

import fscache
from fscache.bench import missing_extra, procs, run_main
from fscache.bench.demo_reader import Reader
from fscache.bench.harness import ServerProcess, fscache_server, spawn_on_free_ports
from fscache.bench.lock_holder import emit

ETCD = "/usr/bin/etcd"
START_TIMEOUT = 20.0  # etcd's first election, or a cold Python start, on a busy machine
HOLD_TIMEOUT = 30.0  # a holder's acquire, or a waiter's grant after the kill
SKEW = 0.1
QUEUE_WAIT = 0.3  # from the holder's grant to its kill: the waiter has asked by then
ETCD_SESSION_TTL = 60  # the waiter's and the latency loop's lease: outlives every wait


# ---------------------------------------------------------------- etcd
def etcd_version() -> str | None:
    if not os.path.exists(ETCD):
        return None
    out = subprocess.run([ETCD, "--version"], capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return None


@contextlib.contextmanager
def etcd_server(workdir: str) -> Iterator[ServerProcess]:
    """One etcd member on free ports, its data in ``workdir``; yields once it is healthy."""

    def argv(ports: list[int], attempt: int) -> list[str]:
        client, peer = ports
        return [
            ETCD, "--name", "bench", "--data-dir", os.path.join(workdir, f"etcd-{attempt}"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"bench=http://127.0.0.1:{peer}",
            "--log-level", "error",
        ]  # fmt: skip

    server = spawn_on_free_ports("etcd", 2, argv, _etcd_healthy, START_TIMEOUT)
    try:
        yield server
    finally:
        server.stop()


def _etcd_healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as reply:
            return bool(json.load(reply).get("health") == "true")
    except (OSError, ValueError):
        return False


class EtcdLocks:
    """etcd's v3 lock API through etcd3gw: a lock is held under a lease. Every request
    gives up after ``timeout`` s, a wait for a held lock included."""

    def __init__(self, port: int, timeout: float = HOLD_TIMEOUT) -> None:
        import etcd3gw  # the bench extra; imported here so the module loads without it

        self.client = etcd3gw.Etcd3Client(host="127.0.0.1", port=port, timeout=timeout)

    def grant(self, ttl: int) -> int:
        lease_id: int = self.client.lease(ttl).id
        return lease_id

    def keep_alive(self, lease_id: int) -> None:
        self.client.post(self.client.get_url("/lease/keepalive"), json={"ID": lease_id})

    def revoke(self, lease_id: int) -> None:
        self.client.post(self.client.get_url("/kv/lease/revoke"), json={"ID": lease_id})

    def lock(self, name: str, lease_id: int) -> str:
        """Wait for the lock; its key (the owner's proof, and its revision a fencing token)."""
        encoded = base64.b64encode(name.encode()).decode()
        reply = self.client.post(
            self.client.get_url("/lock/lock"), json={"name": encoded, "lease": lease_id}
        )
        key: str = reply["key"]
        return key

    def unlock(self, key: str) -> None:
        self.client.post(self.client.get_url("/lock/unlock"), json={"key": key})


# ---------------------------------------------------------------- holder processes
def _hold_etcd(port: int, name: str, ttl: float) -> None:
    locks = EtcdLocks(port)
    lease_id = locks.grant(round(ttl))
    t_send = time.monotonic()
    locks.lock(name, lease_id)
    emit("acquired", t_send=t_send)
    while True:
        time.sleep(ttl / 3)
        t_send = time.monotonic()
        locks.keep_alive(lease_id)
        emit("renewed", t_send=t_send)


# ---------------------------------------------------------------- measurements
@dataclasses.dataclass
class Figures:
    fscache: list[float] = dataclasses.field(default_factory=list)
    etcd: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Handover:
    kill_to_grant: float
    renewal_to_grant: float  # from the holder's last renewal (or acquire) request


class Bench:
    def __init__(self, fscache_port: int, etcd_port: int, ttl: float, logs: str) -> None:
        self.fscache_port = fscache_port
        self.etcd = EtcdLocks(etcd_port)
        self.etcd_port = etcd_port
        self.ttl = ttl
        self.children = procs.Commands(logs)
        self.latency = Figures()
        self.handovers: dict[str, list[Handover]] = {"fscache": [], "etcd": []}

    async def run(self, rounds: int, handovers: int) -> None:
        async with fscache.open_client("127.0.0.1", self.fscache_port, client_id="bench") as c:
            lease_id = self.etcd.grant(ETCD_SESSION_TTL)
            for i in range(rounds):
                order = (self._fscache_pair, self._etcd_pair)
                for measure in order if i % 2 == 0 else reversed(order):
                    await measure(c, lease_id, "bench/latency")
            self.etcd.revoke(lease_id)
            for i in range(handovers):
                systems = ("fscache", "etcd") if i % 2 == 0 else ("etcd", "fscache")
                for system in systems:
                    self.handovers[system].append(await self._handover(c, system, i))

    async def _fscache_pair(self, c: fscache.Client, _lease: int, name: str) -> None:
        t0 = time.perf_counter()
        lock = await c.acquire(name, self.ttl)
        await lock.release()
        self.latency.fscache.append(time.perf_counter() - t0)

    async def _etcd_pair(self, _c: fscache.Client, lease_id: int, name: str) -> None:
        t0 = time.perf_counter()
        key = self.etcd.lock(name, lease_id)
        self.etcd.unlock(key)
        self.latency.etcd.append(time.perf_counter() - t0)

    async def _handover(self, c: fscache.Client, system: str, i: int) -> Handover:
        name = f"bench/handover-{system}-{i}"
        port = self.fscache_port if system == "fscache" else self.etcd_port
        if system == "fscache":
            argv = [
                sys.executable, "-m", "fscache.bench.lock_holder", "--port", str(port),
                "--lock", name, "--ttl", repr(self.ttl), "--identity", "bench-holder",
            ]  # fmt: skip
        else:
            argv = [
                sys.executable, "-m", "fscache.bench.locks", "--hold", "etcd", "--port", str(port),
                "--name", name, "--ttl", repr(self.ttl),
            ]  # fmt: skip
        proc, log = self.children.start(f"holder-{system}-{i}", argv)
        try:
            return await self._time_handover(c, system, name, proc, Reader(i, proc, log))
        finally:
            # On every way out: a holder left alive (the run was interrupted before its
            # kill) would renew its lease for ever from its own session.
            procs.stop_command(proc, 1.0)

    async def _time_handover(
        self,
        c: fscache.Client,
        system: str,
        name: str,
        proc: subprocess.Popen[bytes],
        holder: Reader,
    ) -> Handover:
        holder.name = f"{system} holder"
        granted: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder.pump)
            if system == "fscache":
                holder.command("acquire")
            acquired = await holder.take("acquired", timeout=START_TIMEOUT)

            async def wait() -> None:
                if system == "fscache":
                    lock = await c.acquire(name, self.ttl)
                    granted["t"] = time.monotonic()
                    await lock.release()
                else:
                    # etcd3gw blocks; a cancelled wait (Ctrl-C) leaves its thread behind,
                    # to end when the lock is granted, etcd stops or its timeout passes.
                    granted["t"] = await trio.to_thread.run_sync(
                        self._etcd_wait, name, abandon_on_cancel=True
                    )

            nursery.start_soon(wait)
            await trio.sleep(QUEUE_WAIT)  # the holder has renewed or not
            proc.send_signal(signal.SIGKILL)
            t_kill = time.monotonic()
            with trio.fail_after(HOLD_TIMEOUT):
                while "t" not in granted:
                    await trio.sleep(0.001)
            renewals = [e for e in holder.inbox if e["event"] == "renewed"]
            last = max(self._request_sent(e) for e in [acquired, *renewals])
            nursery.cancel_scope.cancel()
        return Handover(granted["t"] - t_kill, granted["t"] - last)

    def _request_sent(self, event: dict[str, Any]) -> float:
        """When the holder sent the request an ``acquired`` or ``renewed`` answered."""
        if "t_send" in event:
            return float(event["t_send"])
        return float(event["valid_until"]) - self.ttl + SKEW  # fscache: t_send + ttl - skew

    def _etcd_wait(self, name: str) -> float:
        """In a thread of its own, with a client of its own: an abandoned wait must
        not share a connection with the rest of the run."""
        etcd = EtcdLocks(self.etcd_port)
        lease_id = etcd.grant(ETCD_SESSION_TTL)
        key = etcd.lock(name, lease_id)
        t = time.monotonic()
        etcd.unlock(key)
        etcd.revoke(lease_id)
        return t


# ---------------------------------------------------------------- report
def _summary(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def report(bench: Bench, ttl: float) -> dict[str, Any]:
    latency = {"fscache": _summary(bench.latency.fscache), "etcd": _summary(bench.latency.etcd)}
    handover = {
        system: {
            "kill_to_grant": _summary([h.kill_to_grant for h in runs]),
            "last_renewal_to_grant": _summary([h.renewal_to_grant for h in runs]),
        }
        for system, runs in bench.handovers.items()
    }
    return {
        "ttl": ttl,
        "skew": SKEW,
        "etcd_version": etcd_version(),
        "fscache_version": fscache.__version__,
        "acquire_release_s": latency,
        "handover_s": handover,
    }


def print_table(document: dict[str, Any]) -> None:
    ttl = document["ttl"]
    lat, hand = document["acquire_release_s"], document["handover_s"]
    print(f"locks: fscache {document['fscache_version']} vs etcd {document['etcd_version']}")
    print(f"{'figure':<52} {'fscache':>16} {'etcd':>16}")

    def row(label: str, f: dict[str, float], e: dict[str, float], key: str, scale: float) -> None:
        unit = "ms" if scale == 1000 else "s"
        print(f"{label:<52} {f[key] * scale:>13.3f} {unit:<2} {e[key] * scale:>13.3f} {unit:<2}")

    n = lat["fscache"]["n"]
    row(f"acquire + release, median of {n}", lat["fscache"], lat["etcd"], "median", 1000)
    row(f"acquire + release, p90 of {n}", lat["fscache"], lat["etcd"], "p90", 1000)
    f, e = hand["fscache"]["kill_to_grant"], hand["etcd"]["kill_to_grant"]
    m = f["n"]
    row(f"hand-over, SIGKILL to grant, median of {m}", f, e, "median", 1)
    row(f"hand-over, SIGKILL to grant, max of {m}", f, e, "max", 1)
    f, e = hand["fscache"]["last_renewal_to_grant"], hand["etcd"]["last_renewal_to_grant"]
    row(f"hand-over, last renewal to grant, median (ttl {ttl:g} s)", f, e, "median", 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.locks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=200, help="acquire + release rounds")
    parser.add_argument("--handovers", type=int, default=5, help="SIGKILL hand-overs per system")
    parser.add_argument(
        "--ttl", type=float, default=2, help="lock ttl, whole seconds (etcd's unit)"
    )
    parser.add_argument("--quick", action="store_true", help="20 rounds, 1 hand-over each")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument("--hold", choices=("etcd",), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ttl != round(args.ttl) or args.ttl < 1:
        parser.error("--ttl must be a whole number of seconds: etcd's leases count in seconds")
    missing = missing_extra("etcd3gw")
    if missing is not None:
        print(f"{parser.prog}: {missing}", file=sys.stderr)
        return 2
    if args.hold == "etcd":
        _hold_etcd(args.port, args.name, args.ttl)
        return 0
    if etcd_version() is None:
        print(f"{ETCD} is not installed (Debian: apt-get install etcd-server)", file=sys.stderr)
        return 2
    rounds, handovers = (20, 1) if args.quick else (args.rounds, args.handovers)
    with tempfile.TemporaryDirectory(prefix="fscache-bench-locks-") as temp:
        root, logs = os.path.join(temp, "root"), os.path.join(temp, "logs")
        os.mkdir(root)
        os.mkdir(logs)
        with fscache_server(root, term=10.0, skew=SKEW) as fs, etcd_server(temp) as etcd:
            bench = Bench(fs.port, etcd.port, float(args.ttl), logs)
            try:
                trio.run(bench.run, rounds, handovers)
            finally:
                bench.children.stop_all()
    document = report(bench, float(args.ttl))
    print_table(document)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(document, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
