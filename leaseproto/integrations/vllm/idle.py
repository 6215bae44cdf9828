"""P's engine steps with nothing to compute: poll for notifications, then end the step.

While P holds blocks for a decoder, vLLM 0.32 keeps P's engine stepping
(``Scheduler.has_finished_requests``: a finished request waiting for its KV to
be read), with nothing scheduled, sleeping 1 ms between steps. A transfer-done
is then read only when a step comes round: each step is a round trip between the
engine core and the worker process, and under CPU contention that took tens of
milliseconds after the READ (docs/vllm.md).

In such a step (the scheduler marks it: :data:`IDLE_ATTR`) the worker instead
polls NIXL's notifications every :data:`IDLE_POLL_S` for up to ``idle_wait``
seconds, handling each as the step's own poll does (a transfer-done is answered
at once, D's verdict included), and ends the step as soon as a poll finds a
request done sending or the earliest lease deadline comes (so a release is
reported without delay). The cost: a request that reaches an idle P waits up to
``idle_wait`` for the step to end before it is scheduled. It saves little CPU:
while the worker waits, vLLM's engine core waits for its answer in a loop that
yields the CPU but does not sleep (its shared-memory queue polls for 1 s after
each read), so the idle step's CPU moves from the worker to the engine core.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .config import seconds_below

__all__ = [
    "DEFAULT_IDLE_WAIT",
    "IDLE_ATTR",
    "IDLE_POLL_S",
    "IDLE_WAIT_KEY",
    "idle_wait",
    "poll_until",
]

#: connector metadata attribute: the scheduler scheduled no tokens this step
IDLE_ATTR = "leaseproto_idle_step"
#: ``kv_connector_extra_config`` key: the most seconds an idle step of an engine holding
#: leases polls for notifications (0: never; the step returns at once, as vLLM's does)
IDLE_WAIT_KEY = "idle_wait"
#: Its default: short beside the prefill a new request needs, long beside vLLM's 1 ms
DEFAULT_IDLE_WAIT = 0.010
#: How often an idle wait polls NIXL (seconds); it sleeps in between
IDLE_POLL_S = 0.001


def idle_wait(extra: Mapping[str, Any] | None, bound: float) -> float:
    """``extra[IDLE_WAIT_KEY]`` (default :data:`DEFAULT_IDLE_WAIT`), checked.

    Raises:
        ValueError: not a finite number of seconds, or negative, or not below
            ``bound`` (the heartbeat interval: a longer step would delay what a
            step does for the engine's own requests by an interval).
    """
    return seconds_below(extra, IDLE_WAIT_KEY, DEFAULT_IDLE_WAIT, bound, "the heartbeat interval")


def poll_until(
    poll: Callable[[], bool],
    clock: Callable[[], float],
    until: float,
    *,
    period: float = IDLE_POLL_S,
    most: int | None = None,
) -> int:
    """Call ``poll`` until it returns True or ``clock()`` reaches ``until``, sleeping
    ``period`` (at most what is left) in between; returns how many polls were made.
    The first poll is made at once, whatever the clock says. ``most`` bounds the
    polls whatever the clock does (default: as many as ``period`` fits into what is
    left at the start, and two)."""
    if most is None:
        most = int(max(0.0, until - clock()) / period) + 2
    polls = 0
    while True:
        polls += 1
        if poll() or polls >= most:
            return polls
        left = until - clock()
        if left <= 0:
            return polls
        time.sleep(min(period, left))
