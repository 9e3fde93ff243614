"""The FUSE codec against the byte layouts of ``linux/fuse.h`` (protocol 7.38).

Requests are built here field by field with format strings written out from the
header file, not taken from the module, and replies are taken apart the same way:
a layout mistake in the codec cannot cancel itself out in these tests.
"""

from __future__ import annotations

import dataclasses
import errno
import stat
import struct

import pytest

from fscache.client import fuse_protocol as fp

IN_HEADER = "=IIQQIIIHH"  # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = "=IiQ"  # len error unique
ATTR = "=QQQQQQIIIIIIIIII"  # ino size blocks a/m/ctime a/m/ctimensec mode nlink uid gid rdev
#                             blksize flags
ENTRY_OUT = "=QQQQII" + ATTR[1:]  # nodeid generation entry_valid attr_valid (nsec x2) attr


def request(opcode: int, body: bytes, *, unique: int = 7, nodeid: int = 5) -> bytearray:
    header = struct.pack(IN_HEADER, 40 + len(body), opcode, unique, nodeid, 1000, 1000, 42, 0, 0)
    return bytearray(header + body)


def parse(buf: bytearray) -> fp.Request:
    return fp.parse_request(memoryview(buf), len(buf))


# ---------------------------------------------------------------- sizes of the structs
def test_struct_sizes_are_those_of_the_header_file():
    assert struct.calcsize(IN_HEADER) == fp.IN_HEADER_SIZE == 40
    assert struct.calcsize(OUT_HEADER) == fp.OUT_HEADER_SIZE == 16
    assert struct.calcsize(ATTR) == 88
    assert struct.calcsize(ENTRY_OUT) == fp.ENTRY_OUT_SIZE == 128


# ---------------------------------------------------------------- requests
def test_lookup_carries_its_name_without_the_nul():
    assert parse(request(fp.Opcode.LOOKUP, b"notes.txt\0")) == fp.Lookup(7, 5, b"notes.txt")


def test_forget_and_batch_forget_become_one_request_kind():
    assert parse(request(fp.Opcode.FORGET, struct.pack("=Q", 3))) == fp.Forget(7, ((5, 3),))
    body = struct.pack("=II", 2, 0) + struct.pack("=QQ", 10, 1) + struct.pack("=QQ", 11, 4)
    assert parse(request(fp.Opcode.BATCH_FORGET, body)) == fp.Forget(7, ((10, 1), (11, 4)))


def test_getattr_names_a_handle_only_with_its_flag():
    with_fh = struct.pack("=IIQ", 1, 0, 99)  # FUSE_GETATTR_FH
    assert parse(request(fp.Opcode.GETATTR, with_fh)) == fp.Getattr(7, 5, 99)
    assert parse(request(fp.Opcode.GETATTR, struct.pack("=IIQ", 0, 0, 99))) == fp.Getattr(
        7, 5, None
    )


def setattr_in(valid: int, *, fh: int = 0, size: int = 0, mode: int = 0) -> bytes:
    # valid padding fh size lock_owner atime mtime ctime atimensec mtimensec ctimensec
    # mode unused4 uid gid unused5
    return struct.pack("=IIQQQQQQIIIIIIII", valid, 0, fh, size, 0, 0, 0, 0, 0, 0, 0, mode, 0, 0,
                       0, 0)  # fmt: skip


def test_setattr_keeps_the_size_and_the_mode_only_when_they_are_set():
    assert struct.calcsize("=IIQQQQQQIIIIIIII") == 88
    truncate = setattr_in(fp.FATTR_SIZE | fp.FATTR_FH, fh=3, size=4096, mode=0o600)
    assert parse(request(fp.Opcode.SETATTR, truncate)) == fp.Setattr(7, 5, 3, 4096, None)
    chmod = setattr_in(fp.FATTR_MODE, size=4096, mode=0o600)
    assert parse(request(fp.Opcode.SETATTR, chmod)) == fp.Setattr(7, 5, None, None, 0o600)


def test_open_create_and_mkdir():
    flags = 0o100002  # O_RDWR | O_LARGEFILE
    assert parse(request(fp.Opcode.OPEN, struct.pack("=II", flags, 0))) == fp.Open(7, 5, flags)
    create = struct.pack("=IIII", flags, 0o100644, 0o022, 0) + b"new\0"
    assert parse(request(fp.Opcode.CREATE, create)) == fp.Create(7, 5, b"new", 0o100644, flags)
    mkdir = struct.pack("=II", 0o755, 0o022) + b"dir\0"
    assert parse(request(fp.Opcode.MKDIR, mkdir)) == fp.Mkdir(7, 5, b"dir", 0o755)


def test_read_and_readdirplus_name_handle_offset_and_size():
    # fh offset size read_flags lock_owner flags padding
    body = struct.pack("=QQIIQII", 9, 1 << 33, 131072, 0, 0, 0, 0)
    assert parse(request(fp.Opcode.READ, body)) == fp.Read(7, 5, 9, 1 << 33, 131072)
    assert parse(request(fp.Opcode.READDIRPLUS, body)) == fp.Readdir(7, 5, 9, 1 << 33, 131072)


def test_write_copies_its_data_out_of_the_buffer():
    body = struct.pack("=QQIIQII", 9, 100, 5, 0, 0, 0, 0) + b"hello"
    buf = request(fp.Opcode.WRITE, body)
    parsed = parse(buf)
    buf[-5:] = b"XXXXX"  # the session reuses its buffer for the next request
    assert parsed == fp.Write(7, 5, 9, 100, b"hello")


def test_a_write_shorter_than_it_says_is_a_protocol_error():
    body = struct.pack("=QQIIQII", 9, 0, 50, 0, 0, 0, 0) + b"short"
    with pytest.raises(fp.ProtocolError, match="50 bytes"):
        parse(request(fp.Opcode.WRITE, body))


def test_flush_release_and_fsync():
    flush = struct.pack("=QIIQ", 9, 0, 0, 0)  # fh unused padding lock_owner
    assert parse(request(fp.Opcode.FLUSH, flush)) == fp.Flush(7, 5, 9)
    release = struct.pack("=QIIQ", 9, 0o100000, 0, 0)  # fh flags release_flags lock_owner
    assert parse(request(fp.Opcode.RELEASE, release)) == fp.Release(7, 5, 9, directory=False)
    assert parse(request(fp.Opcode.RELEASEDIR, release)) == fp.Release(7, 5, 9, directory=True)
    datasync = struct.pack("=QII", 9, 1, 0)
    assert parse(request(fp.Opcode.FSYNC, datasync)) == fp.Fsync(7, 5, 9, True, directory=False)


def test_unlink_rmdir_rename_and_rename2():
    assert parse(request(fp.Opcode.UNLINK, b"a\0")) == fp.Unlink(7, 5, b"a", directory=False)
    assert parse(request(fp.Opcode.RMDIR, b"d\0")) == fp.Unlink(7, 5, b"d", directory=True)
    rename = struct.pack("=Q", 6) + b"old\0new\0"
    assert parse(request(fp.Opcode.RENAME, rename)) == fp.Rename(7, 5, b"old", 6, b"new", 0)
    rename2 = struct.pack("=QII", 6, 1, 0) + b"old\0new\0"  # RENAME_NOREPLACE
    assert parse(request(fp.Opcode.RENAME2, rename2)) == fp.Rename(7, 5, b"old", 6, b"new", 1)


def test_init_interrupt_destroy_and_unknown_opcodes():
    init = struct.pack("=IIII", 7, 44, 131072, 0x1234) + bytes(48)  # flags2, unused[11]
    assert parse(request(fp.Opcode.INIT, init)) == fp.Init(7, 7, 44, 131072, 0x1234)
    interrupt = request(fp.Opcode.INTERRUPT, struct.pack("=Q", 6), unique=9)
    assert parse(interrupt) == fp.Interrupt(9, 6)
    assert parse(request(fp.Opcode.DESTROY, b"")) == fp.Destroy(7)
    assert parse(request(fp.Opcode.SYMLINK, b"a\0b\0")) == fp.Unsupported(7, fp.Opcode.SYMLINK)
    assert parse(request(4096, b"")) == fp.Unsupported(7, 4096)  # CUSE_INIT


def test_extensions_after_a_request_are_not_part_of_its_name():
    buf = request(fp.Opcode.LOOKUP, b"x\0" + bytes(6) + b"EXTENSION_BYTES!")
    struct.pack_into("=H", buf, 36, 2)  # total_extlen: 16 bytes
    assert parse(buf) == fp.Lookup(7, 5, b"x")


def test_a_truncated_or_mislabelled_request_is_a_protocol_error():
    with pytest.raises(fp.ProtocolError, match="shorter than its header"):
        fp.parse_request(b"\0" * 20, 20)
    buf = request(fp.Opcode.LOOKUP, b"a\0")
    with pytest.raises(fp.ProtocolError, match="were read"):
        fp.parse_request(memoryview(buf), len(buf) - 1)
    with pytest.raises(fp.ProtocolError, match="opcode 14"):
        parse(request(fp.Opcode.OPEN, b"\0\0"))  # fuse_open_in is 8 bytes


# ---------------------------------------------------------------- replies
MTIME_NS = 1_700_000_000_123_456_789
FILE = fp.Entry(
    fp.Attributes(12, stat.S_IFREG | 0o644, size=1000, mtime_ns=MTIME_NS, uid=1000, gid=100),
    timeout=2.25,
)


def test_an_error_reply_is_the_header_alone_with_minus_errno():
    assert struct.unpack(OUT_HEADER, fp.reply_error(7, errno.ENOENT)) == (16, -errno.ENOENT, 7)
    assert struct.unpack(OUT_HEADER, fp.reply_empty(8)) == (16, 0, 8)


def test_an_entry_reply_carries_node_timeouts_and_attributes():
    reply = fp.reply_entry(7, FILE)
    assert struct.unpack_from(OUT_HEADER, reply) == (16 + 128, 0, 7)
    fields = struct.unpack_from(ENTRY_OUT, reply, 16)
    nodeid, generation, entry_valid, attr_valid, entry_nsec, attr_nsec = fields[:6]
    assert (nodeid, generation, entry_valid, attr_valid) == (12, 0, 2, 2)
    assert entry_nsec == attr_nsec == 250_000_000
    ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec = fields[6:15]
    assert (ino, size, blocks) == (12, 1000, 2)
    assert atime == mtime == ctime == 1_700_000_000
    assert atimensec == mtimensec == ctimensec == 123_456_789
    mode, nlink, uid, gid, rdev, blksize, flags = fields[15:]
    assert (mode, nlink, uid, gid, rdev, blksize, flags) == (0o100644, 1, 1000, 100, 0, 4096, 0)


def test_a_name_may_be_kept_longer_than_its_attributes():
    named = dataclasses.replace(FILE, timeout=0.0, name_timeout=9.5)
    fields = struct.unpack_from(ENTRY_OUT, fp.reply_entry(7, named), 16)
    entry_valid, attr_valid, entry_nsec, attr_nsec = fields[2:6]
    assert (entry_valid, entry_nsec, attr_valid, attr_nsec) == (9, 500_000_000, 0, 0)


def test_an_attr_reply_has_one_timeout_and_the_same_attributes():
    reply = fp.reply_attr(7, FILE)
    assert struct.unpack_from(OUT_HEADER, reply) == (16 + 104, 0, 7)
    assert struct.unpack_from("=QII", reply, 16) == (2, 250_000_000, 0)
    assert reply[32:] == fp.reply_entry(7, FILE)[16 + 40 :]


def test_no_timeout_is_sent_as_zero_and_never_negative():
    entry = fp.Entry(FILE.attributes, timeout=-0.5)
    assert struct.unpack_from("=QQQQII", fp.reply_entry(7, entry), 16)[2:] == (0, 0, 0, 0)


def test_open_create_write_and_data_replies():
    opened = fp.Opened(3, fp.FOPEN_KEEP_CACHE | fp.FOPEN_NOFLUSH)
    assert struct.unpack(OUT_HEADER + "QII", fp.reply_open(7, opened)) == (32, 0, 7, 3, 0b100010, 0)
    create = fp.reply_create(7, FILE, opened)
    assert struct.unpack_from(OUT_HEADER, create) == (16 + 128 + 16, 0, 7)
    assert struct.unpack_from("=QII", create, 16 + 128) == (3, 0b100010, 0)
    assert struct.unpack(OUT_HEADER + "II", fp.reply_write(7, 4096)) == (24, 0, 7, 4096, 0)
    assert struct.unpack(OUT_HEADER, fp.reply_data_header(7, 100)) == (116, 0, 7)


def test_statfs_reply():
    capacity = fp.Capacity(blocks=100, free_blocks=40, available_blocks=30, files=9, free_files=2)
    reply = fp.reply_statfs(7, capacity, block_size=4096, name_max=255)
    assert struct.unpack_from(OUT_HEADER, reply) == (16 + 80, 0, 7)
    # blocks bfree bavail files ffree bsize namelen frsize padding spare[6]
    assert struct.unpack_from("=QQQQQIIII", reply, 16) == (100, 40, 30, 9, 2, 4096, 255, 4096, 0)


def direntplus(name: bytes, inode: int, offset: int) -> fp.DirEntry:
    attributes = fp.Attributes(inode, stat.S_IFDIR | 0o755, 0, 0, nlink=2)
    return fp.DirEntry(name, fp.Entry(attributes, 0.0), offset)


def test_readdirplus_entries_are_padded_to_eight_bytes_and_stop_when_full():
    entries = [direntplus(b"a", 2, 1), direntplus(b"twelve_bytes", 3, 2), direntplus(b"c", 4, 3)]
    record_a = 128 + 24 + 8  # entry_out, dirent, "a" padded to 8
    record_b = 128 + 24 + 16  # "twelve_bytes" padded to 16
    packed, sent = fp.pack_direntplus(iter(entries), record_a + record_b + record_a - 1)
    assert sent == entries[:2] and len(packed) == record_a + record_b
    ino, off, namelen, kind = struct.unpack_from("=QQII", packed, 128)
    assert (ino, off, namelen, kind) == (2, 1, 1, stat.S_IFDIR >> 12)
    assert packed[152:160] == b"a" + bytes(7)
    assert struct.unpack_from("=Q", packed, record_a)[0] == 3  # the next entry_out's nodeid
    assert struct.unpack_from("=QQII", packed, record_a + 128) == (3, 2, 12, stat.S_IFDIR >> 12)
    assert packed[record_a + 152 :] == b"twelve_bytes" + bytes(4)
    assert fp.pack_direntplus(entries, 100) == (b"", [])  # not even one fits


def test_notifications_go_with_unique_zero_and_the_code_in_the_error_field():
    inode = fp.notify_inval_inode(12, attributes_only=False)
    assert struct.unpack(OUT_HEADER + "Qqq", inode) == (40, fp.NOTIFY_INVAL_INODE, 0, 12, 0, 0)
    attrs = fp.notify_inval_inode(12, attributes_only=True)
    assert struct.unpack(OUT_HEADER + "Qqq", attrs) == (40, 2, 0, 12, -1, 0)
    entry = fp.notify_inval_entry(1, b"notes.txt")
    assert struct.unpack_from(OUT_HEADER + "QII", entry) == (16 + 16 + 10, 3, 0, 1, 9, 0)
    assert entry[32:] == b"notes.txt\0"  # the NUL is sent, not counted in namelen


# ---------------------------------------------------------------- INIT
def init(minor: int, flags: int) -> fp.Init:
    return fp.Init(unique=1, major=7, minor=minor, max_readahead=131072, flags=flags)


def unpack_init_out(reply: bytes) -> tuple[int, ...]:
    assert struct.unpack_from(OUT_HEADER, reply) == (16 + 64, 0, 1)
    # major minor max_readahead flags max_background congestion_threshold max_write
    # time_gran max_pages map_alignment flags2 unused[7]
    return struct.unpack_from("=IIIIHHIIHHI28x", reply, 16)


def test_init_takes_the_flags_both_sides_name_and_the_smaller_minor():
    offered = fp.FUSE_ASYNC_READ | fp.FUSE_MAX_PAGES | fp.FUSE_DO_READDIRPLUS | (1 << 20)
    want = fp.FUSE_ASYNC_READ | fp.FUSE_MAX_PAGES | fp.FUSE_AUTO_INVAL_DATA
    negotiated = fp.negotiate(init(44, offered), want=want, max_write=1 << 20)
    assert negotiated.minor == fp.KERNEL_MINOR == 38
    assert negotiated.flags == fp.FUSE_ASYNC_READ | fp.FUSE_MAX_PAGES
    assert negotiated.max_write == 1 << 20
    fields = unpack_init_out(negotiated.reply)
    assert fields[:4] == (7, 38, 131072, negotiated.flags)
    assert fields[4:] == (0, 0, 1 << 20, 1, 256, 0, 0)  # 256 pages of 4 KiB
    assert fp.negotiate(init(31, offered), want=want, max_write=1 << 20).minor == 31


def test_without_max_pages_a_write_is_at_most_128_kib():
    negotiated = fp.negotiate(init(38, fp.FUSE_ASYNC_READ), want=-1, max_write=1 << 20)
    assert negotiated.max_write == 128 * 1024
    assert unpack_init_out(negotiated.reply)[6:9] == (128 * 1024, 1, 0)


def test_another_major_version_is_refused():
    with pytest.raises(fp.ProtocolError, match="FUSE 8"):
        fp.negotiate(fp.Init(1, 8, 0, 0, 0), want=0, max_write=1 << 20)
