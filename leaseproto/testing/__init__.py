"""Test support shipped with the package (zarr style): a deliberately naive
reference model of :class:`~leaseproto.LeaseTable` and a hypothesis
``RuleBasedStateMachine`` that drives both and checks they agree, with every
invariant named by its spec id. Importing :mod:`leaseproto.testing.machine`
needs hypothesis (the ``test`` extra)."""

from ..checker.naive import NaiveLeaseTable

__all__ = ["NaiveLeaseTable"]
