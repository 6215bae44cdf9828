"""What the core hands back to its caller: small frozen value objects."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from operator import attrgetter
from typing import Any, overload

__all__ = [
    "LateTransfer",
    "Release",
    "ReleaseReason",
    "Releases",
    "TransferCounted",
    "make_releases",
]


class ReleaseReason(Enum):
    """Why a lease ended."""

    #: Every expected transfer-done notification arrived.
    TRANSFERRED = "transferred"
    #: The deadline passed without renewal.
    EXPIRED = "expired"
    #: D aborted the request (notify-only abort).
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Release:
    """Free this request's blocks now.

    Attributes:
        req_id: P's request id.
        reason: why the lease ended.
        at: the ``now`` of the call that released it.
        granted_at: when the lease was granted.
        deadline: the lease's deadline when it ended.
        last_renewal: ``now`` of the last heartbeat that renewed it, or ``None``.
    """

    req_id: str
    reason: ReleaseReason
    at: float
    granted_at: float = field(default=0.0, kw_only=True)
    deadline: float = field(default=0.0, kw_only=True)
    last_renewal: float | None = field(default=None, kw_only=True)


#: Each field's slot (its member descriptor's ``__set__``): storing through it is what the
#: frozen ``__init__`` does too (``object.__setattr__``), one C call a field.
_SET = {name: getattr(Release, name).__set__ for name in Release.__slots__}
_GET = {name: attrgetter(name) for name in ("req_id", "granted_at", "deadline", "last_renewal")}
_new = object.__new__
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend


def make_releases(leases: Sequence[Any], reason: ReleaseReason, at: float) -> list[Release]:
    """``Release(l.req_id, reason, at, granted_at=l.granted_at, deadline=l.deadline,
    last_renewal=l.last_renewal)`` for each of ``leases``, for ``expire`` releasing
    thousands at once: the objects are made first, then each field is stored in all of
    them by one ``map`` over its slot, at C speed (``tests/test_hot_paths.py`` checks
    the result equals the constructor's)."""
    out: list[Release] = list(map(_new, repeat(Release, len(leases))))
    _consume(map(_SET["reason"], out, repeat(reason)))
    _consume(map(_SET["at"], out, repeat(at)))
    for name, get in _GET.items():
        _consume(map(_SET[name], out, map(get, leases)))
    return out


class Releases(Sequence[Release]):
    """The releases of one ``LeaseTable.expire`` call, in release order: a sequence of
    :class:`Release` that builds them when one is first read (all at once, by
    :func:`make_releases`), and equals the list of them. :attr:`ids` are the released
    ids, at no cost: a caller that only frees blocks by id pays for no record (the
    records a release is built from are those of ended leases, never written again).
    """

    __slots__ = ("_at", "_built", "_leases", "_reason", "ids")
    __hash__ = None  # type: ignore[assignment]  # equals a list

    def __init__(
        self, leases: Sequence[Any], ids: list[str], reason: ReleaseReason, at: float
    ) -> None:
        self._leases = leases
        #: the released ids, in release order
        self.ids = ids
        self._reason = reason
        self._at = at
        self._built: list[Release] | None = None

    def _all(self) -> list[Release]:
        built = self._built
        if built is None:
            built = self._built = make_releases(self._leases, self._reason, self._at)
            self._leases = ()
        return built

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> Release: ...
    @overload
    def __getitem__(self, index: slice) -> list[Release]: ...
    def __getitem__(self, index: int | slice) -> Release | list[Release]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Release]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Releases):
            return self._all() == other._all()
        if isinstance(other, list):
            return self._all() == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"Releases({self._all()!r})"


@dataclass(frozen=True, slots=True)
class TransferCounted:
    """A transfer-done counted against a live lease that still waits for more
    readers: the blocks stay held, and this reader's read was good (I13: it is
    answered OK).

    Attributes:
        req_id: P's request id.
        at: the ``now`` of the call that counted it.
        done: transfer-dones counted so far, this one included.
        readers: how many complete the lease (the notification's ``n``, or
            the granted ``consumers`` when it carried none).
    """

    req_id: str
    at: float
    done: int = field(kw_only=True)
    readers: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class LateTransfer:
    """A transfer-done arrived for a lease that had already ended -- expired,
    aborted, or completed by earlier transfer-dones: the reader may have read
    blocks that were freed and reused. The caller must act on it (answer the
    reader NK so it discards the read and recomputes, I13).

    Attributes:
        req_id: P's request id.
        ended: how the lease had ended (``EXPIRED``, ``ABORTED`` or ``TRANSFERRED``).
        at: the ``now`` of the call that saw the notification.
        ended_at: when the lease ended.
    """

    req_id: str
    ended: ReleaseReason
    at: float
    ended_at: float = field(default=0.0, kw_only=True)
