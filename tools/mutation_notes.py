"""Survivors of the mutation run (tools/mutation_run.py), classified by hand.

``EQUIVALENT`` maps a mutant's key to why no test can tell it from the original
(the behaviour it changes cannot be observed through the module's interface, or
it changes none). A survivor not listed here counts as not killed.
"""

EQUIVALENT: dict[str, str] = {}
