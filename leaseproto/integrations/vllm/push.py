"""Push mode's lease (spec §2.8 "Push mode"), with no vLLM import.

In vLLM's push mode D allocates a request's blocks before prefill and
registers them with P (``PUSH_REG:`` + a msgpack dict); P WRITEs its KV into
them and the WRITE's notification (``<d_id>:<n>``) tells D it is done. Here:

- **D grants.** The registration is a lease in D's own table (kind ``push``,
  initial lease ``push_registration_timeout``). D advertises ``leaseproto/1``
  in the registration itself (:func:`registration_advert`, the dict's
  ``"leaseproto"`` key, which a stock P ignores).
- **P renews.** A leaseproto P heartbeats an advertising D for each
  registration it holds (``HB:`` naming D's id, batched per D engine, the
  core's tracker) while P holds the request (:class:`PushWrites`: its
  scheduler has it, or its WRITE is running), and stops when the WRITE is done.
  Its first heartbeat to each D agent names the capability too
  (``HB:leaseproto/1``), which is how D learns that P understands ``LL:`` and
  ``AB:``.
- **D verifies (I15).** The WRITE's notification is a transfer-done for D's
  table: D uses the pushed KV only if the table handled it while the
  registration was live; otherwise the receive fails and vLLM recomputes.
- **Quarantine.** A registration that ended without its WRITE (expired, or D
  gave up) is never used, and its blocks are not handed back while a
  leaseproto P may still be writing: D reports the receive only once every P
  rank that writes here has completed or aborted (``AB:<d_id>``), P's engine
  is forgotten, or ``stale_after`` has passed (:class:`Registrations`).
- **P gives up.** P sends ``AB:<d_id>`` for a registration it will not write
  (its request ended, ``LL:`` from D, its WRITE failed) once no WRITE of it is
  in flight.

A stock P never heartbeats: its registrations end at
``push_registration_timeout`` (vLLM's one-shot watchdog) and the receive fails
then, unverified. A stock D advertises nothing: P sends it nothing of ours.
"""

from __future__ import annotations

import queue
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .verify import agent_name

__all__ = [
    "PUSH_KIND",
    "PUSH_REG_PREFIX",
    "HeldRegistration",
    "PushRouter",
    "PushWrites",
    "Registrations",
    "base_id",
    "registration_advert",
    "registration_ttl",
]

#: ``kind`` of D's advertisement in a registration, and of its grant in the trace.
PUSH_KIND = "push"
#: The registration's key for it (the same as P's ``kv_transfer_params`` key).
ADVERT_KEY = "leaseproto"
#: vLLM's registration message: this prefix, then a msgpack dict.
PUSH_REG_PREFIX = b"PUSH_REG:"

# vLLM's per-engine suffix of a request id (``input_processor.assign_request_id``)
_SUFFIX = re.compile(r"-[0-9a-f]{8}$", re.IGNORECASE)


def base_id(req_id: str) -> str:
    """``req_id`` without vLLM's random ``-<8 hex>`` suffix: P's and D's ids for
    one request differ only in it (vLLM matches registrations this way)."""
    return _SUFFIX.sub("", req_id)


def registration_advert(advert: dict[str, Any], ttl: float) -> dict[str, Any]:
    """D's advertisement in a registration: the scheduler's, with the initial
    lease ``push_registration_timeout`` and ``"kind": "push"``."""
    lease = {**advert.get("lease", {}), "kv_lease_duration": float(ttl)}
    return {**advert, "kind": PUSH_KIND, "lease": lease}


def _advert(reg: dict[str, Any]) -> dict[str, Any] | None:
    advert = reg.get(ADVERT_KEY)
    if isinstance(advert, dict) and advert.get("v") == 1 and advert.get("kind") == PUSH_KIND:
        return advert
    return None


def registration_ttl(reg: dict[str, Any]) -> float | None:
    """The initial lease D advertised for a registration (None: no advertisement)."""
    advert = _advert(reg)
    ttl = None if advert is None else advert.get("lease", {}).get("kv_lease_duration")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        return None
    return float(ttl)


class PushRouter:
    """vLLM's NIXL agent as vLLM's writer thread polls it: registrations go to
    the writer (it handles them), everything else, with its sender, to ``inbox``
    for the engine's main thread (vLLM's writer forwards only the bytes)."""

    def __init__(self, inner: Any, inbox: queue.Queue[tuple[str, bytes]]) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "inbox", inbox)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def get_new_notifs(self, *args: Any, **kw: Any) -> dict[Any, list[bytes]]:
        out: dict[Any, list[bytes]] = {}
        for sender, msgs in self.inner.get_new_notifs(*args, **kw).items():
            for raw in msgs:
                data = bytes(raw)
                if data.startswith(PUSH_REG_PREFIX):
                    out.setdefault(sender, []).append(raw)
                else:
                    self.inbox.put((agent_name(sender), data))
        return out


# -- P ------------------------------------------------------------------------------------
@dataclass
class HeldRegistration:
    """A registration of an advertising D that P holds."""

    d_id: str
    engine: str
    host: str
    port: int
    tp: int
    arrived: float
    seen_alive: bool = False


class PushWrites:
    """P's registrations of advertising decoders, between vLLM's writer thread
    (registrations arrive, WRITEs start) and the engine's main thread
    (heartbeats, giving up). ``grace``: how long a registration may wait for
    P's scheduler to hold its request before P gives it up."""

    def __init__(self, grace: float, *, max_cancelled: int = 4096) -> None:
        self.grace = grace
        self.max_cancelled = max_cancelled
        self._lock = threading.Lock()
        self._arrived: list[HeldRegistration] = []
        self._writing: dict[str, str] = {}  # d_id -> P's request id its WRITE is for
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        #: main thread: registrations held, by D's id
        self.held: dict[str, HeldRegistration] = {}
        #: main thread: base id -> P's requests with that base its scheduler holds
        self.alive: dict[str, set[str]] = {}

    # -- vLLM's writer thread ------------------------------------------------------------------
    def arrived(self, reg: dict[str, Any], *, now: float) -> bool:
        """A ``PUSH_REG`` arrived; True if D advertised (P renews and may abort it)."""
        d_id = reg.get("request_id")
        if _advert(reg) is None or not isinstance(d_id, str):
            return False
        try:
            held = HeldRegistration(
                d_id,
                str(reg["decode_engine_id"]),
                str(reg["decode_host"]),
                int(reg["decode_port"]),
                int(reg["decode_tp_size"]),
                now,
            )
        except (KeyError, TypeError, ValueError):
            return False
        with self._lock:
            if d_id not in self._cancelled:
                self._arrived.append(held)
        return True

    def may_write(self, d_id: str, p_id: str) -> bool:
        """Before the WRITE of P's ``p_id`` into D's ``d_id``: False if P gave the
        registration up (no WRITE then); else it is writing from now on."""
        with self._lock:
            if d_id in self._cancelled:
                return False
            self._writing[d_id] = p_id
            return True

    # -- the main thread -----------------------------------------------------------------------
    def take_arrived(self) -> list[HeldRegistration]:
        with self._lock:
            out, self._arrived = self._arrived, []
        for reg in out:
            self.held[reg.d_id] = reg
        return out

    def writing(self, d_id: str) -> str | None:
        with self._lock:
            return self._writing.get(d_id)

    def cancel(self, d_id: str) -> HeldRegistration | None:
        """Give ``d_id`` up: the registration, if P held it and no WRITE of it
        started (P then tells D: ``AB:``); None otherwise."""
        with self._lock:
            if d_id in self._writing:
                return None
            self._cancelled[d_id] = None
            while len(self._cancelled) > self.max_cancelled:
                self._cancelled.popitem(last=False)
        return self.held.pop(d_id, None)

    def written(self, p_id: str) -> list[HeldRegistration]:
        """P's WRITEs for ``p_id`` are over (done or failed): the registrations
        they were for, no longer held."""
        with self._lock:
            ids = [d for d, p in self._writing.items() if p == p_id]
            for d in ids:
                del self._writing[d]
        return [r for r in (self.held.pop(d, None) for d in ids) if r is not None]

    def set_alive(self, changes: dict[str, bool]) -> None:
        """The scheduler's news: P request id -> held (True) or let go (False)."""
        for p_id, held in changes.items():
            ids = self.alive.setdefault(base_id(p_id), set())
            if held:
                ids.add(p_id)
            else:
                ids.discard(p_id)
                if not ids:
                    del self.alive[base_id(p_id)]

    def step(self, *, now: float) -> tuple[list[HeldRegistration], list[HeldRegistration]]:
        """(registrations to heartbeat, registrations to give up) now."""
        renew, give_up = [], []
        with self._lock:
            writing = set(self._writing)
        for reg in self.held.values():
            if reg.d_id in writing or base_id(reg.d_id) in self.alive:
                reg.seen_alive = True
                renew.append(reg)
            elif reg.seen_alive or now - reg.arrived >= self.grace:
                give_up.append(reg)
        return renew, give_up


# -- D ------------------------------------------------------------------------------------
@dataclass
class _Registration:
    engine: str  # P's
    writers: int  # P ranks that WRITE into this D rank
    reported: set[str] = field(default_factory=set)  # P agents that completed or aborted
    anonymous: int = 0  # completions with no known sender (vLLM's test path)
    failed_at: float | None = None  # the lease ended without its WRITE: quarantined since
    why: str = ""


class Registrations:
    """D's registrations whose receive vLLM has not been told about yet."""

    def __init__(self, stale_after: float) -> None:
        self.stale_after = stale_after
        self._regs: dict[str, _Registration] = {}
        #: P engines that said they understand ``leaseproto/1`` (their heartbeats did)
        self.peer_engines: set[str] = set()

    def __contains__(self, d_id: object) -> bool:
        return d_id in self._regs

    def __len__(self) -> int:
        return len(self._regs)

    def granted(self, d_id: str, engine: str, writers: int) -> None:
        self._regs[d_id] = _Registration(engine, max(1, writers))

    def engine(self, d_id: str) -> str | None:
        reg = self._regs.get(d_id)
        return None if reg is None else reg.engine

    def ids(self) -> list[str]:
        return list(self._regs)

    def reported(self, d_id: str, agent: str | None) -> None:
        """P agent ``agent`` completed or aborted its WRITE into ``d_id``."""
        reg = self._regs.get(d_id)
        if reg is None:
            return
        if agent is None:
            reg.anonymous += 1
        else:
            reg.reported.add(agent)

    def failed(self, d_id: str, *, now: float, why: str) -> bool:
        """The lease of ``d_id`` ended without its WRITE. True: quarantine it (a
        leaseproto P may still be writing); False: its P is stock (or it was
        failed already), nothing more to wait for."""
        reg = self._regs.get(d_id)
        if reg is None:
            return False
        if reg.failed_at is None:
            reg.failed_at, reg.why = now, why
        return reg.engine in self.peer_engines

    def failing(self, d_id: str) -> bool:
        reg = self._regs.get(d_id)
        return reg is not None and reg.failed_at is not None

    def settled(self, d_id: str) -> bool:
        """Whether every P rank writing here has completed or aborted."""
        reg = self._regs.get(d_id)
        return reg is not None and len(reg.reported) + reg.anonymous >= reg.writers

    def released(self, *, now: float, forgotten: set[str]) -> list[tuple[str, str]]:
        """Quarantined registrations whose blocks go back now, and why: every
        writer reported, P's engine forgotten, or ``stale_after`` passed."""
        out = []
        for d_id, reg in self._regs.items():
            if reg.failed_at is None:
                continue
            if self.settled(d_id) or reg.engine not in self.peer_engines:
                out.append((d_id, reg.why))
            elif reg.engine in forgotten:
                out.append((d_id, f"{reg.why}; prefill engine {reg.engine} forgotten"))
            elif now - reg.failed_at >= self.stale_after:
                out.append(
                    (d_id, f"{reg.why}; no word from {reg.engine} in {self.stale_after:g} s")
                )
        return out

    def drop(self, d_id: str) -> None:
        self._regs.pop(d_id, None)
