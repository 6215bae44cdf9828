"""Lemma L18: the settings and argument checks are the rules of spec §4, §5.3 and §10.

Run on every input of a bounded set of edge cases and compared with the rules as
the spec and the README state them (written here, not taken from the code):

* ``LeaseConfig`` (``core/config.py``) against rules C1-C7: which settings it
  refuses (each duration alone and the four timing durations together over a grid,
  every count alone, derived values that overflow), every effective value and
  default (``H = L/6``, ``E = 2L/3``, tombstone and staging ttls), ``max_id_bytes``,
  ``tolerated_missed_heartbeats`` (the largest ``k`` with ``(k + 1) H < E``) and
  ``from_extra_config`` (a mapping, other keys ignored);
* the core's argument checks (``core/checks.py``) against spec §10's local misuse:
  a time is a finite number (not a bool), a clock never goes back, a count is an
  integer (not a bool) in range, a ttl positive;
* D's first-contact check of P's advertised settings (``core/peer.py``) against
  spec §5.3's assumption-free part of T1 and T2 (``H + S_D < E`` and ``< L``), run
  on z3 reals for P's durations and D's step time (so over every value, not a grid),
  with the warning for a pair that tolerates no lost heartbeat (``E <= 2H``), and the
  advertisement's parse.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import z3

from leaseproto.core import checks as C
from leaseproto.core import peer as P
from leaseproto.core.config import LeaseConfig
from leaseproto.core.errors import LocalProtocolError

from .codec import _Mismatches, _outcome
from .loops import Check, built
from .symexec import Explorer, HSym, SymMath, explore, symbolic_math

SYSTEM = "settings"

_DURATIONS = (
    "kv_lease_duration",
    "decoder_kv_blocks_ttl",
    "heartbeat_interval",
    "lease_extension",
    "max_lease_lifetime",
    "safety_margin",
    "tombstone_ttl",
    "staging_ttl",
)
_COUNTS = {"max_notification_bytes": 64, "tombstone_capacity": 1, "staging_capacity": 0}
_VALUES: list[Any] = [0, 0.0, -1.0, 1e-9, 1, 2.5, 4.0, 5, 6.0, 20.0, 30.0, 500.0, 1e308]
_VALUES += [math.nan, math.inf, -math.inf, True, "5", None]
_ABSENT = object()
_DEFAULTS = {
    "kv_lease_duration": 30.0,
    "decoder_kv_blocks_ttl": 480.0,
    "safety_margin": 5.0,
    "max_notification_bytes": 4096,
    "tombstone_capacity": 100_000,
    "staging_capacity": 10_000,
}


def _seconds(v: Any, *, zero: bool = False) -> bool:
    """C1: a finite number of seconds, > 0 (>= 0 where zero is allowed), not a bool."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    return v >= 0 if zero else v > 0


def expected_config(given: dict[str, Any]) -> dict[str, Any] | None:
    """The effective settings the rules give for ``given`` (keyword arguments), or
    None when some rule refuses them."""
    v = {**_DEFAULTS, **given}
    for key in ("kv_lease_duration", "decoder_kv_blocks_ttl", "safety_margin"):
        if not _seconds(v[key], zero=key == "safety_margin"):
            return None
    big_l = float(v["kv_lease_duration"])
    derived = {"heartbeat_interval": big_l / 6, "lease_extension": big_l * 2 / 3}
    derived |= {"tombstone_ttl": float(v["decoder_kv_blocks_ttl"]), "staging_ttl": big_l}
    for key, default in derived.items():
        if v.get(key) is None:
            v[key] = default
        elif not _seconds(v[key]):
            return None
    cap = v.get("max_lease_lifetime")
    if cap is not None and not _seconds(cap):
        return None
    for key, least in _COUNTS.items():  # C5
        n = v[key]
        if isinstance(n, bool) or not isinstance(n, int) or n < least:
            return None
    h, e = float(v["heartbeat_interval"]), float(v["lease_extension"])
    if not e > h or not h < big_l or (cap is not None and cap < big_l):  # C2, C3, C4
        return None
    out = {k: (float(v[k]) if v.get(k) is not None else None) for k in _DURATIONS}
    out |= {k: v[k] for k in _COUNTS}
    if not all(x is None or math.isfinite(x) for x in out.values()):  # C1, derived too
        return None
    return out


def _tolerated(h: float, e: float) -> int | None:
    """The largest ``k`` with ``(k + 1) h < e`` on the runtime's floats; None past a ratio
    of a million (not searched)."""
    if e / h > 10**6:
        return None
    k = 0
    while (k + 2) * h < e:
        k += 1
    return k


def _config_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = [{}]
    for key in (*_DURATIONS, *_COUNTS):
        extra = [63, 64, 65, 527, 528, 2, 0, -1, 1.0] if key in _COUNTS else []
        cases += [{key: x} for x in [*_VALUES, *extra]]
    grid = [_ABSENT, 1.0, 4.0, 5.0, 6.0, 10.0, 20.0, 30.0]
    for big_l, h, e, cap in itertools.product(grid, repeat=4):
        given = {"kv_lease_duration": big_l, "heartbeat_interval": h, "lease_extension": e}
        given["max_lease_lifetime"] = cap
        cases.append({k: x for k, x in given.items() if x is not _ABSENT})
    cases += [{"kv_lease_duration": 1.6e308}, {"kv_lease_duration": 1e308}]
    cases += [{"decoder_kv_blocks_ttl": 1e-300, "tombstone_ttl": None}]
    return cases


def _effective(given: dict[str, Any]) -> dict[str, Any]:
    return LeaseConfig(**given).as_dict()


def _derived(m: _Mismatches, given: dict[str, Any], want: dict[str, Any]) -> None:
    cfg = LeaseConfig(**given)
    longest = min(512, want["max_notification_bytes"] - len("NK:transferred:"))
    m.same(f"max_id_bytes of {given!r}", cfg.max_id_bytes, longest)
    tol = _tolerated(want["heartbeat_interval"], want["lease_extension"])
    if tol is not None:
        m.same(f"tolerated_missed_heartbeats of {given!r}", cfg.tolerated_missed_heartbeats, tol)
    extra = {**given, "other_connector_key": 1, "kv_role": "kv_producer"}
    m.same(f"from_extra_config({extra!r})", LeaseConfig.from_extra_config(extra), cfg)


def _config() -> Check:
    m = _Mismatches()
    with m.case("known_keys"):
        m.same("known_keys", set(LeaseConfig.known_keys()), {*_DURATIONS, *_COUNTS})
    for given in _config_cases():
        want = expected_config(given)
        got = _outcome(ValueError, _effective, given)
        m.same(f"LeaseConfig(**{given!r})", got, "ValueError" if want is None else want)
        if want is None or not isinstance(got, dict):
            continue
        with m.case(f"LeaseConfig(**{given!r})'s derived values"):
            _derived(m, given, want)
    for bad in ([("kv_lease_duration", 30.0)], "kv_lease_duration=30", None):
        got = _outcome(ValueError, LeaseConfig.from_extra_config, bad)
        m.same(f"from_extra_config({bad!r})", got, "ValueError")
    return m.check()


def _time_ok(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _checks() -> Check:
    """``core/checks.py`` against spec §10's misuse, every pair of a value set."""
    m = _Mismatches()
    values: list[Any] = [-1e308, -2.0, -0.0, 0, 0.0, 1, 1.5, 2, 1e308, math.nan]
    values += [math.inf, -math.inf, True, False, "1", None, 2**20, 2**20 + 1]
    err = "LocalProtocolError"
    for v in values:
        ok = _time_ok(v)
        m.same(
            f"check_finite({v!r})",
            _outcome(LocalProtocolError, C.check_finite, "x", v),
            float(v) if ok else err,
        )
        pos = ok and v > 0
        m.same(
            f"check_positive({v!r})",
            _outcome(LocalProtocolError, C.check_positive, "x", v),
            float(v) if pos else err,
        )
        for top in (1, 2**20):
            good = type(v) is int and 1 <= v <= top
            m.same(
                f"check_count({v!r}, {top})",
                _outcome(LocalProtocolError, C.check_count, "n", v, top),
                v if good else err,
            )
        for last in (C.FIRST_NOW, -2.0, 0.0, 1.5):
            later = ok and v >= last
            m.same(
                f"check_now({v!r}, {last!r})",
                _outcome(LocalProtocolError, C.check_now, v, last),
                float(v) if later else err,
            )
            m.same(
                f"advance({last!r}, {v!r})",
                _outcome(LocalProtocolError, C.advance, last, v),
                v if later else err,
            )
    return m.check()


def _parse() -> Check:
    m = _Mismatches()
    good = {"kv_lease_duration": 30.0, "lease_extension": 20.0, "heartbeat_interval": 5.0}
    with m.case("parse(advertisement)"):
        got = P.PeerLease.parse(P.advertisement(LeaseConfig()))
        m.same("parse(advertisement)", got, P.PeerLease(30.0, 20.0, 5.0, None))
    values: list[Any] = [_ABSENT, None, 0, -1.0, 0.5, 7, math.nan, math.inf, True, "5"]
    for key in (*good, "max_lease_lifetime"):
        for x in values:
            lease = {**good, key: x}
            if x is _ABSENT:
                del lease[key]
            optional = key in ("heartbeat_interval", "max_lease_lifetime")
            fine = (optional and x in (_ABSENT, None)) or _seconds(x)
            given: dict[str, Any] = {k: (None if v is None else float(v)) for k, v in lease.items()}
            want = P.PeerLease(**given) if fine else "ValueError"
            m.same(
                f"parse({lease!r})",
                _outcome(ValueError, P.PeerLease.parse, {"v": 1, "lease": lease}),
                want,
            )
    for adv in (
        {"v": 2, "lease": good},
        {"lease": good},
        {"v": "1", "lease": good},
        {"v": 1},
        {"v": 1, "lease": [1]},
        [good],
        None,
    ):
        m.same(
            f"parse({adv!r})",
            _outcome(ValueError, P.PeerLease.parse, adv),
            "ValueError",
        )
    return m.check()


def _seconds_of(x: Any) -> float:
    """A symbolic duration where the code takes a float (it only compares and prints)."""
    return x  # type: ignore[no-any-return]


class _Own:
    """What ``mismatch`` and ``fragile`` read of D's config."""

    def __init__(self, heartbeat_interval: Any) -> None:
        self.heartbeat_interval = heartbeat_interval


def _first_contact() -> Check:
    """``first_contact`` of two ranks on z3 reals: rank k's ``L``, ``E`` and D's step
    time are unknowns (D's ``H`` a constant, so ``E / H`` stays linear)."""
    big_l, e, step = z3.Reals("L0 L1"), z3.Reals("E0 E1"), z3.Real("S")
    hyps = [x > 0 for x in (*big_l, *e)] + [step >= 0]
    check = Check(hyps, [])
    for h in (1.0, 5.0):
        ex = Explorer(hyps)

        def run(out: list[tuple[str, Any]], h: float = h, ex: Explorer = ex) -> None:
            def s(t: Any) -> HSym:
                return HSym(t, ex)

            ranks = [P.PeerLease(*map(_seconds_of, (s(big_l[k]), s(e[k])))) for k in range(2)]
            with symbolic_math(SymMath()):
                why, warn = P.first_contact([None, *ranks], _Own(h), step_time=s(step))  # type: ignore[arg-type]
            broken = [z3.Or(h + step >= e[k], h + step >= big_l[k]) for k in range(2)]
            weak = [e[k] <= 2 * h for k in range(2)]  # ceil(E/H) - 2 < 1, for H < E
            first = z3.If(broken[0], 1, z3.If(broken[1], 2, 0))
            warned = z3.If(weak[0], 1, z3.If(weak[1], 2, 0))
            pairs = [("why", _names(why, first, broken=broken, e=e, big_l=big_l, h=h, step=step))]
            want_warn = z3.If(first == 0, warned, 0)
            pairs.append(("warning", _rank_is(warn, want_warn)))
            out.extend((f"H={h:g}: {k}", v) for k, v in pairs)

        explore(check, f"first_contact H={h:g}", ex, run)
    return check


def _rank_is(text: str | None, rank: Any) -> Any:
    got = 0 if text is None else 1 + int(text.startswith("P rank 2"))
    if text is not None and not text.startswith(("P rank 1: ", "P rank 2: ")):
        return z3.BoolVal(False)
    return rank == got


def _names(
    why: str | None, first: Any, *, broken: list[Any], e: Any, big_l: Any, h: float, step: Any
) -> Any:
    """``why`` names the first broken rank and exactly the conditions it breaks."""
    ok = _rank_is(why, first)
    if why is None:
        return ok
    k = 0 if why.startswith("P rank 1") else 1
    t2, t1 = "T2: " in why, "T1: " in why
    return z3.And(ok, (h + step >= e[k]) == t2, (h + step >= big_l[k]) == t1, broken[k])


def checks(only: str = "") -> list[tuple[str, Check]]:
    todo: list[tuple[str, Callable[[], Check]]] = [
        ("L18 LeaseConfig = rules C1-C7 and the defaults", _config),
        ("L18 argument checks = spec §10 local misuse", _checks),
        ("L18 PeerLease.parse = the advertisement", _parse),
        ("L18 first_contact = spec §5.3 T1, T2 without assumptions, on z3 reals", _first_contact),
    ]
    return [(label, built(label, build)) for label, build in todo if only in label]
