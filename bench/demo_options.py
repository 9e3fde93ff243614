"""The demos' options: their defaults, their ranges and the one check of each.

Light on purpose: the command line's parser imports it to show the ranges in
``--help`` and refuse a value out of them as bad usage, and the demos import it
to check the same values when they are called as functions.
"""

from __future__ import annotations

from fscache.settings import MAX_LOCK_TTL, MAX_TERM, BadSetting

CRASH_TERM = 3.0  # seconds: the crash demo's default lease term
MIN_TERM = 0.5  # leases must outlive the demo's own steps (start a write, kill a reader)
MAX_CRASH_TERM = MAX_TERM  # the server refuses a longer term
CRASH_CLIENTS = 3
MIN_CLIENTS = 2  # one to kill, one to approve
MAX_CLIENTS = 32

ELECTION_TTL = 2.0  # seconds: the election demo's default leadership ttl
MIN_TTL = 0.5  # the leader must renew at least once before the kill
MAX_TTL = MAX_LOCK_TTL  # the server refuses a longer lock, in each candidate's first acquire
ELECTION_CANDIDATES = 3
MIN_CANDIDATES = 2  # one to kill, one to take over
MAX_CANDIDATES = 16


def check_crash(*, term: float, skew: float, clients: int) -> None:
    """:class:`BadSetting` naming the option if the crash demo cannot run with these."""
    if not MIN_CLIENTS <= clients <= MAX_CLIENTS:
        raise BadSetting(
            f"--clients must be from {MIN_CLIENTS} to {MAX_CLIENTS}"
            f" (one to kill, one to approve), not {clients}"
        )
    if term < MIN_TERM:
        raise BadSetting(f"--term must be at least {MIN_TERM:g} s for the demo, not {term:g}")
    if term > MAX_CRASH_TERM:
        raise BadSetting(
            f"--term must be at most {MAX_CRASH_TERM:g} s (a server's longest), not {term:g}"
        )
    if not 0 <= skew < term:
        raise BadSetting("--skew must be at least 0 and less than --term")


def check_election(*, ttl: float, skew: float, candidates: int) -> None:
    """:class:`BadSetting` naming the option if the election demo cannot run with these."""
    if not MIN_CANDIDATES <= candidates <= MAX_CANDIDATES:
        raise BadSetting(
            f"--candidates must be from {MIN_CANDIDATES} to {MAX_CANDIDATES}, not {candidates}"
        )
    if ttl < MIN_TTL:
        raise BadSetting(f"--ttl must be at least {MIN_TTL:g} s for the demo, not {ttl:g}")
    if ttl > MAX_TTL:
        raise BadSetting(f"--ttl must be at most {MAX_TTL:g} s (a lock's longest), not {ttl:g}")
    if not 0 <= skew < ttl / 2:
        raise BadSetting("--skew must be at least 0 and less than half of --ttl")
