"""A lock holder in a process of its own: the fault tests', the history checker's and
the locks benchmark's subject, so that it can be killed and paused for real.

``python -m fscache.bench.lock_holder --port N --lock NAME --ttl T --identity ID
[--fenced PATH] [--run SECONDS --seed S]``

It reports what it does as JSON lines on stdout, each stamped ``t`` with
``time.monotonic()`` (one clock for the whole machine on Linux, so the events of
every process fit on one timeline):

* ``acquire``: it asks for the lock (``t`` is before the request is sent);
* ``acquired`` ``{token, valid_until}``: granted; it believes it holds the lock
  until ``valid_until``, on the same clock;
* ``renewed`` ``{token, valid_until}``: a renewal moved ``valid_until`` (polled
  every 2 ms, so reported up to about 2 ms after it landed);
* ``write`` ``{token, t_send, outcome, version}``: a write of ``PATH`` fenced
  with the lock; ``outcome`` is ``applied`` (``version`` is the file's new
  version), ``refused`` (the server's :class:`fscache.Conflict`: a newer token
  was granted) or ``error: ...``;
* ``release`` ``{token}``: it lets the lock go and stops believing it holds it
  (``t`` is before the request is sent: the server may grant the lock to the next
  in line before the answer comes back); ``released`` when the answer came;
* ``lost`` ``{token}``: it learnt it had lost the lock.

Without ``--run`` it takes one command a line on stdin: ``acquire``, ``write``
(fenced with the lock), ``write-token`` (fenced with the pair ``(name, token)``),
``release``, ``quit``. With ``--run`` it loops for that many seconds by itself:
acquire, hold for a random time writing every 20 ms, release, rest a random time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

import fscache
from fscache.bench import procs
from fscache.client.locks import Lock

WATCH_POLL = 0.002
WRITE_EVERY = 0.02


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


class Holder:
    def __init__(
        self, client: fscache.Client, name: str, ttl: float, identity: str, fenced: str
    ) -> None:
        self.client = client
        self.name = name
        self.ttl = ttl
        self.identity = identity
        self.fenced = fenced
        self.lock: Lock | None = None
        self.seq = 0

    @property
    def held(self) -> bool:
        return self.lock is not None and not self.lock.lost.is_set()

    async def acquire(self) -> None:
        emit("acquire")
        lock = await self.client.acquire(self.name, self.ttl)
        self.lock = lock
        emit("acquired", token=lock.token, valid_until=lock.valid_until)

    async def watch(self) -> None:
        """Report each renewal and the loss of the lock, as they happen."""
        lock, seen, lost = None, 0.0, False
        while True:
            await trio.sleep(WATCH_POLL)
            if self.lock is not lock:
                lock, lost = self.lock, False
                seen = 0.0 if lock is None else lock.valid_until
            if lock is None:
                continue
            if lock.valid_until != seen:
                seen = lock.valid_until
                emit("renewed", token=lock.token, valid_until=seen)
            if lock.lost.is_set() and not lost:
                lost = True
                emit("lost", token=lock.token)

    async def write(self, *, by_token: bool = False) -> None:
        if self.lock is None:
            emit("error", message="write without a lock")
            return
        token = self.lock.token
        self.seq += 1
        data = f"{self.identity} token {token} seq {self.seq}\n".encode()
        fence = (self.name, token) if by_token else self.lock
        t_send = time.monotonic()
        outcome, version = "applied", None
        try:
            version = await self.client.write(self.fenced, data, fence=fence)
        except fscache.Conflict:
            outcome = "refused"
        except fscache.FscacheError as exc:
            outcome = f"error: {type(exc).__name__}: {exc}"
        emit("write", token=token, t_send=t_send, outcome=outcome, version=version)

    async def release(self) -> None:
        if self.lock is None:
            return
        lock, self.lock = self.lock, None
        emit("release", token=lock.token)
        await lock.release()
        emit("released", token=lock.token)

    async def commands(self) -> None:
        async with procs.stdin_lines() as lines:
            async for line in lines:
                word = line.strip()
                if word == "quit":
                    return
                if word == "acquire":
                    await self.acquire()
                elif word in ("write", "write-token"):
                    await self.write(by_token=word == "write-token")
                elif word == "release":
                    await self.release()

    async def run(self, seconds: float, rng: random.Random) -> None:
        end = trio.current_time() + seconds
        while trio.current_time() < end:
            await self.acquire()
            hold_until = trio.current_time() + rng.uniform(0.05, 2 * self.ttl)
            while trio.current_time() < hold_until and self.held:
                await self.write()
                await trio.sleep(WRITE_EVERY)
            await self.release()
            await trio.sleep(rng.uniform(0, 0.1))


async def _main(args: argparse.Namespace) -> None:
    async with fscache.open_client("127.0.0.1", args.port, client_id=args.identity) as client:
        holder = Holder(client, args.lock, args.ttl, args.identity, args.fenced)
        emit("ready", pid=os.getpid())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder.watch)
            if args.run is None:
                await holder.commands()
            else:
                await holder.run(args.run, random.Random(args.seed))
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fscache.bench.lock_holder")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lock", required=True, help="the lock's name")
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--fenced", default="fenced.log", help="the file fenced writes go to")
    parser.add_argument("--run", type=float, help="loop by itself for this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    return run_child(_main, parser.parse_args(argv))


def run_child(
    main: Callable[[argparse.Namespace], Awaitable[None]], args: argparse.Namespace
) -> int:
    """A child process's trio ``main``; an fscache error ends it with an ``error`` event
    and exit status 1."""
    try:
        trio.run(main, args)
    except fscache.FscacheError as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
