"""Prometheus metrics: the server's counters, gauges and latency histograms at ``/metrics``.

Theory of operation
-------------------
The request path pays nothing for counters: the server already counts into plain
integers (its :class:`~fscache.server.service.Counters`, the lease table's and the
session table's), and :class:`ServiceCollector` reads them when Prometheus scrapes.
Latencies are the one thing observed per request
(:mod:`fscache.server.latency`, which needs no prometheus-client: a server without
``--metrics-port`` never imports it).

prometheus-client's WSGI app serves ``/metrics`` (and only that path) from a
thread of its own, so a scrape never blocks the event loop. That thread does not
read the server's tables itself (a dict the loop is changing cannot be iterated
from another thread): it asks the loop for one
snapshot with :func:`trio.from_thread.run_sync` and waits for it. The snapshot is
taken between two events, so its values are consistent with each other, and the
loop spends on it what ``fscache stats`` costs it.

Names follow Prometheus' conventions: ``fscache_`` and the ``fscache stats`` field,
``_total`` on counters, ``_seconds`` on durations (``docs/design.md``, Metrics).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import trio
from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from fscache.errors import FscacheError
from fscache.server.latency import BUCKETS

if TYPE_CHECKING:
    from fscache.server.service import FileService

# The ``fscache stats`` fields that are levels now (gauges), by metric name; every
# other number there only grows, and is the counter ``fscache_<field>_total``.
GAUGES = {
    "leases_active": ("fscache_leases_active", "leases live now"),
    "writes_pending": ("fscache_writes_pending", "writes waiting now"),
    "connections": ("fscache_connections", "connections open now"),
    "sessions": ("fscache_sessions", "sessions held now (attached or within their TTL)"),
    "uptime_s": ("fscache_uptime_seconds", "seconds since this incarnation started"),
    "restart_window_s": (
        "fscache_restart_window_seconds",
        "seconds writes are still held by the restart window",
    ),
    "term": ("fscache_term_seconds", "the maximum lease term"),
    "skew": ("fscache_skew_seconds", "the clock-skew allowance"),
    "session_ttl": ("fscache_session_ttl_seconds", "a detached session's life"),
    "disk_bytes": ("fscache_disk_bytes", "size of the file system that holds the root"),
    "disk_free_bytes": ("fscache_disk_free_bytes", "bytes free there"),
    "disk_available_bytes": (
        "fscache_disk_available_bytes",
        "bytes free there for a process without privileges",
    ),
    "disk_files": ("fscache_disk_files", "files (inodes) that file system can hold"),
    "disk_free_files": ("fscache_disk_free_files", "files (inodes) free there"),
    "locks_held": ("fscache_locks_held", "locks held now"),
    "ephemeral_files": ("fscache_ephemeral_files", "files tied to a session now"),
}
INFO = "epoch"  # a label of fscache_server_info, not a number
# Counters whose field name would collide with a gauge's once ``_total`` is added.
COUNTERS = {"connections_total": "fscache_connections_accepted"}


# What a counter counts, where its field's name does not say it all (the rest are
# "stats: FIELD"; docs/design.md, Stats, defines every one).
COUNTER_HELP = {
    "reads": "whole-file read requests that reached the server (ranged reads are range_reads)",
    "range_reads": "read_range requests: ranged reads (fscache read, fsspec and the mount"
    " read this way, and the chunks after a big file's first)",
    "reads_not_modified": "read, read_range and scandir requests answered not modified",
    "connections_dropped": "connections the server closed after their hello",
    "connections_refused": "connections refused at max_connections or max_connections_per_identity",
}


def counter_family(field: str) -> str:
    """The counter family of ``fscache stats`` field ``field`` (its sample adds ``_total``)."""
    return COUNTERS.get(field, f"fscache_{field}")


HISTOGRAMS = {
    "read": ("fscache_read_latency_seconds", "reads (whole, ranged, listings): arrival to grant"),
    "write": ("fscache_write_latency_seconds", "applied writes: arrival to reply"),
    "write_delay": ("fscache_write_delay_seconds", "writes: arrival to apply (approvals, expiry)"),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    stats: Mapping[str, Any]
    histograms: Mapping[str, tuple[list[int], float]]


def take_snapshot(service: FileService) -> Snapshot:
    """Everything a scrape reports, read between two events on the event loop."""
    stats = {**service.stats(), "sessions_opened": service.sessions.opened}
    latency = service.latency
    histograms = {name: getattr(latency, name).snapshot() for name in HISTOGRAMS}
    return Snapshot(stats, histograms)


class ServiceCollector(Collector):
    """Turns a :class:`Snapshot`, asked for at each scrape, into metric families."""

    def __init__(self, snapshot: Callable[[], Snapshot], first: Snapshot) -> None:
        self._snapshot = snapshot
        self._first = first  # its families name every metric there is

    def describe(self) -> Iterator[Metric]:
        """The families, for the registry's index of names (a scrape that asks for
        ``name[]=...`` finds them there)."""
        return self._families(self._first)

    def collect(self) -> Iterator[Metric]:
        return self._families(self._snapshot())

    def _families(self, snapshot: Snapshot) -> Iterator[Metric]:
        for field, value in snapshot.stats.items():
            if field == INFO:
                yield InfoMetricFamily("fscache_server", "this incarnation", {field: str(value)})
            elif field in GAUGES:
                name, doc = GAUGES[field]
                yield GaugeMetricFamily(name, doc, value=value)
            else:
                doc = COUNTER_HELP.get(field, f"stats: {field}")
                yield CounterMetricFamily(counter_family(field), doc, value)
        for field, (name, doc) in HISTOGRAMS.items():
            counts, total = snapshot.histograms[field]
            cumulative, buckets = 0, []
            for bound, count in zip((*BUCKETS, float("inf")), counts, strict=True):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            yield HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


async def serve_metrics(
    service: FileService,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics`` for ``service`` on ``host:port`` (0: a free port) from
    prometheus-client's thread until cancelled; ``task_status`` gets the address."""
    token = trio.lowlevel.current_trio_token()

    def snapshot() -> Snapshot:
        return trio.from_thread.run_sync(take_snapshot, service, trio_token=token)

    registry = CollectorRegistry(auto_describe=True)  # (for ProcessCollector's names)
    registry.register(ServiceCollector(snapshot, take_snapshot(service)))
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, memory, descriptors
    try:
        server, thread = _start_server(host, port, make_wsgi_app(registry))
    except OSError as exc:
        raise FscacheError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    try:
        task_status.started((host, server.server_port))
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.shutdown)
        server.server_close()
        thread.join()


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _start_server(host: str, port: int, metrics: WSGIApp) -> tuple[WSGIServer, threading.Thread]:
    """prometheus-client's ``start_http_server``, but any path other than ``/metrics``
    is 404: a server that answered every path with its metrics would pass for up
    behind any URL a probe was given."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"fscache serves its metrics at /metrics\n"]
        return metrics(environ, start_response)

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape every few seconds is not news (the request log stays silent)."""
