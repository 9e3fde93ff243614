"""The locks benchmark (``python -m fscache.bench.locks``): one quick run against a
real etcd and a real fscache server, checked for its shape and lower bounds only
(no speed figure is asserted). Skipped where Debian's etcd is not installed.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import trio

import fscache
from fscache.bench import locks
from fscache.bench.harness import fscache_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        locks.etcd_version() is None,
        reason=f"{locks.ETCD} is not installed (Debian's etcd-server; .ci/run installs it)",
    ),
]


def test_a_quick_run_measures_both_systems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("etcd3gw", reason="the bench extra (etcd3gw) is not installed")
    out = tmp_path / "locks.json"
    assert locks.main(["--quick", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "acquire + release, median of 20" in table
    assert "hand-over, SIGKILL to grant" in table

    document = json.loads(out.read_text())
    ttl, skew = document["ttl"], document["skew"]
    for system in ("fscache", "etcd"):
        latency = document["acquire_release_s"][system]
        assert latency["n"] == 20
        assert 0 < latency["min"] <= latency["median"] <= latency["p90"] <= latency["max"]
        handover = document["handover_s"][system]
        assert handover["kill_to_grant"]["n"] == 1
        assert handover["kill_to_grant"]["min"] > 0
    # fscache grants no sooner than the holder's last renewal + ttl + skew
    assert document["handover_s"]["fscache"]["last_renewal_to_grant"]["min"] >= ttl + skew
    # etcd revokes a lease no sooner than its ttl after the last keep-alive
    assert document["handover_s"]["etcd"]["last_renewal_to_grant"]["min"] >= ttl


async def test_a_hand_over_cut_short_while_etcd_s_waiter_waits_stops_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C between the holder's grant and its kill: the waiter's blocking
    request is left behind and the holder is stopped, not left renewing for ever."""
    pytest.importorskip("etcd3gw", reason="the bench extra (etcd3gw) is not installed")
    monkeypatch.setattr(locks, "QUEUE_WAIT", 600.0)  # the cut lands here, not by timing
    root, logs = tmp_path / "root", tmp_path / "logs"
    root.mkdir()
    logs.mkdir()
    name = "bench/handover-etcd-0"
    with (
        fscache_server(str(root), term=10.0, skew=locks.SKEW) as fs,
        locks.etcd_server(str(tmp_path)) as etcd,
    ):
        bench = locks.Bench(fs.port, etcd.port, 2.0, str(logs))
        # Should the cut hang, this ends it: the test then fails, rather than waits for ever.
        watchdog = threading.Timer(30, bench.children.stop_all)
        async with fscache.open_client("127.0.0.1", fs.port, client_id="test") as c:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(bench._handover, c, "etcd", 0)
                with trio.fail_after(30):  # the holder's key, then the waiter's
                    while len(bench.etcd.client.get_prefix(name)) < 2:
                        await trio.sleep(0.05)
                watchdog.start()
                cut = time.monotonic()
                nursery.cancel_scope.cancel()
            watchdog.cancel()
        assert time.monotonic() - cut < 10
        [holder] = bench.children.procs
        assert holder.poll() is not None
