"""LeaseTable against the naive model (leaseproto.testing.machine), with the
invariants I1-I7 and I10 checked after every step."""

from hypothesis import settings

from leaseproto.testing.machine import LeaseTableMachine

LeaseTableMachine.TestCase.settings = settings(
    settings.default,
    stateful_step_count=100,
    max_examples=settings.default.max_examples,
)
TestLeaseTableMachine = LeaseTableMachine.TestCase
