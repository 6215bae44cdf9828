"""z3 proofs of the lease protocol's invariants over the rules the runtime executes.

``python -m proofs`` (or ``leaseproto prove``) checks every obligation; see
:mod:`proofs.check`. Models: :mod:`proofs.model` (one lease on P, one engine
on D, the read gate) and :mod:`proofs.timing_model` (both sides composed in real
time); invariants by id: :mod:`proofs.invariants`, :mod:`proofs.timing`;
schedules showing each assumption is needed: :mod:`proofs.counterexamples`.
"""
