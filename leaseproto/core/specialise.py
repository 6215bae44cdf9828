"""Fast runtime forms of the rules, generated from the rules themselves.

The hot loops (``LeaseTable.renew`` per heartbeat id, ``LeaseTable.expire`` per
due lease) would otherwise call a rule function per id, and the rule spends most
of its time in :mod:`.sym`'s helpers. Instead, each rule is *traced*: called once
on :class:`Node` values, whose operators record an expression tree and which
:mod:`.sym`'s helpers build through the same hook that builds z3 terms for the
proofs (``__sym_ops__``, in place of the z3 module). The tree is simplified
under the branch's assumption (a renewal that applies; a lease that is due),
subexpressions of the loop's invariants (``now``, ``extension``) are hoisted,
and the result is printed as inline Python into one loop template, compiled
once per rule object.

So the rule is still written once. ``tests/test_specialise.py`` has z3 prove
every generated expression equal to its rule, over reals and over IEEE doubles.
A rule that cannot be traced (one with Python control flow on its arguments, as
a test's patched rule may have) gets the same loop calling the rule per id.
Rebinding a rule in :mod:`.rules` (``monkeypatch.setattr``) is seen at the next
call: forms are cached per rule object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import rules as R
from .tracing import Node, Printer, Untraceable, assume, simplify, trace
from .tracing import lift as _lift

__all__ = ["LIVE", "Node", "Untraceable", "expire_form", "renew_form", "trace"]


# -- the loops -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Form:
    """A compiled loop and, when the rule could be traced, the expressions it
    inlines (for the equivalence proofs): ``exprs`` name -> Python source,
    ``hoisted`` the loop-invariant names they use, ``assumes`` the source of
    the condition under which each expression but the first was simplified."""

    fn: Callable[..., Any]
    source: str
    traced: bool
    exprs: dict[str, str]
    hoisted: tuple[tuple[str, str], ...]


_RENEW = """\
def renew_loop(req_ids, found, every, ended, now, extension, lost, c, rule):
{hoisted}
    missed = 0
    if not every:  # some ids name no live lease: the loop that looks at each id
        for rid, lease in zip(req_ids, found):
            if lease is None:
                missed += 1
                tomb = ended.get(rid)
                if tomb is None:
                    c["renew_unknown"] += 1
                    continue
                c["renew_late"] += 1
                if lost is not None and tomb[0] != {transferred}:
                    lost.append(rid)
                continue
{renew12}
        return len(found) - missed
    for lease in found:  # every id names a live lease (the common heartbeat)
{renew}
    return len(found) - missed
"""
#: One lease's renewal, in both loops (``{rid}``: its id).
_RENEW_ONE = """\
{loads}
        if {applies}:
            lease.deadline = {deadline}
            lease.last_renewal = now
            continue
        missed += 1
        c["renew_lapsed"] += 1
        if lost is not None:
            lost.append({rid})"""
#: The loads for a rule that cannot be traced: the loop calls it per id.
_RENEW_CALL = """\
        applies, deadline = rule(lease.state, lease.deadline, lease.cap_at, now, extension)"""


def _renew_source(
    hoisted: str, loads: str, applies: str = "applies", deadline: str = "deadline"
) -> str:
    """The renew loop's source: ``loads`` (lines indented for the loop over
    leases; the loop over ids that may name none indents them once more) bind
    what ``applies`` and ``deadline`` (expressions) read."""
    one = _RENEW_ONE.format(loads=loads, applies=applies, deadline=deadline, rid="lease.req_id")
    one12 = _RENEW_ONE.format(loads=loads, applies=applies, deadline=deadline, rid="rid")
    return _RENEW.format(
        hoisted=hoisted,
        renew=one,
        renew12="\n".join("    " + line for line in one12.split("\n")),
        transferred=R.TRANSFERRED,
    )


def _compile(source: str, name: str) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec(compile(source, f"<leaseproto.core.specialise {name}>", "exec"), scope)
    fn: Callable[..., Any] = scope[name]
    return fn


_cache: dict[tuple[object, ...], Form] = {}


#: What the renew loop knows of every lease it renews: it is in the table's live map,
#: and a lease is there exactly while it is GRANTED (``LeaseTable`` ends a lease by
#: taking it out of the map before it sets the end state; ``tests/test_hot_paths.py``
#: checks it over random histories). The renewal is simplified under this fact, and
#: ``tests/test_specialise.py`` proves the generated form equal to the rule under it.
LIVE: dict[tuple[Any, ...], object] = {("var", "state"): R.GRANTED}


def renew_form(rule: Callable[..., Any], *, capped: bool) -> Form:
    """The renew loop for ``rule`` (:func:`.rules.renew_rule` or a patched one);
    ``capped``: leases carry a ``cap_at`` (``max_lease_lifetime`` set). Each
    lease it is given is in the table's live map (:data:`LIVE`)."""
    key = ("renew", rule, capped)
    form = _cache.get(key)
    if form is None:
        form = _cache[key] = _renew_form(rule, capped)
    return form


def _renew_form(rule: Callable[..., Any], capped: bool) -> Form:
    try:
        applies, deadline = trace(
            rule, "state", "deadline", "cap_at" if capped else None, "now", "extension"
        )
        applies, deadline = _lift(applies), _lift(deadline)
        applies = simplify(applies, LIVE)
        deadline = simplify(deadline, {**LIVE, **assume(applies)})
    except Untraceable:
        src = _renew_source("    pass", _RENEW_CALL)
        return Form(_compile(src, "renew_loop"), src, False, {}, ())
    pr = Printer(frozenset({"now", "extension"}))
    a_src = pr.expr(applies)
    d_src = pr.expr(deadline)
    loads = "\n".join(
        f"        {v} = lease.{v}" for v in ("state", "deadline", "cap_at") if v in a_src + d_src
    )
    hoisted = "\n".join(f"    {n} = {s}" for n, s in pr.hoisted) or "    pass"
    src = _renew_source(hoisted, loads or "        pass", a_src, d_src)
    return Form(
        _compile(src, "renew_loop"),
        src,
        True,
        {"applies": a_src, "deadline": d_src},
        tuple(pr.hoisted),
    )


def expire_form(due_rule: Callable[..., Any], state_rule: Callable[..., Any]) -> Form:
    """``due(state, deadline, now)`` and, when it holds, the state the lease
    ends in, as one compiled function ``(state, deadline, now) -> int | None``
    (``None``: not due) for :meth:`LeaseTable.expire`."""
    key = ("expire", due_rule, state_rule)
    form = _cache.get(key)
    if form is None:
        form = _cache[key] = _expire_form(due_rule, state_rule)
    return form


_EXPIRE = """\
def expire_one(state, deadline, now, due_rule, state_rule):
{body}
"""


def _expire_form(due_rule: Callable[..., Any], state_rule: Callable[..., Any]) -> Form:
    try:
        due = simplify(_lift(trace(due_rule, "state", "deadline", "now")), {})
        end = simplify(_lift(trace(state_rule, "state", "deadline", "now")), assume(due))
    except Untraceable:
        body = (
            "    if due_rule(state, deadline, now):\n"
            "        return state_rule(state, deadline, now)\n"
            "    return None"
        )
        src = _EXPIRE.format(body=body)
        return Form(_compile(src, "expire_one"), src, False, {}, ())
    pr = Printer(frozenset({"now"}))
    d_src = pr.expr(due)
    e_src = pr.expr(end)
    if pr.hoisted:  # nothing to hoist out of one call: print them inline instead
        pr = Printer(frozenset())
        d_src, e_src = pr.expr(due), pr.expr(end)
    body = f"    if {d_src}:\n        return {e_src}\n    return None"
    src = _EXPIRE.format(body=body)
    return Form(_compile(src, "expire_one"), src, True, {"due": d_src, "state": e_src}, ())
