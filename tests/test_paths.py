"""Path rules: one normal form per file, and a clear BadPath for anything that could
escape the root or confuse the store."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fscache import paths
from fscache.errors import BadPath
from fscache.paths import MAX_PATH_BYTES, MAX_SEGMENT_BYTES, normalize


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("a", "a"),
        ("a/b", "a/b"),
        ("a//b", "a/b"),
        ("./a/b/", "a/b"),
        ("a/./b", "a/b"),
        ("a/b/.", "a/b"),
        ("a///./b//", "a/b"),
        ("...", "..."),  # a legal name, not a parent reference
        ("a..b/c.", "a..b/c."),
        ("fscache/x", "fscache/x"),  # only names starting with ".fscache" are reserved
        ("é/ü", "é/ü"),
        (" a /b ", " a /b "),  # spaces are ordinary characters
    ],
)
def test_normal_form(path: str, normal: str) -> None:
    assert normalize(path) == normal


@pytest.mark.parametrize(
    "path",
    [
        "/a",  # absolute
        "//a",
        "..",  # escapes the root ...
        "../a",
        "a/..",
        "a/../b",  # ... even where it would not
        "a/./../b",
        "a\x00b",  # NUL
        "a\\b",  # backslash
        "..\\a",
        "a\nb",  # control characters
        "a\tb",
        "a\x01b",
        "a\x1fb",
        "a\x7fb",
        "",  # empty: the root is not a file
        ".",
        "./",
        "//",
        ".fscache",  # the store's own names
        ".fscache-tmp-1234",
        "a/.fscache.tmp",
        "\ud800",  # a lone surrogate is not encodable
    ],
)
def test_rejects(path: str) -> None:
    with pytest.raises(BadPath):
        normalize(path)


@pytest.mark.parametrize("path", [None, b"a", 1, ["a"], pathlib.PurePosixPath("a")])
def test_rejects_what_is_not_a_str(path: object) -> None:
    with pytest.raises(BadPath):
        normalize(path)


def test_root_is_allowed_only_where_a_directory_is_meant() -> None:
    assert normalize("", allow_root=True) == ""
    assert normalize(".", allow_root=True) == ""
    assert normalize("./", allow_root=True) == ""
    assert normalize("a/", allow_root=True) == "a"
    with pytest.raises(BadPath):
        normalize("/", allow_root=True)  # still not absolute
    with pytest.raises(BadPath):
        normalize("..", allow_root=True)


def test_path_of_1024_bytes_is_allowed_1025_is_too_long() -> None:
    segment = "a" * MAX_SEGMENT_BYTES
    longest = "/".join([segment, segment, segment, "a" * 254, "b"])  # 1024 bytes

    assert MAX_PATH_BYTES == 1024
    assert len(longest.encode()) == 1024
    assert normalize(longest) == longest
    with pytest.raises(BadPath):
        normalize(longest + "c")


def test_path_length_counts_utf8_bytes_not_characters() -> None:
    path = "/".join(["é" * 127] * 4)  # 4 * 254 + 3 = 1019 bytes

    assert normalize(path) == path
    with pytest.raises(BadPath):
        normalize(path + "/ééé")  # 1026 bytes, though only 515 characters


def test_segment_of_255_bytes_is_allowed_256_is_too_long() -> None:
    assert MAX_SEGMENT_BYTES == 255
    assert normalize("d/" + "a" * 255) == "d/" + "a" * 255
    with pytest.raises(BadPath):
        normalize("d/" + "a" * 256)
    with pytest.raises(BadPath):
        normalize("é" * 128)  # 128 characters, 256 bytes


PATHLIKE = st.lists(
    st.sampled_from(["a", "b", "é", ".", "..", "", "...", ".x", ".fscache"]), max_size=8
).map("/".join)


@given(path=PATHLIKE | st.text(max_size=40))
def test_normalize_raises_nothing_but_bad_path_and_its_output_is_a_normal_form(
    path: str,
) -> None:
    try:
        normal = normalize(path)
    except BadPath:
        return

    assert normalize(normal) == normal  # idempotent
    assert normal != ""
    assert not normal.startswith("/")
    assert not normal.endswith("/")
    assert "//" not in normal
    assert ".." not in normal.split("/")
    assert "." not in normal.split("/")


@given(path=PATHLIKE | st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=40))
def test_the_fast_check_for_normal_paths_agrees_with_the_rules(path: str) -> None:
    """A path the one-regex check accepts is one the rules return unchanged."""
    if paths._ALREADY_NORMAL.fullmatch(path):
        assert paths._normalize_by_rules(path, False) == path


@pytest.mark.parametrize("path", ["a/.fscache-x", ".", "..", "a/../b", "a/./b", "a/", "x\\y"])
def test_the_fast_check_leaves_every_abnormal_path_to_the_rules(path: str) -> None:
    assert not paths._ALREADY_NORMAL.fullmatch(path)
