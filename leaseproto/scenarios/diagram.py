"""State diagrams for ``spec/``, generated from the tables the code runs.

The prefill-side diagram and table are drawn from
:data:`leaseproto.core.state.TRANSITIONS` (spec §6.2), so the picture a designer
reads is the table :mod:`leaseproto.core.rules` evaluates. The decode side has no
transition table of its own (:class:`~leaseproto.HeartbeatTracker` keeps plain
maps), so its diagram is drawn from :data:`TRACKER_EDGES`, a description that
``tests/test_spec.py`` checks edge by edge against the tracker (spec §7.2).

Pure text: nothing here reads or writes files. ``leaseproto spec-diagrams``
prints the blocks and checks or rewrites the spec's copies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..core.state import ENDED_STATES, REGRANT, TRANSITIONS, Guard, Input, LeaseState, Transition

__all__ = [
    "BLOCKS",
    "TRACKER_EDGES",
    "TrackerEdge",
    "lease_ascii",
    "lease_mermaid",
    "lease_table_markdown",
    "render_blocks",
    "stale_blocks",
    "tracker_ascii",
]

Table = Mapping[tuple[LeaseState, Input], Transition]


def _label(inp: Input, t: Transition) -> list[str]:
    lines = [inp.value]
    if t.guard is not Guard.ALWAYS:
        lines.append(f"[{t.guard.value}]")
    lines.append(f"/ {t.effect}")
    return lines


def _box(name: str) -> list[str]:
    bar = "+" + "-" * (len(name) + 2) + "+"
    return [bar, f"| {name} |", bar]


def _center(text: str, width: int) -> str:
    pad = width - len(text)
    return " " * (pad // 2) + text + " " * (pad - pad // 2)


def _layers(table: Table) -> list[list[LeaseState]] | None:
    """States by distance from ``ABSENT`` over state-changing edges, when every
    such edge goes from one layer to the next and each layer's edges leave a
    single state (the fan-out shape :func:`lease_ascii` draws); else ``None``."""
    depth = {LeaseState.ABSENT: 0}
    frontier = [LeaseState.ABSENT]
    while frontier:
        nxt: list[LeaseState] = []
        for (src, _), t in table.items():
            if src in frontier and t.target != src and t.target not in depth:
                depth[t.target] = depth[src] + 1
                nxt.append(t.target)
        frontier = sorted(set(nxt))
    if len(depth) != len(LeaseState):
        return None
    for (src, _), t in table.items():
        if t.target != src and depth[t.target] != depth[src] + 1:
            return None
    layers: list[list[LeaseState]] = [[] for _ in range(max(depth.values()) + 1)]
    for state in LeaseState:
        layers[depth[state]].append(state)
    for i in range(len(layers) - 1):
        sources = {src for (src, _), t in table.items() if t.target != src and depth[src] == i}
        if len(sources) != 1:
            return None
    return layers


_INPUT_ORDER = {inp: i for i, inp in enumerate(Input)}


def _rows(table: Table) -> list[tuple[tuple[LeaseState, Input], Transition]]:
    """The rows in canonical order (state, then input as declared), so the
    pictures do not depend on the dict's insertion order."""
    return sorted(table.items(), key=lambda row: (row[0][0], _INPUT_ORDER[row[0][1]]))


def lease_ascii(table: Table = TRANSITIONS) -> str:
    """P's per-lease state machine as an ASCII diagram (edges that change the
    state), followed by the inputs that leave each state where it is."""
    layers = _layers(table)
    edges = [(src, inp, t) for (src, inp), t in _rows(table) if t.target != src]
    out: list[str] = []
    if layers is None:  # not a layered fan-out: list the edges instead
        out.extend(
            f"{src.name} --{inp.value}"
            f"{'' if t.guard is Guard.ALWAYS else ' [' + t.guard.value + ']'}"
            f" / {t.effect}--> {t.target.name}"
            for src, inp, t in edges
        )
    else:
        out.extend(_draw_layers(layers, edges))
    out.append("")
    out.append("Inputs that leave the state unchanged (a guarded edge whose guard is")
    out.append("false also leaves the state unchanged):")
    width = max(len(s.name) for s in LeaseState)
    iwidth = max(len(i.value) for i in Input)
    for state in LeaseState:
        first = True
        for inp in Input:
            t = table.get((state, inp))
            if t is None and inp is Input.GRANT and state in ENDED_STATES:
                text = REGRANT
            elif t is None:
                text = "(not allowed: local misuse)"
            elif t.target == state:
                guard = "" if t.guard is Guard.ALWAYS else f" [{t.guard.value}]"
                text = f"{t.effect}{guard}"
            else:
                continue
            out.append(f"  {state.name if first else '':<{width}}  {inp.value:<{iwidth}}  {text}")
            first = False
    return "\n".join(line.rstrip() for line in out) + "\n"


def _draw_layers(
    layers: list[list[LeaseState]], edges: list[tuple[LeaseState, Input, Transition]]
) -> list[str]:
    labels: dict[LeaseState, list[str]] = {}
    for _, inp, t in edges:  # several inputs to one target: stack their labels
        labels.setdefault(t.target, []).extend(_label(inp, t))
    widest = max(len(x) for lab in labels.values() for x in lab)
    col = max(widest, max(len(s.name) for s in LeaseState) + 4) + 2
    total = col * max(len(layer) for layer in layers)
    out: list[str] = []
    for i, layer in enumerate(layers):
        if i > 0:
            n = len(layer)
            lo = (total - col * n) // 2
            centers = [lo + col * k + col // 2 for k in range(n)]
            mid = total // 2
            out.append(_center("|", total))
            if n > 1:
                row = [" "] * total
                for c in range(centers[0], centers[-1] + 1):
                    row[c] = "-"
                for c in centers:
                    row[c] = "+"
                row[mid] = "+"
                out.append("".join(row))
                pipes = [" "] * total
                for c in centers:
                    pipes[c] = "|"
                out.append("".join(pipes))
            depth = max(len(labels[s]) for s in layer)
            for k in range(depth):
                row_text = ""
                for j, state in enumerate(layer):
                    lab = labels[state]
                    text = lab[k] if k < len(lab) else "|"
                    start = lo + col * j
                    row_text = row_text.ljust(start) + _center(text, col)
                out.append(row_text)
            arrows = ""
            for j in range(n):
                arrows = arrows.ljust(lo + col * j) + _center("v", col)
            out.append(arrows)
        for k in range(3):
            row_text = ""
            lo = (total - col * len(layer)) // 2
            for j, state in enumerate(layer):
                row_text = row_text.ljust(lo + col * j) + _center(_box(state.name)[k], col)
            out.append(row_text)
    return out


def lease_table_markdown(table: Table = TRANSITIONS) -> str:
    """Every row of the table, by state then input, as a Markdown table."""
    rows = ["| state | input | guard | next state | effect |", "|---|---|---|---|---|"]
    for (src, inp), t in _rows(table):
        guard = "always" if t.guard is Guard.ALWAYS else f"`{t.guard.value}`"
        rows.append(f"| {src.name} | `{inp.value}` | {guard} | {t.target.name} | {t.effect} |")
    return "\n".join(rows) + "\n"


def lease_mermaid(table: Table = TRANSITIONS) -> str:
    """The same machine as a Mermaid ``stateDiagram-v2`` (state-changing edges)."""
    out = ["stateDiagram-v2", f"    [*] --> {LeaseState.ABSENT.name}"]
    for (src, inp), t in _rows(table):
        if t.target == src:
            continue
        guard = "" if t.guard is Guard.ALWAYS else f" [{t.guard.value}]"
        out.append(f"    {src.name} --> {t.target.name}: {inp.value}{guard}")
    for state in LeaseState:
        if (
            all(
                table.get((state, i), Transition(state, Guard.ALWAYS, "")).target == state
                for i in Input
            )
            and state is not LeaseState.ABSENT
        ):
            out.append(f"    {state.name} --> [*]")
    return "\n".join(out) + "\n"


# -- decode side ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TrackerEdge:
    """One edge of D's tracking state machines (spec §7)."""

    machine: str  # "request" or "engine"
    source: str
    event: str
    guard: str
    target: str
    effect: str


_E = TrackerEdge
#: D's two small machines: per request, and per P engine's heartbeat schedule.
#: Verified against :class:`~leaseproto.HeartbeatTracker` by tests/test_spec.py.
TRACKER_EDGES: tuple[TrackerEdge, ...] = (
    _E("request", "UNTRACKED", "track", "", "TRACKED", "add P's id to its engine's set"),
    _E("request", "TRACKED", "track", "", "TRACKED", "local misuse: rejected, no change"),
    _E("request", "TRACKED", "untrack", "", "UNTRACKED", "remove from the engine's set"),
    _E("request", "TRACKED", "drop_engine", "", "UNTRACKED", "fail over (P lost)"),
    _E("request", "UNTRACKED", "untrack", "", "UNTRACKED", "no-op"),
    _E("engine", "IDLE", "track", "", "NEVER_SENT", "due at once"),
    _E("engine", "NEVER_SENT", "step", "pending", "NEVER_SENT", "deferred: keeps its turn"),
    _E("engine", "NEVER_SENT", "step", "not pending", "SENT", "send HB:, last := now"),
    _E("engine", "SENT", "step", "now - last < H", "SENT", "nothing"),
    _E("engine", "SENT", "step", "now - last >= H, pending", "SENT", "deferred: keeps its turn"),
    _E("engine", "SENT", "step", "now - last >= H, not pending", "SENT", "send HB:, last := now"),
    _E("engine", "NEVER_SENT", "untrack last", "", "IDLE", "forget the engine"),
    _E("engine", "SENT", "untrack last", "", "IDLE", "forget the engine and last"),
    _E("engine", "NEVER_SENT", "drop_engine", "", "IDLE", "forget the engine"),
    _E("engine", "SENT", "drop_engine", "", "IDLE", "forget the engine and last"),
)


def tracker_ascii(edges: tuple[TrackerEdge, ...] = TRACKER_EDGES) -> str:
    """D's machines as edge lists, one block per machine."""
    out: list[str] = []
    for machine in ("request", "engine"):
        rows = [e for e in edges if e.machine == machine]
        out.append(f"per {machine}:")
        sw = max(len(e.source) for e in rows)
        ew = max(len(e.event + (f" [{e.guard}]" if e.guard else "")) for e in rows)
        tw = max(len(e.target) for e in rows)
        for e in rows:
            ev = e.event + (f" [{e.guard}]" if e.guard else "")
            out.append(f"  {e.source:<{sw}} --{ev:-<{ew}}--> {e.target:<{tw}}  {e.effect}")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


# -- blocks embedded in spec/ -----------------------------------------------------------------
#: Generated blocks, by the name used in the spec's markers.
BLOCKS: dict[str, Callable[[], str]] = {
    "lease-diagram": lambda: "```\n" + lease_ascii() + "```\n",
    "lease-table": lease_table_markdown,
    "tracker-diagram": lambda: "```\n" + tracker_ascii() + "```\n",
}

_BLOCK_RE = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END GENERATED -->)",
    re.DOTALL,
)


def render_blocks(text: str) -> str:
    """``text`` with every generated block replaced by its current content.

    Raises:
        ValueError: a marker names a block that does not exist.
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in BLOCKS:
            raise ValueError(f"unknown generated block {name!r}")
        return m.group(1) + BLOCKS[name]() + m.group(4)

    return _BLOCK_RE.sub(sub, text)


def stale_blocks(text: str) -> list[str]:
    """Names of the generated blocks in ``text`` whose content is out of date
    (an unknown block name counts as stale)."""
    stale = []
    for m in _BLOCK_RE.finditer(text):
        name = m.group("name")
        if name not in BLOCKS or m.group("body") != BLOCKS[name]():
            stale.append(name)
    return stale
