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
from typing import Any

EVENTS = logging.getLogger("fscache.events")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def event(name: str, message: str, /, *args: object, **fields: Any) -> None:
    """Log event ``name``: ``message % args`` for people, ``fields`` for machines."""
    if EVENTS.isEnabledFor(logging.INFO):
        EVENTS.info(message, *args, extra={"event": name, "fields": fields})


def wall_time(seconds: float) -> str:
    """A POSIX time as ISO 8601 in UTC, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``event``, ``message``, the
    event's fields, and ``error`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": wall_time(record.created),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", "log"),
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(log_format: str, verbose: int) -> None:
    """Set the serve command's log: ``log_format`` (text or json) on every handler of
    the root logger; fscache's INFO records, and its DEBUG ones with ``-v``. In text
    the events are quiet unless ``-v``, as the connections' lines always were."""
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    if verbose == 0:
        logging.getLogger("fscache").setLevel(logging.INFO)
        if log_format == "text":
            EVENTS.setLevel(logging.WARNING)
