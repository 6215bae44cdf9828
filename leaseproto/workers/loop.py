"""What every worker process shares: the run loop, the options of a rank
that holds KV, and the request-plane ops every worker answers (``ping``,
``stats``). Stopping a worker is not a request-plane op (anyone who can reach
the port could send it): a worker stops on SIGTERM or SIGINT, and logs it."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import zmq

from ..adapters.nixl import NixlEndpoint
from ..core.config import LeaseConfig
from ..core.mac import FRAME_OVERHEAD, ClusterKey
from ..core.wire import MAX_ID_BYTES, VERDICT_OVERHEAD
from .keys import load_cluster_key
from .notifications import MAX_INCOMING_BYTES, DropLog
from .plane import Msg, Server

__all__ = ["IDLE_WAIT_S", "PENDING_WAIT_S", "EngineLoop", "RankOptions", "wait_for_input"]

#: Longest a worker's loop waits for request-plane traffic before it polls
#: NIXL again, when it expects no notification.
IDLE_WAIT_S = 0.005
#: The longest wait while a notification is expected soon (P holds a live lease,
#: D has a read or a verdict outstanding): the loop turns at least this often
#: (expiry, READ completion). A notification ends the wait when it arrives,
#: give or take the endpoint's check interval (:func:`wait_for_input`).
PENDING_WAIT_S = 0.001

log = logging.getLogger("leaseproto.workers")

_O = TypeVar("_O", bound="RankOptions")


@dataclass
class RankOptions:
    """Options of a prefill or decode rank (a process with a KV pool)."""

    config: LeaseConfig
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = 0
    nixl_port: int = 0
    rank: int = 0
    tp: int = 1
    device: str = "cpu"
    num_blocks: int = 256
    block_size: int = 4
    model_seed: int = 0
    policy: str = "lease"
    #: largest incoming notification handled; larger ones are dropped and counted
    max_notification_in: int = MAX_INCOMING_BYTES
    #: write a structured event trace here (:mod:`.trace`); None: no trace
    trace: str | None = None
    #: seal leaseproto's NIXL messages and run the request plane over CURVE
    #: (``--cluster-key-file``; :mod:`.keys`); None: unauthenticated
    cluster_key: ClusterKey | None = None

    @classmethod
    def from_args(
        cls: type[_O],
        args: argparse.Namespace,
        config: LeaseConfig,
        metrics_port: int | None,
        **extra: Any,
    ) -> _O:
        """From ``leaseproto serve``'s parsed flags; ``extra``: the subclass's fields."""
        return cls(
            config=config,
            host=args.host,
            port=args.port,
            metrics_port=metrics_port,
            nixl_port=args.nixl_port,
            rank=args.rank,
            tp=args.tp,
            device=args.device,
            num_blocks=args.num_blocks,
            block_size=args.block_size,
            model_seed=args.model_seed,
            policy=args.policy,
            max_notification_in=args.max_incoming_notification_bytes,
            trace=getattr(args, "trace", None),
            cluster_key=load_cluster_key(getattr(args, "cluster_key_file", None)),
            **extra,
        )

    def check(self) -> None:
        if self.policy not in ("lease", "fixed"):
            raise ValueError(f"policy must be 'lease' or 'fixed', got {self.policy!r}")
        if not 0 <= self.rank < self.tp:
            raise ValueError(f"rank {self.rank} is not in 0..{self.tp - 1}")
        if self.max_notification_in < self.config.max_notification_bytes:
            raise ValueError(
                f"max_notification_in={self.max_notification_in} is below "
                f"max_notification_bytes={self.config.max_notification_bytes}: "
                "our own heartbeats would be dropped"
            )
        if self.cluster_key is not None:
            if self.policy != "lease":
                raise ValueError("a cluster key needs policy 'lease' (its greeting starts it)")
            least = MAX_ID_BYTES + VERDICT_OVERHEAD + FRAME_OVERHEAD
            if self.config.max_notification_bytes < least:
                raise ValueError(
                    f"with a cluster key, max_notification_bytes must be at least {least} "
                    f"(the longest verdict plus the {FRAME_OVERHEAD}-byte frame), got "
                    f"{self.config.max_notification_bytes}"
                )


def wait_for_input(
    sock: zmq.Socket[bytes], wait_s: float, notifications: NixlEndpoint | None = None
) -> None:
    """Wait up to ``wait_s`` seconds for a request on ``sock``, and, with
    ``notifications`` (an endpoint a notification is expected on soon), until
    one arrives there too. NIXL offers nothing to block on, so the second is
    the endpoint's poll-and-sleep (:meth:`~leaseproto.adapters.nixl.NixlEndpoint.wait`,
    which checks ``sock`` at each of its checks); the first is a blocking poll
    (a worker expecting no notification wakes only for requests and its
    timeout: its idle CPU)."""
    if notifications is None:
        sock.poll(max(1, round(wait_s * 1000)), zmq.POLLIN)
        return

    def has_request() -> bool:  # without a syscall: the socket's own event state
        return bool(cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN)

    notifications.wait(wait_s, until=has_request)


class EngineLoop:
    """A single-threaded engine loop: ``run`` calls ``step`` until ``stop``."""

    server: Server
    _stop: bool = False
    #: leave the loop when this process's parent is no longer this pid
    parent_pid: int | None = None
    #: the rate-limited log of refused request-plane ops (made at the first)
    _stop_refusals: DropLog | None = None

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """One line for the log when the loop starts."""
        raise NotImplementedError

    def pong(self) -> Msg:
        raise NotImplementedError

    def stats(self) -> Msg:
        raise NotImplementedError

    def run(self) -> None:
        log.info("%s", self.describe())
        turns = 0
        try:
            while not self._stop:
                self.step()
                turns += 1
                if (
                    self.parent_pid is not None
                    and turns % 100 == 0
                    and os.getppid() != self.parent_pid
                ):
                    log.warning("parent process %d is gone: stopping", self.parent_pid)
                    break
        finally:
            self.close()

    def stop(self, why: str = "asked to stop") -> None:
        """Leave the loop after the current step (signal handlers call it)."""
        if not self._stop:
            log.warning("%s: stopping after this step", why)
        self._stop = True

    def common_op(self, envelope: list[bytes], msg: Msg) -> bool:
        """Answer ``ping`` and ``stats`` (and refuse ``stop``); False for any other op."""
        op = msg["op"]
        if op == "ping":
            self.server.reply(envelope, {"op": "pong", **self.pong()})
        elif op == "stats":
            self.server.reply(envelope, {"op": "stats", **self.stats()})
        elif op == "stop":  # not from the network: a signal stops a worker
            if self._stop_refusals is None:
                self._stop_refusals = DropLog(log)
            self._stop_refusals.drop("request-plane 'stop'", f"send SIGTERM to pid {os.getpid()}")
            self.server.reply(
                envelope,
                {"op": "error", "error": "stop is not a request-plane op: send SIGTERM"},
            )
        else:
            return False
        return True
