"""The stale-read checker (``fscache.bench.checker``): proof that it finds stale reads,
then one short real run under a nemesis that must find none.

Test rules: the history tests are hand-made histories on an invented clock (times
in seconds, one file unless said), each the smallest one that shows one rule.
The real run uses real processes, 127.0.0.1 and a port picked by the kernel.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fscache.bench.checker import Op, check_history, count_ops, parse_log, run


def write(value: str, start: float, end: float, *, ok: bool = True, file: str = "f") -> Op:
    return Op("write", file, value, start, end if ok else math.inf, ok, client="w")


def read(value: str, start: float, end: float, *, file: str = "f", ok: bool = True) -> Op:
    return Op("read", file, value if ok else None, start, end, ok, client="r")


def kinds(ops: list[Op]) -> list[str]:
    return [anomaly.kind for anomaly in check_history(ops)]


# ---------------------------------------------------------------- histories that are fine
def test_a_read_after_a_write_completed_that_sees_it_is_fine() -> None:
    assert kinds([write("a", 0, 1), write("b", 2, 3), read("b", 4, 5)]) == []


def test_a_read_concurrent_with_a_write_may_see_the_old_or_the_new_value() -> None:
    history = [write("a", 0, 1), write("b", 2, 6), read("a", 3, 4), read("b", 4.5, 5)]
    assert kinds(history) == []


def test_a_read_may_see_a_write_that_ends_after_the_read_does() -> None:
    assert kinds([write("a", 0, 1), write("b", 2, 9), read("b", 3, 4)]) == []


def test_overlapping_writes_may_be_applied_in_either_order() -> None:
    # b began before a ended: a read after both may see either.
    history = [write("a", 0, 3), write("b", 2, 4), read("a", 5, 6)]
    assert kinds(history) == []


def test_a_write_whose_outcome_is_unknown_may_appear_at_any_later_time() -> None:
    history = [write("a", 0, 1), write("b", 2, 3, ok=False), read("a", 4, 5), read("b", 9, 10)]
    assert kinds(history) == []


def test_failed_reads_are_ignored() -> None:
    assert kinds([write("a", 0, 1), write("b", 2, 3), read("a", 4, 5, ok=False)]) == []


def test_files_are_checked_separately() -> None:
    history = [
        write("a", 0, 1, file="x"),
        write("b", 2, 3, file="y"),
        read("a", 4, 5, file="x"),
    ]
    assert kinds(history) == []


# ---------------------------------------------------------------- histories that are not
def test_a_read_of_the_old_value_after_a_write_completed_is_stale() -> None:
    history = [write("a", 0, 1), write("b", 2, 3), read("a", 4, 5)]
    [anomaly] = check_history(history)
    assert anomaly.kind == "stale"
    assert anomaly.write == history[0]
    assert anomaly.newer == history[1]
    assert "stale" in anomaly.describe()


def test_a_stale_read_from_the_cache_is_found_among_many_good_reads() -> None:
    history = [write("v0", 0, 0.1)]
    for n in range(1, 50):
        history.append(write(f"v{n}", n, n + 0.5))
        history.append(read(f"v{n}", n + 0.6, n + 0.7))
    history.append(Op("read", "f", "v40", 45.6, 45.7, True, "r", hit=True))
    [anomaly] = check_history(history)
    assert anomaly.newer is not None
    assert (anomaly.kind, anomaly.read.value, anomaly.newer.value) == ("stale", "v40", "v45")


def test_a_read_that_begins_the_instant_after_the_write_returned_must_see_it() -> None:
    history = [write("a", 0, 1), write("b", 2, 3), read("a", math.nextafter(3, 4), 4)]
    assert kinds(history) == ["stale"]


def test_a_read_that_began_before_the_write_returned_is_not_stale() -> None:
    history = [write("a", 0, 1), write("b", 2, 3), read("a", math.nextafter(3, 2), 4)]
    assert kinds(history) == []


def test_a_value_no_one_wrote_is_a_phantom() -> None:
    assert kinds([write("a", 0, 1), read("zzz", 2, 3)]) == ["phantom"]


def test_a_value_read_before_its_write_began_is_from_the_future() -> None:
    assert kinds([write("a", 0, 1), write("b", 5, 6), read("b", 2, 3)]) == ["future"]


def test_an_older_value_after_a_newer_one_was_seen_is_stale_even_if_unacknowledged() -> None:
    # b's write() never returned (its acknowledgement was lost), but a read saw b:
    # a read that starts afterwards may not go back to a.
    history = [
        write("a", 0, 1),
        write("b", 2, 3, ok=False),
        read("b", 4, 5),
        read("a", 6, 7),
    ]
    [anomaly] = check_history(history)
    assert anomaly.kind == "stale-observed"
    assert anomaly.witness == history[2]


def test_anomalies_come_in_the_order_of_the_reads() -> None:
    history = [write("a", 0, 1), write("b", 2, 3), read("a", 8, 9), read("zzz", 4, 5)]
    assert kinds(history) == ["phantom", "stale"]


def test_a_value_written_twice_makes_the_history_unusable() -> None:
    with pytest.raises(ValueError, match="written twice"):
        check_history([write("a", 0, 1), write("a", 2, 3)])


# ---------------------------------------------------------------- the workers' log
def test_a_log_cut_short_by_a_kill_leaves_the_write_in_flight_indeterminate() -> None:
    lines = [
        '{"event": "write-begin", "client": "c", "file": "f", "value": "c/1", "start": 1.0}',
        '{"event": "write-end", "value": "c/1", "end": 2.0, "ok": true}',
        '{"event": "read", "client": "c", "file": "f", "value": "c/1", "start": 3.0, '
        '"end": 3.5, "ok": true, "hit": true}',
        '{"event": "write-begin", "client": "c", "file": "f", "value": "c/2", "start": 4.0}',
        '{"event": "write-end", "value": "c/2", "end": 5.0, "ok": false}',
        '{"event": "write-begin", "client": "c", "file": "f", "value": "c/3", "start": 6.0}',
        '{"event": "read", "client": "c", "fi',  # torn by SIGKILL
    ]
    ops = parse_log(lines)
    assert ops == [
        Op("write", "f", "c/1", 1.0, 2.0, True, "c"),
        Op("read", "f", "c/1", 3.0, 3.5, True, "c", hit=True),
        Op("write", "f", "c/2", 4.0, math.inf, False, "c"),
        Op("write", "f", "c/3", 6.0, math.inf, False, "c"),
    ]
    assert count_ops(ops) == {"write_ok": 1, "read_ok": 1, "read_hit": 1, "write_unknown": 2}


# ---------------------------------------------------------------- a real run
@pytest.mark.slow
def test_a_short_run_with_kills_and_restarts_finds_no_anomaly(tmp_path: Path) -> None:
    """Three workers on two files for 9 s, a fault every 1.2 s on average (at least
    one full deck: a server kill, two client kills, a client pause)."""
    report = run(duration=9, clients=3, files=2, kill_every=1.2, term=1.0, skew=0.1, seed=7,
                 workdir=str(tmp_path / "run"))  # fmt: skip
    print(report.format())
    assert report.anomalies == [], report.format()
    assert report.nemesis["server_kill"] >= 1
    assert report.nemesis["client_kill"] >= 2 and report.nemesis["client_pause"] >= 1
    # The run really exercised the cache and the writes. How many it managed is a
    # matter of the machine's speed (a loaded 2-core runner does a third of a quiet
    # one's), so the floor only proves the history was not trivially empty.
    assert report.ops["read_hit"] >= 10
    assert report.ops["read_ok"] > report.ops["read_hit"] > 0
    assert report.ops["write_ok"] >= 10
