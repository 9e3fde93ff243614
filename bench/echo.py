"""A bare trio TCP echo server: the baseline for fscache's round trip and throughput.

Each length-prefixed CBOR frame is decoded with plain ``cbor2.loads`` and re-encoded
with ``cbor2.dumps`` before it goes back: the least any CBOR-over-TCP server must do.
No validation, no dispatch, no per-connection sender task. Run it in its own process:
``python -m fscache.bench.echo`` prints ``echo serving on HOST:PORT``.

``--wire`` serves the same loop over :class:`fscache.net.SocketWire`, the socket I/O
the fscache server itself uses, instead of trio's ``SocketStream``: a second
baseline that shows how much of a difference is the I/O layer and how much is
fscache's own work.

``--root DIR`` answers each read frame with the file it names, opened beneath
``DIR``, ``fstat``-ed and read, in the shape of fscache's data reply: the least a
CBOR-over-TCP *file* server must do, with no path rules, leases or caches. Beside
it, a miss shows what fscache's own work costs apart from the file system's.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import struct
from collections.abc import Awaitable, Callable

import cbor2
import trio

from fscache.net import SocketWire, StreamWire, Wire

HEADER = struct.Struct(">I")


def echo(payload: bytes) -> bytes:
    return cbor2.dumps(cbor2.loads(payload))


def file_reader(root: str) -> Callable[[bytes], bytes]:
    """The reply to a read frame: the file it names beneath ``root``; any other
    frame is echoed."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)

    def read_file(payload: bytes) -> bytes:
        request = cbor2.loads(payload)
        if request.get("t") != "read":  # the hello, say: echoed
            return cbor2.dumps(request)
        fd = os.open(request["path"], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=root_fd)
        try:
            st = os.fstat(fd)
            data = os.read(fd, st.st_size)
        finally:
            os.close(fd)
        return cbor2.dumps({
            "t": "data", "id": request["id"], "version": st.st_mtime_ns, "term": 0.0,
            "data": data,
        })  # fmt: skip

    return read_file


async def echo_frames(
    stream: trio.SocketStream, wire: Wire | None = None, answer: Callable[[bytes], bytes] = echo
) -> None:
    if wire is None:
        wire = StreamWire(stream)
    buffer = bytearray()
    try:
        async with stream:
            while True:
                data = await wire.receive()
                if not data:
                    return
                buffer += data
                replies = []
                while len(buffer) >= HEADER.size:
                    (length,) = HEADER.unpack_from(buffer)
                    end = HEADER.size + length
                    if len(buffer) < end:
                        break
                    payload = answer(bytes(buffer[HEADER.size : end]))
                    del buffer[:end]
                    replies.append(HEADER.pack(len(payload)) + payload)
                if replies:
                    await wire.send_all(b"".join(replies))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return


async def echo_frames_on_wire(
    stream: trio.SocketStream, answer: Callable[[bytes], bytes] = echo
) -> None:
    await echo_frames(stream, SocketWire(stream), answer)


async def main(handler: Callable[[trio.SocketStream], Awaitable[None]] = echo_frames) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()[:2]
    print(f"echo serving on {host}:{port}", flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m fscache.bench.echo",
        description="A bare trio TCP echo server of length-prefixed CBOR frames, the"
        " baseline of the speed benchmark. It listens on a free port of 127.0.0.1 and"
        " prints 'echo serving on HOST:PORT'; SIGTERM or Ctrl-C stops it.",
    )  # fmt: skip
    parser.add_argument(
        "--wire", action="store_true",
        help="serve over fscache's own socket I/O (SocketWire) instead of trio's SocketStream",
    )  # fmt: skip
    parser.add_argument(
        "--root", metavar="DIR",
        help="answer each read frame with the file it names beneath DIR (opened, fstat-ed"
        " and read), in the shape of fscache's data reply",
    )  # fmt: skip
    args = parser.parse_args()
    answer = echo if args.root is None else file_reader(args.root)
    handler = echo_frames_on_wire if args.wire else echo_frames
    trio.run(main, functools.partial(handler, answer=answer))
