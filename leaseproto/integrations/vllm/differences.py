"""vLLM 0.32.0 tests that assert a behaviour LeaseprotoConnector changes on purpose.

The driver test (``tests/test_vllm_suite.py``) deselects these when it runs
vLLM's lease tests under our plugin, checks that each still fails under the
plugin and passes on stock vLLM (so the list cannot go stale), and
``tests/test_vllm_behaviour.py`` tests our behaviour instead. ``docs/vllm.md``
has the same table; a test keeps the two equal.
"""

from __future__ import annotations

__all__ = ["DIFFERENCES", "LEASE_TEST_FILES", "LEASE_TEST_SELECTION", "WHOLE_TEST_FILES"]

_UNIT = "tests/v1/kv_connector/unit/"

#: vLLM's files with lease tests, relative to the unpacked tarball.
LEASE_TEST_FILES = (
    _UNIT + "test_nixl_heartbeat.py",
    _UNIT + "test_nixl_connector.py",
    _UNIT + "test_bidirectional_kv_transfer.py",
)

#: vLLM's files run whole under our classes (issue 18: bidirectional mode).
WHOLE_TEST_FILES = (_UNIT + "test_bidirectional_kv_transfer.py",)

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
}
