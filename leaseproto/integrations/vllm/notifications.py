"""What the connector's worker does with each NIXL notification. No vLLM import.

P: heartbeats renew through the core's rule, transfer-dones count readers from
vLLM's ``n``, aborts end the lease, each only from a D agent the lease is bound
to (:class:`~.binding.ReaderBindings`); a hello loads the greeting D's metadata
so P can answer with verdicts (:class:`~.binding.Greeters`), and decoders that
fell silent are forgotten (with a cluster key, P answers each hello it could
verify, which opens the sealed connection; :mod:`.sealing`). D:
``OK:``/``NK:``/``LL:`` go to the
:class:`~.verify.ReadVerifier`, which takes them only from the P agents the
read went to.

Every line a peer can trigger here is rate-limited (:class:`DropLog`, one line
per kind per second, then a count).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from leaseproto import LateTransfer, Release, ReleaseReason, wire
from leaseproto.adapters.droplog import DropLog
from leaseproto.adapters.trace_writer import text
from leaseproto.core.mac_peers import ANSWER

from .agents import metadata_agent_name
from .binding import Greeters, ReaderBindings
from .verify import agent_name, decode_hello

if TYPE_CHECKING:
    from leaseproto.core.mac_peers import PeerAuth

    from .leases import WorkerLeases
    from .verify import ReadVerifier, Settled

__all__ = ["NotificationHandling"]

logger = logging.getLogger("vllm.leaseproto.worker")


class NotificationHandling:
    """Mixed into :class:`~.worker.LeaseprotoConnectorWorker` (vLLM's worker)."""

    nixl_wrapper: Any
    xfer_stats: Any

    if TYPE_CHECKING:

        def _leases(self) -> WorkerLeases: ...

        def _verifier(self) -> ReadVerifier: ...

        def _stat(self, key: str, n: int = 1) -> None: ...

        def _auth(self) -> PeerAuth | None: ...

    # -- state (on workers built with object.__new__ too, as vLLM's tests do) -------------
    def _drops(self) -> DropLog:
        d: DropLog | None = self.__dict__.get("_lp_drops")
        if d is None:
            d = self.__dict__["_lp_drops"] = DropLog(logger)
        return d

    def _notes(self) -> DropLog:
        """Rate-limited lines about what a peer made happen (not drops)."""
        d: DropLog | None = self.__dict__.get("_lp_notes")
        if d is None:
            d = self.__dict__["_lp_notes"] = DropLog(logger, prefix="")
        return d

    def _bindings(self) -> ReaderBindings:
        b: ReaderBindings | None = self.__dict__.get("_lp_bindings")
        if b is None:
            b = ReaderBindings(self._leases().config.heartbeat_interval)
            self.__dict__["_lp_bindings"] = b
        return b

    def _greeters(self) -> Greeters:
        g: Greeters | None = self.__dict__.get("_lp_greeters")
        if g is None:
            g = self.__dict__["_lp_greeters"] = Greeters(self._leases().config.tombstone_ttl)
        return g

    # -- every notification -----------------------------------------------------------------
    def _get_new_notifs(self) -> set[str]:
        got = self.nixl_wrapper.get_new_notifs()
        # requests found done sending by a poll of a step's verdict wait come first (taken
        # once NIXL answered: a poll that raises keeps them for the next)
        done: set[str] = self.__dict__.pop("_lp_done_carry", None) or set()
        for agent, notifs in got.items():
            for raw in notifs:
                self._on_notification(agent, raw, done)
        return done

    def _on_notification(self, agent: str, raw: bytes, done: set[str]) -> None:
        self._greeters().heard(agent, now=self._leases().now())
        hello = decode_hello(raw)
        if hello is not None:
            self._handled(agent, raw)
            self._on_hello(agent, hello)
            return
        try:
            msg = wire.decode(raw)
        except wire.MalformedMessage as exc:
            self._handled(agent, raw)
            self._stat("lp_malformed")
            self._drops().drop("malformed notification", f"from {agent}: {exc}")
            return
        if isinstance(msg, wire.Heartbeat):
            self._renew(msg.ids, agent, raw)
        elif isinstance(msg, wire.TransferDone):
            self._transfer_done(msg.req_id, msg.count, done, agent, raw)
        elif isinstance(msg, (wire.Ok, wire.Nack, wire.LeaseLost)):
            ignored = self._verifier().on_message(msg, agent)
            if ignored is not None:
                self._stat(f"lp_{ignored}_verdicts")
                self._drops().drop(
                    f"{ignored} verdict", f"{type(msg).__name__} for {msg.req_id} from {agent}"
                )
        elif isinstance(msg, wire.Abort):
            lp = self._leases()
            now = lp.now()
            if msg.req_id in lp.table and not self._admit(msg.req_id, agent, now=now, act="abort"):
                self._handled(agent, raw, now, (msg.req_id,))
                self._foreign("abort", msg.req_id, agent)
                return
            self._handled(agent, raw, now)
            release = lp.table.abort(msg.req_id, now=now)
            if release is not None:
                lp.trace.release(release, 0)
                self._stat("lp_aborted")
                self._released(release, done)
        else:
            self._handled(agent, raw)
            self._stat("lp_malformed")
            self._drops().drop("not a message for P", f"{type(msg).__name__} from {agent}")

    def _handled(
        self,
        agent: str,
        raw: bytes,
        now: float | None = None,
        refused: tuple[str, ...] = (),
        **extra: Any,
    ) -> None:
        """Trace the notification P hands its lease table now, with the ids it
        refused (bound to other agents), before what it does (check-trace).
        ``extra``: how the table reads it where that is not the bytes alone
        (push mode: ``ids`` a heartbeat's ids resolved to, ``readers``)."""
        trace = self._leases().trace
        if trace.enabled:
            if refused:
                extra["refused"] = list(refused)
            t = self._leases().now() if now is None else now
            trace.emit("handle", now=t, src=agent, data=text(bytes(raw)), **extra)

    def _foreign(self, what: str, req_id: str, agent: str, n: int = 1) -> None:
        self._stat("lp_foreign_acts", n)
        self._drops().drop(
            "act for a lease bound to another agent", f"{what} for {req_id} from {agent}"
        )

    # -- D: what became of a verified read ------------------------------------------------------
    def _read_settled(self, read: Settled) -> None:
        """Trace a read D uses; log one it fails (P's NK, or no verdict in time),
        rate-limited: vLLM then recomputes it (``kv_load_failure_policy``)."""
        if read.ok:
            self._leases().trace.emit(
                "use", req=read.local_id, remote=read.remote_id, ok_from=read.agents
            )
            return
        kind = "read refused" if read.how.startswith("NK:") else "verdict timeout"
        self._notes().drop(
            kind,
            f"request {read.local_id} (prefill's {read.remote_id}): {read.how}; what was read "
            "is not used: the request fails its KV load (recomputed under "
            "kv_load_failure_policy=recompute)",
        )

    # -- hooks (push mode's worker overrides them) -----------------------------------------------
    def _admit(self, req_id: str, agent: str, *, now: float, act: str, readers: int = 1) -> bool:
        """May ``agent`` do ``act`` for the lease ``req_id``? (leases bound to their reader)"""
        return self._bindings().admit(req_id, agent, now=now, act=act, readers=readers)

    def _answers_to(self, agent: str) -> bool:
        """Whether ``agent`` said it understands our answers (``LL:``, verdicts)."""
        return agent in self._greeters()

    def _lease_ids(self, ids: tuple[str, ...]) -> tuple[str, ...]:
        """The lease ids a heartbeat's ids name (push mode's P: by base id too)."""
        return ids

    # -- P: heartbeats, transfer-dones --------------------------------------------------------
    def _handle_heartbeat(self, payload: str) -> None:
        """vLLM's entry point (its tests call it): a heartbeat of no known sender."""
        try:
            msg = wire.decode(b"HB:" + payload.encode("utf-8", "surrogateescape"))
        except wire.MalformedMessage as exc:
            self._stat("lp_malformed")
            self._drops().drop("malformed heartbeat", str(exc))
            return
        assert isinstance(msg, wire.Heartbeat)
        self._renew(msg.ids)

    def _renew(
        self, ids: tuple[str, ...], agent: str | None = None, raw: bytes | None = None
    ) -> None:
        lp = self._leases()
        now = lp.now()
        named = ids
        ids = mapped = self._lease_ids(ids)
        foreign: list[str] = []
        if agent is not None:
            foreign = [
                r
                for r in ids
                if r in lp.table and not self._admit(r, agent, now=now, act="heartbeat")
            ]
            if foreign:
                self._foreign("heartbeat", foreign[0], agent, len(foreign))
                skip = set(foreign)
                ids = tuple(r for r in ids if r not in skip)
        before = lp.table.stats
        lost: list[str] = []
        if agent is not None and raw is not None:
            resolved = {"ids": list(mapped)} if mapped != named else {}
            self._handled(agent, raw, now, tuple(foreign), **resolved)
        renewed = lp.table.renew(ids, now=now, lost=lost)
        if lp.trace.enabled and agent is not None and ids:
            left = {rid: lp.table.deadline(rid) for rid in ids}
            lp.trace.emit(
                "renew", now=now, leases={r: d - now for r, d in left.items() if d is not None}
            )
        if agent is not None and self._answers_to(agent):
            for rid in lost:  # advisory: D may give up early; a verdict still decides
                self._answer(agent, wire.lease_lost(rid, lp.table.lost_reason(rid, now=now)))
        after = lp.table.stats
        self._stat("lp_leases_renewed", renewed)
        self._stat("lp_heartbeat_ids_unknown", after.renew_unknown - before.renew_unknown)
        self._stat("lp_heartbeat_ids_late", len(lost))

    def _transfer_done(
        self,
        req_id: str,
        readers: int,
        done: set[str],
        agent: str | None = None,
        raw: bytes | None = None,
    ) -> None:
        lp = self._leases()
        table = lp.table
        now = lp.now()
        known = (
            req_id in table
            or table.ended(req_id) is not None
            or req_id in getattr(self, "_reqs_to_process", ())
        )
        if (
            known
            and agent is not None
            and not self._admit(req_id, agent, now=now, act="transfer", readers=readers)
        ):
            if raw is not None:
                self._handled(agent, raw, now, (req_id,))
            self._foreign("transfer-done", req_id, agent)
            return
        if agent is not None and raw is not None:
            self._handled(agent, raw, now)
        result = lp.transfer_done(req_id, readers, now=now) if known else None
        answer: wire.Message | None = None
        if agent is not None and self._answers_to(agent):
            if known and result is None:  # early: staged, answered when the grant settles it
                self.__dict__.setdefault("_lp_early", {}).setdefault(req_id, []).append(agent)
            else:
                answer = wire.verdict(req_id, result)
                self._answer(agent, answer)
        if not known:
            self._unrecognized(req_id, None, answer)
        elif isinstance(result, Release):
            self._released(result, done)
        elif isinstance(result, LateTransfer):
            self._stat("lp_late_reads")
            self._unrecognized(req_id, result.ended, answer)

    def _unrecognized(
        self, req_id: str, ended: ReleaseReason | None, answer: wire.Message | None
    ) -> None:
        """A transfer-done for a lease that is not live: what happened, and what
        the decoder does about it (rate-limited)."""
        self.xfer_stats.record_notification_after_expiry()
        how = "no lease known" if ended is None else f"lease {ended.value}"
        if isinstance(answer, wire.Nack):  # D discards the read: nothing invalid is used
            self._notes().drop(
                "late transfer-done",
                f"request {req_id} ({how}): answered NK:{answer.reason}; the decode worker "
                "does not use what it read and recomputes it (kv_load_failure_policy)",
                level=logging.INFO,
            )
        else:
            self._notes().drop(
                "late transfer-done",
                f"request {req_id} ({how}): potentially invalid KV blocks were read by a decode "
                "worker that takes no verdicts (stock vLLM); it may use them",
            )

    def _released(self, release: Release, done: set[str]) -> None:
        getattr(self, "_reqs_to_process", set()).discard(release.req_id)
        self.__dict__.get("consumer_notification_counts_by_req", {}).pop(release.req_id, None)
        self.__dict__.get("expected_consumer_notifications_by_req", {}).pop(release.req_id, None)
        done.add(release.req_id)

    def _answer(self, agent: str, msg: wire.Message) -> None:
        try:
            for payload in wire.encode(msg):
                self.nixl_wrapper.send_notif(agent, notif_msg=payload)
            self._stat("lp_verdicts_sent" if not isinstance(msg, wire.LeaseLost) else "lp_ll_sent")
        except Exception as exc:
            self._stat("lp_verdict_send_failures")
            self._drops().drop("unsent answer", f"{type(msg).__name__} to {agent}: {exc!r}")

    # -- P: decoders it can notify ------------------------------------------------------------
    def _on_hello(self, agent: str, metadata: bytes) -> None:
        greeters = self._greeters()
        now = self._leases().now()
        if agent in greeters:  # greeted again after a silence: still loaded
            self._answer_hello(agent)
            return
        named = metadata_agent_name(metadata)
        if named is not None and named != agent:  # another agent's metadata: not loaded
            self._stat("lp_malformed")
            self._drops().drop("hello", f"from {agent} carried the metadata of {named}")
            return
        try:
            name = agent_name(self.nixl_wrapper.add_remote_agent(metadata))
        except Exception as exc:
            self._stat("lp_malformed")
            self._drops().drop("hello", f"from {agent}: {exc!r}")
            return
        if name != agent:  # metadata naming another agent: squatting, not a greeting
            self._remove_agent(name)
            self._stat("lp_malformed")
            self._drops().drop("hello", f"from {agent} carried the metadata of {name}")
            return
        greeters.add(agent, name, now=now)
        self._answer_hello(agent)
        last = self.__dict__.get("_lp_hello_logged", -1.0e18)
        if now - last >= 1.0:  # at most a line a second, however many decoders greet
            self.__dict__["_lp_hello_logged"] = now
            logger.info(
                "Decode agent %s understands %s: verdicts will be sent to it "
                "(%d decode agents loaded)",
                agent,
                wire.CAPABILITY,
                len(greeters),
            )

    def _answer_hello(self, agent: str) -> None:
        """With a cluster key: answer a (verified) hello, which opens the
        sealed connection D's heartbeats and transfer-dones wait for."""
        if self._auth() is None:
            return
        try:
            self.nixl_wrapper.send_notif(agent, notif_msg=ANSWER)
        except Exception as exc:
            self._drops().drop("unsent answer", f"to hello of {agent}: {exc!r}")

    def _forget_silent_decoders(self) -> None:
        """Remove the NIXL agents of greeters with no live lease bound to them
        and nothing heard for ``tombstone_ttl``."""
        lp = self._leases()
        bindings = self._bindings()

        def busy(agent: str) -> bool:
            return any(rid in lp.table for rid in bindings.leases_of(agent))

        silent = self._greeters().silent(now=lp.now(), busy=busy)
        for _, name in silent:
            self._remove_agent(name)
        if silent:
            lp.trace.emit("forget", now=lp.now(), agents=[a for a, _ in silent])
            self._greeters().forget(a for a, _ in silent)
            self._stat("lp_decoders_forgotten", len(silent))
            logger.info("Forgot %d silent decode agent(s)", len(silent))

    def _remove_agent(self, name: str) -> None:
        try:
            self.nixl_wrapper.remove_remote_agent(name)
        except Exception as exc:
            self._drops().drop("agent removal", f"{name}: {exc!r}")

    def _prune_bindings(self) -> None:
        """Forget the bindings of leases the table no longer remembers."""
        table = self._leases().table
        staged = getattr(self, "_reqs_to_process", ())
        self._bindings().prune(
            lambda rid: rid in table or table.ended(rid) is not None or rid in staged
        )
