"""Survivors of the mutation run (tools/mutation_run.py), classified by hand.

``EQUIVALENT`` maps a mutant's key to why no test can tell it from the original
(the behaviour it changes cannot be observed through the module's interface, or
it changes none). A survivor not listed here counts as not killed.
"""

#: a fast-path guard whose failure falls through to the full check, which does the same
_FAST_PATH = (
    "a fast-path guard: when it fails, the slow path (`advance`, `_clock`) runs the full "
    "check, which accepts the same inputs and stores the same state"
)

EQUIVALENT: dict[str, str] = {
    "tracker.py:HeartbeatTracker.track:LtE -> Lt:self._last_now <= now < _INF#0": _FAST_PATH
    + " (`now == last` then takes `_clock(now)`: it sets `_last_now = now`, as the fast path does)",
    "tracker.py:HeartbeatTracker._threshold:constant 8 -> 9:8#0": "the bound of the search for the "
    "float threshold only decides when to give the shortcut up: a threshold is returned only once "
    "the rule says it is exact (due at it, not due at the float below), and giving up returns -inf "
    "(no shortcut: `due` asks the rule for each engine), so any bound gives the same `due` answers",
    "specialise.py:<module>:constant 1 -> 2:1#0": "`_PREC['or']` 1 -> 2 (equal to `and`): the "
    "printer writes every operand of `and`/`or` with parentheses at equal precedence (`tight`), so "
    "the change only adds parentheses around an `and` or `or` inside an `or`; `not`, `if`, the "
    "arithmetic and comparisons still bind as before (2 is between `if` 0 and `not` 3, like 1)",
    "specialise.py:_renew_form:statement deleted:"
    "deadline = simplify(deadline, assume(applies))#0": (
        "simplifying the deadline under the assumption that the renewal applies is an "
        "optimisation: the unsimplified expression is the rule's own and equals the simplified "
        "one wherever the loop uses it (only when it applies); tests/test_specialise.py proves "
        "either equal to the rule"
    ),
}
