"""D's push registrations inside :class:`~leaseproto.integrations.vllm.LeaseprotoPushConnector`
(spec §2.8 "Push mode", I15). No vLLM import.

What D does with a registration is decided by the core's
:class:`~leaseproto.core.push.PushRegistrations` (the code the model checker's
``push`` scope runs); this mixin feeds it and acts on its answers:

- **Registered.** When vLLM's writer thread has sent a registration
  (:class:`~.push.SentRegistration`: ``PUSH_REG`` went to each P agent vLLM's
  handshake gave D for P's engine, one per P rank and pipeline stage that
  WRITEs into this D rank), the main thread grants it a lease in D's table
  (kind ``push``, ``push_registration_timeout``) and registers it with those
  agents as its *writers*. A registration whose send to a writer raised
  forgets that writer at once: it never got the registration, so it will
  neither write nor abort.
- **Completions.** A writer's ``<d_id>:<n>`` goes to the table (counted against
  the number of writers), its verdict (``OK``: the lease was live) to
  ``completion``; ``AB:<d_id>`` to ``abort``; each release of the lease to
  ``ended``. ``USE`` reports the receive done; nothing else ever does.
- **Free.** The receive is reported failed (vLLM recomputes into the blocks or
  frees them) only for what ``take_free`` returns: a registration that ended
  with a writer still owed stays *quarantined* (not reported, so its blocks
  stay with the request) until each such writer completed, aborted or was
  forgotten.
- **Forgetting a writer** (``forget``): its agent is gone from vLLM's
  connections for P's engine, a send to it failed, or nothing was heard from it
  for ``max(10 kv_lease_duration, max_lease_lifetime)`` while a quarantine owes
  it (counted from the lapse). What that discards and is still leased ends now
  (D aborts the lease), so any later completion from it is ``NK`` and unused.
- **Stock P.** A P engine that never said ``leaseproto/1`` never aborts: at
  the end of its registration's lease D does not wait for it
  (``ended(wait=False)``), unverified, as the spec's stock fallback says.

Traced for ``check-trace``: the push ``grant`` names its writers,
``quarantine`` (``req``, ``writers``), ``unquarantine`` (``req``) and
``forget`` (``agents``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leaseproto import Release, ReleaseReason, wire
from leaseproto.core.push import DISCARD, USE, PushRegistrations

from .notifications import NotificationHandling
from .push import PUSH_KIND, SentRegistration, registration_ttl
from .verify import agent_name

__all__ = ["PushDecoder"]

logger = logging.getLogger("vllm.leaseproto.worker")

#: Settled registrations remembered, to recognise a late completion (oldest dropped).
_SETTLED = 4096
#: Agents whose last word D remembers before it drops those it heard from long ago.
_HEARD = 1024


@dataclass(frozen=True, slots=True)
class Registered:
    """A registration of D's: P's engine and the writers it was sent to."""

    engine: str
    writers: tuple[str, ...]


class PushDecoder(NotificationHandling):
    """Mixed into :class:`~.push_worker.LeaseprotoPushConnectorWorker` (see the module)."""

    _remote_agents: dict[str, dict[tuple[int, int], Any]]
    _recving_metadata: dict[str, Any]
    _recving_transfers: dict[str, list[int]]
    _recv_failures: set[str]

    if TYPE_CHECKING:  # vLLM's

        def _handle_failed_transfer(
            self,
            req_id: str,
            handle: int | None,
            failed_req_ids: set[str] | None = None,
            record_failed_transfer: bool = True,
        ) -> bool: ...

    # -- state (also on workers built with object.__new__, as vLLM's tests do) ------------------
    def _push_regs(self) -> PushRegistrations:
        r: PushRegistrations | None = self.__dict__.get("_lp_regs")
        if r is None:
            r = self.__dict__["_lp_regs"] = PushRegistrations()
        return r

    def _registered(self) -> dict[str, Registered]:
        """The registrations ``_push_regs`` holds, with their engine and writers."""
        out: dict[str, Registered] = self.__dict__.setdefault("_lp_registered", {})
        return out

    def _settled(self) -> OrderedDict[str, Registered]:
        """Registrations settled lately (used or freed)."""
        out: OrderedDict[str, Registered] = self.__dict__.setdefault(
            "_lp_settled_regs", OrderedDict()
        )
        return out

    def _peer_engines(self) -> set[str]:
        """P engines that said ``leaseproto/1`` (their capability heartbeat did)."""
        out: set[str] = self.__dict__.setdefault("_lp_push_peer_engines", set())
        return out

    def _quarantined_since(self) -> dict[str, float]:
        out: dict[str, float] = self.__dict__.setdefault("_lp_quarantined", {})
        return out

    def _heard(self) -> dict[str, float]:
        """P agent -> when D last handled anything from it."""
        out: dict[str, float] = self.__dict__.setdefault("_lp_heard", {})
        return out

    def _why(self) -> dict[str, str]:
        """Why a registration's pushed KV was discarded (its failure's log line)."""
        out: dict[str, str] = self.__dict__.setdefault("_lp_push_why", {})
        return out

    def _registration_engine(self, d_id: str) -> str | None:
        reg = self._registered().get(d_id) or self._settled().get(d_id)
        return None if reg is None else reg.engine

    def _silence_bound(self) -> float:
        cfg = self._leases().config
        return max(10 * cfg.kv_lease_duration, cfg.max_lease_lifetime or 0.0)

    # -- vLLM's writer thread --------------------------------------------------------------------
    def _reg_sent_to(self, agent: str, msg: bytes, ok: bool) -> None:
        """The router saw a registration sent to ``agent`` (``ok``: no error)."""
        sends: list[tuple[str, bool]] | None = self.__dict__.get("_lp_reg_sends")
        if sends is not None:
            sends.append((agent, ok))

    # -- the main thread -------------------------------------------------------------------------
    def _grant_registration(self, sent: SentRegistration) -> None:
        """A registration left D: a lease in D's table, registered with its writers."""
        d_id, writers = sent.d_id, tuple(sorted(set(sent.writers)))
        if d_id not in self._recving_metadata or d_id in self._registered() or not writers:
            return  # vLLM reported the receive already, or sent it again
        lp = self._leases()
        ttl = registration_ttl(sent.reg) or lp.config.decoder_kv_blocks_ttl
        if lp.config.max_lease_lifetime is not None:
            ttl = min(ttl, lp.config.max_lease_lifetime)
        engine = str(sent.reg.get("remote_engine_id"))
        now = lp.now()
        kind, lp.grant_kind = lp.grant_kind, PUSH_KIND  # a kv_both engine grants P leases too
        try:
            lp.grant_until(d_id, now + ttl, now=now, writers=writers)
        finally:
            lp.grant_kind = kind
        if d_id not in lp.table:
            return  # an id the table refused
        self._push_regs().register(d_id, writers)
        self._registered()[d_id] = Registered(engine, writers)
        if sent.unsent:
            self._forget_writers(sent.unsent, "the registration could not be sent to it")

    def _completion(self, msg: wire.TransferDone, agent: str, raw: bytes) -> None:
        """A writer's WRITE completion: the table's verdict, then the registry's."""
        lp = self._leases()
        now, d_id = lp.now(), msg.req_id
        if not self._admit(d_id, agent, now=now, act="transfer"):
            self._handled(agent, raw, now, (d_id,))
            self._foreign("write completion", d_id, agent)
            return
        reg = self._registered().get(d_id) or self._settled().get(d_id)
        readers = 1 if reg is None else len(reg.writers)
        self._handled(agent, raw, now, readers=readers)
        result = lp.transfer_done(d_id, readers, now=now)
        verdict = wire.verdict(d_id, result)
        act = self._push_regs().completion(d_id, agent, ok=isinstance(verdict, wire.Ok))
        if self._answers_to(agent):
            self._answer(agent, verdict)
        if isinstance(verdict, wire.Nack):
            self._stat("lp_push_writes_refused")
            self._notes().drop(
                "late write",
                f"registration {d_id}: a WRITE from {agent} completed after the registration "
                f"ended ({verdict.reason}); what it wrote is not used (recomputed under "
                "kv_load_failure_policy=recompute)",
            )
        if act == USE:
            self._used(d_id)
        elif act == DISCARD:
            self._why().setdefault(d_id, f"{agent}'s WRITE completed after it ended")
        if isinstance(result, Release):
            self._registration_ended(result)
        self._free_registrations()

    def _aborted_by_p(self, d_id: str, agent: str, raw: bytes) -> None:
        """``AB:<d_id>``: the writer will not write; the lease ends now."""
        lp = self._leases()
        now = lp.now()
        if not self._admit(d_id, agent, now=now, act="abort"):
            self._handled(agent, raw, now, (d_id,))
            self._foreign("abort", d_id, agent)
            return
        self._handled(agent, raw, now)
        why = "the prefill engine aborted it"
        if self._push_regs().abort(d_id, agent) == DISCARD:
            self._why().setdefault(d_id, why)
        release = lp.table.abort(d_id, now=now)
        if release is not None:
            lp.trace.release(release, 0)
            self._stat("lp_aborted")
            self._registration_ended(release, why=why)
        self._free_registrations()

    def _aborted_here(self, d_id: str) -> None:
        """D: the request ended while its registration waited. With a leaseproto
        P the registration ends now (P hears ``LL:`` at its next heartbeat and
        says ``AB:`` unless its WRITE is running); a stock P may still write, so
        its registration runs on to the end of its lease, as vLLM's watchdog."""
        reg = self._registered().get(d_id)
        lp = self._leases()
        if reg is None or reg.engine not in self._peer_engines() or d_id not in lp.table:
            return
        release = lp.abort(d_id)
        if release is not None:
            self._registration_ended(release, why="the request ended on the decoder")

    def _registration_ended(self, release: Release, why: str | None = None) -> None:
        """A release of a registration's lease (expired, aborted, transferred)."""
        d_id = release.req_id
        reg = self._registered().get(d_id)
        if reg is None:
            return  # used already
        regs = self._push_regs()
        why = why or f"registration {release.reason.value}"
        waits = reg.engine in self._peer_engines()
        if regs.ended(d_id, wait=waits) == DISCARD:
            self._why().setdefault(d_id, why)
        owed = regs.owed(d_id)
        if owed and d_id not in self._quarantined_since():
            lp = self._leases()
            self._quarantined_since()[d_id] = lp.now()
            lp.trace.emit("quarantine", req=d_id, writers=sorted(owed))
            self._stat("lp_push_quarantined")
            self._notes().drop(
                "registration held",
                f"{d_id}: {why}; its blocks stay with it until {', '.join(sorted(owed))} "
                "completes or aborts its WRITE, or is forgotten",
                level=logging.INFO,
            )
        elif not waits and release.reason is not ReleaseReason.TRANSFERRED:
            said: set[str] = self.__dict__.setdefault("_lp_stock_logged", set())
            if reg.engine not in said:
                said.add(reg.engine)
                logger.warning(
                    "Prefill engine %s did not say %s: its registrations end after "
                    "push_registration_timeout (vLLM's watchdog), unverified, and the request "
                    "is recomputed (kv_load_failure_policy)",
                    reg.engine,
                    wire.CAPABILITY,
                )
        self._free_registrations()

    def _forget_writers(self, agents: Iterable[str], why: str) -> None:
        """D gives up on these P agents: no registration granted so far waits
        for them; what that discards and is still leased ends now."""
        names = sorted({str(a) for a in agents})
        if not names:
            return
        lp = self._leases()
        regs = self._push_regs()
        lp.trace.emit("forget", now=lp.now(), agents=names)
        self._stat("lp_push_writers_forgotten", len(names))
        logger.info("Forgot prefill agent(s) %s: %s", ", ".join(names), why)
        discarded = [d_id for a in names for d_id in regs.forget(a)]
        for d_id in discarded:
            self._why().setdefault(d_id, f"{why} ({', '.join(names)} forgotten)")
            if d_id in lp.table:
                release = lp.abort(d_id)
                if release is not None:
                    self._registration_ended(release, why=self._why()[d_id])
        self._free_registrations()

    def _push_step(self) -> None:
        """Each step: forget the owed writers that are gone from vLLM's
        connections, and those a quarantine owes that were silent too long."""
        registered = self._registered()
        if not registered:
            return
        regs = self._push_regs()
        agents: dict[str, set[str]] = {}
        gone: set[str] = set()
        for d_id, reg in registered.items():
            if reg.engine not in agents:
                known = self._remote_agents.get(reg.engine, {})
                agents[reg.engine] = {agent_name(a) for a in list(known.values())}
            gone |= regs.owed(d_id) - agents[reg.engine]
        if gone:
            self._forget_writers(gone, "gone from the decoder's connections")
        now, bound, heard = self._leases().now(), self._silence_bound(), self._heard()
        silent = {
            w
            for d_id, since in self._quarantined_since().items()
            for w in regs.owed(d_id)
            if now - max(since, heard.get(w, since)) >= bound
        }
        if silent:
            self._forget_writers(silent, f"nothing heard from it in {bound:g} s")
        if len(heard) > _HEARD:
            for a in [a for a, t in heard.items() if now - t >= bound]:
                del heard[a]

    def _heard_from(self, agent: str) -> None:
        self._heard()[agent] = self._leases().now()

    def _unsent(self, agent: str) -> None:
        """A send to ``agent`` failed: forgotten, if a registration waits for it."""
        regs = self._push_regs()
        if any(agent in regs.owed(d_id) for d_id in self._registered()):
            self._forget_writers([agent], "a send to it failed")

    # -- telling vLLM ----------------------------------------------------------------------------
    def _settle_record(self, d_id: str) -> None:
        reg = self._registered().pop(d_id, None)
        if reg is None:
            return
        settled = self._settled()
        settled[d_id] = reg
        while len(settled) > _SETTLED:
            settled.popitem(last=False)

    def _used(self, d_id: str) -> None:
        """Every writer's completion was ``OK``: the receive is done."""
        self._settle_record(d_id)
        self._why().pop(d_id, None)
        if d_id not in self._recving_metadata:
            return  # vLLM's own failure path reported it already
        self._recving_transfers.setdefault(d_id, [])
        self._leases().trace.emit("use", req=d_id, remote=d_id, kind="push")
        self._stat("lp_push_writes_verified")

    def _free_registrations(self) -> None:
        """Report failed each receive whose blocks the registry frees."""
        lp = self._leases()
        for d_id in self._push_regs().take_free():
            self._settle_record(d_id)
            if self._quarantined_since().pop(d_id, None) is not None:
                lp.trace.emit("unquarantine", req=d_id)
            how = self._why().pop(d_id, "registration ended")
            if d_id not in self._recving_metadata:
                continue  # vLLM's own failure path reported it already
            self._handle_failed_transfer(
                d_id, None, self._recv_failures, record_failed_transfer=False
            )
            self._stat("lp_push_recv_failed")
            self._notes().drop(
                "push receive failed",
                f"request {d_id}: {how}; the request fails its KV load (recomputed under "
                "kv_load_failure_policy=recompute)",
            )
