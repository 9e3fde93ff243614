"""The server's log: events an operator acts on, as text or as one JSON object a line.

Events are emitted with :func:`event` where the server already knows them (a
connection opened or closed, a write delayed, a holder waited out, a restart
window, a session expired), never on the read path. They go to the logger
``fscache.events`` at INFO, each record carrying its name and fields; other log
records (warnings, errors) keep their loggers and become JSON objects too, with
``event`` ``"log"``. Text output is the standard one; ``--log-format json`` swaps
only the formatter.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
from typing import Any

EVENTS = logging.getLogger("fscache.events")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def event(name: str, message: str, /, *args: object, **fields: Any) -> None:
    """Log event ``name``: ``message % args`` for people, ``fields`` for machines."""
    if EVENTS.isEnabledFor(logging.INFO):
        EVENTS.info(message, *args, extra={"event": name, "fields": fields})


def loud_event(
    throttle: Throttle, now: float, name: str, message: str, /, *args: object, **fields: Any
) -> None:
    """Log event ``name`` as one an operator should see without ``-v``: at WARNING.
    Its level is its kind's, every time, never the clock's: a refused TLS handshake
    is a warning whether or not another came just before. Only what the text log
    shows is throttled: the first, then at most one per ``throttle``'s interval (a
    peer that keeps trying cannot flood it), the next one shown counting those
    hidden; JSON and ``-v`` show every one, so their lines count nothing."""
    quiet = throttle.loud(now)
    extra = {"event": name, "fields": fields, "quiet": quiet is None, "quiet_before": quiet or 0}
    EVENTS.warning(message, *args, extra=extra)


def _not_quiet(record: logging.LogRecord) -> bool:
    """The text log's filter: hides the records :func:`loud_event` throttled, and ends
    the next one shown with how many it hid. Only this log hides them, so only its
    lines say so."""
    if getattr(record, "quiet", False):
        return False
    hidden = getattr(record, "quiet_before", 0)
    if hidden:
        record.msg = f"{record.msg} (and {hidden} more since the last one of these)"
        record.quiet_before = 0  # said once
    return True


def rare_event(
    throttle: Throttle, now: float, name: str, message: str, /, *args: object, **fields: Any
) -> None:
    """A WARNING event of a condition that may repeat thousands of times a second (a
    full disk fails every write): the first, then at most one per ``throttle``'s
    interval; the ones between are not logged at all, and the next one counts them
    (its field ``suppressed``)."""
    quiet = throttle.loud(now)
    if quiet is None:
        return
    if quiet:
        message += f" (and {quiet} more since the last one of these)"
    EVENTS.warning(message, *args, extra={"event": name, "fields": {**fields, "suppressed": quiet}})


class Throttle:
    """Which records of one kind are loud: the first, then at most one each
    ``interval`` seconds of the caller's clock; it counts the quiet ones between."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._next = -math.inf  # the earliest time of the next loud one
        self._quiet = 0

    def loud(self, now: float) -> int | None:
        """None if this record is quiet; else how many were quiet since the last loud one."""
        if now < self._next:
            self._quiet += 1
            return None
        self._next = now + self.interval
        quiet, self._quiet = self._quiet, 0
        return quiet


_FIRST, _LAST = (
    moment.replace(tzinfo=datetime.UTC).isoformat(timespec="milliseconds")
    for moment in (datetime.datetime.min, datetime.datetime.max)
)


def wall_time(seconds: float) -> str:
    """A POSIX time as ISO 8601 in UTC, to the millisecond. A time the calendar
    cannot show (before year 1, after year 9999: a restart window read from a damaged
    record may end in year 33,000) is said against its bound, ``after 9999-12-31...``
    or ``before 0001-01-01...``, and a NaN as ``not a time``: reporting a time never
    fails."""
    if math.isnan(seconds):
        return "not a time"
    try:
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, OSError, ValueError):  # which one depends on the platform
        return f"after {_LAST}" if seconds > 0 else f"before {_FIRST}"
    return moment.isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``event``, ``message``, the
    event's fields, and ``error`` (the traceback) when there is one. A field that is
    an infinite or NaN number is written as a string (``"inf"``, ``"nan"``): JSON has
    no such numbers, and strict parsers refuse Python's ``Infinity``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": wall_time(record.created),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", "log"),
            "logger": record.name,
            "message": record.getMessage(),
            **{
                name: str(value) if isinstance(value, float) and not math.isfinite(value)
                else value
                for name, value in getattr(record, "fields", {}).items()
            },
        }  # fmt: skip
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(log_format: str, verbose: int) -> None:
    """Set the serve command's log: ``log_format`` (text or json) on every handler of
    the root logger; fscache's INFO records, and its DEBUG ones with ``-v``. In text
    the events are quiet unless ``-v``, as the connections' lines always were, but
    for the few an operator must see (:func:`loud_event`: a refused TLS handshake or
    connection, throttled; :func:`rare_event`: a failing disk)."""
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    if verbose == 0:
        logging.getLogger("fscache").setLevel(logging.INFO)
        if log_format == "text":
            EVENTS.setLevel(logging.WARNING)
            EVENTS.addFilter(_not_quiet)
