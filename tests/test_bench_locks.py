"""The locks benchmark (``python -m fscache.bench.locks``): one quick run against a
real etcd and a real fscache server, checked for its shape and lower bounds only
(no speed figure is asserted). Skipped where Debian's etcd is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fscache.bench import locks

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
