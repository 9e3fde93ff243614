"""A Ctrl-C reaches the caller's task, even when it comes while one of the client's
own tasks runs (``_background`` in ``client/client.py``).

The program below is a real process: trio's Ctrl-C handling is the process's. Its
approval hook raises SIGINT from inside the client's task that runs approval hooks,
as a Ctrl-C arriving at that instant would. Unprotected, trio would raise the
KeyboardInterrupt inside that task, which would end it and the client's other
tasks with it; protected, it is delivered to the program's own task, waiting in a
write, and the program exits as for any Ctrl-C.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fscache.bench.harness import fscache_server

PROGRAM = """
import signal, sys, trio, fscache

async def main(port):
    async with fscache.open_client("127.0.0.1", port) as reader, \\
            fscache.open_client("127.0.0.1", port) as writer:
        await writer.write("f", b"1")
        await reader.read("f")  # cached, under a lease

        async def hook(path):  # runs in the reader client's own task
            print("hook", path, trio.lowlevel.currently_ki_protected(), flush=True)
            signal.raise_signal(signal.SIGINT)

        reader.before_approval.append(hook)
        await writer.write("f", b"2")  # asks the reader to approve: the hook runs
        print("the write returned", flush=True)
        await trio.sleep(30)

try:
    trio.run(main, int(sys.argv[1]))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_a_ctrl_c_inside_a_client_task_reaches_the_caller(root: Path) -> None:
    with fscache_server(str(root), term=10.0) as server:
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, str(server.port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.stdout.splitlines() == ["hook f True", "interrupted"], done.stderr
    assert done.returncode == 130, done.stderr
