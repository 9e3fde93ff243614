"""Which lease keys an operation on the name tree touches. Pure functions, no I/O.

A file's key is its normal path (its contents); a directory's key is its path and a
``/`` (its name set: what a listing returns; the root's is ``/``). Every operation
that creates or removes a name in a directory is also a write on that directory's
key; one that only changes a file's contents (an overwrite, a ranged write, a
truncate of an existing file) is not. The rules, and why the facts passed here may
be trusted, are in :mod:`fscache.leases`.

The caller passes what it knows of the tree (whether a write creates its file,
whether a rename's destination exists, whether its source is a directory); the
lease table cannot know what exists.
"""

from __future__ import annotations

from fscache.leases import Footprint


def parent(path: str) -> str:
    """The directory holding ``path`` (a normal path): ``""`` (the root) at the top."""
    return path.rpartition("/")[0]


def dir_key(path: str) -> str:
    """The key of directory ``path``'s name set: ``docs/`` for ``docs``, ``/`` for the
    root. A listing of ``path`` is a read of this key."""
    return path + "/"


def keys_for_write(path: str, *, creates: bool) -> Footprint:
    """A whole, ranged or truncating write of file ``path``; ``creates``: it does not
    exist yet, so its directory gains a name."""
    if creates:
        return Footprint((path, dir_key(parent(path))))
    return Footprint((path,))


def keys_for_delete(path: str) -> Footprint:
    """A delete of file ``path``: its contents and its directory's name set."""
    return Footprint((path, dir_key(parent(path))))


def keys_for_mkdir(path: str) -> Footprint:
    """mkdir ``path``: the new directory's name set (the writer may cache it, empty)
    and its parent's."""
    return Footprint((dir_key(path), dir_key(parent(path))))


def keys_for_rmdir(path: str) -> Footprint:
    """rmdir ``path``: its own name set and its parent's."""
    return Footprint((dir_key(path), dir_key(parent(path))))


def keys_for_rename(src: str, dst: str, *, src_is_dir: bool, dst_exists: bool) -> Footprint:
    """rename ``src`` to ``dst``: both names, of the kind ``src`` is first (the writer
    may cache ``dst`` afterwards) and then of the other kind (a name may change kind
    while the rename waits; keys of the kind it lacks have no holders and cost
    nothing), the source directory's name set, the destination directory's unless
    ``dst`` exists already, and for a directory everything below either name."""
    if src_is_dir:
        keys = [dir_key(dst), dst, dir_key(src), src]
    else:
        keys = [dst, dir_key(dst), src, dir_key(src)]
    keys.append(dir_key(parent(src)))
    if not dst_exists:
        keys.append(dir_key(parent(dst)))
    subtrees = (dir_key(src), dir_key(dst)) if src_is_dir else ()
    return Footprint(tuple(dict.fromkeys(keys)), subtrees)
