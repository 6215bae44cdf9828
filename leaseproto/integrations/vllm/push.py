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
  agent it registered with (its *writers*) has completed or aborted
  (``AB:<d_id>``) or is forgotten. Both decisions are the core's
  :class:`~leaseproto.core.push.PushRegistrations` (:mod:`.push_decoder`).
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .verify import agent_name

__all__ = [
    "PUSH_KIND",
    "PUSH_REG_PREFIX",
    "HeldRegistration",
    "PushRouter",
    "PushWrites",
    "SentRegistration",
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


@dataclass(frozen=True)
class SentRegistration:
    """D's writer thread sent a registration (``PUSH_REG``) to ``writers``, the
    P agents vLLM's handshake gave D for P's engine (one per P rank and pipeline
    stage that WRITEs into this D rank); ``unsent``: those whose send raised.
    Queued for the main thread ahead of anything P can answer it with."""

    d_id: str
    reg: dict[str, Any]
    writers: tuple[str, ...]
    unsent: tuple[str, ...]


#: what the main thread takes from the router: a notification with its sender, or a
#: registration D's writer thread sent
Inbound = tuple[str, bytes] | SentRegistration


class PushRouter:
    """vLLM's NIXL agent as vLLM's writer thread uses it: registrations go to
    the writer (it handles them), everything else, with its sender, to ``inbox``
    for the engine's main thread (vLLM's writer forwards only the bytes). Each
    send of a registration is told to ``on_send`` (agent, message, sent)."""

    def __init__(
        self,
        inner: Any,
        inbox: queue.Queue[Inbound],
        on_send: Callable[[str, bytes, bool], None] | None = None,
    ) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "inbox", inbox)
        object.__setattr__(self, "on_send", on_send)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def send_notif(self, agent: Any, *args: Any, **kw: Any) -> Any:
        msg = kw.get("notif_msg", args[0] if args else b"")
        if self.on_send is None or not bytes(msg).startswith(PUSH_REG_PREFIX):
            return self.inner.send_notif(agent, *args, **kw)
        try:
            out = self.inner.send_notif(agent, *args, **kw)
        except Exception:
            self.on_send(agent_name(agent), bytes(msg), False)
            raise
        self.on_send(agent_name(agent), bytes(msg), True)
        return out

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
