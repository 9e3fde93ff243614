"""The progress bar ``fscache bench`` draws on stderr while it runs."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    WIDTH = 28

    def __init__(self, planned: float, *, enabled: bool = True) -> None:
        self.planned = max(planned, 1e-9)
        self.done = 0.0
        self.started = time.monotonic()
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._last_phase = ""

    def show(self, label: str, phase: str, within: float, detail: str = "") -> None:
        if not self.enabled:
            return
        if not self.tty:
            if phase != self._last_phase:
                print(f"bench: {label}: {phase}", file=sys.stderr, flush=True)
                self._last_phase = phase
            return
        phase = f"{phase} {detail}"
        fraction = min(1.0, (self.done + within) / self.planned)
        filled = int(fraction * self.WIDTH)
        elapsed = time.monotonic() - self.started
        eta = elapsed / fraction - elapsed if fraction > 0.02 else float("nan")
        eta_text = "?" if eta != eta else f"{int(eta) // 60}m{int(eta) % 60:02d}s"
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = f"\r[{bar}] {fraction:4.0%}  {label:<26} {phase:<22} ETA {eta_text}"
        sys.stderr.write(line[:120].ljust(100))
        sys.stderr.flush()

    def finish_run(self, planned: float) -> None:
        self.done += planned
        self._last_phase = ""

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r" + " " * 110 + "\r")
            sys.stderr.flush()
