"""The demos' timeline on the terminal: stamped lines, section titles, and one live
status line (only on a terminal)."""

from __future__ import annotations

import os
from typing import ClassVar, TextIO

WHO_WIDTH = 9  # "reader 10"


class Console:
    """The timeline: stamped lines, section titles, and one live status line (TTY)."""

    STYLES: ClassVar[dict[str, str]] = {
        "bold": "1",
        "dim": "2",
        "red": "1;31",
        "green": "1;32",
    }

    def __init__(
        self, t0: float, out: TextIO, who_width: int = WHO_WIDTH, *, in_time_order: bool = False
    ) -> None:
        self.t0 = t0
        self.out = out
        self.who_width = who_width
        # A demo that stamps some events after later ones (an instant it predicts, an
        # inbox read late) holds a section's events and prints them in time order when
        # the section ends: at the next title or plain line.
        self.in_time_order = in_time_order
        self._held: list[tuple[float, int, str]] = []
        self.tty = out.isatty()
        self.colour = self.tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        self._status = ""

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{self.STYLES[style]}m{text}\x1b[0m" if self.colour else text

    def rel(self, t: float) -> str:
        return f"+{t - self.t0:.3f}"

    def _print(self, line: str) -> None:
        status = self._status
        self.clear_status()
        print(line, file=self.out, flush=True)
        if status:
            self.status(status)

    def line(self, text: str = "") -> None:
        self.flush()
        self._print(text)

    def section(self, title: str) -> None:
        self.flush()
        self._print("")
        self._print(self.paint(title, "bold"))

    def event(self, t: float, who: str, text: str, style: str | None = None) -> None:
        stamp = self.paint(f"{self.rel(t):>9}", "dim")
        body = f"{who:<{self.who_width}}  {text}"
        line = f"{stamp}  {self.paint(body, style) if style else body}"
        if self.in_time_order:
            self._held.append((t, len(self._held), line))  # ties keep their order
        else:
            self._print(line)

    def flush(self) -> None:
        """Print the held events, earliest first."""
        for _, _, line in sorted(self._held):
            self._print(line)
        self._held.clear()

    def status(self, text: str) -> None:
        """A line redrawn in place; only on a terminal."""
        if not self.tty:
            return
        pad = " " * max(0, len(self._status) - len(text))
        self.out.write(f"\r{text}{pad}")
        self.out.flush()
        self._status = text

    def clear_status(self) -> None:
        if self._status:
            self.out.write("\r" + " " * len(self._status) + "\r")
            self.out.flush()
            self._status = ""
