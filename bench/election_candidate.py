"""The election demo's candidate process.

``python -m fscache.bench.election_candidate --port N --election NAME --identity ID
--ttl T --heartbeat PATH`` runs for leadership of ``NAME`` again and again, and
while it leads, writes ``PATH`` every 100 ms fenced with its leadership's token.
It speaks JSON lines on stdout (``{"event": ..., "t": ...}``, stamped with
``time.monotonic()`` like :mod:`fscache.bench.lock_holder`'s) and stops at
``quit`` or the end of its stdin:

* ``ready``; ``elected`` ``{token, valid_until}``: it leads, and believes so until
  ``valid_until`` (same clock); ``renewed`` ``{token, valid_until}``;
* ``write`` ``{token, outcome, version}``: one fenced heartbeat write;
* ``deposed`` ``{token, why}``: it lost the leadership (the body of its
  ``leadership`` block was cancelled and :class:`fscache.LockLost` raised).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import trio

import fscache
from fscache.bench import procs
from fscache.bench.lock_holder import WATCH_POLL, emit, run_child
from fscache.client.locks import Lock

HEARTBEAT_EVERY = 0.1


async def _lead(client: fscache.Client, args: argparse.Namespace, leader: Lock) -> None:
    """While leading: heartbeat writes fenced with the leadership, and its renewals."""
    emit("elected", token=leader.token, valid_until=leader.valid_until)

    async def renewals() -> None:
        seen = leader.valid_until
        while True:
            await trio.sleep(WATCH_POLL)
            if leader.valid_until != seen:
                seen = leader.valid_until
                emit("renewed", token=leader.token, valid_until=seen)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(renewals)
        beat = 0
        while True:
            beat += 1
            data = f"{args.identity} token {leader.token} beat {beat}\n".encode()
            t_send = time.monotonic()
            try:
                version = await client.write(args.heartbeat, data, fence=leader)
            except fscache.Conflict:
                emit("write", token=leader.token, t_send=t_send, outcome="refused", version=None)
            else:
                emit("write", token=leader.token, t_send=t_send, outcome="applied", version=version)
            await trio.sleep(HEARTBEAT_EVERY)


async def _campaign(client: fscache.Client, args: argparse.Namespace) -> None:
    while True:
        token = None
        try:
            async with client.leadership(args.election, identity=args.identity, ttl=args.ttl) as le:
                token = le.token
                await _lead(client, args, le)
        except fscache.LockLost as exc:
            emit("deposed", token=token, why=str(exc))


async def _main(args: argparse.Namespace) -> None:
    async with fscache.open_client("127.0.0.1", args.port, client_id=args.identity) as client:
        emit("ready", pid=os.getpid())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_campaign, client, args)
            async with procs.stdin_lines() as commands:
                async for line in commands:
                    if line.strip() == "quit":
                        break
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fscache.bench.election_candidate")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--election", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--heartbeat", required=True)
    return run_child(_main, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
