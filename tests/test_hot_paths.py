"""The fast paths of issue 12 decide exactly as the paths they replace.

* ``LeaseTable.renew_heartbeat`` (decode and renew fused) against ``wire.decode``
  then ``LeaseTable.renew``, on random payloads: valid, invalid, unknown and ended
  ids, non-UTF-8 bytes, a clock that goes back;
* the fact the renew loops rely on (every lease in the live map is GRANTED: they
  do not test the state, and ``proofs/loops.py`` proves them equal to the rule under
  it), over random histories;
* P's worker with the fused path against the same worker decoding every message.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaseproto import HeartbeatTracker, LeaseConfig, LeaseTable, wire
from leaseproto.core import rules as R
from leaseproto.core.errors import LocalProtocolError
from leaseproto.core.events import Release, ReleaseReason, make_releases
from leaseproto.testing import NaiveLeaseTable
from leaseproto.workers.prefill_leases import LeaseGrants

GRANTED = [f"req-{i:03d}" for i in range(6)]
UNKNOWN_VALID = ["fresh-1", "x" * 40, "caf\u00e9-2", "a:b"]
INVALID = ["", "HB", "AB:x", "bad\x01id", "x" * 600, "OK:", "\x7f", "\ud800"]


def _table(cfg: LeaseConfig, ends: list[int]) -> LeaseTable:
    """Leases for GRANTED; those in ``ends`` ended by 6 s: aborted, transferred or
    expired (k % 3), so a heartbeat finds tombstones of each kind."""
    t = LeaseTable(cfg)
    for k, rid in enumerate(GRANTED):
        t.grant(rid, now=float(k), ttl=0.5 if k in ends and k % 3 == 2 else None)
    for k in sorted(set(ends)):
        if k % 3 == 0:
            t.abort(GRANTED[k], now=6.0)
        elif k % 3 == 1:
            t.transfer_done(GRANTED[k], now=6.0)
    t.expire(now=6.0)
    return t


def _snapshot(t: LeaseTable) -> Any:
    return (
        t.stats,
        {rid: t.lease_info(rid) for rid in t.live()},
        {rid: t.ended(rid) for rid in GRANTED},
        t._last_now,
    )


_part = st.one_of(
    st.sampled_from(GRANTED),
    st.sampled_from(UNKNOWN_VALID),
    st.sampled_from(INVALID),
    st.text(max_size=6),
)


@st.composite
def _payloads(draw: st.DrawFn) -> bytes:
    ids = draw(st.lists(_part, min_size=1, max_size=6))
    body = ",".join(ids).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 0:
        body += draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"]))
    return draw(st.sampled_from([b"HB:", b"HB:", b"HB:", b"AB:", b"HB", b""])) + body


@settings(max_examples=600, deadline=None)
@given(
    _payloads(),
    st.lists(st.integers(0, 5), max_size=4),
    st.sampled_from([7.0, 6.5, 28.0, 40.0, math.inf, math.nan, -math.inf, 3.0]),
    st.booleans(),
    st.booleans(),
)
def test_renew_heartbeat_decides_as_decode_then_renew(
    payload: bytes, ends: list[int], now: float, capped: bool, want_lost: bool
) -> None:
    cfg = LeaseConfig(max_lease_lifetime=33.0) if capped else LeaseConfig()
    fused, parts = _table(cfg, ends), _table(cfg, ends)
    before = _snapshot(fused)
    lost_f: list[str] | None = [] if want_lost else None
    lost_p: list[str] | None = [] if want_lost else None
    try:
        msg: Any = wire.decode(payload)
    except wire.MalformedMessage:
        msg = None
    try:
        got = fused.renew_heartbeat(payload, now=now, lost=lost_f)
    except LocalProtocolError:
        got = "clock"
    if not isinstance(msg, wire.Heartbeat):
        assert got is None  # decode refuses it, or it is no heartbeat: nothing changed
        assert _snapshot(fused) == before
        return
    assert got is not None, f"{payload!r}: decode takes it, the fused path does not"
    try:
        parts.renew(msg.ids, now=now, lost=lost_p)
    except LocalProtocolError:
        assert got == "clock"
        assert _snapshot(fused) == before
        return
    assert got == list(msg.ids)
    assert _snapshot(fused) == _snapshot(parts)
    assert lost_f == lost_p


def test_renew_heartbeat_leaves_the_error_to_decode() -> None:
    t = _table(LeaseConfig(), [])
    payload = b"HB:req-000,bad\x01id"
    assert t.renew_heartbeat(payload, now=7.0) is None
    assert t.deadline("req-000") == 30.0  # not renewed: the message is refused whole
    with pytest.raises(wire.MalformedMessage, match="control character"):
        wire.decode(payload)
    # an unknown but valid id is counted, as renew counts it
    assert t.renew_heartbeat(b"HB:req-000,fresh-1", now=7.0) == ["req-000", "fresh-1"]
    assert (t.stats.renewed, t.stats.renew_unknown) == (1, 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["grant", "renew", "done", "abort", "expire", "hb"]), _part),
        max_size=30,
    )
)
def test_every_lease_in_the_live_map_is_granted(ops: list[tuple[str, str]]) -> None:
    """The fact the renew loops rely on, and L14 (``proofs/loops.py``) assumes; and
    the one the deadline queue's C-speed paths rely on (a stale entry's record says
    it ended)."""
    t = LeaseTable(LeaseConfig(kv_lease_duration=3.0, lease_extension=2.0))
    now = 0.0
    for op, rid in ops:
        now += 0.5
        try:
            if op == "grant":
                t.grant(rid, now=now, consumers=2)
            elif op == "renew":
                t.renew([rid, rid], now=now)
            elif op == "done":
                t.transfer_done(rid, now=now)
            elif op == "abort":
                t.abort(rid, now=now)
            elif op == "expire":
                t.expire(now=now)
            else:
                t.renew_heartbeat(b"HB:" + rid.encode("utf-8", "surrogatepass"), now=now)
        except LocalProtocolError:
            pass
        assert all(lease.state == R.GRANTED for lease in t._leases.values())
        # and no live id has a tombstone (grant drops it): ending one appends its tombstone
        assert not t._ended.keys() & t._leases.keys()
        # the deadline queue reads an entry as stale from its record's state (at C
        # speed): exactly the entries of records no longer in the live map
        entries = [lease for _, lease in t._queue.entries()]
        assert [x.state == R.GRANTED for x in entries] == [
            t._leases.get(x.req_id) is x for x in entries
        ]
        assert sorted(x.req_id for x in entries if x.state == R.GRANTED) == sorted(t._leases)


# -- P's worker: the fused path against decoding every message -------------------------------
class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def inc(self, by: int = 1) -> None:
        self.n += by


class _Trace:
    """Records what the worker would write to its event trace (``--trace``)."""

    enabled = True

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))

    def release(self, rel: object, blocks: int) -> None:
        self.events.append(("release", rel, blocks))


class _Backend:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.trace = _Trace()

    def send(self, peer: str, payload: bytes) -> bool:
        self.sent.append((peer, payload))
        return True

    def free(self, blocks: list[int]) -> None:
        pass


class _Opts:
    policy = "lease"
    config = LeaseConfig()


class _Metrics:
    def __init__(self) -> None:
        self.heartbeats, self.heartbeat_ids = _Counter(), _Counter()
        self.nacks, self.malformed = _Counter(), _Counter()
        self.refused: dict[str, _Counter] = {}

    def labels(self, kind: str) -> _Counter:  # acts_refused, by kind
        return self.refused.setdefault(kind, _Counter())

    @property
    def acts_refused(self) -> _Metrics:
        return self

    def observe_release(self, rel: object) -> None:
        pass


class _Drops:
    def __init__(self) -> None:
        self.dropped: list[str] = []

    def drop(self, kind: str, why: str, *, level: int = 0) -> None:
        self.dropped.append(why)


def _worker(fused: bool) -> LeaseGrants:
    w = LeaseGrants(
        _Opts(),  # type: ignore[arg-type]
        LeaseTable(LeaseConfig()),
        _Backend(),  # type: ignore[arg-type]
        _Metrics(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # the gate: notifications are handed in
        drops=_Drops(),  # type: ignore[arg-type]
        notes=_Drops(),  # type: ignore[arg-type]
    )
    if not fused:
        w.acts._fused_heartbeat = lambda *a: False  # type: ignore[method-assign]
    return w


def _state(w: LeaseGrants) -> Any:
    m: Any = w.metrics
    return (
        w.table.stats,
        {rid: w.table.lease_info(rid) for rid in w.table.live()},
        w.backend.sent,  # type: ignore[attr-defined]
        w.backend.trace.events,  # type: ignore[attr-defined]
        w.drops.dropped,  # type: ignore[attr-defined]
        (w.acts.heartbeats_received, w.acts.malformed, w.acts.nacks_sent, w.acts.verdicts_sent),
        (m.heartbeats.n, m.heartbeat_ids.n, m.nacks.n, m.malformed.n),
        {k: c.n for k, c in m.refused.items()},
        w.acts.verdict_readers,
        w.binding.refused,
        {rid: w.binding.bound(rid) for rid in GRANTED},
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            _payloads(),
            st.just(b"HB:" + wire.CAPABILITY.encode()),
            st.sampled_from([b"req-001:1", b"AB:req-002", b"OK:req-003"]),
        ),
        max_size=8,
    ),
    st.booleans(),
    st.lists(st.sampled_from(["d1", "d2", "x"]), min_size=8, max_size=8),
)
def test_the_worker_answers_alike_with_the_fused_path(
    payloads: list[bytes], debug: bool, senders: list[str]
) -> None:
    """Also for the binding (spec §10.2): req-000 is named to d1 and d2 (one
    engine), the rest bind on first use; "x" is a third agent."""
    fast, slow = _worker(True), _worker(False)
    for w in (fast, slow):
        for k, rid in enumerate(GRANTED):
            w.table.grant(rid, now=float(k))
            w.blocks[rid] = []
        w.binding.name(GRANTED[0], ["d1", "d2"])
    log = logging.getLogger("leaseproto.prefill")
    level = log.level
    log.setLevel(logging.DEBUG if debug else logging.WARNING)  # the DEBUG lines read the table
    try:
        for k, payload in enumerate(payloads):
            for w in (fast, slow):
                w.acts.handle(senders[k], payload, 6.0 + 10.0 * k)
    finally:
        log.setLevel(level)
    assert _state(fast) == _state(slow)


def test_the_worker_takes_a_plain_heartbeat_the_fused_way() -> None:
    w = _worker(True)
    w.table.grant("req-000", now=0.0)
    assert w.acts._fused_heartbeat("d1", b"HB:req-000", 7.0)
    assert w.table.stats.renewed == 1 and w.acts.heartbeats_received == 1
    assert not w.acts._fused_heartbeat("d1", b"HB:req-000,\x01", 7.0)  # decode words the error
    assert not w.acts._fused_heartbeat("d1", b"HB:" + wire.CAPABILITY.encode(), 7.0)  # the hello


# -- D's encoder: the tracker's ids, checked at track ---------------------------------------
_valid_ids = st.one_of(
    st.sampled_from(GRANTED + UNKNOWN_VALID + ["\u00e9t\u00e9-\U0001f600", "x" * 70]),
    st.text(min_size=1, max_size=12).filter(lambda s: wire.id_problem(s) is None),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_valid_ids, max_size=30), st.integers(-2, 260))
def test_tracker_payloads_are_encode_heartbeat_byte_for_byte(
    ids: list[str], max_bytes: int
) -> None:
    t = HeartbeatTracker(LeaseConfig())
    for k, rid in enumerate(ids):  # the ids as the tracker holds them: checked at track
        t.track(f"local-{k}", engine_id="p", remote_req_id=rid, now=0.0)
    due = t.due(now=0.0)
    sent = due.get("p", [])
    assert sent == list(dict.fromkeys(ids))  # each once, in tracking order
    # what due() returned (known to hold no repeats), and any list of checked ids
    for given_ids in (sent, ids):
        try:
            want: Any = wire.encode_heartbeat(given_ids, max_bytes=max_bytes)
        except ValueError as exc:
            want = ("ValueError", str(exc))
        try:
            got: Any = t.payloads(given_ids, max_bytes=max_bytes)
        except ValueError as exc:
            got = ("ValueError", str(exc))
        assert got == want


def test_tracker_payloads_keep_a_last_message_that_fills_its_room_whole() -> None:
    """After the first cut the rest is exactly ``room`` bytes and holds a comma:
    it is one message, as ``encode_heartbeat`` packs it, not cut again."""
    t = HeartbeatTracker(LeaseConfig())
    ids = ["x" * 10, "b" * 4, "c" * 5]  # room 10: "x"*10 | "bbbb,ccccc" (10 bytes)
    want = [b"HB:" + b"x" * 10, b"HB:bbbb,ccccc"]
    assert wire.encode_heartbeat(ids, max_bytes=13) == want
    assert t.payloads(ids, max_bytes=13) == want


def test_tracker_payloads_cut_the_ids_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of ``payloads``: ids that ``track`` checked are joined and cut
    without ``encode_heartbeat``'s per-id checks; only what it cannot encode
    (no room, an id longer than a message) goes to ``encode_heartbeat``."""
    real = wire.encode_heartbeat
    asked: list[object] = []

    def counting(ids: list[str], *, max_bytes: int = 4096) -> list[bytes]:
        asked.append(ids)
        return real(ids, max_bytes=max_bytes)

    monkeypatch.setattr(wire, "encode_heartbeat", counting)
    t = HeartbeatTracker(LeaseConfig())
    for ids, max_bytes in (
        (["a", "b"], 4),  # room 1: one id a message
        (["x" * 10, "b" * 4, "c" * 5], 13),
        ([f"chatcmpl-{i:040d}" for i in range(300)], 4096),
    ):
        assert t.payloads(ids, max_bytes=max_bytes) == real(ids, max_bytes=max_bytes)
    assert asked == []
    for ids, max_bytes in ((["a"], 3), (["a", "b" * 20], 13)):
        with pytest.raises(ValueError):
            t.payloads(ids, max_bytes=max_bytes)
    assert len(asked) == 2


def test_tracker_payloads_default_to_the_configured_size() -> None:
    t = HeartbeatTracker(LeaseConfig())
    ids = [f"chatcmpl-{i:040d}" for i in range(300)]
    want = wire.encode_heartbeat(ids, max_bytes=t.config.max_notification_bytes)
    assert len(want) > 1 and t.payloads(ids) == want


# -- expire: the deadline calendar against the naive model ----------------------------------
@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["grant", "renew", "done", "expire"]), st.integers(0, 7)),
        max_size=40,
    ),
    st.integers(0, 4),
)
def test_expire_releases_as_the_naive_model_does(ops: list[tuple[str, int]], ttl: int) -> None:
    """Integer times make deadlines collide (one bucket for grants and renewals), so
    renewed leases are queued again into buckets that already hold later grants."""
    cfg = LeaseConfig(kv_lease_duration=4.0, lease_extension=3.0, heartbeat_interval=1.0)
    t, naive = LeaseTable(cfg), NaiveLeaseTable(cfg)
    now = 0.0
    for op, k in ops:
        rid = f"r{k}"
        for x in (t, naive):
            if op == "grant" and rid not in x:
                x.grant(rid, now=now, ttl=float(1 + (k + ttl) % 4))
            elif op == "renew":
                x.renew([rid, f"r{(k + 1) % 8}"], now=now)
            elif op == "done":
                x.transfer_done(rid, now=now)
        if op == "expire":
            assert t.expire(now=now) == naive.expire(now=now)
            assert t.next_deadline() == naive.next_deadline()
        now += 1.0
    assert t.expire(now=now + 10) == naive.expire(now=now + 10)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["grant", "renew", "done", "expire"]),
            st.integers(0, 3),
            st.integers(0, 11),
        ),
        max_size=30,
    )
)
def test_expire_takes_whole_buckets_as_the_naive_model_does(
    ops: list[tuple[str, int, int]],
) -> None:
    """Groups of 12 leases granted at one ``now`` fill buckets past the size that
    ``take_due`` first checks whole; renewals and transfers of some of them leave
    renewed and stale entries inside such buckets."""
    cfg = LeaseConfig(kv_lease_duration=4.0, lease_extension=3.0, heartbeat_interval=1.0)
    t, naive = LeaseTable(cfg), NaiveLeaseTable(cfg)
    now = 0.0
    for op, k, j in ops:
        group = [f"g{k}-{i}" for i in range(12)]
        for x in (t, naive):
            if op == "grant":
                for rid in group:
                    if rid not in x:
                        x.grant(rid, now=now, ttl=float(1 + k % 3))
            elif op == "renew":
                x.renew(group[j:], now=now)
            elif op == "done":
                x.transfer_done(group[j], now=now)
        if op == "expire":
            assert t.expire(now=now) == naive.expire(now=now)
            assert t.next_deadline() == naive.next_deadline()
        now += 1.0
    assert t.expire(now=now + 10) == naive.expire(now=now + 10)


@given(st.lists(st.tuples(st.text(max_size=4), st.floats(), st.one_of(st.none(), st.floats()))))
def test_make_releases_equals_the_constructor(rows: list[tuple[str, float, float | None]]) -> None:
    leases = [
        type("L", (), {"req_id": r, "granted_at": g, "deadline": 1.0, "last_renewal": x})()
        for r, g, x in rows
    ]
    fast = make_releases(leases, ReleaseReason.EXPIRED, 2.0)
    slow = [
        Release(r, ReleaseReason.EXPIRED, 2.0, granted_at=g, deadline=1.0, last_renewal=x)
        for r, g, x in rows
    ]
    assert [type(r) for r in fast] == [Release] * len(rows)
    assert [dataclasses.astuple(r) for r in fast] == [dataclasses.astuple(r) for r in slow]
    for r in fast:  # every field set (astuple read each), and frozen like the constructor's
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.at = 0.0  # type: ignore[misc]
