"""Verified reads on D (invariant I13), with no vLLM import.

A READ from a P that advertised ``leaseproto/1`` is reported to vLLM's scheduler
(``finished_recving``) only once P answered its transfer-done with ``OK:``; on
``NK:``, or with no verdict within the bound, it is reported as a failed load,
so vLLM's ``kv_load_failure_policy`` (recompute) takes over. A READ from a stock
P is passed through unverified, as stock vLLM does.

For P to answer, it must be able to notify D: D's first message to an
advertised P is a hello carrying D's NIXL agent metadata, which P loads.
The hello contains ``,`` right after its first word, so it can never parse as a
vLLM message (a request id has no ``,``; a heartbeat starts with ``HB:``), and it
is only ever sent to a P that advertised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leaseproto import wire

__all__ = ["HELLO_PREFIX", "ReadVerifier", "VerifierStats", "decode_hello", "encode_hello"]

#: D -> P: "I understand leaseproto/1; here is my NIXL agent metadata".
HELLO_PREFIX = (wire.CAPABILITY + ",hello,").encode()


def encode_hello(agent_metadata: bytes) -> bytes:
    return HELLO_PREFIX + bytes(agent_metadata)


def decode_hello(raw: bytes) -> bytes | None:
    """D's agent metadata if ``raw`` is a hello, else ``None``."""
    data = bytes(raw)
    return data[len(HELLO_PREFIX) :] if data.startswith(HELLO_PREFIX) else None


@dataclass
class VerifierStats:
    verified: int = 0  # READs reported after P's OK
    refused: int = 0  # READs failed on P's NK
    timed_out: int = 0  # READs failed for want of a verdict within the bound
    lease_lost: int = 0  # advisory LL answers received
    unverified: int = 0  # READs from a P that did not advertise


@dataclass
class _Read:
    remote_id: str
    completed_at: float | None = None


@dataclass
class ReadVerifier:
    """Holds finished READs back until their verdict; ``bound`` seconds after a
    READ completes without one, it fails."""

    bound: float
    stats: VerifierStats = field(default_factory=VerifierStats)
    _reads: dict[str, _Read] = field(default_factory=dict)  # local id -> read
    _by_remote: dict[str, str] = field(default_factory=dict)  # P's id -> local id
    _verdicts: dict[str, bool] = field(default_factory=dict)  # P's id -> OK?

    def expect(self, local_id: str, remote_id: str) -> None:
        """A READ of ``remote_id`` (P's id) for ``local_id`` goes to an advertised P."""
        if local_id not in self._reads:
            self._reads[local_id] = _Read(remote_id)
            self._by_remote[remote_id] = local_id

    def on_message(self, msg: wire.Message) -> None:
        """An ``OK:``, ``NK:`` or ``LL:`` from P (others are ignored)."""
        if isinstance(msg, wire.Ok):
            self._verdicts.setdefault(msg.req_id, True)
        elif isinstance(msg, wire.Nack):
            self._verdicts[msg.req_id] = False  # one NK is enough: the read is suspect
        elif isinstance(msg, wire.LeaseLost):
            self.stats.lease_lost += 1

    def settle(self, done: set[str], failed: set[str], *, now: float) -> tuple[set[str], set[str]]:
        """vLLM's finished and failed READs of this step -> what to report now.

        Returns ``(done, failed)``: a failed id is also in ``done`` (vLLM's
        convention); READs waiting for their verdict are in neither."""
        out_done, out_failed = set(done), set(failed)
        for local in failed:
            self._drop(local)
        for local in done - failed:
            read = self._reads.get(local)
            if read is not None and read.completed_at is None:
                read.completed_at = now
        for local, read in list(self._reads.items()):
            if read.completed_at is None:
                continue
            ok = self._verdicts.get(read.remote_id)
            if ok is None and now - read.completed_at < self.bound:
                out_done.discard(local)  # held: no verdict yet
                continue
            if ok:
                self.stats.verified += 1
            else:
                if ok is None:
                    self.stats.timed_out += 1
                else:
                    self.stats.refused += 1
                out_failed.add(local)
            out_done.add(local)
            self._drop(local)
        return out_done, out_failed

    def held(self) -> list[str]:
        """Local ids of finished READs waiting for a verdict."""
        return [k for k, r in self._reads.items() if r.completed_at is not None]

    def _drop(self, local: str) -> None:
        read = self._reads.pop(local, None)
        if read is not None:
            self._by_remote.pop(read.remote_id, None)
            self._verdicts.pop(read.remote_id, None)
