import math

import pytest

from leaseproto import ClockOffset, LocalProtocolError


def test_keeps_lowest_rtt_sample() -> None:
    c = ClockOffset()
    assert c.add_sample(t0=10.0, remote_time=1010.0, t1=10.4)  # rtt 0.4
    assert c.offset == pytest.approx(999.8) and c.uncertainty == pytest.approx(0.2)
    assert not c.add_sample(t0=20.0, remote_time=1000.0, t1=21.0)  # worse rtt ignored
    assert c.add_sample(t0=30.0, remote_time=1030.05, t1=30.1)
    assert c.offset == pytest.approx(1000.0) and c.uncertainty == pytest.approx(0.05)
    assert c.samples == 3 and c.to_local(1100.0) == pytest.approx(100.0)


def test_read_gate_is_conservative_I9() -> None:
    c = ClockOffset()
    c.add_sample(t0=0.0, remote_time=100.0, t1=2.0)  # offset 99, uncertainty 1
    # remote deadline 200 is local 101 +- 1: reads allowed only while now + 5 + 1 < 101
    assert c.read_allowed(200.0, now=94.9)
    assert not c.read_allowed(200.0, now=95.0)
    assert not c.read_allowed(200.0, now=95.0, margin=5.0)
    assert c.read_allowed(200.0, now=99.9, margin=0.0)
    assert not c.read_allowed(200.0, now=100.0, margin=0.0)


def test_no_sample_means_no_read_and_errors_on_offset() -> None:
    c = ClockOffset()
    assert not c.has_sample and not c.read_allowed(1e9, now=0.0)
    with pytest.raises(ValueError, match="no clock sample"):
        _ = c.offset


@pytest.mark.parametrize(
    ("t0", "rt", "t1"), [(1.0, 0.0, 0.5), (math.nan, 0.0, 1.0), (0.0, math.inf, 1.0)]
)
def test_bad_samples_rejected(t0: float, rt: float, t1: float) -> None:
    c = ClockOffset()
    with pytest.raises(LocalProtocolError):
        c.add_sample(t0=t0, remote_time=rt, t1=t1)
    assert c.samples == 0 and not c.has_sample


def test_a_sample_with_no_round_trip_is_taken_exactly() -> None:
    """``t1 == t0`` (a clock too coarse to see the round trip) is a valid sample:
    only ``t1 < t0`` is refused."""
    c = ClockOffset()
    assert c.add_sample(t0=3.0, remote_time=10.0, t1=3.0)
    assert (c.offset, c.uncertainty, c.sampled_at, c.samples) == (7.0, 0.0, 3.0, 1)


# -- samples age (issue 9 §4): the drift allowance 2 rho/(1 - rho) * age ----------------------
def test_an_old_sample_does_not_admit_a_read_past_the_peers_deadline_I9() -> None:
    # The peer's clock runs 100 ppm fast against ours (each within rho = 100 ppm of
    # real time is 2 rho relative; 1 rho is enough here). The sample at t = 0 says
    # offset 0 +- 0.05; 1e5 s later the true offset is 10 s.
    c = ClockOffset(rho=1e-4)
    c.add_sample(t0=0.0, remote_time=0.05, t1=0.1)
    now = 1e5
    peer_now = now * (1 + 1e-4)  # the peer's clock reads now + 10
    deadline = peer_now - 9.9  # passed 9.9 s ago on the peer's clock
    # main admitted it: now + 0 + 0.05 < deadline - 0 = now + 0.1
    assert not c.read_allowed(deadline, now=now, margin=0.0)
    assert c.uncertainty_at(now) == pytest.approx(0.05 + 2e-4 / (1 - 1e-4) * 1e5)
    # a deadline far enough ahead on the peer's clock is still readable
    assert c.read_allowed(peer_now + 25.0, now=now, margin=0.0)


def test_a_newer_sample_replaces_an_aged_one_with_more_uncertainty() -> None:
    c = ClockOffset(rho=1e-4)
    assert c.add_sample(t0=0.0, remote_time=0.05, t1=0.1)  # +- 0.05
    # 1e4 s later the kept one is +- 0.05 + 2.0; a fresh +- 0.25 sample is better
    assert c.add_sample(t0=1e4, remote_time=1e4 + 1.25, t1=1e4 + 0.5)
    assert c.offset == pytest.approx(1.0) and c.uncertainty == pytest.approx(0.25)
    # a fresh sample worse than the kept one's aged uncertainty is not kept
    assert not c.add_sample(t0=1e4 + 1, remote_time=0.0, t1=1e4 + 11)  # +- 5 > 0.25 + 2e-4
    assert c.offset == pytest.approx(1.0)


def test_an_old_sample_arriving_late_is_aged_before_it_is_compared() -> None:
    c = ClockOffset(rho=1e-4)
    c.add_sample(t0=1e4, remote_time=1e4, t1=1e4 + 0.5)  # +- 0.25 at 1e4
    # a +- 0.05 sample taken at 0 is +- 2.05 at 1e4: worse
    assert not c.add_sample(t0=0.0, remote_time=0.05, t1=0.1)
    assert c.uncertainty == pytest.approx(0.25)


def test_the_kept_sample_is_aged_by_the_time_since_it_was_taken() -> None:
    """Its age is the new sample's ``t0`` minus its own, whatever the clock reads."""
    c = ClockOffset(rho=0.01)  # 2 rho / (1 - rho) = 0.0202 s a second
    assert c.add_sample(t0=100.0, remote_time=150.0, t1=102.0)  # +- 1 at 100
    # at 110 the kept one is +- 1.202: a +- 1.5 sample is worse
    assert not c.add_sample(t0=110.0, remote_time=0.0, t1=113.0)
    assert (c.sampled_at, c.uncertainty, c.offset) == (100.0, 1.0, 49.0)
    # at 200 it is +- 3.02: the same +- 1.5 sample is better
    assert c.add_sample(t0=200.0, remote_time=300.0, t1=203.0)
    assert (c.sampled_at, c.uncertainty, c.offset) == (200.0, 1.5, 98.5)


def test_has_sample_is_a_bool() -> None:
    c = ClockOffset()
    assert c.has_sample is False
    c.add_sample(t0=0.0, remote_time=1.0, t1=0.5)
    assert c.has_sample is True


def test_without_drift_a_sample_wins_only_with_a_strictly_shorter_round_trip() -> None:
    c = ClockOffset(rho=0.0)
    assert c.add_sample(t0=10.0, remote_time=20.0, t1=12.0)  # +- 1
    assert c.add_sample(t0=20.0, remote_time=30.0, t1=22.0) is False  # +- 1: a tie, later
    assert c.add_sample(t0=0.0, remote_time=0.0, t1=2.0) is False  # +- 1: a tie, earlier
    assert c.add_sample(t0=30.0, remote_time=0.0, t1=32.5) is False  # +- 1.25
    assert c.sampled_at == 10.0
    assert c.add_sample(t0=40.0, remote_time=50.0, t1=41.5) is True  # +- 0.75
    assert (c.sampled_at, c.uncertainty, c.offset) == (40.0, 0.75, 9.25)


def test_a_late_sample_is_aged_by_the_time_to_the_kept_one() -> None:
    c = ClockOffset(rho=0.01)  # 0.0202 s a second
    assert c.add_sample(t0=100.0, remote_time=200.0, t1=100.5)  # +- 0.25 at 100
    # taken at 99: +- 0.0625 + 0.0202 = 0.0827 at 100, better
    assert c.add_sample(t0=99.0, remote_time=199.0, t1=99.125) is True
    assert (c.sampled_at, c.uncertainty) == (99.0, 0.0625)
    assert c.uncertainty_at(109.0) == pytest.approx(0.0625 + 0.02 / 0.99 * 10)
    assert c.uncertainty_at(89.0) == pytest.approx(0.0625 + 0.02 / 0.99 * 10)


def test_a_clock_with_no_sample_has_no_uncertainty_nor_time() -> None:
    c = ClockOffset()
    for read in (lambda: c.uncertainty, lambda: c.sampled_at, lambda: c.uncertainty_at(0.0)):
        with pytest.raises(ValueError, match="no clock sample"):
            read()
    assert c.read_allowed(1e9, now=0.0) is False


def test_without_drift_the_lowest_round_trip_wins_as_before() -> None:
    c = ClockOffset(rho=0.0)
    c.add_sample(t0=0.0, remote_time=0.05, t1=0.1)
    assert not c.add_sample(t0=1e6, remote_time=1e6, t1=1e6 + 0.2)
    assert c.uncertainty_at(1e9) == pytest.approx(0.05)


@pytest.mark.parametrize("rho", [-1e-4, 1.0, math.nan, True])
def test_bad_drift_bound_refused(rho: object) -> None:
    with pytest.raises(LocalProtocolError, match="rho"):
        ClockOffset(rho=rho)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_now_deadline_or_margin_is_local_misuse(bad: float) -> None:
    c = ClockOffset()
    c.add_sample(t0=0.0, remote_time=0.0, t1=0.1)
    for call in (
        lambda: c.read_allowed(10.0, now=bad),
        lambda: c.read_allowed(bad, now=1.0),
        lambda: c.read_allowed(10.0, now=1.0, margin=bad),
        lambda: c.uncertainty_at(bad),
    ):
        with pytest.raises(LocalProtocolError, match="finite"):
            call()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_clock_with_no_sample_refuses_a_non_finite_argument_too(bad: float) -> None:
    """Misuse is refused whether or not a sample was taken (not answered False)."""
    c = ClockOffset()
    for call in (
        lambda: c.read_allowed(10.0, now=bad),
        lambda: c.read_allowed(bad, now=1.0),
        lambda: c.read_allowed(10.0, now=1.0, margin=bad),
    ):
        with pytest.raises(LocalProtocolError, match="finite"):
            call()
    assert not c.read_allowed(10.0, now=1.0) and c.samples == 0
