import math

import pytest

from leaseproto import ClockOffset


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
    with pytest.raises(ValueError):
        c.add_sample(t0=t0, remote_time=rt, t1=t1)
    assert c.samples == 0 and not c.has_sample
