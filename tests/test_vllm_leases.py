"""WorkerLeases / LeaseView: vLLM's ``_reqs_to_send`` as a view of the LeaseTable.
No vLLM needed."""

from __future__ import annotations

import pytest

from leaseproto import LeaseConfig, ReleaseReason, TransferCounted
from leaseproto.integrations.vllm.leases import LeaseView, WorkerLeases


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make() -> tuple[WorkerLeases, LeaseView, Clock]:
    clock = Clock()
    lp = WorkerLeases(LeaseConfig(30, heartbeat_interval=5, lease_extension=20), clock)
    return lp, LeaseView(lp), clock


def test_setitem_grants_until_the_deadline() -> None:
    lp, view, _ = make()
    view["a"] = 112.5
    assert lp.table.deadline("a") == 112.5 and view["a"] == 112.5 and "a" in view
    assert lp.table.lease_info("a")["granted_at"] == 100.0  # type: ignore[index]


def test_already_due_grant_is_reaped_at_the_next_reap_even_if_the_clock_stands_still() -> None:
    lp, view, _ = make()
    view["late"] = 90.0
    assert [r.req_id for r in lp.reap()] == ["late"]
    assert "late" not in view


def test_clock_going_back_is_clamped() -> None:
    lp, view, clock = make()
    view["a"] = 110.0
    clock.t = 50.0  # vLLM's tests patch perf_counter backwards
    assert lp.now() == 100.0
    assert lp.reap() == []
    clock.t = 110.0
    assert [r.reason for r in lp.reap()] == [ReleaseReason.EXPIRED]


def test_assigning_a_dict_replaces_the_table_keeping_order() -> None:
    lp, view, _ = make()
    view["old"] = 200.0
    lp.reset({"x": 55.0, "y": 46.0, "z": 500.0})
    assert list(view) == ["x", "y", "z"] and dict(view) == {"x": 55.0, "y": 46.0, "z": 500.0}


def test_delete_aborts() -> None:
    lp, view, _ = make()
    view["a"] = 130.0
    del view["a"]
    assert lp.table.ended("a") is ReleaseReason.ABORTED
    with pytest.raises(KeyError):
        del view["a"]


def test_setting_a_live_lease_again_replaces_it() -> None:
    lp, view, _ = make()
    assert not lp.table
    view["a"] = 130.0
    view["a"] = 140.0
    assert view["a"] == 140.0 and len(view) == 1


@pytest.mark.parametrize("readers", [1, 2, 3])
def test_readers_complete_the_lease(readers: int) -> None:
    lp, view, _ = make()
    view["a"] = 130.0
    for i in range(readers - 1):
        counted = lp.transfer_done("a", readers)
        assert isinstance(counted, TransferCounted) and counted.done == i + 1
        assert lp.readers_done("a") == i + 1
    release = lp.transfer_done("a", readers)
    assert release is not None and release.reason is ReleaseReason.TRANSFERRED


def test_early_transfer_done_settles_at_grant() -> None:
    lp, view, _ = make()
    assert lp.transfer_done("a", 1) is None  # staged by the core
    view["a"] = 130.0
    assert [r.req_id for r in lp.take_settled()] == ["a"] and "a" not in view


def test_an_id_that_cannot_go_on_the_wire_is_freed_not_leased() -> None:
    lp, view, _ = make()
    view["bad,id"] = 130.0  # ',' would split a heartbeat: the core refuses the grant
    assert "bad,id" not in view and lp.take_refused() == ["bad,id"]
