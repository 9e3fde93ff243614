"""The workload's configuration and the plan that follows from it: which client
reads and writes which file at what rate, and the phases of one run's schedule.

Every figure of ``fscache bench`` is defined here; see ``bench/README.md``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from fscache.bench import model, shown

SYSTEMS = ("fscache", "ttl", "redis")
QUICK_SCALE = 10.0  # --quick: rates x10, terms and skew /10 (R t_C is kept)

# The largest values a run takes. The driver schedules every operation of a run in
# memory before it starts and must keep up with the schedule on a small machine:
# beyond these, a run exhausts memory or falls behind until a worker stops answering.
MAX_CLIENTS = 1000
MAX_PROCESSES = 64
MAX_FILES = 100_000
MAX_FILE_SIZE = 1024 * 1024  # bytes
MIN_FILE_SIZE = 16  # bytes: room for the value the stale-read checker reads back
MAX_RATE = 1000.0  # reads or writes per second of one client
MAX_LOAD = 10_000.0  # operations per second of all clients together
MAX_DURATION = 3600.0  # seconds measured per run
MAX_TERM = 600.0  # seconds: a term or a TTL (a run first primes its leases for one term)
MAX_SKEW = 10.0  # seconds
MAX_ZIPF_S = 10.0


@dataclasses.dataclass(frozen=True)
class ClientPlan:
    """One client's share of the workload (here, not in the driver that runs it, so
    the configuration loads without numpy: ``fscache bench --help`` needs no extra)."""

    index: int  # global client number
    files: tuple[int, ...]  # the files it reads ...
    read_p: tuple[float, ...]  # ... with these probabilities
    owned: tuple[int, ...]  # the files it alone writes ...
    write_p: tuple[float, ...]  # ... with these probabilities


@dataclasses.dataclass
class Config:
    clients: int = 40
    processes: int = 2
    read_rate: float = 8.64  # per client: 10 files x 0.864/s, the paper's R per file
    write_rate: float = 0.1  # per client
    sharing: int = 2
    files: int = 200
    file_size: int = 1024
    popularity: str = "uniform"
    zipf_s: float = 1.0
    duration: float = 40.0  # measured seconds per run
    terms: tuple[float, ...] = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
    ttl_terms: tuple[float, ...] = (1.0, 10.0)
    skew: float = 0.1
    systems: tuple[str, ...] = SYSTEMS
    seed: int = 1
    calibration_reads: int = 2000
    quick: bool = False

    @classmethod
    def quick_preset(cls) -> Config:
        """Under a minute on 2 cores: half the clients, half the files per client,
        rates x10 and terms and skew /10, so R t_C -- the shape of the curve -- is kept."""
        q = QUICK_SCALE
        return cls(
            clients=20,
            read_rate=0.864 * 5 * q,
            write_rate=0.05 * q,  # per file as in the full run: 5 files, 2-3 owned
            files=50,
            duration=3.0,
            terms=tuple(t / q for t in (0.0, 0.1, 0.5, 2.0, 10.0)),
            ttl_terms=(2.0 / q, 10.0 / q),
            skew=0.1 / q,
            calibration_reads=500,
            quick=True,
        )

    def validate(self) -> None:
        """ValueError naming the option if the benchmark cannot run with these values."""
        _check_range("--clients", self.clients, 1, MAX_CLIENTS)
        if not 1 <= self.processes <= min(MAX_PROCESSES, self.clients):
            raise ValueError(
                f"--processes must be from 1 to {MAX_PROCESSES} and at most --clients"
                f" ({self.clients}), not {self.processes}"
            )
        _check_range("--files", self.files, 1, MAX_FILES)
        _check_range("--file-size", self.file_size, MIN_FILE_SIZE, MAX_FILE_SIZE)
        _check_range("--read-rate", self.read_rate, 0, MAX_RATE, above_least=True)
        _check_range("--write-rate", self.write_rate, 0, MAX_RATE)
        load = self.clients * (self.read_rate + self.write_rate)
        if load > MAX_LOAD:
            raise ValueError(
                f"--clients x (--read-rate + --write-rate) must be at most {MAX_LOAD:g}"
                f" operations/s, not {shown(load)}"
            )
        _check_range("--duration", self.duration, 0, MAX_DURATION, above_least=True)
        _check_range("--skew", self.skew, 0, MAX_SKEW)
        _check_range("--zipf-s", self.zipf_s, 0, MAX_ZIPF_S)
        if self.seed < 0:
            raise ValueError(f"--seed must be 0 or more, not {self.seed}")
        for term in self.terms:
            _check_range("--terms", term, 0, MAX_TERM)
        for term in self.ttl_terms:
            _check_range("--ttl-terms", term, 0, MAX_TERM, above_least=True)
        if "fscache" in self.systems and not self.terms:
            raise ValueError("--terms names no term (fscache is among --systems)")
        if "ttl" in self.systems and not self.ttl_terms:
            raise ValueError("--ttl-terms names no lifetime (ttl is among --systems)")
        if not self.systems:
            raise ValueError(f"--systems names no system; choose from {','.join(SYSTEMS)}")
        if self.sharing < 1 or self.clients % self.sharing:
            raise ValueError("--clients must be a positive multiple of --sharing")
        groups = self.clients // self.sharing
        if self.files < groups or self.files % groups:
            raise ValueError(
                f"--files must be a positive multiple of the {groups} groups of "
                f"{self.sharing} sharing clients"
            )
        if self.files // groups < self.sharing and self.write_rate > 0:
            raise ValueError("each group needs at least --sharing files (one writer per file)")
        if self.popularity not in ("uniform", "zipf"):
            raise ValueError("--popularity is uniform or zipf")
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise ValueError(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")

    @property
    def files_per_client(self) -> int:
        return self.files // (self.clients // self.sharing)


def _check_range(
    option: str, value: float, least: float, most: float, *, above_least: bool = False
) -> None:
    """ValueError unless ``value`` is a finite number from ``least`` (or above it) to
    ``most``; nan and infinity are refused by the same comparisons."""
    low_ok = value > least if above_least else value >= least
    if not (low_ok and value <= most):
        low = f"more than {least:g} and at most" if above_least else f"from {least:g} to"
        raise ValueError(f"{option} must be {low} {shown(most)}, not {shown(value)}")


def popularity(k: int, kind: str, s: float) -> list[float]:
    weights = [1.0] * k if kind == "uniform" else [1.0 / (rank**s) for rank in range(1, k + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def plan_clients(cfg: Config) -> list[ClientPlan]:
    """Clients in groups of ``sharing``; each group reads its own files (so each file is
    shared by exactly ``sharing`` clients); file ``j`` of a group is written by member
    ``j mod sharing`` only."""
    k = cfg.files_per_client
    weights = popularity(k, cfg.popularity, cfg.zipf_s)
    plans = []
    for group in range(cfg.clients // cfg.sharing):
        files = tuple(range(group * k, (group + 1) * k))
        for member in range(cfg.sharing):
            owned = [j for j in range(k) if j % cfg.sharing == member]
            owned_total = sum(weights[j] for j in owned)
            plans.append(
                ClientPlan(
                    index=group * cfg.sharing + member,
                    files=files,
                    read_p=tuple(weights),
                    owned=tuple(files[j] for j in owned),
                    write_p=tuple(weights[j] / owned_total for j in owned),
                )
            )
    return plans


def lease_read_rates(cfg: Config, plans: Sequence[ClientPlan]) -> list[float]:
    """One Poisson read rate per (client, file): the model's lease streams."""
    return [cfg.read_rate * p for plan in plans for p in plan.read_p]


@dataclasses.dataclass(frozen=True)
class Phases:
    """Offsets within one run's schedule, seconds."""

    prime_term: float  # t_C the priming reads prepare for (0: no priming)
    steady_from: float  # the Poisson arrivals begin; every lease stream is stationary
    window: tuple[float, float]  # measured

    @property
    def length(self) -> float:
        return self.window[1]


def phases_for(
    cfg: Config, system: str, term: float, rates: Sequence[float], costs: model.Calibration
) -> Phases:
    """Priming reads for ``t_C`` seconds (see :func:`fscache.bench.driver.schedule`),
    then a short settling time, then the window. Redis has no term: its caches fill
    during three mean gaps between reads of a file."""
    scale = 0.1 if cfg.quick else 1.0
    lead, settle = 0.5 * scale, 1.0 * scale
    if system == "redis":
        prime = 0.0
        settle = max(settle, 3.0 / statistics.median(rates))
    elif system == "ttl":
        prime = term  # a TTL is trusted exactly that long, no skew allowance
    else:
        prime = model.client_term(term, costs.m_prop, costs.m_proc, cfg.skew)
    steady = lead + prime
    return Phases(prime, steady, (steady + settle, steady + settle + cfg.duration))
