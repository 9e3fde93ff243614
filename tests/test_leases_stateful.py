"""The lease table against a model of the name tree and of what every holder may
have cached.

Hypothesis drives a :class:`LeaseTable` with three holders over a small tree (files
``x``, ``d/x``, ``e/x``, ``d/s/x``, ``e/s/x``; directories ``d``, ``e``, ``d/s``,
``e/s``) through random reads and listings, writes (creating or overwriting),
deletes, mkdir, rmdir, renames of files and of directories, withdrawals of queued
writes, approvals, extensions, relinquishes, disconnects (with and without goodbye),
reconnects, the passing of time, and the completion of writes (which fail when the
tree forbids them: a missing parent, a non-empty rmdir). Beside it runs a
deliberately simple model: the committed tree; per holder and key the value it has
cached (a file's contents, a directory's name set) and the expiry the server
recorded for it. Each write's footprint comes from :mod:`fscache.names` with the
facts the model knows on arrival, cautious where :meth:`LeaseTable.is_blocked` says
they may change. A holder drops its copy when it handles an approval request; the
approval reaches the server later, possibly after the holder has read the key again
(a late, stale approval). A holder drops its copies on relinquish and on goodbye;
one cut off without goodbye keeps them until they expire.

The invariants are the consistency guarantee and the rules that give it:

(a) no holder trusts a stale copy: every copy live in the model (``now <
    expiry + skew``) holds the key's committed value; and when a write is applied,
    no holder but the writer has a live copy of any key whose value it changes
    (leases on the old names end at apply);
(b) a write is applied only when no other holder of any of its keys, or of any key
    below its subtrees, is live in the table (each approved, relinquished or expired);
(c) no read is granted while a write that arrived before it and touches its key
    is unfinished, and reads of a key are granted in arrival order;
(d) writes that touch a common key are applied one at a time, in arrival order
    (FIFO per key);
(e) after any step, ``next_deadline()`` is never in the past, is not None while a
    write waits and none is being applied (so the oldest write never waits for
    another: no deadlock), and ticking before it does nothing;
(f) the table records a lease for every copy a holder may still trust;
and, when the run ends and time is allowed to pass, every operation completes.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fscache import names
from fscache.leases import (
    PURGE_GRANULARITY,
    AdaptiveTermPolicy,
    ApplyWrite,
    Discarded,
    Effect,
    Footprint,
    Grant,
    HolderId,
    LeaseTable,
    OpId,
    SendApprovalRequest,
    WriteCommitted,
)

HOLDERS = [HolderId("a"), HolderId("b"), HolderId("c")]
FILES = ["x", "d/x", "e/x", "d/s/x", "e/s/x"]
DIRS = ["d", "e", "d/s", "e/s"]
DIR_RENAMES = [("d", "e"), ("e", "d"), ("d/s", "e/s"), ("e/s", "d/s")]
KEYS = [*FILES, names.dir_key(""), *(names.dir_key(d) for d in DIRS)]
TIME_STEPS = [0.0, 0.05, 0.1, 0.5, 1.0, 3.0, 9.9, 10.0, 10.1, 20.0]

Value = object  # a file's contents (an int), a directory's names (a frozenset), or None


@dataclasses.dataclass
class Tree:
    files: dict[str, int]
    dirs: set[str]

    def is_dir(self, path: str) -> bool:
        return path == "" or path in self.dirs

    def value(self, key: str) -> Value:
        if not key.endswith("/"):
            return self.files.get(key)
        path = key[:-1]
        if not self.is_dir(path):
            return None
        return frozenset(n for n in [*self.files, *self.dirs] if names.parent(n) == path)

    def values(self) -> dict[str, Value]:
        return {key: self.value(key) for key in KEYS}


@dataclasses.dataclass
class Copy:
    value: Value
    expiry: float  # as the server recorded it


@dataclasses.dataclass
class PendingOp:
    op: OpId
    holder: HolderId
    footprint: Footprint  # a read: one key
    is_write: bool
    change: tuple[str, ...] = ()  # a write: what it does, e.g. ("rename", "d", "e")

    def touches(self, key: str) -> bool:
        return key in self.footprint.keys or key.startswith(self.footprint.subtrees)

    def conflicts(self, other: PendingOp) -> bool:
        keys = {*KEYS, *self.footprint.keys, *other.footprint.keys}
        return any(self.touches(k) and other.touches(k) for k in keys)


def changed(tree: Tree, change: tuple[str, ...], contents: int) -> Tree | None:
    """The tree after ``change``, or None if the store would refuse it."""
    files, dirs = dict(tree.files), set(tree.dirs)
    kind, path, *rest = change
    if kind == "write":
        if not tree.is_dir(names.parent(path)):
            return None
        files[path] = contents
    elif kind == "delete":
        if path not in files:
            return None
        del files[path]
    elif kind == "mkdir":
        if path in dirs or not tree.is_dir(names.parent(path)):
            return None
        dirs.add(path)
    elif kind == "rmdir":
        if path not in dirs or tree.value(names.dir_key(path)):
            return None
        dirs.remove(path)
    elif kind == "rename_file":
        (dst,) = rest
        if path not in files or not tree.is_dir(names.parent(dst)):
            return None
        files[dst] = files.pop(path)
    else:
        assert kind == "rename_dir"
        (dst,) = rest
        if path not in dirs or not tree.is_dir(names.parent(dst)) or tree.value(names.dir_key(dst)):
            return None
        dirs.discard(dst)

        def moved(name: str) -> str:
            return dst + name[len(path) :] if name == path or name.startswith(path + "/") else name

        files = {moved(n): v for n, v in files.items()}
        dirs = {moved(n) for n in dirs}
    return Tree(files, dirs)


class LeaseTableMachine(RuleBasedStateMachine):
    # ------------------------------------------------------------ set-up
    @initialize(
        term=st.sampled_from([1.0, 10.0]),
        hot_writes=st.sampled_from([0, 2]),
        skew=st.sampled_from([0.0, 0.1]),
        restarted=st.booleans(),
    )
    def start(self, term: float, hot_writes: int, skew: float, restarted: bool) -> None:
        self.policy = AdaptiveTermPolicy(default=term, hot_writes=hot_writes, window=term)
        self.skew = skew
        self.now = 0.0
        self.hold = term + skew if restarted else None
        self.table = LeaseTable(self.policy, skew=skew, hold_writes_until=self.hold)
        self.next_op = 1
        self.tree = Tree({"x": 1, "d/x": 2}, {"d", "d/s"})
        self.copies: dict[tuple[HolderId, str], Copy] = {}
        self.connected = set(HOLDERS)
        self.queued: dict[OpId, PendingOp] = {}  # arrived, not granted / applied
        self.applying: dict[OpId, PendingOp] = {}  # ApplyWrite handed out
        self.approval_requests: set[tuple[HolderId, str, OpId]] = set()  # not yet handled
        self.approvals_in_flight: list[tuple[HolderId, str, OpId]] = []
        self.granted_order: dict[str, list[OpId]] = {}
        self.leases_granted = 0
        self.approvals_sent = 0
        self.writes_delayed = 0

    def new_op(self) -> OpId:
        self.next_op += 1
        return OpId(self.next_op)

    # ------------------------------------------------------------ effects
    def absorb(self, effects: list[Effect], *, resend: bool = False) -> None:
        """Carry out ``effects`` on the model, checking each rule as it happens."""
        for effect in effects:
            if isinstance(effect, Grant):
                self.on_grant(effect)
            elif isinstance(effect, SendApprovalRequest):
                assert effect.holder != self.writer_of(effect.write)
                self.approval_requests.add((effect.holder, effect.path, effect.write))
                if not resend:
                    self.approvals_sent += 1
            elif isinstance(effect, ApplyWrite):
                self.on_apply(effect)
            elif isinstance(effect, WriteCommitted):
                raise AssertionError(f"{effect} outside write_done")
            else:
                assert isinstance(effect, Discarded)
                raise AssertionError(f"{effect} outside disconnected")

    def writer_of(self, write: OpId) -> HolderId:
        pending = self.queued.get(write) or self.applying[write]
        return pending.holder

    def unfinished_writes(self) -> list[PendingOp]:
        return [w for w in [*self.queued.values(), *self.applying.values()] if w.is_write]

    def on_grant(self, grant: Grant) -> None:
        read = self.queued.pop(grant.op)
        assert (read.holder, read.footprint.keys, read.is_write) == (
            grant.holder,
            (grant.path,),
            False,
        )
        # (c) no read is granted while a write that arrived before it is unfinished
        earlier = [w for w in self.unfinished_writes() if w.op < grant.op and w.touches(grant.path)]
        assert earlier == [], f"{grant} overtook {earlier}"
        # reads of one key are granted in arrival order
        order = self.granted_order.setdefault(grant.path, [])
        assert not order or order[-1] < grant.op
        order.append(grant.op)
        self.take_copy(grant.holder, grant.path, grant.term)

    def take_copy(self, holder: HolderId, key: str, term: float) -> None:
        if term > 0:
            self.copies[(holder, key)] = Copy(self.tree.value(key), self.now + term)
            self.leases_granted += 1
        else:  # the client may not cache: it drops whatever it had
            self.copies.pop((holder, key), None)

    def on_apply(self, apply: ApplyWrite) -> None:
        write = self.queued.pop(apply.op)
        assert (write.holder, write.footprint.keys[0], write.is_write) == (
            apply.holder,
            apply.path,
            True,
        )
        # (d) one at a time, in arrival order, on every key it shares
        assert not any(w.conflicts(write) for w in self.applying.values())
        assert not any(w.conflicts(write) for w in self.unfinished_writes() if w.op < apply.op)
        if self.hold is not None:
            assert self.now >= self.hold
        # (b) no other holder's lease on any of its keys is live in the table
        for key in {*write.footprint.keys, *(k for k in KEYS if write.touches(k))}:
            assert set(self.table.holders(key, self.now)) <= {apply.holder}, (apply, key)
        # (a) no copy of a value it changes is live anywhere but at the writer
        after = changed(self.tree, write.change, contents=-1)
        if after is not None:
            before_values, after_values = self.tree.values(), after.values()
            for (holder, key), copy in self.copies.items():
                if holder != apply.holder and before_values[key] != after_values[key]:
                    assert write.touches(key), f"{write} changes {key} outside its footprint"
                    assert copy.expiry + self.skew <= self.now, (
                        f"{apply} while {holder} may still trust {key} = {copy.value} "
                        f"until {copy.expiry} + {self.skew} (now {self.now})"
                    )
        self.applying[apply.op] = write

    # ------------------------------------------------------------ rules: reads
    def connected_holder(self, data: st.DataObject) -> HolderId:
        return data.draw(st.sampled_from(sorted(self.connected)), label="holder")

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def read(self, data: st.DataObject, key: str) -> None:
        """A read of a file (whole or a range: one key) or a listing of a directory."""
        holder = self.connected_holder(data)
        op = self.new_op()
        self.queued[op] = PendingOp(op, holder, Footprint((key,)), is_write=False)
        busy = any(w.touches(key) for w in self.unfinished_writes())
        term = self.table.read(op, holder, key, self.now)
        if busy:  # (c) it waits for the write
            assert term is None
        else:
            assert term is not None
            self.on_grant(Grant(op, holder, key, term))

    # ------------------------------------------------------------ rules: writes
    def submit(self, data: st.DataObject, footprint: Footprint, change: tuple[str, ...]) -> None:
        holder = self.connected_holder(data)
        op = self.new_op()
        self.queued[op] = PendingOp(op, holder, footprint, is_write=True, change=change)
        effects = self.table.write(op, holder, footprint, self.now)
        if ApplyWrite(op, holder, footprint.keys[0]) not in effects:
            self.writes_delayed += 1
        self.absorb(effects)

    def settled(self, key: str) -> bool:
        """A fact about ``key`` read now holds until a write arriving now is applied."""
        return not self.table.is_blocked(key)

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), path=st.sampled_from(FILES))
    def write(self, data: st.DataObject, path: str) -> None:
        """A whole, ranged or truncating write; it creates the file if it is missing."""
        creates = path not in self.tree.files or not self.settled(path)
        self.submit(data, names.keys_for_write(path, creates=creates), ("write", path))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), path=st.sampled_from(FILES))
    def delete(self, data: st.DataObject, path: str) -> None:
        self.submit(data, names.keys_for_delete(path), ("delete", path))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), path=st.sampled_from(DIRS))
    def mkdir(self, data: st.DataObject, path: str) -> None:
        self.submit(data, names.keys_for_mkdir(path), ("mkdir", path))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), path=st.sampled_from(DIRS))
    def rmdir(self, data: st.DataObject, path: str) -> None:
        self.submit(data, names.keys_for_rmdir(path), ("rmdir", path))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), src=st.sampled_from(FILES), dst=st.sampled_from(FILES))
    def rename_file(self, data: st.DataObject, src: str, dst: str) -> None:
        dst_exists = dst in self.tree.files and self.settled(dst)
        footprint = names.keys_for_rename(src, dst, src_is_dir=False, dst_exists=dst_exists)
        self.submit(data, footprint, ("rename_file", src, dst))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), pair=st.sampled_from(DIR_RENAMES))
    def rename_dir(self, data: st.DataObject, pair: tuple[str, str]) -> None:
        src, dst = pair
        dst_exists = dst in self.tree.dirs and self.settled(names.dir_key(dst))
        footprint = names.keys_for_rename(src, dst, src_is_dir=True, dst_exists=dst_exists)
        self.submit(data, footprint, ("rename_dir", src, dst))

    @precondition(lambda self: self.queued_writes())
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        """The writer gives up on a queued write (a cancelled upload): it is never
        applied, and what waited behind it goes on as if it had never come."""
        write = data.draw(st.sampled_from(sorted(w.op for w in self.queued_writes())))
        effects = self.table.withdraw(write, self.now)
        assert effects is not None, f"queued write {write} could not be withdrawn"
        del self.queued[write]
        self.absorb(effects)

    @precondition(lambda self: self.applying)
    @rule(data=st.data())
    def withdraw_too_late(self, data: st.DataObject) -> None:
        """A write handed out to be applied cannot be withdrawn: nothing changes."""
        write = data.draw(st.sampled_from(sorted(self.applying)))
        assert self.table.withdraw(write, self.now) is None

    # ------------------------------------------------------------ rules: approvals
    @precondition(lambda self: self.approval_requests)
    @rule(data=st.data())
    def handle_approval_request(self, data: st.DataObject) -> None:
        """The client drops its copy and sends the approval (it arrives later)."""
        request = data.draw(st.sampled_from(sorted(self.approval_requests)))
        self.approval_requests.discard(request)
        holder, key, _ = request
        self.copies.pop((holder, key), None)
        self.approvals_in_flight.append(request)

    @precondition(lambda self: self.approvals_in_flight)
    @rule(data=st.data())
    def deliver_approval(self, data: st.DataObject) -> None:
        """An approval reaches the server, perhaps after its holder has read the key
        again (a read sent before the approval, answered after it)."""
        holder, key, write = self.approvals_in_flight.pop(
            data.draw(st.integers(0, len(self.approvals_in_flight) - 1))
        )
        self.absorb(self.table.approve(holder, key, write, self.now))

    @precondition(lambda self: self.connected)
    @rule(data=st.data(), keys=st.sets(st.sampled_from(KEYS), min_size=1, max_size=3))
    def relinquish(self, data: st.DataObject, keys: set[str]) -> None:
        holder = self.connected_holder(data)
        for key in keys:
            self.copies.pop((holder, key), None)
        self.absorb(self.table.relinquish(holder, sorted(keys), self.now))

    def extenders(self) -> list[HolderId]:
        return sorted({h for h, _ in self.copies if h in self.connected})

    @precondition(lambda self: self.extenders())
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        """A client extends every copy it caches, in one batch."""
        holder = data.draw(st.sampled_from(self.extenders()), label="holder")
        named = sorted(k for h, k in self.copies if h == holder)
        batch = [(k, self.copies[(holder, k)].value == self.tree.value(k)) for k in named]
        terms = self.table.extend(holder, batch, self.now)
        assert len(terms) == len(named)
        for (key, is_current), term in zip(batch, terms, strict=True):
            if not is_current or self.table.is_blocked(key):
                assert term is None
            if term is None:
                self.copies.pop((holder, key))
            else:
                self.take_copy(holder, key, term)

    # ------------------------------------------------------------ rules: connections
    @precondition(lambda self: self.connected)
    @rule(data=st.data(), goodbye=st.booleans())
    def disconnect(self, data: st.DataObject, goodbye: bool) -> None:
        holder = self.connected_holder(data)
        self.connected.discard(holder)
        # what was on the wire is lost; the server resends requests on reconnect
        self.approval_requests = {r for r in self.approval_requests if r[0] != holder}
        self.approvals_in_flight = [r for r in self.approvals_in_flight if r[0] != holder]
        if goodbye:  # the client closes: its cache goes with it
            self.copies = {k: c for k, c in self.copies.items() if k[0] != holder}
        its_reads = {q.op for q in self.queued.values() if q.holder == holder and not q.is_write}
        effects = self.table.disconnected(holder, goodbye=goodbye, now=self.now)
        discarded = [e for e in effects if isinstance(e, Discarded)]
        assert effects[: len(discarded)] == discarded
        assert {d.op for d in discarded} == its_reads
        for d in discarded:
            del self.queued[d.op]
        if not goodbye:
            assert len(discarded) == len(effects)
        self.absorb(effects[len(discarded) :])

    @precondition(lambda self: len(self.connected) < len(HOLDERS))
    @rule(data=st.data())
    def reconnect(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(sorted(set(HOLDERS) - self.connected)))
        self.connected.add(holder)
        self.absorb(self.table.connected(holder, self.now), resend=True)

    # ------------------------------------------------------------ rules: time
    @rule(step=st.sampled_from(TIME_STEPS))
    def advance(self, step: float) -> None:
        deadline = self.table.next_deadline()
        self.now += step
        self.tick(deadline)

    @precondition(lambda self: self.table.next_deadline() is not None)
    @rule(exactly=st.booleans())
    def advance_to_deadline(self, exactly: bool) -> None:
        deadline = self.table.next_deadline()
        assert deadline is not None
        self.now = deadline if exactly else max(self.now, math.nextafter(deadline, -math.inf))
        self.tick(deadline)

    def tick(self, deadline: float | None) -> None:
        effects = self.table.tick(self.now)
        if deadline is None or self.now < deadline:
            assert effects == [], "(e) tick before next_deadline() did something"
        self.absorb(effects)

    # ------------------------------------------------------------ rules: completion
    @precondition(lambda self: self.applying)
    @rule(data=st.data(), ok=st.booleans())
    def complete_write(self, data: st.DataObject, ok: bool) -> None:
        op = data.draw(st.sampled_from(sorted(self.applying)))
        self.complete(op, ok)

    def complete(self, op: OpId, ok: bool) -> None:
        write = self.applying.pop(op)
        after = changed(self.tree, write.change, contents=op)
        ok = ok and after is not None
        effects = self.table.write_done(op, self.now, ok=ok)
        if ok:
            assert after is not None
            committed = effects.pop(0)
            assert isinstance(committed, WriteCommitted)
            assert (committed.op, committed.holder, committed.path) == (
                op,
                write.holder,
                write.footprint.keys[0],
            )
            self.tree = after
            for holder, key in list(self.copies):  # the writer drops all it changed and
                if holder == write.holder and write.touches(key):  # holds what it wrote anew
                    del self.copies[(holder, key)]
            self.take_copy(write.holder, committed.path, committed.term)
        assert not any(isinstance(e, WriteCommitted) for e in effects)
        self.absorb(effects)

    # ------------------------------------------------------------ invariants
    @invariant()
    def no_holder_trusts_a_stale_copy(self) -> None:
        for (holder, key), copy in self.copies.items():
            if self.now < copy.expiry + self.skew:
                assert copy.value == self.tree.value(key), (
                    f"(a) {holder} trusts {key} = {copy.value} until {copy.expiry}, "
                    f"but it is {self.tree.value(key)} (now {self.now})"
                )

    @invariant()
    def deadline_is_never_in_the_past(self) -> None:
        deadline = self.table.next_deadline()
        assert deadline is None or deadline > self.now
        if self.queued_writes() and not self.applying:
            # the oldest write heads all its queues: it waits on holders or the window
            assert deadline is not None, "(e) writes wait but no deadline is set"
            bound = max(self.hold or 0.0, self.now + self.policy.max_term + self.skew)
            assert deadline <= bound + PURGE_GRANULARITY

    def queued_writes(self) -> list[PendingOp]:
        return [w for w in self.queued.values() if w.is_write]

    @invariant()
    def table_records_a_lease_for_every_copy_still_trusted(self) -> None:
        for (holder, key), copy in self.copies.items():
            if self.now < copy.expiry + self.skew:
                recorded = self.table.holders(key, self.now).get(holder)
                assert recorded is not None and recorded >= copy.expiry, (
                    f"{holder} trusts {key} = {copy.value} until {copy.expiry} "
                    f"but the table records {recorded} (now {self.now})"
                )

    @invariant()
    def counters_match_the_model(self) -> None:
        assert self.table.leases_granted == self.leases_granted
        assert self.table.approvals_sent == self.approvals_sent
        assert self.table.writes_delayed == self.writes_delayed
        assert self.table.live_leases(self.now) == sum(
            len(self.table.holders(key, self.now)) for key in KEYS
        )
        assert self.table.pending_writes() == len(self.unfinished_writes())

    # ------------------------------------------------------------ the end
    def teardown(self) -> None:
        """Let time pass and everyone answer: every operation completes."""
        if not hasattr(self, "table"):
            return
        for _ in range(100):
            if not self.queued and not self.applying:
                break
            for op in sorted(self.applying):
                self.complete(op, ok=True)
            for holder, key, write in sorted(self.approval_requests):
                self.copies.pop((holder, key), None)
                self.approvals_in_flight.append((holder, key, write))
            self.approval_requests.clear()
            while self.approvals_in_flight:
                holder, key, write = self.approvals_in_flight.pop(0)
                self.absorb(self.table.approve(holder, key, write, self.now))
            deadline = self.table.next_deadline()
            if deadline is not None:
                self.now = max(self.now, deadline)
                self.tick(deadline)
        assert not self.queued and not self.applying, "operations never completed"
        assert self.table.pending_writes() == 0
        assert not any(self.table.is_blocked(key) for key in KEYS)


LeaseTableMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestLeaseTable = LeaseTableMachine.TestCase
