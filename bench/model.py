"""The analytic model of Gray & Cheriton (SOSP 1989, section 3), as pure functions.

Notation (the paper's Table 1):

=========  ==========================================================
N          clients
R, W       each client's read and write rate (Poisson), per second
S          clients sharing each file
m_prop     propagation delay of one message
m_proc     processing time of one message at one end (send or receive)
eps        allowance for clock skew (our ``--skew``)
t_S        the server's lease term
t_C        the client's effective term: t_S - (m_prop + 2 m_proc) - eps
=========  ==========================================================

Server consistency load, messages per second::

    2NR / (1 + R t_C) + N S W        (t_S > 0)
    2NR                              (t_S = 0: every read asks, no write needs approval)

A read whose lease has run out costs a request and a reply; a lease lasts ``t_C``
and the next read comes ``1/R`` later on average, hence ``R / (1 + R t_C)``
extensions per second. A write costs approval traffic from the ``S`` sharers.
With ``t_S = 0`` nothing is cached and no approval is needed, which is why term 0
beats a very short term (``t_C = 0`` but approvals are still paid).

Added delay per operation, seconds::

    [2R (m_prop + 2 m_proc) / (1 + R t_C) + W t_a] / (R + W),
    t_a = 2 m_prop + (S + 2) m_proc                (approval of a write)

The paper's ``R`` is the rate at which one client reads the one file a lease
covers. A client that reads ``k`` files is ``k`` independent lease streams
(Poisson thinning), each at its own rate; the ``*_for_rates`` functions sum the
paper's per-lease term over them, and equal the paper's formulas when every
client reads one file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True, slots=True)
class Calibration:
    """Measured message costs (seconds)."""

    m_prop: float
    m_proc: float

    @property
    def round_trip(self) -> float:
        """A request and its reply: ``2 (m_prop + 2 m_proc)``."""
        return 2 * (self.m_prop + 2 * self.m_proc)


def client_term(t_s: float, m_prop: float, m_proc: float, eps: float) -> float:
    """``t_C = max(0, t_S - (m_prop + 2 m_proc) - eps)``."""
    return max(0.0, t_s - (m_prop + 2 * m_proc) - eps)


def approval_delay(s: int, m_prop: float, m_proc: float) -> float:
    """``t_a = 2 m_prop + (S + 2) m_proc``: what getting approval adds to a write."""
    return 2 * m_prop + (s + 2) * m_proc


def consistency_load(n: int, r: float, w: float, s: int, t_s: float, t_c: float) -> float:
    """Server consistency messages per second (the paper's formula)."""
    if t_s == 0:
        return 2 * n * r
    return 2 * n * r / (1 + r * t_c) + n * s * w


def added_delay(
    r: float, w: float, s: int, t_s: float, t_c: float, m_prop: float, m_proc: float
) -> float:
    """Mean delay consistency adds to one operation (the paper's formula), seconds."""
    if r + w == 0:
        return 0.0
    reads = 2 * r * (m_prop + 2 * m_proc) / (1 + r * t_c)
    writes = w * approval_delay(s, m_prop, m_proc) if t_s > 0 else 0.0
    return (reads + writes) / (r + w)


# ---------------------------------------------------------------- many leases per client
def server_read_rate(rates: Iterable[float], t_c: float) -> float:
    """Reads per second that reach the server: ``sum r / (1 + r t_C)`` over lease streams
    (one per client and file), each with its own Poisson read rate ``r``."""
    return sum(r / (1 + r * t_c) for r in rates)


def consistency_load_for_rates(
    read_rates: Iterable[float], write_rate: float, s: int, t_s: float, t_c: float
) -> float:
    """The paper's load for clients reading several files: ``2 sum r/(1 + r t_C)``
    over the (client, file) read rates, plus ``S`` messages per write when t_S > 0.
    ``write_rate`` is the total, ``N W``."""
    rates = list(read_rates)
    if t_s == 0:
        return 2 * sum(rates)
    return 2 * server_read_rate(rates, t_c) + s * write_rate


def hit_ratio_for_rates(read_rates: Iterable[float], t_c: float) -> float:
    """The fraction of reads answered from the cache."""
    rates = list(read_rates)
    total = sum(rates)
    return 1 - server_read_rate(rates, t_c) / total if total else 0.0


def mean_read_delay_for_rates(
    read_rates: Iterable[float], t_c: float, calibration: Calibration
) -> float:
    """Mean delay a read waits for the server, seconds (the read half of the paper's
    added delay, per read)."""
    return (1 - hit_ratio_for_rates(read_rates, t_c)) * calibration.round_trip


def ttl_load_for_rates(read_rates: Iterable[float], ttl: float) -> float:
    """A TTL cache's server traffic: like leases of ``ttl`` with no approvals at all
    (and no consistency: it serves stale data until the TTL runs out)."""
    return 2 * server_read_rate(read_rates, ttl)
