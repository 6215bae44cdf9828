"""A hypothesis state machine: :class:`~leaseproto.LeaseTable` against
:class:`NaiveLeaseTable` through random grant / renew / transfer_done / abort /
expire / advance-time sequences, with the spec's invariants checked after every
step under their ids (spec §9).

Run it with ``run_state_machine_as_test(LeaseTableMachine)`` or through
``LeaseTableMachine.TestCase``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ..checker.naive import NaiveLeaseTable
from ..core import wire
from ..core.config import LeaseConfig
from ..core.events import LateTransfer, Release, ReleaseReason, TransferCounted
from ..core.table import LeaseTable

__all__ = [
    "DENSE",
    "WIDE",
    "DenseLeaseTableMachine",
    "LeaseTableMachine",
    "Profile",
    "machine_class",
]


@dataclass(frozen=True)
class Profile:
    """What a machine draws from: request ids, grant ttls, time steps, configurations."""

    name: str
    ids: tuple[str, ...]
    ttls: st.SearchStrategy[float | None]
    dts: st.SearchStrategy[float]
    configs: tuple[LeaseConfig, ...]


#: CI's machine (``tests/test_stateful.py``, derandomised): 8 ids, any float time step.
WIDE = Profile(
    "wide",
    ids=tuple(f"req-{i}" for i in range(8)),
    ttls=st.sampled_from([None, 0.5, 3.0, 30.0, 480.0]),
    dts=st.sampled_from([0.0, 0.25, 1.0, 2.5, 5.0, 20.0, 29.75, 30.0, 100.0])
    | st.floats(min_value=0.0, max_value=60.0, allow_nan=False),
    configs=(
        LeaseConfig(),
        LeaseConfig(kv_lease_duration=3.0, max_lease_lifetime=7.0),
        LeaseConfig(
            kv_lease_duration=3.0,
            tombstone_ttl=10.0,
            tombstone_capacity=3,
            staging_ttl=2.0,
            staging_capacity=2,
        ),
    ),
)
#: The randomised profile's machine (``tests/test_random_profile.py``): three ids and
#: whole-second steps on short leases (L 6, E 4; H 1), so leases collide, come due
#: together and are renewed across each other's deadlines in a few steps; capped and
#: small-tombstone variants of the same durations.
DENSE = Profile(
    "dense",
    ids=("a", "b", "c"),
    ttls=st.sampled_from([None, None, 1.0, 2.0]),
    dts=st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, 8.0]),
    configs=(
        LeaseConfig(kv_lease_duration=6.0, heartbeat_interval=1.0, lease_extension=4.0),
        LeaseConfig(
            kv_lease_duration=6.0,
            heartbeat_interval=1.0,
            lease_extension=4.0,
            max_lease_lifetime=8.0,
        ),
        LeaseConfig(
            kv_lease_duration=6.0,
            heartbeat_interval=1.0,
            lease_extension=4.0,
            tombstone_ttl=6.0,
            tombstone_capacity=2,
            staging_ttl=2.0,
            staging_capacity=1,
        ),
    ),
)


def machine_class(profile: Profile) -> type[RuleBasedStateMachine]:
    """The state machine drawing from ``profile``."""
    ids_ = list(profile.ids)
    _ids = st.sampled_from(ids_)
    _ttls = profile.ttls
    _dts = profile.dts
    _configs = st.sampled_from(list(profile.configs))

    class Machine(RuleBasedStateMachine):
        """Real table and naive model, stepped together on one virtual clock."""

        def __init__(self) -> None:
            super().__init__()
            self.now = 0.0
            self.table: LeaseTable | None = None
            self.model: NaiveLeaseTable | None = None
            # per live lease: what the bounds I5-I7 need
            self.meta: dict[str, dict[str, Any]] = {}
            self.released: dict[str, int] = {}
            self.granted: dict[str, int] = {}

        # -- set-up -----------------------------------------------------------------------------
        @initialize(cfg=_configs)
        def setup(self, cfg: LeaseConfig) -> None:
            note(f"config {cfg}")
            self.cfg = cfg
            self.table = LeaseTable(cfg)
            self.model = NaiveLeaseTable(cfg)

        def _t(self) -> tuple[LeaseTable, NaiveLeaseTable]:
            assert self.table is not None and self.model is not None
            return self.table, self.model

        def _ended(self, out: Release | TransferCounted | LateTransfer | None) -> None:
            if isinstance(out, Release):
                self.released[out.req_id] = self.released.get(out.req_id, 0) + 1
                self.meta.pop(out.req_id, None)

        # -- inputs -----------------------------------------------------------------------------
        @precondition(lambda self: self.table is not None)
        @rule(req_id=_ids, ttl=_ttls, consumers=st.integers(1, 3))
        def grant(self, req_id: str, ttl: float | None, consumers: int) -> None:
            table, model = self._t()
            if req_id in table:
                return
            note(f"t={self.now}: grant({req_id!r}, ttl={ttl}, consumers={consumers})")
            got = table.grant(req_id, now=self.now, consumers=consumers, ttl=ttl)
            want = model.grant(req_id, now=self.now, consumers=consumers, ttl=ttl)
            assert got == want
            self.granted[req_id] = self.granted.get(req_id, 0) + 1
            eff = self.cfg.kv_lease_duration if ttl is None else ttl
            self.meta[req_id] = {"granted_at": self.now, "ttl": eff, "last_renewal": None}
            self._ended(got)

        @precondition(lambda self: self.table is not None)
        @rule(req_ids=st.lists(_ids, max_size=5))
        def renew(self, req_ids: list[str]) -> None:
            table, model = self._t()
            before = {r: table.deadline(r) for r in req_ids}
            note(f"t={self.now}: renew({req_ids})")
            got = table.renew(req_ids, now=self.now)
            assert got == model.renew(req_ids, now=self.now)
            for rid, old in before.items():
                new = table.deadline(rid)
                if old is None:
                    assert new is None, "I2: a renewal never creates or revives a lease"
                else:
                    assert new is not None and new >= old, "I1: a renewal never shortens a lease"
                    if old > self.now:
                        self.meta[rid]["last_renewal"] = self.now

        @precondition(lambda self: self.table is not None and len(self.table) > 0)
        @rule(data=st.data())
        def renew_one_live(self, data: st.DataObject) -> None:
            """A heartbeat naming one live lease: a renewal that reorders deadlines
            (what the expire-order bug needed, and random ids rarely hit)."""
            table, _ = self._t()
            self.renew([data.draw(st.sampled_from(sorted(table.live())))])

        @precondition(lambda self: self.table is not None)
        @rule(req_id=_ids, readers=st.none() | st.integers(1, 3))
        def transfer_done(self, req_id: str, readers: int | None) -> None:
            table, model = self._t()
            note(f"t={self.now}: transfer_done({req_id!r}, readers={readers})")
            live = req_id in table
            got = table.transfer_done(req_id, now=self.now, readers=readers)
            assert got == model.transfer_done(req_id, now=self.now, readers=readers)
            ok = isinstance(wire.verdict(req_id, got), wire.Ok)
            assert ok == live, "I13: OK exactly when the lease was live when handled"
            self._ended(got)

        @precondition(lambda self: self.table is not None)
        @rule(req_id=_ids)
        def abort(self, req_id: str) -> None:
            table, model = self._t()
            note(f"t={self.now}: abort({req_id!r})")
            got = table.abort(req_id, now=self.now)
            assert got == model.abort(req_id, now=self.now)
            self._ended(got)

        @precondition(lambda self: self.table is not None)
        @rule()
        def expire(self) -> None:
            table, model = self._t()
            note(f"t={self.now}: expire()")
            got = table.expire(now=self.now)
            want = model.expire(now=self.now)
            # deadline order, ties in grant order: the order tombstones are kept in
            assert got == want
            for r in got:
                assert r.reason is ReleaseReason.EXPIRED and r.deadline <= self.now
                self._ended(r)
            # I4: after expire(now) no live lease has deadline <= now
            for rid in table.live():
                d = table.deadline(rid)
                assert d is not None and d > self.now, f"I4: {rid} live with deadline {d}"

        @precondition(lambda self: self.table is not None)
        @rule()
        def next_deadline(self) -> None:
            """A query, but one that requeues renewed entries at the heap's head: as an
            invariant after every step it hid the expire-order bug (a stale entry is
            only ever reached by ``expire`` when no query ran in between)."""
            table, model = self._t()
            note(f"t={self.now}: next_deadline()")
            assert table.next_deadline() == model.next_deadline()

        @precondition(lambda self: self.table is not None)
        @rule(dt=_dts)
        def advance(self, dt: float) -> None:
            self.now += dt

        # -- invariants -------------------------------------------------------------------------
        @invariant()
        def agree(self) -> None:
            if self.table is None or self.model is None:
                return
            table, model = self.table, self.model
            assert len(table) == len(model)
            assert sorted(table.live()) == sorted(model.leases)
            for rid in model.leases:
                assert table.deadline(rid) == model.deadline(rid)
            stats = table.stats
            for key, value in model.counts.items():
                assert getattr(stats, key) == value, key

        @invariant()
        def i3_released_exactly_once(self) -> None:
            if self.table is None:
                return
            for rid in ids_:
                live = 1 if rid in self.table else 0
                assert self.granted.get(rid, 0) == self.released.get(rid, 0) + live, (
                    f"I3: {rid} granted {self.granted.get(rid, 0)}x, released "
                    f"{self.released.get(rid, 0)}x, live {live}"
                )

        @invariant()
        def i5_i6_i7_deadline_bounds(self) -> None:
            if self.table is None:
                return
            cap = self.cfg.max_lease_lifetime
            ext = self.cfg.lease_extension
            for rid, m in self.meta.items():
                d = self.table.deadline(rid)
                assert d is not None
                bound = m["granted_at"] + m["ttl"]
                if m["last_renewal"] is None:
                    assert d == bound, "I5: without renewals a lease ends by granted_at + ttl"
                else:
                    assert d <= max(bound, m["last_renewal"] + ext), "I6"
                if cap is not None:
                    assert d <= m["granted_at"] + max(m["ttl"], cap), "I7: cap"

        @invariant()
        def i10_consumers(self) -> None:
            if self.table is None:
                return
            for rid in self.table.live():
                info = self.table.lease_info(rid)
                assert info is not None
                # readers: the latest notification's n (the granted consumers before any)
                done, readers = info["done"], info["readers"]
                assert isinstance(done, int) and isinstance(readers, int)
                assert done < readers, "I10: a live lease has fewer notifications than its readers"

    Machine.__name__ = Machine.__qualname__ = f"LeaseTableMachine_{profile.name}"
    return Machine


LeaseTableMachine = machine_class(WIDE)
DenseLeaseTableMachine = machine_class(DENSE)
