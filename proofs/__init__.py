"""z3 proofs of the lease protocol's invariants over the rules the runtime executes,
and of the runtime's hot loops equal to those rules (:mod:`leaseproto.proofs.loops`).

``python -m leaseproto.proofs`` (or ``leaseproto prove``) checks every obligation; see
:mod:`leaseproto.proofs.check`. Models: :mod:`leaseproto.proofs.model` (one lease on P, one engine
on D, the read gate) and :mod:`leaseproto.proofs.timing_model` (both sides composed in real
time); invariants by id: :mod:`leaseproto.proofs.invariants`, :mod:`leaseproto.proofs.timing`
(stated there, predicates in :mod:`leaseproto.proofs.timing_invariants`); schedules showing
each assumption is needed: :mod:`leaseproto.proofs.counterexamples`.

This folder sits at the top of the repository for readers and is installed as
the subpackage ``leaseproto.proofs`` (``pyproject.toml`` maps it), so a wheel
adds no top-level ``proofs`` package.
"""
