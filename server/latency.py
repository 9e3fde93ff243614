"""The server's latency histograms: observed on the event loop's thread, once per
request where it is answered, with no lock; :mod:`fscache.server.metrics` exports
them. :meth:`Histogram.observe` is a bisection and two additions."""

from __future__ import annotations

import dataclasses
from bisect import bisect_left

# Upper bounds of the latency buckets, seconds: a request handled at once takes well
# under a millisecond; a write may wait out a lease (term + skew, 10.1 s by default)
# or a restart window.
BUCKETS = (
    *(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0),
)


class Histogram:
    """Counts of observed durations per bucket, and their sum. Written only by the
    event loop's thread; read from it too (:meth:`snapshot`)."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> tuple[list[int], float]:
        return list(self.counts), self.sum


@dataclasses.dataclass(frozen=True, slots=True)
class Latencies:
    """The server's histograms, each observed once per request where it is answered."""

    read: Histogram = dataclasses.field(default_factory=Histogram)  # arrival to grant
    write: Histogram = dataclasses.field(default_factory=Histogram)  # arrival to reply
    write_delay: Histogram = dataclasses.field(default_factory=Histogram)  # arrival to apply
