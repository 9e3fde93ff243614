"""The ephemeral table's rules (``fscache.ephemeral``), without I/O: each test plans a
change, commits it, and reads the ties and the deletes a session's end asks for."""

from __future__ import annotations

from fscache.ephemeral import DeleteTied, EphemeralTable, Move, Plan, Rewrite
from fscache.leases import HolderId

A = HolderId("e.1")
B = HolderId("e.2")
LIVE = {A, B}


def apply(table: EphemeralTable, change: Rewrite | Move) -> Plan:
    plan = table.plan(change)
    assert table.commit(plan, 0.0, LIVE) == []
    return plan


def test_an_ephemeral_write_ties_the_file_to_its_session() -> None:
    table = EphemeralTable()
    plan = apply(table, Rewrite("svc/n1", A))
    assert plan == Plan({"svc/n1": None}, {"svc/n1": A})
    assert table.session_of("svc/n1") == A
    assert table.session_ended(A, 5.0) == [DeleteTied("svc/n1", A, 5.0)]
    assert table.session_ended(B, 5.0) == []


def test_the_sessions_with_files_are_those_with_a_tie_left() -> None:
    table = EphemeralTable()
    assert table.sessions() == []
    apply(table, Rewrite("a", A))
    apply(table, Rewrite("b", A))
    apply(table, Rewrite("c", B))
    assert sorted(table.sessions()) == [A, B]
    apply(table, Rewrite("c"))  # B's last tie goes
    apply(table, Rewrite("a"))  # A keeps b
    assert table.sessions() == [A]


def test_a_plain_write_or_delete_unties() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("f", A))
    assert apply(table, Rewrite("f")) == Plan({"f": A}, {"f": None})
    assert table.session_of("f") is None
    assert table.session_ended(A, 1.0) == []


def test_an_ephemeral_write_by_another_session_reties() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("f", A))
    apply(table, Rewrite("f", B))
    assert table.session_ended(A, 1.0) == []
    assert table.session_ended(B, 1.0) == [DeleteTied("f", B, 1.0)]


def test_a_change_that_changes_no_tie_plans_nothing() -> None:
    table = EphemeralTable()
    assert not table.plan(Rewrite("f"))
    apply(table, Rewrite("f", A))
    assert not table.plan(Rewrite("f", A))  # the same session writes it again
    assert not table.plan(Move("g", "h"))


def test_a_plan_not_committed_changes_nothing() -> None:
    table = EphemeralTable()
    table.plan(Rewrite("f", A))  # the write failed: never committed
    assert table.session_of("f") is None


def test_a_rename_moves_the_tie_with_the_file() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("tmp", A))
    assert apply(table, Move("tmp", "svc/n1")) == Plan(
        {"tmp": A, "svc/n1": None}, {"tmp": None, "svc/n1": A}
    )
    assert table.ties() == {"svc/n1": A}


def test_a_file_renamed_over_a_tied_one_replaces_its_tie() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("svc/n1", A))
    apply(table, Move("plain", "svc/n1"))  # an untied file over a tied one
    assert table.ties() == {}
    apply(table, Rewrite("x", B))
    apply(table, Rewrite("y", A))
    apply(table, Move("x", "y"))
    assert table.ties() == {"y": B}


def test_a_directory_rename_moves_every_tie_below_it() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("svc/a", A))
    apply(table, Rewrite("svc/sub/b", B))
    apply(table, Rewrite("svcx", A))  # a sibling sharing the prefix stays
    apply(table, Move("svc", "old/svc"))
    assert table.ties() == {"old/svc/a": A, "old/svc/sub/b": B, "svcx": A}


def test_a_directory_rename_finds_its_ties_among_names_that_sort_around_it() -> None:
    """Names that share the directory's name as a prefix and sort before "/" (" ",
    "-", ".") or after it ("0", "x", non-ASCII) are not below it."""
    table = EphemeralTable()
    around = ["d", "d d", "d-x", "d.x", "d0", "dx", "dé", "c/d/x", "e"]
    for path in around:
        apply(table, Rewrite(path + "/f" if path == "d" else path, A))
    apply(table, Rewrite("d/sub/g", B))
    apply(table, Rewrite("d/z", B))
    apply(table, Move("d", "moved"))
    assert table.ties() == {
        **dict.fromkeys(["d d", "d-x", "d.x", "d0", "dx", "dé", "c/d/x", "e"], A),
        "moved/f": A, "moved/sub/g": B, "moved/z": B,
    }  # fmt: skip
    apply(table, Move("e", "moved/z"))  # a file over a tied file
    assert table.ties()["moved/z"] == A and "e" not in table.ties()


def test_a_delete_for_an_ended_session_is_skipped_once_the_file_is_untied() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("f", A))
    (delete,) = table.session_ended(A, 3.0)
    apply(table, Rewrite("f", B))  # queued before the delete: applied first
    assert table.plan_delete(delete) is None
    apply(table, Rewrite("f"))
    assert table.plan_delete(delete) is None


def test_a_delete_for_an_ended_session_unties_and_counts() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("f", A))
    (delete,) = table.session_ended(A, 3.0)
    plan = table.plan_delete(delete)
    assert plan == Plan({"f": A}, {"f": None})
    table.commit(plan, 4.0, LIVE, ephemeral_delete=True)
    assert table.ties() == {} and table.deleted == 1


def test_ties_recovered_at_start_are_all_ended() -> None:
    table = EphemeralTable()
    old = HolderId("old.4")
    deletes = table.recovered([("a", old), ("b/c", old)], 0.0)
    assert deletes == [DeleteTied("a", old, 0.0), DeleteTied("b/c", old, 0.0)]
    assert table.ties() == {"a": old, "b/c": old}
    assert table.next_deadline() is None


def test_a_tie_made_for_a_session_already_ended_is_ended_as_it_is_made() -> None:
    """An ephemeral write queued before its session ended, applied after."""
    table = EphemeralTable()
    plan = table.plan(Rewrite("f", A))
    assert table.session_ended(A, 2.0) == []  # nothing tied yet
    assert table.commit(plan, 3.0, {B}) == [DeleteTied("f", A, 3.0)]


def test_a_rename_carrying_an_ended_sessions_tie_ends_it_at_the_new_name() -> None:
    table = EphemeralTable()
    apply(table, Rewrite("tmp", A))
    (delete,) = table.session_ended(A, 2.0)
    plan = table.plan(Move("tmp", "svc/n1"))  # queued before the delete
    assert table.commit(plan, 3.0, {B}) == [DeleteTied("svc/n1", A, 3.0)]
    assert table.plan_delete(delete) is None  # the old name's delete: nothing to do
