"""Which keys each operation touches (:mod:`fscache.names`), one test per rule."""

from __future__ import annotations

import pytest

from fscache.leases import Footprint
from fscache.names import (
    dir_key,
    keys_for_delete,
    keys_for_mkdir,
    keys_for_rename,
    keys_for_rmdir,
    keys_for_write,
    parent,
)


@pytest.mark.parametrize(("path", "expected"), [("a", ""), ("d/a", "d"), ("d/s/a", "d/s")])
def test_parent_is_the_directory_holding_a_path_the_root_being_empty(
    path: str, expected: str
) -> None:
    assert parent(path) == expected


def test_a_directory_key_is_its_path_and_a_slash_and_never_a_file_key() -> None:
    assert (dir_key("d"), dir_key("d/s"), dir_key("")) == ("d/", "d/s/", "/")
    # a normal path never ends in '/': file and directory keys never collide,
    # and every key below d starts with d/
    assert dir_key("d") != "d"
    assert all(key.startswith(dir_key("d")) for key in ["d/a", "d/s/", dir_key("d/s")])


def test_an_overwrite_ranged_write_or_truncate_of_an_existing_file_touches_only_its_key() -> None:
    assert keys_for_write("d/a", creates=False) == Footprint(("d/a",))


def test_a_write_that_creates_a_file_is_also_a_write_on_its_directorys_name_set() -> None:
    assert keys_for_write("d/a", creates=True) == Footprint(("d/a", "d/"))
    assert keys_for_write("a", creates=True) == Footprint(("a", "/"))


def test_delete_touches_the_file_and_its_directorys_name_set() -> None:
    assert keys_for_delete("d/a") == Footprint(("d/a", "d/"))


def test_mkdir_and_rmdir_touch_the_directorys_own_name_set_and_its_parents() -> None:
    assert keys_for_mkdir("d/s") == Footprint(("d/s/", "d/"))
    assert keys_for_rmdir("d/s") == Footprint(("d/s/", "d/"))
    assert keys_for_mkdir("d") == Footprint(("d/", "/"))


def test_a_rename_inside_one_directory_touches_both_names_and_one_directory_key() -> None:
    footprint = keys_for_rename("d/a", "d/b", src_is_dir=False, dst_exists=False)

    assert footprint == Footprint(("d/b", "d/b/", "d/a", "d/a/", "d/"))


def test_a_rename_across_directories_touches_two_directory_keys() -> None:
    footprint = keys_for_rename("d/a", "e/b", src_is_dir=False, dst_exists=False)

    assert footprint == Footprint(("e/b", "e/b/", "d/a", "d/a/", "d/", "e/"))


def test_a_rename_over_an_existing_file_leaves_the_destination_directorys_names_alone() -> None:
    footprint = keys_for_rename("d/a", "e/b", src_is_dir=False, dst_exists=True)

    assert footprint == Footprint(("e/b", "e/b/", "d/a", "d/a/", "d/"))


def test_a_directory_rename_names_both_subtrees_and_leads_with_the_directory_keys() -> None:
    footprint = keys_for_rename("d", "e", src_is_dir=True, dst_exists=False)

    assert footprint == Footprint(("e/", "e", "d/", "d", "/"), subtrees=("d/", "e/"))


def test_a_footprint_names_at_least_one_key() -> None:
    with pytest.raises(ValueError):
        Footprint(())
