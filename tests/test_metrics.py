"""Prometheus metrics (``docs/design.md``, "Metrics").

Test rules: a real ``fscache serve --metrics-port 0`` process on 127.0.0.1, scraped
over HTTP and parsed with prometheus-client's own parser; counters are checked to
move by exactly what the test did, never against a time. The histograms are checked
with exact values in process: their buckets directly, and what the service observes
under ``autojump_clock`` over memory streams (``harness.Cluster``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import fscache
from fscache.cli import parse_serving_line
from fscache.server.latency import BUCKETS, Histogram
from fscache.server.metrics import (
    GAUGES,
    HISTOGRAMS,
    ServiceCollector,
    Snapshot,
    counter_family,
    take_snapshot,
)

from .harness import Cluster

pytestmark = pytest.mark.slow

LOCAL = "127.0.0.1"


# ---------------------------------------------------------------- a server process
@dataclasses.dataclass
class Served:
    process: subprocess.Popen[str]
    host: str
    port: int
    metrics: str | None  # the /metrics URL, with --metrics-port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@contextlib.contextmanager
def serve_process(
    *args: str, metrics: bool = False, cwd: Path | None = None, stderr: IO[Any] | None = None
) -> Iterator[Served]:
    """``fscache serve ARGS`` in a child process, until SIGTERM on exit (SIGKILL if it
    does not stop); ``metrics``: ARGS ask for metrics, and it says where. Its stderr
    goes to ``stderr`` (else nowhere)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fscache", "serve", *args],
        stdout=subprocess.PIPE, stderr=stderr or subprocess.DEVNULL, text=True, cwd=cwd,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        address = parse_serving_line(line)
        assert address is not None, f"not a serving line: {line!r}"
        url = None
        if metrics:
            while not (line := process.stdout.readline()).startswith("metrics at "):
                assert line, "the server ended before it said where its metrics are"
            url = line.removeprefix("metrics at ").strip()
        yield Served(process, address[0], address[1], url)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def scrape(url: str) -> dict[str, float]:
    """Every sample at ``url`` by name (labels folded into the name: ``a{le="1"}``)."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples


# ---------------------------------------------------------------- scraping a server
def test_a_scrape_shows_counters_gauges_and_histograms_move_with_reads_and_writes(
    root: Path,
) -> None:
    with serve_process(
        "--root", str(root), "--port", "0", "--metrics-port", "0", metrics=True
    ) as server:
        assert server.metrics is not None
        before = scrape(server.metrics)
        with (
            fscache.connect(server.address, client_id="reader") as reader,
            fscache.connect(server.address, client_id="writer") as writer,
        ):
            writer.write("a.txt", b"one")
            reader.read("a.txt")  # a miss: a lease
            reader.read("a.txt")  # a hit: the server sees nothing
            writer.write("a.txt", b"two")  # the reader is asked, and approves
            assert reader.read("a.txt") == b"two"
            during = scrape(server.metrics)
            stats = writer.server_stats()
        after = scrape(server.metrics)
        deadline = time.monotonic() + 30  # the goodbyes are read by the server in its time
        while after["fscache_connections"] and time.monotonic() < deadline:
            time.sleep(0.05)
            after = scrape(server.metrics)

    def moved(name: str, samples: dict[str, float] = during) -> float:
        return samples[name] - before[name]

    assert moved("fscache_reads_total") == 2
    assert moved("fscache_writes_total") == 2
    assert moved("fscache_writes_applied_total") == 2
    assert moved("fscache_approvals_sent_total") == 1
    assert moved("fscache_approvals_received_total") == 1
    assert moved("fscache_writes_delayed_total") == 1
    assert moved("fscache_leases_granted_total") >= 2
    assert moved("fscache_sessions_opened_total") == 2
    assert moved("fscache_read_latency_seconds_count") == 2
    assert moved("fscache_write_latency_seconds_count") == 2
    assert moved("fscache_write_delay_seconds_count") == 2
    assert during['fscache_read_latency_seconds_bucket{le="+Inf"}'] == 2
    assert during["fscache_connections"] == 2
    assert during["fscache_leases_active"] >= 1
    assert during["fscache_term_seconds"] == 10.0
    assert during[f'fscache_server_info{{epoch="{stats["epoch"]}"}}'] == 1
    assert after["fscache_connections"] == 0
    assert "process_cpu_seconds_total" in after


def test_scrapes_during_a_stream_of_requests_are_each_consistent_and_never_go_back(
    root: Path,
) -> None:
    """Each scrape is one snapshot taken on the event loop: within it, a histogram's
    +Inf bucket is its count; across scrapes, counters only grow."""
    with serve_process(
        "--root", str(root), "--port", "0", "--metrics-port", "0", metrics=True
    ) as server:
        assert server.metrics is not None
        stop = threading.Event()

        def traffic(name: str) -> None:
            with fscache.connect(server.address, client_id=name, cache_bytes=0) as client:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    client.write(f"{name}.txt", b"%d" % i)
                    client.read(f"{name}.txt")

        workers = [threading.Thread(target=traffic, args=(f"c{i}",)) for i in range(2)]
        for worker in workers:
            worker.start()
        try:
            scrapes = []
            while len(scrapes) < 20 or scrapes[-1]["fscache_writes_total"] < 50:
                scrapes.append(scrape(server.metrics))
        finally:
            stop.set()
            for worker in workers:
                worker.join()

    for samples in scrapes:
        for name, _ in HISTOGRAMS.values():
            assert samples[f'{name}_bucket{{le="+Inf"}}'] == samples[f"{name}_count"]
        assert samples["fscache_writes_applied_total"] <= samples["fscache_writes_total"]
    for earlier, later in itertools.pairwise(scrapes):
        for name in ("fscache_reads_total", "fscache_writes_total", "fscache_messages_in_total"):
            assert earlier[name] <= later[name]


def test_every_stats_field_is_a_metric(root: Path) -> None:
    with serve_process(
        "--root", str(root), "--port", "0", "--metrics-port", "0", metrics=True
    ) as server:
        assert server.metrics is not None
        samples = scrape(server.metrics)
        with fscache.connect(server.address) as client:
            stats = client.server_stats()

    names = {name.partition("{")[0] for name in samples}
    for field in stats:
        if field == "epoch":
            assert "fscache_server_info" in names
        elif field in GAUGES:
            assert GAUGES[field][0] in names
        else:
            assert f"{counter_family(field)}_total" in names, field
    assert len(names) == len({name.removesuffix("_total") for name in names})  # no clash


def test_only_metrics_is_served_and_a_scrape_may_ask_for_some_names(root: Path) -> None:
    with serve_process(
        "--root", str(root), "--port", "0", "--metrics-port", "0", metrics=True
    ) as server:
        assert server.metrics is not None
        base = server.metrics.removesuffix("/metrics")
        for path in ("/", "/foo", "/metrics/x", "/favicon.ico"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=30)
            assert refused.value.code == 404
            refused.value.close()
        with fscache.connect(server.address) as client:
            client.write("a", b"x")
            asked = "name[]=fscache_writes_total&name[]=process_open_fds&name[]=fscache_disk_bytes"
            some = scrape(f"{server.metrics}?{asked}")
    assert some.keys() == {"fscache_writes_total", "process_open_fds", "fscache_disk_bytes"}
    assert some["fscache_writes_total"] == 1


async def test_every_counter_only_grows_while_levels_go_up_and_down(
    nursery: trio.Nursery, root: Path, autojump_clock: Any
) -> None:
    """A counter that went down would break rate() and increase(): over locks, ephemeral
    files, sessions, leases and connections coming and going, every counter family
    only grows, and the levels that fall are gauges."""
    cluster = Cluster(nursery, root, term=10.0, skew=0.1)
    service = await cluster.start()
    seen: list[dict[str, tuple[str, float]]] = []

    def look() -> None:
        snapshot = take_snapshot(service)
        seen.append({
            family.name: (family.type, family.samples[0].value)
            for family in ServiceCollector(lambda: snapshot, snapshot).collect()
            if family.type in ("counter", "gauge")
        })  # fmt: skip

    look()
    async with cluster.client("a") as a, cluster.client("b") as b:
        lock = await a.acquire("jobs/x")
        await a.write("reg/n1", b"x", ephemeral=True)
        await a.write("f", b"1")
        await b.read("f")
        look()
        await lock.release()
        await a.delete("reg/n1")
        await a.write("f", b"2")
        look()
    await trio.sleep(30)  # sessions and leases end
    look()

    for name, (kind, _) in seen[0].items():
        values = [look_[name][1] for look_ in seen]
        if kind == "counter":
            assert values == sorted(values), name
    for level in ("fscache_locks_held", "fscache_ephemeral_files", "fscache_connections"):
        assert seen[1][level] == ("gauge", 1 if level != "fscache_connections" else 2)
        assert seen[-1][level] == ("gauge", 0)


def test_the_metrics_port_is_refused_with_the_reason_when_taken(root: Path) -> None:
    other = root.parent / "other"  # beside the served root: a tree of its own
    other.mkdir()
    with serve_process(
        "--root", str(root), "--port", "0", "--metrics-port", "0", metrics=True
    ) as first:
        assert first.metrics is not None
        taken = first.metrics.rsplit(":", 1)[1].split("/")[0]
        done = subprocess.run(
            [sys.executable, "-m", "fscache", "serve", "--root", str(other),
             "--port", "0", "--metrics-port", taken],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{taken}" in done.stderr
    assert "fscache serving" not in done.stdout  # it never said it serves
    with serve_process("--root", str(other), "--port", "0") as again:
        assert again.process.stdout is not None
        again.process.send_signal(signal.SIGTERM)
        rest = again.process.stdout.read()
    assert "restart window" not in rest  # the failed start left no window behind


# ---------------------------------------------------------------- histograms, exactly
def test_a_histogram_counts_each_duration_in_the_first_bucket_that_holds_it() -> None:
    histogram = Histogram()

    for seconds in (0.0, 0.0005, 0.0006, 10.0, 61.0):
        histogram.observe(seconds)

    counts, total = histogram.snapshot()
    assert counts[0] == 2  # le=0.0005: a bound holds its own value
    assert counts[1] == 1  # le=0.001
    assert counts[BUCKETS.index(10.0)] == 1
    assert counts[-1] == 1  # +Inf
    assert sum(counts) == 5
    assert total == pytest.approx(71.0011)


def test_the_read_counters_say_which_requests_each_counts() -> None:
    """``reads`` counts whole-file reads only; ``fscache read`` and every ranged read
    move ``range_reads`` (docs/design.md, Stats)."""
    empty = Histogram().snapshot()
    stats = {"reads": 1, "range_reads": 2, "reads_not_modified": 0, "pings": 0}
    snapshot = Snapshot(stats, {"read": empty, "write": empty, "write_delay": empty})
    families = {f.name: f for f in ServiceCollector(lambda: snapshot, snapshot).collect()}

    assert "whole-file read requests" in families["fscache_reads"].documentation
    assert "range_reads" in families["fscache_reads"].documentation
    assert "fscache read" in families["fscache_range_reads"].documentation
    assert "scandir" in families["fscache_reads_not_modified"].documentation
    assert families["fscache_pings"].documentation == "stats: pings"
    design = (Path(__file__).parent.parent / "docs" / "design.md").read_text()
    assert "| `reads` | whole-file `read` requests that reached the server" in design
    assert "such as `fscache read`" in design


def test_the_collector_reports_cumulative_buckets_and_counters_with_total() -> None:
    read = Histogram()
    read.observe(0.002)
    read.observe(3.0)
    empty = Histogram().snapshot()
    snapshot = Snapshot(
        stats={
            "reads": 7,
            "leases_active": 3,
            "uptime_s": 1.5,
            "epoch": "e1",
            "disk_available_bytes": 4096,
        },
        histograms={"read": read.snapshot(), "write": empty, "write_delay": empty},
    )

    families = {
        family.name: family for family in ServiceCollector(lambda: snapshot, snapshot).collect()
    }

    assert families["fscache_reads"].type == "counter"
    assert families["fscache_reads"].samples[0].name == "fscache_reads_total"
    assert families["fscache_reads"].samples[0].value == 7
    assert families["fscache_leases_active"].type == "gauge"
    assert families["fscache_uptime_seconds"].samples[0].value == 1.5
    assert families["fscache_disk_available_bytes"].type == "gauge"  # it goes down too
    buckets = {
        s.labels["le"]: s.value
        for s in families["fscache_read_latency_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert buckets["0.001"] == 0
    assert buckets["0.0025"] == 1
    assert buckets["2.5"] == 1
    assert buckets["5.0"] == 2
    assert buckets["+Inf"] == 2
    assert set(HISTOGRAMS) == {"read", "write", "write_delay"}


# ---------------------------------------------------------------- exact instants, in process
async def test_a_waited_out_lease_is_one_write_delay_of_exactly_the_remaining_lease(
    nursery: trio.Nursery, root: Path, autojump_clock: Any
) -> None:
    cluster = Cluster(nursery, root, term=10.0, skew=0.1)
    service = await cluster.start()
    async with cluster.client("seeder") as seeder:
        await seeder.write("f", b"v1")  # applied on arrival: a delay of 0
    silent = await cluster.raw("silent")
    await silent.read("f")  # granted on arrival: a read latency of 0
    await trio.sleep(2.0)
    async with cluster.client("writer") as writer:
        await writer.write("f", b"v2")  # waits out the silent holder: 8.1 s
    await silent.close()

    snapshot = take_snapshot(service)
    families = {
        family.name: {sample.name + str(sample.labels.get("le", "")): sample.value
                      for sample in family.samples}
        for family in ServiceCollector(lambda: snapshot, snapshot).collect()
    }  # fmt: skip
    delay = families["fscache_write_delay_seconds"]
    assert delay["fscache_write_delay_seconds_count"] == 2
    assert delay["fscache_write_delay_seconds_sum"] == pytest.approx(8.1, abs=1e-9)
    assert delay["fscache_write_delay_seconds_bucket0.0005"] == 1  # the seed
    assert delay["fscache_write_delay_seconds_bucket5.0"] == 1
    assert delay["fscache_write_delay_seconds_bucket10.0"] == 2  # the wait
    assert families["fscache_write_latency_seconds"]["fscache_write_latency_seconds_sum"] == (
        pytest.approx(8.1, abs=1e-9)
    )
    read = families["fscache_read_latency_seconds"]
    assert read["fscache_read_latency_seconds_count"] == 1
    assert read["fscache_read_latency_seconds_sum"] == 0.0
    assert families["fscache_writes_delayed"]["fscache_writes_delayed_total"] == 1
    assert families["fscache_approvals_sent"]["fscache_approvals_sent_total"] == 1
    assert families["fscache_leases_active"]["fscache_leases_active"] == 0  # all gone by now
