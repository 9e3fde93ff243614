"""The session table's rules (``fscache/sessions.py``), with an explicit clock.

Every instant is a plain float passed in; expiry is asserted at exactly
``detach + ttl``. A state machine at the end checks the rules against a model
over random sequences of opens, resumes, detaches, goodbyes and time.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fscache.leases import HolderId
from fscache.sessions import (
    MIN_TTL,
    SHORTEST_TTL,
    Attached,
    Expired,
    Refused,
    SessionTable,
    default_ttl,
)
from fscache.settings import BadSetting

SECRET = b"s" * 16
OTHER_SECRET = b"o" * 16
TTL = 10.1


def table() -> SessionTable:
    return SessionTable(ttl=TTL, prefix="e")


def opened(t: SessionTable, label: str = "web", now: float = 0.0) -> Attached:
    return t.open(label, "anonymous", SECRET, now)


def detached(t: SessionTable, at: float) -> Attached:
    """A session opened at 0 whose connection was lost at ``at``."""
    first = opened(t)
    t.detach(first.session, first.attachment, now=at)
    return first


def resume(
    t: SessionTable,
    session: HolderId,
    secret: bytes = SECRET,
    *,
    identity: str = "anonymous",
    now: float = 0.0,
) -> Attached | Refused:
    return t.resume(
        session, secret, label="web", identity=identity, new_secret=OTHER_SECRET, now=now
    )


def test_the_default_ttl_is_the_longest_lease_life_and_at_least_a_few_seconds() -> None:
    assert default_ttl(10.0, 0.1) == 10.1
    assert default_ttl(1.0, 0.1) == MIN_TTL
    assert default_ttl(0.0, 0.0) == MIN_TTL


def test_a_negative_ttl_is_refused_by_the_one_duration_check() -> None:
    with pytest.raises(BadSetting, match="session_ttl"):
        SessionTable(ttl=-1.0, prefix="e")


@pytest.mark.parametrize("ttl", [0.0, 0.5, math.nextafter(SHORTEST_TTL, 0)])
def test_a_ttl_under_a_second_is_refused(ttl: float) -> None:
    """At 0 every session holding ephemeral files would be silent at once (the server
    spun deleting them); under a second its client would ping too often."""
    with pytest.raises(BadSetting, match="at least 1 s"):
        SessionTable(ttl=ttl, prefix="e")
    assert SessionTable(ttl=SHORTEST_TTL, prefix="e").ttl == 1.0


def test_a_connection_silent_for_the_ttl_counts_as_lost() -> None:
    t = table()
    assert not t.is_silent(heard_at=5.0, now=5.0 + TTL - 0.001)
    assert t.is_silent(heard_at=5.0, now=5.0 + TTL)
    attached = opened(t, now=0.0)
    t.detach(attached.session, attached.attachment, now=5.0)  # as of its last message
    assert t.expires(attached.session) == 5.0 + TTL


def test_two_opens_with_one_label_are_two_sessions() -> None:
    t = table()

    first, second = opened(t), opened(t)

    assert first.session != second.session
    assert (first.resumed, second.resumed) == (False, False)
    assert t.label(first.session) == t.label(second.session) == "web"
    assert len(t) == 2


def test_session_ids_carry_the_prefix_and_are_never_reused() -> None:
    t = table()
    first = opened(t)
    assert first.session.startswith("e.")
    t.end(first.session, first.attachment, now=1.0)

    again = opened(t, now=2.0)

    assert again.session != first.session


def test_a_resume_with_the_secret_attaches_the_session_to_the_new_connection() -> None:
    t = table()
    first = detached(t, at=3.0)

    back = resume(t, first.session, now=4.0)

    assert isinstance(back, Attached)
    assert (back.session, back.resumed, back.displaced) == (first.session, True, None)
    assert back.attachment != first.attachment
    assert t.is_attached(first.session) and t.expires(first.session) is None
    assert t.next_deadline() is None


def test_a_resume_while_the_old_connection_is_open_displaces_it() -> None:
    t = table()
    first = opened(t)

    back = resume(t, first.session, now=1.0)

    assert isinstance(back, Attached) and back.displaced == first.attachment


def test_news_of_a_displaced_connection_changes_nothing() -> None:
    t = table()
    first = opened(t)
    back = resume(t, first.session, now=1.0)
    assert isinstance(back, Attached)

    t.detach(first.session, first.attachment, now=2.0)
    assert not t.end(first.session, first.attachment, now=2.0)

    assert t.is_attached(first.session) and t.next_deadline() is None
    assert t.tick(1000.0) == []


@pytest.mark.parametrize("secret", [OTHER_SECRET, b"", SECRET[:-1], SECRET + b"x"])
def test_a_wrong_secret_is_refused_and_the_session_is_untouched(secret: bytes) -> None:
    t = table()
    first = detached(t, at=1.0)

    refused = resume(t, first.session, secret, now=2.0)

    assert isinstance(refused, Refused) and refused.session == first.session
    assert "wrong secret" in refused.reason
    assert SECRET.hex() not in refused.reason and repr(SECRET) not in refused.reason
    assert not t.is_attached(first.session) and t.expires(first.session) == 1.0 + TTL
    assert (t.refused, t.resumed) == (1, 0)


def test_a_wrong_secret_does_not_displace_an_attached_session() -> None:
    t = table()
    first = opened(t)

    assert isinstance(resume(t, first.session, OTHER_SECRET, now=1.0), Refused)

    t.detach(first.session, first.attachment, now=2.0)  # still its connection
    assert t.expires(first.session) == 2.0 + TTL


def test_only_the_identity_that_opened_a_session_may_resume_it() -> None:
    t = table()
    first = t.open("web", "alice", SECRET, 0.0)

    refused = resume(t, first.session, identity="bob", now=1.0)
    back = resume(t, first.session, identity="alice", now=1.0)

    assert isinstance(refused, Refused) and "another identity" in refused.reason
    assert isinstance(back, Attached) and back.resumed


def test_an_unknown_session_gets_a_new_one_with_the_new_secret() -> None:
    t = table()

    fresh = resume(t, HolderId("old-incarnation.7"), now=1.0)

    assert isinstance(fresh, Attached) and not fresh.resumed
    assert fresh.session != "old-incarnation.7"
    assert isinstance(resume(t, fresh.session, OTHER_SECRET, now=2.0), Attached)
    assert isinstance(resume(t, fresh.session, SECRET, now=2.0), Refused)


def test_a_detached_session_expires_at_exactly_detach_plus_ttl() -> None:
    t = table()
    first = detached(t, at=2.5)

    assert t.next_deadline() == 2.5 + TTL
    assert t.tick(2.5 + TTL - 1e-9) == []
    assert first.session in t

    assert t.tick(2.5 + TTL) == [Expired(first.session, "web")]
    assert first.session not in t and t.next_deadline() is None and t.expired == 1


def test_a_session_that_holds_locks_lives_until_their_last_renewal_could_come() -> None:
    t = table()
    first = opened(t)
    t.detach(first.session, first.attachment, now=2.0, at_least=2.0 + 30.0)
    assert t.next_deadline() == 32.0
    assert t.tick(2.0 + TTL) == []  # past its own TTL: its lock may still be renewed
    back = resume(t, first.session, now=31.0)
    assert isinstance(back, Attached) and back.resumed and back.session == first.session
    t.detach(first.session, back.attachment, now=40.0, at_least=35.0)  # locks end earlier
    assert t.next_deadline() == 40.0 + TTL


def test_an_expired_session_cannot_be_resumed() -> None:
    t = table()
    first = detached(t, at=0.0)
    t.tick(TTL)

    fresh = resume(t, first.session, now=TTL)

    assert isinstance(fresh, Attached) and not fresh.resumed and fresh.session != first.session


def test_a_resume_before_expiry_cancels_it_and_the_next_detach_starts_a_new_ttl() -> None:
    t = table()
    first = detached(t, at=1.0)
    back = resume(t, first.session, now=5.0)
    assert isinstance(back, Attached)

    assert t.tick(1.0 + TTL) == []
    t.detach(first.session, back.attachment, now=20.0)

    assert t.next_deadline() == 20.0 + TTL
    assert t.tick(20.0 + TTL) == [Expired(first.session, "web")]


def test_a_goodbye_ends_the_session_at_once() -> None:
    t = table()
    first = opened(t)

    assert t.end(first.session, first.attachment, now=1.0)

    assert first.session not in t and t.next_deadline() is None
    fresh = resume(t, first.session, now=2.0)
    assert isinstance(fresh, Attached) and not fresh.resumed


def test_the_secret_never_appears_in_a_repr() -> None:
    t = table()
    first = opened(t)

    assert repr(SECRET) not in repr(t._sessions[first.session])


def test_secrets_are_compared_in_constant_time() -> None:
    import inspect

    import fscache.sessions

    source = inspect.getsource(fscache.sessions.SessionTable.resume)
    assert "hmac.compare_digest(" in source and "==" not in source


# ---------------------------------------------------------------- the rules, against a model
@dataclasses.dataclass
class _Model:
    secret: bytes
    identity: str
    attachment: int | None
    expires: float | None


class SessionMachine(RuleBasedStateMachine):
    """Random opens, resumes (right and wrong), detaches (current and stale),
    goodbyes and ticks; the table must agree with a plain model at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.table = SessionTable(ttl=3.0, prefix="p")
        self.now = 0.0
        self.model: dict[HolderId, _Model] = {}
        self.attachments: list[tuple[HolderId, int]] = []  # every connection ever
        self.known: list[HolderId] = []  # every session ever issued
        self.secret_no = 0

    def _secret(self) -> bytes:
        self.secret_no += 1
        return self.secret_no.to_bytes(16, "big")

    def _took(self, attached: Attached, secret: bytes, identity: str) -> None:
        state = self.model.get(attached.session)
        if attached.resumed:
            assert state is not None and attached.displaced == state.attachment
            state.attachment, state.expires = attached.attachment, None
        else:
            assert state is None and attached.session not in self.known
            self.model[attached.session] = _Model(secret, identity, attached.attachment, None)
            self.known.append(attached.session)
        self.attachments.append((attached.session, attached.attachment))

    @rule(identity=st.sampled_from(["anonymous", "alice"]))
    def open(self, identity: str) -> None:
        secret = self._secret()
        self._took(self.table.open("l", identity, secret, self.now), secret, identity)

    @precondition(lambda self: self.known)
    @rule(
        data=st.data(),
        right_secret=st.booleans(),
        identity=st.sampled_from(["anonymous", "alice"]),
    )
    def resume(self, data: st.DataObject, right_secret: bool, identity: str) -> None:
        session = data.draw(st.sampled_from(self.known))
        state = self.model.get(session)
        secret = state.secret if state is not None and right_secret else b"wrong"
        new_secret = self._secret()
        result = self.table.resume(
            session, secret, label="l", identity=identity, new_secret=new_secret, now=self.now
        )
        if state is None:
            assert isinstance(result, Attached) and not result.resumed
            self._took(result, new_secret, identity)
        elif not right_secret or identity != state.identity:
            assert isinstance(result, Refused)
        else:
            assert isinstance(result, Attached) and result.resumed
            self._took(result, secret, identity)

    @precondition(lambda self: self.attachments)
    @rule(data=st.data(), goodbye=st.booleans())
    def connection_closes(self, data: st.DataObject, goodbye: bool) -> None:
        session, attachment = data.draw(st.sampled_from(self.attachments))
        state = self.model.get(session)
        current = state is not None and state.attachment == attachment
        if goodbye:
            assert self.table.end(session, attachment, self.now) == current
            if current:
                del self.model[session]
        else:
            self.table.detach(session, attachment, self.now)
            if current and state is not None:
                state.attachment, state.expires = None, self.now + 3.0

    @precondition(lambda self: self.attachments)
    @rule(data=st.data(), silent_for=st.sampled_from([0.5, 2.9, 3.0, 4.5]))
    def a_silent_connection_is_cut(self, data: st.DataObject, silent_for: float) -> None:
        """The server's look at a connection last heard ``silent_for`` ago: cut once
        silent for the TTL, its session detached as of its last message."""
        session, attachment = data.draw(st.sampled_from(self.attachments))
        heard_at = self.now - silent_for
        if not self.table.is_silent(heard_at, self.now):
            assert silent_for < 3.0
            return
        assert silent_for >= 3.0
        state = self.model.get(session)
        self.table.detach(session, attachment, heard_at)
        if state is not None and state.attachment == attachment:
            state.attachment, state.expires = None, heard_at + 3.0  # due now, or past

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        due = self.table.next_deadline()
        expired = self.table.tick(self.now)
        should = {
            s for s, m in self.model.items() if m.expires is not None and m.expires <= self.now
        }
        assert {e.session for e in expired} == should
        assert due is None or should or due > self.now
        for session in should:
            del self.model[session]

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert len(self.table) == len(self.model)
        for session, state in self.model.items():
            assert self.table.is_attached(session) == (state.attachment is not None)
            assert self.table.expires(session) == state.expires
        pending = [m.expires for m in self.model.values() if m.expires is not None]
        assert self.table.next_deadline() == min(pending, default=None)


TestSessionMachine = SessionMachine.TestCase
