"""The crash demo's reader process, and the demo's handle on it.

The reader (``python -m fscache.bench.demo_reader --port N --client-id ID``) is a
client in a process of its own. It speaks JSON lines on stdout (``{"event": ...,
"t": ..., ...}``, stamped with ``time.monotonic()``) and takes one-word commands
on stdin (``read``, ``quit``; end of input means quit). It notices approval
requests by polling its client's ``approvals`` counter every millisecond, so an
approval's time is at most about a millisecond late. :class:`Reader` is the
demo's side of that protocol.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

from fscache.bench import procs
from fscache.client.client import Client, open_client
from fscache.errors import FscacheError

STEP_TIMEOUT = 5.0  # a read, an approval or an exit that should take milliseconds
APPROVAL_POLL = 0.001


class Abort(Exception):
    """The demo cannot go on: something it depends on did not happen."""


@dataclasses.dataclass
class Read:
    t_send: float
    t: float  # the reply arrived
    data: str
    hit: bool


class Reader:
    """One reader process and the events it has reported, oldest first."""

    def __init__(self, index: int, proc: subprocess.Popen[bytes], log_path: str) -> None:
        self.index = index
        self.name = f"reader {index}"
        self.proc = proc
        self.log_path = log_path
        self.inbox: list[dict[str, Any]] = []
        self._arrived = trio.Event()
        self.killed_at: float | None = None
        self.last_read: Read | None = None

    async def pump(self) -> None:
        stream = procs.stdout_stream(self.proc)
        async with stream:
            async for line in procs.lines(stream):
                try:
                    event = json.loads(line)
                except ValueError:
                    event = {"event": "error", "t": time.monotonic(), "message": line}
                self._post(event)
        self._post({"event": "exit", "t": time.monotonic()})

    def _post(self, event: dict[str, Any]) -> None:
        self.inbox.append(event)
        self._arrived.set()
        self._arrived = trio.Event()

    async def take(self, kind: str, *, since: float = 0.0, timeout: float = STEP_TIMEOUT) -> Any:
        """The oldest unconsumed ``kind`` event stamped at or after ``since``."""
        with trio.move_on_after(timeout):
            while True:
                for i, event in enumerate(self.inbox):
                    if event["event"] == kind and event["t"] >= since:
                        del self.inbox[i]
                        return event
                    if event["event"] in ("error", "exit") and self.killed_at is None:
                        detail = event.get("message") or "exited unexpectedly"
                        raise Abort(f"{self.name}: {detail}")
                await self._arrived.wait()
        raise Abort(f"{self.name} reported no {kind!r} within {timeout:g} s")

    def command(self, word: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(word.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise Abort(f"{self.name} is not listening ({exc})") from None

    async def take_read(self, *, timeout: float = STEP_TIMEOUT) -> Read:
        """The answer to a ``read`` command (it becomes :attr:`last_read`)."""
        event = await self.take("read", timeout=timeout)
        self.last_read = Read(event["t_send"], event["t"], event["data"], event["hit"])
        return self.last_read


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


async def _worker(port: int, client_id: str, path: str) -> None:
    async def read(client: Client) -> None:
        hits = client.stats["hits"]
        t_send = time.monotonic()
        try:
            data = await client.read(path)
        except FscacheError as exc:
            _emit("error", message=f"read failed: {type(exc).__name__}: {exc}")
            return
        hit = client.stats["hits"] > hits
        _emit("read", t_send=t_send, data=data.decode(errors="replace"), hit=hit)

    async def watch_approvals(client: Client) -> None:
        seen = client.stats["approvals"]
        while True:
            await trio.sleep(APPROVAL_POLL)
            count = client.stats["approvals"]
            if count != seen:
                seen = count
                _emit("approval", count=count)

    async with open_client("127.0.0.1", port, client_id=client_id) as client:
        _emit("ready")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_approvals, client)
            async with procs.stdin_lines() as commands:
                async for line in commands:
                    if line.strip() == "read":
                        nursery.start_soon(read, client)
                    elif line.strip() == "quit":
                        break
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fscache.bench.demo_reader")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--path", required=True)
    args = parser.parse_args(argv)
    try:
        trio.run(_worker, args.port, args.client_id, args.path)
    except FscacheError as exc:
        _emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
