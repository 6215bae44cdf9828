"""Lemma L17: the wire codec is the grammar of spec §3.6, on every input of a bounded set.

``core/wire.py`` (with the id rules of ``core/wire_ids.py``, which it re-exports, and
``checks.check_wire_id``) is run on every input built from a small alphabet of the
grammar's edge cases (empty, reserved stems and prefixes, each class of forbidden
character, ``:`` and ``,`` placements, multibyte and invalid UTF-8, the longest id and
one byte more, counts at and past each bound and in other digit forms, every reason and
a wrong one), and compared with the naive codec written from the spec's text
(:mod:`leaseproto.checker.naive_wire`): which ids are valid and which fit
``max_id_bytes``; the bytes of every encoder or its refusal; what ``decode`` makes of
every payload the encoders produce, every cut and splice of them and every hand-made
malformed one (the same message, or ``MalformedMessage`` exactly when the grammar has no
parse); the heartbeat split of every list of up to three ids at every size from no room
to one message; the verdict (I13) for every kind of transfer-done result; the advisory
lease-lost answer.

This is exhaustive over the set, not over all inputs: a codec that is wrong only on
inputs built from none of these cases passes. The set is small enough that the
obligation costs a fraction of a second.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import z3

from leaseproto.checker import naive_wire as N
from leaseproto.core import wire as W
from leaseproto.core import wire_ids
from leaseproto.core.checks import check_wire_id
from leaseproto.core.errors import LocalProtocolError
from leaseproto.core.events import LateTransfer, Release, ReleaseReason, TransferCounted

from .loops import Check, built
from .symexec import Raised

SYSTEM = "wire"
#: the most mismatches one check records (each names its input)
_MOST = 4

_LONG = "x" * 512
IDS: list[Any] = [
    "a",
    "abc\t",
    "a" * 12,
    "a" * 13,
    "req-1",
    "ab",
    "abc",
    "HB",
    "AB",
    "OK",
    "NK",
    "LL",
    "HB:",
    "HB:x",
    "OK:1",
    "NK:expired",
    "HBx",
    "hb:x",
    "xHB:",
    "a:b",
    "a:1",
    ":",
    "::",
    "a,b",
    ",",
    "",
    " ",
    "a b",
    "\x00",
    "a\x1f",
    "\x7f",
    "a\x80",
    "é",
    "日本",
    "\ud800",
    _LONG,
    _LONG + "y",
    "é" * 256,
    "é" * 255 + "x",
    "é" * 256 + "x",
    5,
    None,
    b"a",
]
COUNTS: list[Any] = [1, 2, 7, 10, 2**20, 2**20 + 1, 0, -1, True, 1.0, "1", None]
REASONS = [*N.REASONS, "bogus", "", "EXPIRED"]
SIZES = (12, 49, 64, 512, 4096)  # the max_id_bytes that check_wire_id is asked about


def _outcome(errors: Any, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)``, or the name of the error among ``errors`` it raised, or
    :class:`~proofs.symexec.Raised` for any other exception (a crash)."""
    try:
        return fn(*args, **kw)
    except errors as exc:
        return type(exc).__name__
    except Exception as exc:  # the code raised what the spec never makes it raise
        return Raised(exc)


def _decoded(payload: Any) -> Any:
    """What ``decode`` makes of ``payload``, as the naive decoder's tuple."""
    return _as_tuple(W.decode(payload))


class _Mismatches:
    """The inputs on which code and model differ, at most :data:`_MOST` of them, and the
    first on which the code raised (a crash: the other inputs are still compared)."""

    def __init__(self) -> None:
        self.found: list[str] = []
        self.raised = ""

    def same(self, what: str, got: Any, want: Any) -> None:
        if isinstance(got, Raised):
            self.raised = self.raised or f"{what}: {got}"
        elif got != want and len(self.found) < _MOST:
            self.found.append(f"{what}: the code gives {got!r:.80}, the spec {want!r:.80}")

    @contextlib.contextmanager
    def case(self, what: str) -> Iterator[None]:
        """A block of comparisons: an exception out of it is the code's crash."""
        try:
            yield
        except Exception as exc:
            self.same(what, Raised(exc), None)

    def check(self) -> Check:
        found = [(f, z3.BoolVal(True)) for f in self.found]
        return Check([], found, error=self.raised[:300], refuted=bool(found))


def _plain(rid: object, size: int) -> bool:
    """``plain_id``'s contract (its docstring): yes exactly for an ASCII, printable str
    longer than a reserved stem and of at most ``size`` and 512 bytes, with no ``,`` and
    no reserved prefix; the callers' common case, decided without ``id_problem``."""
    if type(rid) is not str or not 2 < len(rid) <= min(size, N.ID_MAX_BYTES):
        return False
    reserved = rid.startswith(("HB:", "AB:", "OK:", "NK:", "LL:"))
    return rid.isascii() and rid.isprintable() and "," not in rid and not reserved


def _ids() -> Check:
    m = _Mismatches()
    for rid in IDS:
        ok = N.id_ok(rid)
        problem = _outcome((), wire_ids.id_problem, rid)
        m.same(
            f"id_problem({rid!r})", problem if isinstance(problem, Raised) else problem is None, ok
        )
        m.same(
            f"check_id({rid!r})",
            _outcome(ValueError, wire_ids.check_id, rid),
            (rid.encode() if ok else "ValueError"),
        )
        for size in SIZES:
            fits = ok and len(rid.encode()) <= size
            plain = _outcome((), wire_ids.plain_id, rid, size)
            m.same(f"plain_id({rid!r}, {size})", plain, _plain(rid, size))
            if plain is True and not fits:  # a sufficient check: never a wrong yes
                m.same(f"plain_id({rid!r}, {size}) of an id that does not fit", True, False)
            got = _outcome(LocalProtocolError, check_wire_id, rid, size)
            m.same(f"check_wire_id({rid!r}, {size})", got, rid if fits else "LocalProtocolError")
    return m.check()


def _encoders() -> tuple[Check, list[bytes]]:
    m = _Mismatches()
    made: list[bytes] = []
    plain: dict[str, Callable[[Any], bytes]] = {
        "abort": W.encode_abort,
        "ok": W.encode_ok,
    }
    for rid in IDS:
        for kind, fn in plain.items():
            want = _outcome(ValueError, N.encode, kind, rid)
            got = _outcome(ValueError, fn, rid)
            m.same(f"encode_{kind}({rid!r})", got, want)
            made += [got] if isinstance(got, bytes) else []
        for count in COUNTS:
            want = _outcome(ValueError, N.encode, "transfer_done", rid, count)
            got = _outcome(ValueError, W.encode_transfer_done, rid, count)
            m.same(f"encode_transfer_done({rid!r}, {count!r})", got, want)
            made += [got] if isinstance(got, bytes) else []
        for reason in REASONS:
            for kind, fn2 in (("nack", W.encode_nack), ("lease_lost", W.encode_lease_lost)):
                want = _outcome(ValueError, N.encode, kind, rid, reason)
                got = _outcome(ValueError, fn2, rid, reason)
                m.same(f"encode_{kind}({rid!r}, {reason!r})", got, want)
                made += [got] if isinstance(got, bytes) else []
    messages = [
        (W.Abort("a"), [b"AB:a"]),
        (W.Ok("a"), [b"OK:a"]),
        (W.Nack("a", "expired"), [b"NK:expired:a"]),
        (W.LeaseLost("a", "unknown"), [b"LL:unknown:a"]),
        (W.TransferDone("a", 3), [b"a:3"]),
        (W.Heartbeat(("a", "b", "a")), [b"HB:a,b"]),
    ]
    for msg, want in messages:
        m.same(f"encode({msg!r})", _outcome(ValueError, W.encode, msg), want)
    m.same("encode('AB:a')", _outcome(TypeError, W.encode, "AB:a"), "TypeError")
    return m.check(), made


def _as_tuple(msg: Any) -> Any:
    """A decoded message as the naive decoder's tuple."""
    if isinstance(msg, W.Heartbeat):
        return ("heartbeat", msg.ids)
    if isinstance(msg, W.TransferDone):
        return ("transfer_done", msg.req_id, msg.count)
    if isinstance(msg, (W.Nack, W.LeaseLost)):
        return ("nack" if isinstance(msg, W.Nack) else "lease_lost", msg.req_id, msg.reason)
    if isinstance(msg, (W.Abort, W.Ok)):
        return ("abort" if isinstance(msg, W.Abort) else "ok", msg.req_id)
    return msg


_PAYLOADS = [
    b"",
    b"HB:",
    b"HB:,a",
    b"HB:a,",
    b"HB:a,,b",
    b"HB:a,b",
    b"HB:HB",
    b"HB:a,HB:x",
    b"HB:ab,abc,a",
    b"AB:",
    b"OK:",
    b"NK:",
    b"NK:expired",
    b"NK:expired:",
    b"NK:bogus:a",
    b"NK:expired:a:b",
    b"LL:aborted:a",
    b"LL:transferred",
    b"a",
    b"a:",
    b":1",
    b"a:0",
    b"a:01",
    b"a:+1",
    b"a: 1",
    b"a:1 ",
    b"a:1048576",
    b"a:1048577",
    b"a:1234567",
    b"a:12345678",
    b"a:0000001",
    "a:\u0661".encode(),
    "a:\u00b2".encode(),
    b"a:b:2",
    b"HB:1",
    b"\xff",
    b"HB:\xe9",
    b"a\xc3:1",
    "é:1".encode(),
    b"leaseproto/1,hello,xyz",
]


def _decoder(made: list[bytes]) -> Check:
    m = _Mismatches()
    corpus = [*_PAYLOADS, *made]
    corpus += [p[:k] for p in made[:40] for k in range(1, len(p))]
    for p in corpus:
        want = N.decode(p)
        got = _outcome(W.MalformedMessage, _decoded, p)
        m.same(f"decode({p!r})", got, "MalformedMessage" if want is None else want)
    views: list[Any] = [bytearray(b"AB:a"), memoryview(b"OK:a")]
    for view in views:
        got = _outcome(W.MalformedMessage, _decoded, view)
        m.same(f"decode({view!r})", got, N.decode(bytes(view)))
    for other in ("AB:a", None, 5):
        got = _outcome(W.MalformedMessage, W.decode, other)
        m.same(f"decode({other!r})", got, "MalformedMessage")
    return m.check()


_HB_IDS = ["a", "bc", "def", "a", "x" * 9, "é", "HB:x"]


def _parts(ids: tuple[str, ...], payloads: list[bytes]) -> list[tuple[str, tuple[str, ...]]]:
    """The heartbeats that carry ``ids`` in order, as many in each as each payload has."""
    out, k = [], 0
    for p in payloads:
        n = p.count(b",") + 1
        out.append(("heartbeat", ids[k : k + n]))
        k += n
    return out if k == len(ids) else [("heartbeat", ids)]


def _heartbeats() -> Check:
    m = _Mismatches()
    for n in range(4):
        for ids in itertools.product(_HB_IDS, repeat=n):
            for size in (*range(1, 16), 4096):
                want = _outcome(ValueError, N.pack_heartbeat, ids, size)
                if not all(N.id_ok(r) for r in ids):  # an invalid id is refused
                    want = "ValueError"
                got = _outcome(ValueError, W.encode_heartbeat, ids, max_bytes=size)
                m.same(f"encode_heartbeat({list(ids)!r}, {size})", got, want)
                if isinstance(got, list):
                    back = [_outcome(W.MalformedMessage, _decoded, p) for p in got]
                    once = tuple(dict.fromkeys(ids))
                    m.same(f"decode(encode_heartbeat({list(ids)!r}))", back, _parts(once, got))
    return m.check()


def _verdicts() -> Check:
    m = _Mismatches()
    live: list[Any] = [Release("a", r, 1.0) for r in ReleaseReason] + [
        TransferCounted("a", 1.0, done=1, readers=2)
    ]
    for res in live:
        m.same(f"verdict(a, {res!r})", _outcome((), W.verdict, "a", res), W.Ok("a"))
    for reason in ReleaseReason:
        res = LateTransfer("a", reason, 2.0, ended_at=1.0)
        got = _outcome((), W.verdict, "a", res)
        m.same(f"verdict(a, {res!r})", got, W.Nack("a", reason.value))
        got = _outcome((), W.lease_lost, "a", reason)
        m.same(f"lease_lost(a, {reason})", got, W.LeaseLost("a", reason.value))
    m.same("verdict(a, None)", _outcome((), W.verdict, "a", None), W.Nack("a", "unknown"))
    got = _outcome((), W.lease_lost, "a", None)
    m.same("lease_lost(a, None)", got, W.LeaseLost("a", "unknown"))
    for bad in (
        LateTransfer("b", ReleaseReason.EXPIRED, 2.0),
        Release("b", ReleaseReason.ABORTED, 1.0),
        "OK",
    ):
        got = _outcome(LocalProtocolError, W.verdict, "a", bad)
        m.same(f"verdict(a, {bad!r})", got, "LocalProtocolError")
    return m.check()


def checks(only: str = "") -> list[tuple[str, Check]]:
    """Every check (those whose label contains ``only``), built now from the current
    code."""
    made: list[bytes] = []

    def encoders() -> Check:
        chk, found = _encoders()
        made.extend(found)
        return chk

    todo: list[tuple[str, Callable[[], Check]]] = [
        ("L17 request ids = spec §3.3 (id_problem, check_id, plain_id, check_wire_id)", _ids),
        ("L17 encoders = spec §3.2, §3.6", encoders),
        ("L17 decode = the grammar of spec §3.6", lambda: _decoder(made)),
        ("L17 encode_heartbeat = the split of spec §3.4, and decodes back", _heartbeats),
        ("L17 verdict and lease_lost = I13, spec §3.2", _verdicts),
    ]
    # every check is built (decode's inputs are the encoders' outputs), then selected
    every = [(label, built(label, build)) for label, build in todo]
    return [(label, chk) for label, chk in every if only in label]
