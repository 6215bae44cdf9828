"""P's lease record inside a vLLM worker, and vLLM's ``_reqs_to_send`` as a view of it.

No vLLM import. :class:`WorkerLeases` owns the :class:`~leaseproto.LeaseTable`
and the worker's clock discipline: the table needs ``now`` that never goes
back, while vLLM's code (and its tests, which patch ``time.perf_counter``) may
read a clock that does; every call here uses ``max(clock(), last now)``.

:class:`LeaseView` is what vLLM's code and tests see as ``_reqs_to_send``: a
mapping request id -> absolute deadline on the worker clock, read from the
table. Writing ``view[id] = deadline`` grants a lease ending at ``deadline``
(what vLLM's ``start_load_kv`` does after rebasing the scheduler's deadline);
deleting one aborts it. Nothing else holds deadlines.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from leaseproto import (
    LateTransfer,
    LeaseConfig,
    LeaseTable,
    LocalProtocolError,
    Release,
    TransferCounted,
)
from leaseproto.adapters.trace_writer import NO_TRACE, NoTrace

__all__ = ["LeaseView", "WorkerLeases"]

logger = logging.getLogger("vllm.leaseproto.worker")

#: Smallest lease a grant may carry: an already-due deadline is granted with it
#: and reaped at the next reap (the table refuses a zero ttl).
_EPSILON = 1e-9


def _perf_counter() -> float:
    return time.perf_counter()


class WorkerLeases:
    """The table, the monotone clock, and grants by absolute deadline."""

    def __init__(self, config: LeaseConfig, clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.table = LeaseTable(config)
        # looked up at each call by default, so a patched time.perf_counter takes effect
        self._clock: Callable[[], float] = clock or _perf_counter
        self._last = -math.inf
        # ids granted with a deadline already passed: the next reap frees them
        self._due: set[str] = set()
        self.settled: list[Release] = []
        # ids the table refused to lease (see grant_until): freed at the next reap
        self.refused: list[str] = []
        #: the worker's event trace (:mod:`.trace`); off by default
        self.trace: NoTrace = NO_TRACE
        #: leases granted since :meth:`take_granted`
        self.granted = 0
        #: what the trace calls these grants: P's (``prefill``) or D's cached turn (``turn``)
        self.grant_kind = "prefill"

    def now(self) -> float:
        """The worker clock, never earlier than the last ``now`` handed to the table."""
        t = self._clock()
        if t < self._last:
            return self._last
        self._last = t
        return t

    def grant_until(
        self,
        req_id: str,
        deadline: float,
        *,
        now: float | None = None,
        writers: Sequence[str] | None = None,
    ) -> None:
        """Grant ``req_id`` a lease ending at ``deadline`` (worker clock). A live
        lease for the id is replaced (vLLM overwrites its map entry).
        ``writers``: traced with the grant (push mode's registrations)."""
        t = self.now() if now is None else now
        if req_id in self.table:
            self.abort(req_id, now=t)
        ttl = deadline - t
        if not ttl > _EPSILON:
            ttl = _EPSILON
            self._due.add(req_id)
        try:
            release = self.table.grant(req_id, now=t, ttl=ttl)
        except LocalProtocolError as exc:  # an id that cannot go on the wire: no D can name it
            logger.error("Not leasing KV blocks for request %r (%s): freeing them now", req_id, exc)
            self._due.discard(req_id)
            self.refused.append(req_id)
            return
        self.granted += 1
        if self.trace.enabled:
            left = self.table.deadline(req_id)
            named: dict[str, Any] = {} if writers is None else {"writers": list(writers)}
            # the lease began when vLLM's scheduler stamped it: the grant is its rest
            self.trace.emit(
                "grant",
                now=t,
                req=req_id,
                consumers=1,
                lease=None if left is None else left - t,
                rebased=True,
                kind=self.grant_kind,
                **named,
            )
        if release is not None:  # staged early notifications completed it at once
            self.trace.release(release, 0)
            self.settled.append(release)

    def abort(self, req_id: str, *, now: float | None = None) -> Release | None:
        """End ``req_id``'s lease now (vLLM deleted it from ``_reqs_to_send``)."""
        t = self.now() if now is None else now
        self.trace.emit("abort_req", now=t, req=req_id)
        release = self.table.abort(req_id, now=t)
        if release is not None:
            self.trace.release(release, 0)
        return release

    def reap(self) -> list[Release]:
        """Expire every lease whose deadline has passed, plus the already-due grants."""
        now = self.now()
        for rid in self._due:
            d = self.table.deadline(rid)
            if d is not None and d > now:
                now = d
        self._due.clear()
        self._last = max(self._last, now)
        released = list(self.table.expire(now=now))
        self.trace.expire(now, len(released))
        for release in released:
            self.trace.release(release, 0)
        return released

    def take_granted(self) -> int:
        """Leases granted since the last call (``vllm:leaseproto_leases_granted``)."""
        out, self.granted = self.granted, 0
        return out

    def take_settled(self) -> list[Release]:
        """Releases produced by grants that staged notifications completed."""
        out, self.settled = self.settled, []
        return out

    def take_refused(self) -> list[str]:
        """Ids the table refused to lease: the caller frees their blocks."""
        out, self.refused = self.refused, []
        return out

    def transfer_done(
        self, req_id: str, readers: int, *, now: float | None = None
    ) -> Release | TransferCounted | LateTransfer | None:
        """One transfer-done carrying vLLM's ``n`` (``readers``): the lease ends
        after ``readers`` of them (the core counts them)."""
        t = self.now() if now is None else now
        out = self.table.transfer_done(req_id, now=t, readers=readers)
        if isinstance(out, Release):
            self.trace.release(out, 0)
        return out

    def readers_done(self, req_id: str) -> int:
        """Transfer-dones counted so far for a live lease."""
        info = self.table.lease_info(req_id)
        return 0 if info is None else int(info["done"] or 0)

    def reset(self, deadlines: Mapping[str, float]) -> None:
        """Replace every lease by ``deadlines`` (id -> absolute deadline), keeping
        their order: what assigning a dict to ``_reqs_to_send`` means."""
        self.table = LeaseTable(self.config)
        self._due.clear()
        self.settled = []
        base = min([self._clock(), *(d - 1.0 for d in deadlines.values())])
        self._last = base
        for rid, d in deadlines.items():
            self.grant_until(rid, float(d), now=base)


class LeaseView(MutableMapping[str, float]):
    """``_reqs_to_send``: request id -> deadline, read from the lease table."""

    __slots__ = ("_leases",)

    def __init__(self, leases: WorkerLeases) -> None:
        self._leases = leases

    def __getitem__(self, req_id: str) -> float:
        d = self._leases.table.deadline(req_id)
        if d is None:
            raise KeyError(req_id)
        return d

    def __setitem__(self, req_id: str, deadline: float) -> None:
        self._leases.grant_until(req_id, float(deadline))

    def __delitem__(self, req_id: str) -> None:
        if req_id not in self._leases.table:
            raise KeyError(req_id)
        self._leases.abort(req_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._leases.table.live())

    def __len__(self) -> int:
        return len(self._leases.table)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._leases.table

    def __repr__(self) -> str:
        return f"LeaseView({dict(self.items())!r})"
