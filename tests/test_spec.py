"""spec/ agrees with the code: generated diagrams are current and drawn from the
tables the code runs; D's diagram matches HeartbeatTracker edge by edge; every
invariant id, message prefix, configuration key and cited section is where it
should be."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from leaseproto import HeartbeatTracker, LeaseConfig, LocalProtocolError, ReleaseReason, wire
from leaseproto.core.state import (
    ENDED_STATES,
    REGRANT,
    TRANSITIONS,
    Guard,
    Input,
    LeaseState,
    Transition,
)
from leaseproto.scenarios import diagram as dg

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "spec"
SPEC = SPEC_DIR / "lease-protocol.md"
IDS = [f"I{n}" for n in range(1, 12)]  # the brief's ids; spec §9 may add I12+ (checked below)


def _spec() -> str:
    return SPEC.read_text(encoding="utf-8")


def _section(text: str, number: str) -> str:
    """The body of section ``number`` ("3.2", "4"), up to the next heading of its level
    or above."""
    level = "##" if "." not in number else "###"
    m = re.search(
        rf"^{level} {re.escape(number)}\.? .*?$(.*?)(?=^#{{2,{len(level)}}} |\Z)",
        text,
        re.MULTILINE | re.DOTALL,
    )
    assert m, f"spec has no section {number}"
    return m.group(1)


# -- generated diagrams -----------------------------------------------------------------------
def test_embedded_diagrams_equal_the_generated_ones() -> None:
    text = _spec()
    for name in dg.BLOCKS:
        assert f"<!-- BEGIN GENERATED: {name} -->" in text, name
    assert dg.stale_blocks(text) == [], (
        "run: leaseproto spec-diagrams --write spec/lease-protocol.md"
    )


def test_stale_block_is_detected_and_rewritten() -> None:
    text = _spec()
    broken = text.replace("| GRANTED |", "| GRANTD  |", 1)
    assert dg.stale_blocks(broken) == ["lease-diagram"]
    assert dg.render_blocks(broken) == text


def test_lease_diagram_and_table_come_from_the_transition_table() -> None:
    table_md = dg.lease_table_markdown()
    assert len(table_md.strip().splitlines()) == 2 + len(TRANSITIONS)
    mermaid = dg.lease_mermaid()
    ascii_art = dg.lease_ascii()
    for (src, inp), t in TRANSITIONS.items():
        assert f"| {src.name} | `{inp.value}` |" in table_md
        if t.target != src:
            assert f"{src.name} --> {t.target.name}: {inp.value}" in mermaid
            assert inp.value in ascii_art and t.target.name in ascii_art
    # a changed row changes the picture: the generator reads the table, not a copy
    mutated = dict(TRANSITIONS)
    mutated[(LeaseState.GRANTED, Input.RECV_HEARTBEAT)] = Transition(
        LeaseState.EXPIRED, Guard.DUE, "lapse"
    )
    art = dg.lease_ascii(mutated)
    assert art != ascii_art and "recv_heartbeat" in art and "/ lapse" in art
    assert "GRANTED --> EXPIRED: recv_heartbeat [deadline <= now]" in dg.lease_mermaid(mutated)


def test_a_table_that_is_not_a_layered_fan_out_is_listed_edge_by_edge() -> None:
    mutated = dict(TRANSITIONS)
    mutated[(LeaseState.EXPIRED, Input.GRANT)] = Transition(
        LeaseState.GRANTED, Guard.ALWAYS, "regrant"
    )
    art = dg.lease_ascii(mutated)
    assert "EXPIRED --grant / regrant--> GRANTED" in art
    assert "ABSENT --grant / grant--> GRANTED" in art


def test_missing_rows_show_as_local_misuse() -> None:
    art = dg.lease_ascii()
    for state in LeaseState:
        for inp in Input:
            if (state, inp) not in TRANSITIONS and not (
                inp is Input.GRANT and state in ENDED_STATES
            ):
                assert re.search(rf"{inp.value}\s+\(not allowed: local misuse\)", art)


def test_regrant_of_an_ended_id_is_one_thing_in_diagram_spec_and_code() -> None:
    # the diagram: an ended lease's "grant" row names the new lease, not misuse
    art = dg.lease_ascii()
    for state in ENDED_STATES:
        assert re.search(rf"{state.name}\s+grant\s+{re.escape(REGRANT)}", art), state
    assert "GRANTED      grant               (not allowed: local misuse)" in art
    assert "forget" in _section(_spec(), "6.1") and "ABSENT" in _section(_spec(), "6.1")
    # the code: the tombstone goes, the id is a fresh lease; a live one is misuse
    from leaseproto import LeaseTable

    t = LeaseTable()
    t.grant("a", now=0.0, consumers=2)
    t.abort("a", now=1.0)
    assert t.ended("a") is ReleaseReason.ABORTED
    assert t.grant("a", now=2.0) is None
    assert t.ended("a") is None and t.lease_info("a")["done"] == 0  # type: ignore[index]
    with pytest.raises(LocalProtocolError, match="live"):
        t.grant("a", now=3.0)


# -- D's machines, checked against the tracker ---------------------------------------------------
H = LeaseConfig().heartbeat_interval
E_ID = "P0"


def _engine_state(tr: HeartbeatTracker) -> str:
    if E_ID not in tr.engines():
        return "IDLE"
    nd = tr.next_due()
    return "NEVER_SENT" if nd == -math.inf else "SENT"


def _setup_engine(state: str) -> tuple[HeartbeatTracker, float]:
    tr = HeartbeatTracker()
    if state != "IDLE":
        tr.track("r1", engine_id=E_ID, remote_req_id="R1", now=0.0)
    if state == "SENT":
        assert tr.due(now=1.0) == {E_ID: ["R1"]}
    assert _engine_state(tr) == state
    return tr, 1.0  # (tracker, time of the last send or of tracking)


_STEP_NOW = {
    "": 1.0 + H,
    "pending": 1.0 + H,
    "not pending": 1.0 + H,
    "now - last < H": 1.0 + H / 2,
    "now - last >= H, pending": 1.0 + H,
    "now - last >= H, not pending": 1.0 + H,
}


def _check_engine_edge(e: dg.TrackerEdge) -> None:
    tr, _ = _setup_engine(e.source)
    before = tr.stats
    sent: dict[str, list[str]] = {}
    if e.event == "track":
        tr.track("r9", engine_id=E_ID, now=0.5)
    elif e.event == "untrack last":
        tr.untrack("r1")
    elif e.event == "drop_engine":
        assert tr.drop_engine(E_ID) == ["r1"]
    elif e.event == "step":
        pending = (
            {E_ID} if e.guard.endswith("pending") and not e.guard.endswith("not pending") else set()
        )
        sent = tr.due(now=_STEP_NOW[e.guard], pending=pending)
    else:
        pytest.fail(f"no way to check event {e.event!r}")
    assert _engine_state(tr) == e.target, e
    deferred = tr.stats.deferred - before.deferred
    if e.effect.startswith("send"):
        assert sent == {E_ID: ["R1"]} and deferred == 0, e
        assert tr.next_due() == _STEP_NOW[e.guard] + H
    elif e.effect.startswith("deferred"):
        assert sent == {} and deferred == 1, e
        assert tr.next_due() is not None and tr.next_due() <= _STEP_NOW[e.guard]  # still due
    elif e.effect == "nothing":
        assert sent == {} and deferred == 0, e
    elif e.effect == "due at once":
        assert tr.next_due() == -math.inf
    elif e.effect.startswith("forget"):
        tr.track("r2", engine_id=E_ID, now=2.0)  # the engine comes back due at once
        assert tr.next_due() == -math.inf
    else:
        pytest.fail(f"no way to check effect {e.effect!r}")


def _check_request_edge(e: dg.TrackerEdge) -> None:
    tr = HeartbeatTracker()
    if e.source == "TRACKED":
        tr.track("r1", engine_id=E_ID, now=0.0)
    actions: dict[str, Callable[[], object]] = {
        "track": lambda: tr.track("r1", engine_id=E_ID, now=1.0),
        "untrack": lambda: tr.untrack("r1"),
        "drop_engine": lambda: tr.drop_engine(E_ID),
    }
    if e.effect.startswith("local misuse"):
        with pytest.raises(LocalProtocolError):
            actions[e.event]()
    else:
        actions[e.event]()
    assert ("TRACKED" if "r1" in tr else "UNTRACKED") == e.target, e


@pytest.mark.parametrize(
    "edge",
    dg.TRACKER_EDGES,
    ids=[f"{e.machine}:{e.source}-{e.event}-{e.guard}" for e in dg.TRACKER_EDGES],
)
def test_tracker_edge_matches_heartbeat_tracker(edge: dg.TrackerEdge) -> None:
    if edge.machine == "engine":
        _check_engine_edge(edge)
    else:
        _check_request_edge(edge)


def test_tracker_description_covers_every_step_case() -> None:
    steps = {(e.source, e.guard) for e in dg.TRACKER_EDGES if e.event == "step"}
    assert steps == {
        ("NEVER_SENT", "pending"),
        ("NEVER_SENT", "not pending"),
        ("SENT", "now - last < H"),
        ("SENT", "now - last >= H, pending"),
        ("SENT", "now - last >= H, not pending"),
    }


# -- ids, prefixes, keys, section numbers --------------------------------------------------------
def _mentions(paths: list[Path], ident: str) -> bool:
    pat = re.compile(rf"(?<![A-Za-z0-9]){ident}(?!\d)")  # test_x_I1 counts; I10 is not I1
    return any(pat.search(p.read_text(encoding="utf-8")) for p in paths)


def _spec_ids() -> list[str]:
    ids = re.findall(r"^- \*\*(I\d+)\*\* ", SPEC.read_text(encoding="utf-8"), re.MULTILINE)
    return sorted(set(ids) | set(IDS), key=lambda i: int(i[1:]))


@pytest.mark.parametrize("ident", _spec_ids())
def test_invariant_id_appears_in_spec_proofs_and_tests(ident: str) -> None:
    spec_files = sorted(SPEC_DIR.rglob("*.md"))
    proof_files = sorted((ROOT / "proofs").rglob("*.py"))
    test_files = [p for p in sorted((ROOT / "tests").rglob("*.py")) if p.name != "test_spec.py"]
    assert _mentions(spec_files, ident), f"{ident} missing from spec/"
    assert proof_files, "proofs/ has no Python files"
    assert _mentions(proof_files, ident), f"{ident} missing from proofs/"
    assert _mentions(test_files, ident), f"{ident} missing from tests/ (test_spec.py excluded)"


def test_spec_states_each_invariant_once() -> None:
    body = _section(_spec(), "9")
    assert set(IDS) <= set(_spec_ids())
    for ident in _spec_ids():
        assert len(re.findall(rf"^- \*\*{ident}\*\* ", body, re.MULTILINE)) == 1, ident


def test_every_wire_form_is_in_the_message_table() -> None:
    table = _section(_spec(), "3.2")
    for prefix in wire.RESERVED_PREFIXES:
        assert f"`{prefix.decode()}" in table, prefix
        assert f"`{prefix.decode()}`" in _section(_spec(), "3.3"), prefix
    assert "`<id>:<n>`" in table
    for reason in wire.NACK_REASONS:
        assert f"`{reason}`" in table
    assert str(wire.MAX_COUNT) in table
    assert f"`{wire.CAPABILITY}`" in table
    assert f"`MAX_ID_BYTES` = {wire.MAX_ID_BYTES}" in _section(_spec(), "3.3")


def _fmt(value: object) -> str:
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_config_key_is_in_the_constants_table_with_its_default() -> None:
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(
            r"^\| `(\w+)` \|[^|]*\| ([^|]*) \|", _section(_spec(), "4"), re.MULTILINE
        )
    }
    for key, value in LeaseConfig().as_dict().items():
        assert key in rows, f"{key} missing from spec §4"
        assert re.search(rf"(?<![\d.]){re.escape(_fmt(value))}(?![\d.])", rows[key]), (
            f"spec §4 default of {key} should show {_fmt(value)}: {rows[key]!r}"
        )
    for rule in ("C1", "C2", "C3", "C4", "C5", "C6"):
        assert f"**{rule}**" in _section(_spec(), "4")


def test_every_section_the_code_cites_exists() -> None:
    text = _spec()
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.MULTILINE))
    cited: set[str] = set()
    for path in (ROOT / "leaseproto").rglob("*.py"):
        for m in re.finditer(r"spec (§[\d.,\-§ ]+)", path.read_text(encoding="utf-8")):
            for part in re.findall(r"\d+(?:\.\d+)?", m.group(1)):
                cited.add(part)
    assert cited, "no citations found: the pattern is wrong"
    missing = sorted(cited - headings, key=lambda s: [int(x) for x in s.split(".")])
    assert not missing, f"code cites spec sections that do not exist: {missing}"


def test_timing_conditions_use_the_shared_symbols() -> None:
    body = _section(_spec(), "5")
    # the spec writes the brief's symbols: U+2212 minus, delta, rho
    assert "R + max(K, H/(1\u2212\u03c1)) + S_D + \u03b4 + S_P  <  L/(1+\u03c1)" in body
    assert "H/(1\u2212\u03c1) + S_D + \u03b4 + S_P              <  E/(1+\u03c1)" in body
    for sym in ("S_D", "S_P", "\u03b4", "K", "R", "\u03c1"):
        assert f"| `{sym}` |" in body
