"""Survivors of the mutation run (tools/mutation_run.py), classified by hand.

``EQUIVALENT`` maps a mutant's key to why no test can tell it from the original
(the behaviour it changes cannot be observed through the module's interface, or
it changes none). A survivor not listed here counts as not killed.
"""

#: conj's two-operand shortcut, narrowed (it admits fewer pairs, never a non-bool)
_CONJ_FAST = (
    "conj's shortcut for two plain bools (`a and b`) taken for fewer pairs: it still admits "
    "only pairs of bools (so never asks a z3 term for its truth value), and a pair "
    "it no longer takes falls through to the loop, which finds no symbolic operand and "
    "returns `False not in conds`: the same bool as `a and b` for every pair of bools"
)

#: tracker.payloads's cutting loop: a cut at offset 0 cannot happen for the ids it takes
_CUT_0 = (
    "`cut == 0` would need a comma at the start of the joined ids (`rfind` from `start`, and "
    "`start` is 0 only in the first round), that is an empty first id, which `track` refuses; "
    "for the ids `payloads` takes (checked by `track`) `cut` is -1 or past the first id, never 0"
)

#: deadlines.py's unused attrgetter (removed since)
_DEAD_REQ_ID = (
    "deadlines.py:<module>:statement deleted:"
    "_REQ_ID: Callable[[Lease], str] = attrgetter('req_id')#0"
)

EQUIVALENT: dict[str, str] = {
    "tracker.py:HeartbeatTracker._threshold:constant 8 -> 9:8#0": "the bound of the search for the "
    "float threshold only decides when to give the shortcut up: a threshold is returned only once "
    "the rule says it is exact (due at it, not due at the float below), and giving up returns -inf "
    "(no shortcut: `due` asks the rule for each engine), so any bound gives the same `due` answers",
    # -- tracker.py --
    "tracker.py:HeartbeatTracker._new_engine:constant 1 -> 2:1#0": "the order counter is "
    "read only as the sort key of `due` (`self._order.__getitem__`) and, in the checker's "
    "fingerprint, as ranks; counting by 2 keeps every engine's rank, so the same order",
    "tracker.py:HeartbeatTracker.__init__:constant 0 -> 1:0#0": "the order counter's first "
    "value: it is read only as the sort key of `due` and, in the checker's fingerprint, as "
    "ranks; starting at 1 keeps every engine's rank, so the same order",
    "tracker.py:_Requests.__init__:statement deleted:super().__init__()#0": "`dict.__init__()` "
    "with no arguments adds nothing: `dict.__new__` already made the mapping, empty, and "
    "`__slots__` gives `engine` its slot without any base initialiser",
    "tracker.py:HeartbeatTracker._threshold:return None:return -math.inf#1": "the branch "
    "cannot run: `oldest` is a `now` the tracker accepted (finite) and `interval` a finite "
    "positive config value, so `oldest + interval` is a number or +inf, never NaN",
    "tracker.py:HeartbeatTracker.payloads:LtE -> Lt:len(data) <= room#0": "an id list of "
    "exactly `room` bytes then goes to the cutting loop, which runs no round (`last = "
    "len(data) - room = 0`, so `start < last` fails) and appends `_HB + data[0:]`: the one "
    "message the shortcut returns",
    "tracker.py:HeartbeatTracker.due:Gt -> GtE:len(due) > 1#0": "the guard only skips "
    "sorting a list of one engine (or none); sorting it (`>= 1`) leaves it as it is",
    "tracker.py:HeartbeatTracker.payloads:Lt -> LtE:cut < 0#0": _CUT_0,
    "tracker.py:HeartbeatTracker.payloads:constant 0 -> 1:0#1": "`cut < 1`: " + _CUT_0,
    # -- clock.py --
    "clock.py:ClockOffset.__init__:statement deleted:self._at = 0.0#0": "`_at` is read only "
    "where `_offset` is not None (`add_sample`'s comparison, `sampled_at`), and `add_sample`, "
    "the one place that sets `_offset`, sets `_at` with it: the initial value is never read",
    "clock.py:ClockOffset.add_sample:GtE -> Gt:t0 >= self._at#0": "at `t0 == _at` both "
    "branches compare the same numbers: the age is 0 and `aged_uncertainty(x, 0, rho)` is "
    "`x + 2 rho / (1 - rho) * 0 = x` exactly, so `new < kept` either way",
    # -- checks.py --
    "checks.py:advance:statement deleted:"
    "raise LocalProtocolError(f'now={now!r} is not a time')#0": (
        "the raise cannot run: `check_now` before it raises for every `now` that fails "
        "`last <= now < inf and now > -inf` or is a bool (not a number, a bool, NaN, an "
        "infinity, or before `last`; an int or float never makes the comparison raise "
        "TypeError); it only tells mypy the branch ends"
    ),
    # -- wire.py --
    "wire.py:_encode_plain:return None:return []#0": "`_encode_plain` is read only by "
    "`encode_heartbeat`, which on None runs `_encode_each` on the same items: with no ids "
    "that returns `[]` too",
    "clock.py:ClockOffset.__init__:statement deleted:self._rtt = math.inf#0": "`_rtt` is read "
    "only where `_offset` is not None (the comparison in `add_sample`, `uncertainty`), and the "
    "one place that sets `_offset` (`add_sample`) sets `_rtt` just before it: the initial value "
    "is never read (an unset slot also copies as nothing: the checker's `copy.copy`)",
    # -- deadlines.py --
    "deadlines.py:DeadlineQueue.take_due:Lt -> LtE:bucket[-1].seq < lease.seq#0": "the inline "
    "requeue appends instead of `bisect.insort` also when the bucket's last entry has the same "
    "`seq`: a bucket is always sorted by `seq` (`push` takes the largest `seq` yet, every other "
    "insertion goes in order, `compact` and `copy` keep the order), so `insort` (insort_right: "
    "after every entry whose key is `<=`) puts the lease at the end too, as `append` does",
    "deadlines.py:DeadlineQueue.requeue:Gt -> GtE:bucket[-1].seq > lease.seq#0": "`requeue` "
    "takes `bisect.insort` instead of `push` (an append, the bucket existing) also when the "
    "bucket's last entry has the same `seq`; a bucket is sorted by `seq`, so insort_right puts "
    "the lease at the end too: the same list (the take_due entry above, for the inline copy)",
    "deadlines.py:DeadlineQueue.grant:statement deleted:self._tail = deadline#0": "`_tail` is "
    "read only by `grant`'s test `self._tail <= deadline`, which can only be true: a grant in "
    "the list has the deadline `grant_deadline(now, ttl) = now + ttl` for the queue's one "
    "`ttl`, the table refuses a `now` before the last it saw, and `now + ttl` does not "
    "decrease as `now` grows (float addition is monotone), so each such deadline is at least "
    "the latest one's; left at -inf, the test is true as well: every grant goes where it went",
    "deadlines.py:DeadlineQueue._requeue_all:return None:return False#0": "its one caller reads "
    "the answer only as the condition of `if len(renewed) > 1 and self._requeue_all(renewed)`, "
    "where `None` is as false as `False`: the per-deadline loop runs either way",
    "deadlines.py:DeadlineQueue._queue_group:Lt -> LtE:bucket[-1].seq < leases[0].seq#0": "the "
    "group is appended instead of merged also when the bucket's last entry has the same `seq` as "
    "the group's first: the bucket and the group are each sorted by `seq`, so every entry of the "
    "bucket is `<=` every one of the group, and the stable sort of `bucket + leases` returns that "
    "very concatenation: the same list",
    "deadlines.py:DeadlineQueue.take_due:constant 0 -> 1:0#1": "the group path is then tried "
    "when the second entry, not the first, has moved from `d`: `_requeue_all` does anything "
    "only when every entry is live and has the first's deadline, and then all of them have "
    "moved or none has. Where they have, both versions requeue them as one group; where the "
    "two entries differ, or one is stale, it answers False and the loop below runs, as when "
    "the path is skipped: the same calendar",
    "deadlines.py:DeadlineQueue.take_due:Gt -> GtE:len(popped) > 1#0": "a bucket of one "
    "renewed lease then goes to `_requeue_all` too: for a live lease its checks hold (held, "
    "its deadline equal to itself) and `_queue_group(later, [lease])` is what the loop below "
    "does with it; for an ended one `_requeue_all` finds it not held and answers False, so "
    "the loop below drops it as before: the same calendar either way",
    "deadlines.py:DeadlineQueue._take_grants:Gt -> GtE:len(renewed) > 1#0": "a single renewed "
    "lease then goes through `_requeue_all` too: its checks hold for one live lease (held, and "
    "its deadline equal to itself), and `_queue_group(later, [lease])` is what the per-deadline "
    "loop below does with a group of one: the same calendar",
    "deadlines.py:DeadlineQueue._take_grants:return None:return run#0": "`run` is empty there, "
    "and the one caller, `take_due`, reads the answer only as `if not granted: return out`, "
    "where `None` is as false as `[]`: the same list is returned",
    "deadlines.py:DeadlineQueue.next_deadline:Lt -> LtE:first < d#0": "`first if first < d "
    "else d`: the two differ only where `first == d`, and then both return that value",
    "deadlines.py:DeadlineQueue._requeue_all:constant 0 -> 1:0#0": "`later` is then the second "
    "lease's deadline: both callers pass at least two leases (`len(popped) > 1`, "
    "`len(renewed) > 1`), and the check that follows requires every lease's deadline to equal "
    "`later`, which holds for the second's exactly when it holds for the first's",
    "events.py:<module>:constant 0 -> 1:0#0": "`_consume = deque(maxlen=1).extend`: the deque "
    "then keeps the last item of what it consumes, and everything it consumes is a `map` of a "
    "slot's `__set__`, which returns None: it keeps a None, no object of the records' (the "
    "stores run the same, consumed to the end either way)",
    # -- renewal.py --
    "renewal.py:renew_ids:constant True -> False:True#0": "`zip(ids, found, strict=False)`: "
    "every caller builds `found` as `list(map(self._leases.get, ids))`, so the two always have "
    "the same length and `strict` never raises",
    "renewal.py:Renewals.renew:or -> and:type(req_ids) is list or type(req_ids) is tuple#0": (
        "a fast-path guard: with it failing, a list or tuple of ids is copied with `list()` "
        "instead of used as given; the copy is equal, and the renew loop only reads the ids "
        "(zipped with `found`, which fixes their number, never stored, indexed or returned), "
        "so every call renews, counts and reports the same (also with `lost` the same list)"
    ),
    "renewal.py:Renewals._known_or_valid:constant True -> False:True#0": "`zip(ids, found, "
    "strict=False)`: `found` is `list(map(self._leases.get, ids))`, made from `ids` just "
    "before, so the two always have the same length and `strict` never raises",
    "renewal.py:Renewals._known_or_valid:return None:return False#0": "its one caller, "
    "`renew_heartbeat`, reads the answer only as `not self._known_or_valid(...)`, and `None` "
    "is falsy as `False` is: the payload is refused (None returned, nothing changed) either way",
    # -- table.py --
    "table.py:LeaseTable._prune:Lt -> LtE:at < first#0": "`first = at if at < first else "
    "first`, the next prune time: the two differ only where `at == first`, and then both give "
    "that value (a signed zero apart, which the table only compares)",
    "events.py:Releases:statement deleted:__hash__ = None#0": "`Releases` defines `__eq__` in "
    "its body, and Python then sets `__hash__` to None for the class by itself: the explicit "
    "line only says so (instances stay unhashable, as a list is)",
    "table.py:<module>:constant 0 -> 1:0#0": "`_consume = deque(maxlen=1).extend`: the deque "
    "then keeps the last item of what it consumes, and everything it consumes is a `map` of "
    "`dict.__delitem__`, `OrderedDict.move_to_end` (or, before 93776db, the `state` slot's "
    "setter), which return None: it keeps a None, "
    "no object of the table's (the calls run the same, consumed to the end either way)",
    _DEAD_REQ_ID: "`_REQ_ID` was defined in `deadlines.py` and read nowhere (the table has "
    "its own): deleting it changed nothing. Dead, so removed since the run of 2026-12-06 found it",
    # -- rules.py --
    "rules.py:<module>:constant 1 -> 2:1#0": "`NO_ROW = -1` -> `-2`: NO_ROW only has to be no "
    "state (LeaseState is 0..4), and -2 is none either; every use compares with the name "
    "(`next_state`'s ite chain yields it, proofs/check.py's L0 and tests/test_rules_agree.py "
    "expect `R.NO_ROW`; the runtime's lookup raises KeyError instead), so the terms differ only in "
    "that constant, on both sides of each comparison, and every obligation and test reads the same",
    "rules.py:abort_state:constant True -> False:True#0": "`next_state(state, RECV_ABORT, "
    "False)`: the guard is read only for a row whose guard is not `Guard.ALWAYS` (both the "
    "lookup and the ite chain return `t.target` for ALWAYS without looking at it), and every "
    "RECV_ABORT row of TRANSITIONS is ALWAYS (an abort is unconditional, spec §8.4)",
    # -- sym.py --
    "sym.py:conj:or -> and:a is True or a is False#0": _CONJ_FAST,
    "sym.py:conj:constant True -> False:True#0": _CONJ_FAST,
    "sym.py:conj:constant False -> True:False#0": _CONJ_FAST,
    "sym.py:conj:or -> and:b is True or b is False#0": _CONJ_FAST,
    "sym.py:conj:constant True -> False:True#1": _CONJ_FAST,
    "sym.py:conj:constant False -> True:False#1": _CONJ_FAST,
}
