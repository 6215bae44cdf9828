"""P's advertised lease settings and D's check of them at first contact
(spec §5.3, T1/T2): a mismatch is named with both values, never silent."""

from __future__ import annotations

import dataclasses

import pytest

from leaseproto import LeaseConfig
from leaseproto.core.peer import PeerLease, advertisement, first_contact, fragile, mismatch


def test_advertisement_round_trips_as_durations() -> None:
    cfg = LeaseConfig(30.0, max_lease_lifetime=600.0)
    peer = PeerLease.parse(advertisement(cfg))
    assert peer == PeerLease(30.0, cfg.lease_extension, cfg.heartbeat_interval, 600.0)


@pytest.mark.parametrize(
    "adv",
    [
        None,
        {"v": 1},
        {"v": 2, "lease": {"kv_lease_duration": 3, "lease_extension": 2}},
        {"v": 1, "lease": {"kv_lease_duration": "3", "lease_extension": 2}},
        {"v": 1, "lease": {"kv_lease_duration": 3, "lease_extension": -2}},
        {"v": 1, "lease": {"kv_lease_duration": 3, "lease_extension": float("nan")}},
        {"v": 1, "lease": {"kv_lease_duration": True, "lease_extension": 2}},
        {"v": 1, "lease": {"kv_lease_duration": 3, "lease_extension": 0}},
        {"v": 1, "lease": {"kv_lease_duration": 3, "lease_extension": 2, "max_lease_lifetime": 0}},
        {"v": 1, "lease": {"kv_lease_duration": 3}},  # a required setting missing
        {"v": 1, "lease": {"kv_lease_duration": None, "lease_extension": 2}},
    ],
)
def test_bad_advertisement_is_a_value_error(adv: object) -> None:
    with pytest.raises(ValueError, match=r"leaseproto|lease setting"):
        PeerLease.parse(adv)


def test_p_at_3_s_and_d_at_30_s_is_refused_naming_both_values() -> None:
    p = PeerLease.parse(advertisement(LeaseConfig(3.0)))  # extension 2 s
    why = mismatch(p, LeaseConfig(30.0))  # D heartbeats every 5 s
    assert why is not None
    assert "heartbeat_interval 5 s" in why and "lease_extension 2 s" in why and "T2" in why
    assert "step time" not in why  # none was given


def test_same_settings_pass() -> None:
    for seconds in (1.5, 3.0, 30.0, 600.0):
        cfg = LeaseConfig(seconds)
        assert mismatch(PeerLease.parse(advertisement(cfg)), cfg) is None
        assert fragile(PeerLease.parse(advertisement(cfg)), cfg) is None


def test_step_time_counts_against_the_extension() -> None:
    p = PeerLease(3.0, 2.0)
    d = LeaseConfig(3.0, heartbeat_interval=1.5)
    assert mismatch(p, d) is None
    assert "step time 0.6 s" in (mismatch(p, d, step_time=0.6) or "")


def test_t1_needs_the_interval_below_the_initial_lease() -> None:
    why = mismatch(PeerLease(4.0, 10.0), LeaseConfig(30.0, heartbeat_interval=5.0))
    assert why is not None and "T1" in why and "kv_lease_duration 4 s" in why


def test_the_advertised_settings_are_a_frozen_value() -> None:
    p = PeerLease.parse(advertisement(LeaseConfig(30.0)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.lease_extension = 1.0  # type: ignore[misc]
    assert hash(p) == hash(PeerLease.parse(advertisement(LeaseConfig(30.0))))


def test_a_heartbeat_interval_equal_to_the_extension_or_the_lease_is_refused() -> None:
    # a heartbeat due exactly at the deadline is too late (it does not revive: I2)
    d = LeaseConfig(30.0, heartbeat_interval=5.0)
    why = mismatch(PeerLease(30.0, 5.0), d)
    assert why is not None and "T2" in why and "T1" not in why
    why = mismatch(PeerLease(5.0, 10.0), d)
    assert why is not None and "T1" in why and "T2" not in why
    assert mismatch(PeerLease(5.5, 5.5), d) is None


def test_step_time_counts_against_the_initial_lease_too() -> None:
    p, d = PeerLease(6.0, 10.0), LeaseConfig(30.0, heartbeat_interval=5.0)
    assert mismatch(p, d, step_time=0.5) is None
    why = mismatch(p, d, step_time=2.0)  # 5 + 2 >= 6, but 7 < 10
    assert why is not None and "T1" in why and "T2" not in why and "step time 2 s" in why


def test_a_pair_that_tolerates_one_lost_heartbeat_is_not_warned() -> None:
    d = LeaseConfig(30.0, heartbeat_interval=5.0)
    assert fragile(PeerLease(30.0, 15.0), d) is None  # ceil(15 / 5) - 2 = 1
    assert fragile(PeerLease(30.0, 10.0), d) is not None  # ceil(10 / 5) - 2 = 0
    # one at or past the extension is mismatch's refusal, not a warning
    assert fragile(PeerLease(30.0, 5.0), d) is None and mismatch(PeerLease(30.0, 5.0), d)


def test_a_pair_that_tolerates_no_lost_heartbeat_is_warned() -> None:
    warn = fragile(PeerLease(30.0, 8.0), LeaseConfig(30.0, heartbeat_interval=5.0))
    assert warn is not None and "8 s" in warn and "5 s" in warn


def test_first_contact_names_the_rank_and_skips_ranks_that_did_not_advertise() -> None:
    good = PeerLease.parse(advertisement(LeaseConfig(30.0)))
    bad = PeerLease(3.0, 2.0)
    problem, warning = first_contact([None, good, bad], LeaseConfig(30.0))
    assert problem is not None and problem.startswith("P rank 2:") and warning is None
    assert first_contact([None, good], LeaseConfig(30.0)) == (None, None)


def test_first_contact_warns_of_a_fragile_rank_when_none_is_refused() -> None:
    good = PeerLease.parse(advertisement(LeaseConfig(30.0)))
    thin = PeerLease(30.0, 8.0)  # E 8 s over H 5 s: no lost heartbeat tolerated
    problem, warning = first_contact([good, None, thin], LeaseConfig(30.0))
    assert problem is None and warning is not None and warning.startswith("P rank 2:")
    assert "tolerates no lost heartbeat" in warning
