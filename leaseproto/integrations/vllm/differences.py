"""vLLM 0.32.0 tests that assert a behaviour LeaseprotoConnector changes on purpose.

The driver test (``tests/test_vllm_suite.py``) deselects these when it runs
vLLM's lease tests under our plugin, checks that each still fails under the
plugin and passes on stock vLLM (so the list cannot go stale), and
``tests/test_vllm_behaviour.py`` tests our behaviour instead. ``docs/vllm.md``
has the same table; a test keeps the two equal.
"""

from __future__ import annotations

__all__ = [
    "DIFFERENCES",
    "LEASE_TEST_FILES",
    "LEASE_TEST_SELECTION",
    "PUSH_TEST_FILE",
    "WHOLE_TEST_FILES",
]

_UNIT = "tests/v1/kv_connector/unit/"

#: vLLM's files with lease tests, relative to the unpacked tarball.
LEASE_TEST_FILES = (
    _UNIT + "test_nixl_heartbeat.py",
    _UNIT + "test_nixl_connector.py",
    _UNIT + "test_bidirectional_kv_transfer.py",
)

#: vLLM's files run whole under our classes (issue 18: bidirectional mode).
WHOLE_TEST_FILES = (_UNIT + "test_bidirectional_kv_transfer.py",)

#: vLLM's push-mode file, run whole under our push classes (issue 18: push mode).
PUSH_TEST_FILE = _UNIT + "test_nixl_push_connector.py"
_PUSH = PUSH_TEST_FILE + "::"
_SCAFFOLD = "tests/test_vllm_push_scaffold.py::"
#: why seven of vLLM's push tests cannot run on any subclass of its push classes
_MRO = (
    "patches type(obj).__mro__[1] to stub the base class: under a subclass that is "
    "another class (our mixin), so the patch misses or removes vLLM's push logic. "
    "Nothing behaves differently: the same is checked with the base class patched by name"
)

#: ``-k`` expression picking the lease, deadline, expiry and abort tests (ray excluded:
#: the CPU platform does not support ray executors).
LEASE_TEST_SELECTION = (
    "heartbeat or expir or deadline or lease or reaper or abort_timeout_on_prefiller and not ray"
)

#: node id -> (what vLLM asserts, what we do instead, our test)
DIFFERENCES: dict[str, tuple[str, str, str]] = {
    _UNIT + "test_nixl_heartbeat.py::test_handle_heartbeat": (
        "a heartbeat renews an entry whose deadline has already passed (100.0, long past) "
        "as long as the reaper has not removed it yet",
        "a lease whose deadline has passed has lapsed: the core's renew rule does not "
        "revive it, the heartbeat id is counted as late and the reaper frees the blocks",
        "tests/test_vllm_behaviour.py::test_lapsed_lease_is_not_revived",
    ),
    _UNIT + "test_nixl_heartbeat.py::test_reaper_reclaims_expired_leases_behind_heartbeated_head": (
        "heartbeats at t = 40, 60, 80 each land exactly on A's deadline (40, 60, 80) and "
        "renew it (vLLM handles heartbeats before the reaper, and renews at now == deadline)",
        "deadline <= now is expired (the same boundary vLLM's reaper uses), so the heartbeat "
        "at t = 40 finds A lapsed; what the test is about, expired B and C reclaimed behind a "
        "live head (B1), holds and is tested with a heartbeat before the deadline",
        "tests/test_vllm_behaviour.py::test_reaper_frees_behind_a_renewed_head",
    ),
    _PUSH + "TestPushWriterNegative::test_get_new_notifs_extends_lease_on_heartbeat": (
        "a heartbeat forwarded by the writer thread renews entries whose deadline passed "
        "5 s ago (not reaped yet)",
        "as in pull mode: a lease past its deadline has lapsed and is not revived; the "
        "reaper frees it",
        _SCAFFOLD + "test_a_forwarded_heartbeat_does_not_revive_a_lapsed_lease",
    ),
    **{
        _PUSH + "TestPushWriterNotifs::test_push_completion_after_expiry_is_not_reported_twice"
        f"[{first}]": (
            "P reports a lease done_sending (its blocks freed) when it expires, while one of "
            "its WRITEs is still running",
            "P keeps the blocks of a lease that expires while its WRITE reads them, and frees "
            "them when the WRITE is over (vLLM's WRITE would read freed, reused blocks)",
            "tests/test_vllm_push.py::test_p_keeps_its_blocks_while_its_write_runs",
        )
        for first in ("ERR", "DONE")
    },
    **{
        _PUSH + node: (_MRO, "the same behaviour", _SCAFFOLD + ours)
        for node, ours in (
            (
                "TestPushScheduler::test_build_connector_meta_drains_both_sides",
                "test_build_connector_meta_ships_registrations_and_finished_blocks",
            ),
            (
                "TestPushScheduler::test_has_pending_push_work_lifecycle",
                "test_pending_push_work_lasts_until_the_write_completes",
            ),
            (
                "TestPushScheduler::test_registration_watchdog_expires",
                "test_vllms_watchdog_still_drops_a_registration_never_shipped",
            ),
            (
                "TestPushWriterNotifs::test_get_transfer_results_evicts_completed_state",
                "test_finished_requests_are_evicted_from_the_writer",
            ),
            (
                "TestPushWriterNegative::test_get_transfer_results_enqueues_each_completed_request",
                "test_finished_requests_are_evicted_from_the_writer",
            ),
            (
                "TestPushWriterNegative::test_empty_transfer_results_do_not_enqueue_eviction",
                "test_nothing_finished_evicts_nothing_but_wakes_the_writer",
            ),
            (
                "TestPushWriterNegative::test_failed_push_transfer_does_not_evict_writer_state",
                "test_a_failed_write_keeps_the_lease_and_evicts_nothing",
            ),
        )
    },
}
