"""The serving workers of ``leaseproto serve``: prefill, decode and router
processes built on the adapters, serving the toy model
(:mod:`leaseproto.toymodel`), and what only they use.

- prefill (:mod:`.prefill`): its leases (:mod:`.prefill_leases`), what their
  readers say and are answered (:mod:`.prefill_acts`), the readers they are
  bound to (:mod:`.prefill_binding`), its reads of D's cached turns
  (:mod:`.prefill_prefix`);
- decode rank 0 (:mod:`.decode`), built from parts: the leases it holds at P
  (:mod:`.decode_leases`), which P agents it verifies
  (:mod:`.decode_verification`), its reads of P (:mod:`.decode_reads`), its
  links to ranks 1.. (:mod:`.decode_fanout`), the cached turns it grants
  (:mod:`.decode_turns`), the model's tokens and its answers
  (:mod:`.decode_output`); one request's path through them is walked in
  :mod:`.decode_scheduler`. Ranks 1.. are :mod:`.decode_follower`;
- router (:mod:`.router`, conversations in :mod:`.conversations`);
- shared: the loop (:mod:`.loop`), one rank's NIXL, KV pool and model
  (:mod:`.backend`), the request plane (:mod:`.plane`, :mod:`.messages`), the
  cluster key (:mod:`.keys`), notifications (:mod:`.notifications`), metrics,
  event traces and the verdict decisions the checker drives (:mod:`.verdicts`).

Modules import torch, NIXL and ZeroMQ themselves; importing this package
imports nothing heavy.
"""

from __future__ import annotations

__all__: list[str] = []
