"""Scenario files for ``leaseproto replay``: parsing and validation (spec §12).

A scenario is JSON lines. Blank lines and lines starting with ``#`` are
ignored. An optional header object (no ``"t"``) comes first; every other line
is one timed operation ``{"t": <seconds>, "op": <name>, ...}`` with ``t`` never
decreasing from one line to the next. Everything is checked here, before
anything runs, and every problem is a :class:`ScenarioError` naming its line.

A header with ``"grantor": "D"`` mirrors the world (spec §2.8: D's cached turn,
read by P): the engines are D's and the reader is P, and the ``p``/``d`` of an
op or ``expect`` key follows the side it names (``d_step`` is the grantor's
step, ``p_step`` the reader's). Ops are stored under the names of the P-grants
world, so the engine runs one world either way.

Pure: takes text, returns values. The engine is :mod:`leaseproto.scenarios.replay`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..core.config import LeaseConfig

__all__ = [
    "MIRRORED",
    "OPS",
    "USE_OUTCOMES",
    "Engine",
    "Header",
    "Op",
    "Scenario",
    "ScenarioError",
    "parse_scenario",
]


class ScenarioError(ValueError):
    """A scenario line that cannot be replayed. ``line`` is 1-based (0: none)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class Engine:
    """A P engine: ``tp`` ranks, each with its own lease table; ``handshake``
    is how long D's first connection to it takes (the symbol K)."""

    name: str
    tp: int = 1
    handshake: float = 0.0


@dataclass(frozen=True, slots=True)
class Header:
    config: LeaseConfig = field(default_factory=LeaseConfig)
    #: default one-way delay of D's messages to P (the symbol delta)
    delay: float = 0.0
    engines: tuple[Engine, ...] = (Engine("P"),)
    #: side -> (rate, offset): that side's clock reads offset + rate * t
    clocks: tuple[tuple[str, float, float], ...] = (("P", 1.0, 0.0), ("D", 1.0, 0.0))
    name: str = ""
    #: the side whose engines hold the leases: ``P`` (pull) or ``D`` (a turn-2 read)
    grantor: str = "P"


@dataclass(frozen=True, slots=True)
class Op:
    line: int
    t: float
    op: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Scenario:
    header: Header
    ops: tuple[Op, ...]


_ENGINE_SEL = {"engine": "str", "rank": "int"}
_REPEAT = {"every": "pos", "until": "num"}
#: op -> {field: kind}; kinds: str, int, num, pos, bool, ids, msg, map
OPS: dict[str, dict[str, str]] = {
    "grant": {"id": "str!", "consumers": "int", "ttl": "pos", **_ENGINE_SEL},
    "deliver": {"msg": "str!", **_ENGINE_SEL},
    "p_step": {**_ENGINE_SEL, **_REPEAT},
    "track": {"id": "str!", "engine": "str", "remote_id": "str"},
    "untrack": {"id": "str!"},
    "d_step": {"deliver": "bool", "delay": "num", **_REPEAT},
    "send": {
        "transfer_done": "str",
        "n": "int",
        "abort": "str",
        "msg": "str",
        "deliver": "bool",
        "delay": "num",
        **_ENGINE_SEL,
    },
    "drop_engine": {"engine": "str!"},
    "d_crash": {},
    "d_restart": {},
    "note": {"text": "str!"},
    # the reader's read of a grantor's blocks (spec §2.8, §8.7): the gate, then the use
    "gate": {
        "id": "str!",
        "margin": "num",
        "rho": "num",
        "sampled_at": "num",
        "rtt": "num",
        "engine": "str",
    },
    "use": {"id": "str!", "verify": "bool!", "engine": "str"},
    "expect": {
        "where": "str",
        "live": "ids",
        "released": "map",
        "deadline": "map",
        "nacked": "ids",
        "tracked": "ids",
        "p_stats": "map",
        "d_stats": "map",
        "uses": "map",
    },
}
_HEADER_KEYS = {"scenario", "config", "delay", "engines", "clocks", "grantor"}
#: op and ``expect`` names as a mirrored scenario writes them -> as stored
MIRRORED = {
    "p_step": "d_step",
    "d_step": "p_step",
    "p_crash": "d_crash",
    "p_restart": "d_restart",
    "p_stats": "d_stats",
    "d_stats": "p_stats",
}
#: what ``use`` found (spec §12.1)
USE_OUTCOMES = ("used", "stale", "recomputed", "waiting")


def _kind_ok(kind: str, v: Any) -> bool:
    if kind == "str":
        return isinstance(v, str) and v != ""
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "bool":
        return isinstance(v, bool)
    if kind in ("num", "pos"):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return ok and (v >= 0 if kind == "num" else v > 0)
    if kind == "ids":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if kind == "map":
        return isinstance(v, dict)
    raise AssertionError(kind)  # pragma: no cover - OPS is data


_KIND_TEXT = {
    "str": "a non-empty string",
    "int": "an integer",
    "bool": "true or false",
    "num": "a finite number >= 0",
    "pos": "a finite number > 0",
    "ids": "a list of strings",
    "map": "an object",
}


def _header(obj: dict[str, Any], line: int) -> Header:
    unknown = set(obj) - _HEADER_KEYS
    if unknown:
        raise ScenarioError(
            line, f"unknown header key(s) {sorted(unknown)}; known: {sorted(_HEADER_KEYS)}"
        )
    cfg_in = obj.get("config", {})
    if not isinstance(cfg_in, dict):
        raise ScenarioError(line, "header 'config' must be an object")
    bad = set(cfg_in) - set(LeaseConfig.known_keys())
    if bad:
        raise ScenarioError(line, f"unknown config key(s) {sorted(bad)}")
    try:
        config = LeaseConfig(**cfg_in)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(line, f"bad config: {exc}") from None
    delay = obj.get("delay", 0.0)
    if not _kind_ok("num", delay):
        raise ScenarioError(line, "header 'delay' must be a finite number >= 0")
    grantor = obj.get("grantor", "P")
    if grantor not in ("P", "D"):
        raise ScenarioError(line, 'header \'grantor\' must be "P" or "D"')
    engines_in = obj.get("engines", {grantor: {}})
    if not isinstance(engines_in, dict) or not engines_in:
        raise ScenarioError(line, "header 'engines' must be a non-empty object")
    engines = []
    for name, spec in engines_in.items():
        if not isinstance(spec, dict) or set(spec) - {"tp", "handshake"}:
            raise ScenarioError(
                line, f'engine {name!r}: expected {{"tp": N, "handshake": seconds}}'
            )
        tp, hs = spec.get("tp", 1), spec.get("handshake", 0.0)
        if not _kind_ok("int", tp) or tp < 1:
            raise ScenarioError(line, f"engine {name!r}: tp must be an integer >= 1")
        if not _kind_ok("num", hs):
            raise ScenarioError(line, f"engine {name!r}: handshake must be a number >= 0")
        engines.append(Engine(name, tp, float(hs)))
    clocks_in = obj.get("clocks", {})
    if not isinstance(clocks_in, dict) or set(clocks_in) - {"P", "D"}:
        raise ScenarioError(line, 'header \'clocks\' maps "P"/"D" to {"rate", "offset"}')
    clocks = []
    for side in ("P", "D"):
        spec = clocks_in.get(side, {})
        if not isinstance(spec, dict) or set(spec) - {"rate", "offset"}:
            raise ScenarioError(line, f'clock {side}: expected {{"rate": r, "offset": s}}')
        rate, off = spec.get("rate", 1.0), spec.get("offset", 0.0)
        if (
            not _kind_ok("pos", rate)
            or not isinstance(off, (int, float))
            or isinstance(off, bool)
            or not math.isfinite(off)
        ):
            raise ScenarioError(line, f"clock {side}: rate must be > 0, offset finite")
        clocks.append((side, float(rate), float(off)))
    name = obj.get("scenario", "")
    if not isinstance(name, str):
        raise ScenarioError(line, "header 'scenario' must be a string")
    return Header(config, float(delay), tuple(engines), tuple(clocks), name, grantor)


def _stored(name: object, header: Header) -> object:
    """An op or ``expect`` key as stored: a mirrored world's names swapped back
    (a name only the P-grants world has is left unknown there)."""
    if header.grantor != "D" or not isinstance(name, str):
        return name
    if name in MIRRORED:
        return MIRRORED[name]
    return None if name in MIRRORED.values() else name


def _written(name: str, header: Header) -> str:
    """A stored name as the scenario writes it."""
    if header.grantor != "D":
        return name
    return next((k for k, v in MIRRORED.items() if v == name), name)


def _op(obj: dict[str, Any], line: int, header: Header) -> Op:
    t = obj.get("t")
    if not isinstance(t, (int, float)) or not _kind_ok("num", t):
        raise ScenarioError(line, "'t' must be a finite number >= 0 (seconds)")
    name = _stored(obj.get("op"), header)
    if name not in OPS:
        known = ", ".join(_written(k, header) for k in OPS)
        raise ScenarioError(line, f"unknown op {obj.get('op')!r}; known: {known}")
    assert isinstance(name, str)
    spec = OPS[name]
    args = {k: v for k, v in obj.items() if k not in ("t", "op")}
    if name == "expect":  # d_stats/p_stats as stored
        args = {str(_stored(k, header) or k): v for k, v in args.items()}
    unknown = set(args) - set(spec)
    if unknown:
        raise ScenarioError(
            line, f"{name}: unknown field(s) {sorted(unknown)}; known: {sorted(spec)}"
        )
    for key, kind_spec in spec.items():
        required = kind_spec.endswith("!")
        kind = kind_spec.rstrip("!")
        if key not in args:
            if required:
                raise ScenarioError(line, f"{name}: missing field {key!r}")
            continue
        if not _kind_ok(kind, args[key]):
            raise ScenarioError(line, f"{name}: {key!r} must be {_KIND_TEXT[kind]}")
    names = [e.name for e in header.engines]
    if "engine" in args and args["engine"] not in names:
        raise ScenarioError(
            line, f"{name}: unknown engine {args['engine']!r}; the header declares {names}"
        )
    if "rank" in args:
        eng = args.get("engine", names[0] if len(names) == 1 else None)
        if eng is None:
            raise ScenarioError(line, f"{name}: 'rank' needs 'engine'")
        tp = next(e.tp for e in header.engines if e.name == eng)
        if not 0 <= args["rank"] < tp:
            raise ScenarioError(
                line, f"{name}: rank {args['rank']} out of range for engine {eng!r} (tp={tp})"
            )
    if name in ("grant", "deliver", "track", "send", "gate", "use") and "engine" not in args:
        if len(names) != 1:
            raise ScenarioError(
                line, f"{name}: 'engine' is required when the header declares several engines"
            )
        args["engine"] = names[0]
    if name == "grant" and "consumers" in args and args["consumers"] < 1:
        raise ScenarioError(line, "grant: 'consumers' must be >= 1")
    if name == "send":
        forms = [k for k in ("transfer_done", "abort", "msg") if k in args]
        if len(forms) != 1:
            raise ScenarioError(line, "send: give exactly one of 'transfer_done', 'abort', 'msg'")
        if "n" in args and "transfer_done" not in args:
            raise ScenarioError(line, "send: 'n' goes with 'transfer_done'")
    if name == "gate" and args.get("sampled_at", 0) + args.get("rtt", 0) > t:
        raise ScenarioError(line, "gate: the offset sample ('sampled_at' + 'rtt') ends after 't'")
    if name == "gate" and not args.get("rho", 0) < 1:
        raise ScenarioError(line, "gate: 'rho' must be below 1")
    if "until" in args and "every" not in args:
        raise ScenarioError(line, f"{name}: 'until' needs 'every'")
    if "every" in args and args.get("until", math.inf) < t:
        raise ScenarioError(line, f"{name}: 'until' is before 't'")
    if "every" in args and "until" not in args:
        raise ScenarioError(line, f"{name}: 'every' needs 'until'")
    if name == "expect" and len(args) == ("where" in args):
        raise ScenarioError(line, "expect: nothing to check")
    if name == "expect":
        _check_expect(args, line)
    return Op(line, float(t), name, args)


def _check_expect(args: dict[str, Any], line: int) -> None:
    for key in ("released",):
        for rid, v in args.get(key, {}).items():
            reason = v.get("reason") if isinstance(v, dict) else v
            if reason not in ("transferred", "expired", "aborted"):
                raise ScenarioError(
                    line,
                    f"expect: released[{rid!r}] needs a reason (transferred, expired or aborted)",
                )
            if isinstance(v, dict) and (
                set(v) - {"reason", "at"} or ("at" in v and not _kind_ok("num", v["at"]))
            ):
                raise ScenarioError(
                    line, f'expect: released[{rid!r}] is {{"reason": ..., "at": seconds}}'
                )
    for rid, v in args.get("deadline", {}).items():
        if v is not None and not _kind_ok("num", v):
            raise ScenarioError(line, f"expect: deadline[{rid!r}] must be a number or null")
    for key in ("p_stats", "d_stats"):
        for k, v in args.get(key, {}).items():
            if not _kind_ok("int", v):
                raise ScenarioError(line, f"expect: {key}[{k!r}] must be an integer")
    for rid, v in args.get("uses", {}).items():
        if not isinstance(v, list) or not all(x in USE_OUTCOMES for x in v):
            raise ScenarioError(
                line, f"expect: uses[{rid!r}] must be a list of {', '.join(USE_OUTCOMES)}"
            )


def parse_scenario(text: str) -> Scenario:
    """Parse and validate a whole scenario.

    Raises:
        ScenarioError: the first bad line, with its number and what is wrong.
    """
    header: Header | None = None
    ops: list[Op] = []
    last_t = 0.0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ScenarioError(number, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise ScenarioError(number, "each line must be a JSON object")
        if "t" not in obj and "op" not in obj:
            if header is not None or ops:
                raise ScenarioError(number, "a header (a line without 't') may only come first")
            header = _header(obj, number)
            continue
        op = _op(obj, number, header if header is not None else Header())
        if op.t < last_t:
            raise ScenarioError(
                number,
                f"t={op.t:g} is before the previous line's "
                f"t={last_t:g}: lines must be in time order",
            )
        last_t = op.t
        if header is None:
            header = Header()
        ops.append(op)
    if not ops:
        raise ScenarioError(0, "the scenario has no operations")
    return Scenario(header if header is not None else Header(), tuple(ops))
