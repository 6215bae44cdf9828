"""A comparison as a table, as files (JSON and CSV) and as a picture."""

from __future__ import annotations

import csv
import json
import shutil
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from .figures import FIGURE_LABELS
from .runner import Comparison

__all__ = ["plot", "print_report", "table", "write_files"]


def _cell(value: object, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def table(comp: Comparison, width: int = 80) -> str:
    """The figures, one column per policy, one row per figure, in ``width``
    columns where it can: a policy's name wraps at its spaces when the table
    is too wide for it on one line (``lease+cap`` over ``300s``)."""
    names = [f.policy for f in comp.figures]
    rows = [
        [label, *(_cell(getattr(f, attr), fmt) for f in comp.figures)]
        for attr, label, fmt in FIGURE_LABELS
    ]
    label_w = max(len(r[0]) for r in rows)
    figures_w = [max(len(r[k]) for r in rows) for k in range(1, len(names) + 1)]
    widths = [max(w, len(n)) for w, n in zip(figures_w, names, strict=True)]
    for k in sorted(range(len(names)), key=lambda k: -widths[k]):  # the widest names first
        if label_w + sum(2 + w for w in widths) <= width:
            break
        widths[k] = max(figures_w[k], *(len(word) for word in names[k].split()))
    heads = [textwrap.wrap(n, w) or [""] for n, w in zip(names, widths, strict=True)]
    depth = max(len(h) for h in heads)
    heads = [[""] * (depth - len(h)) + h for h in heads]  # names end on the rule's line
    lines = [
        ("  ".join([" " * label_w, *(f"{h[i]:>{w}}" for h, w in zip(heads, widths, strict=True))]))
        for i in range(depth)
    ]
    lines.append("  ".join("-" * w for w in [label_w, *widths]))
    lines += [
        "  ".join(
            [f"{r[0]:<{label_w}}", *(f"{c:>{w}}" for c, w in zip(r[1:], widths, strict=True))]
        )
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def print_report(comp: Comparison, out: TextIO) -> None:
    """The header and the figures on ``out``, fitted to the terminal's width (80
    columns when ``out`` is not a terminal)."""
    width = shutil.get_terminal_size().columns if out.isatty() else 80
    out.write("\n".join([*textwrap.wrap(header(comp), width), table(comp, width)]) + "\n")


def header(comp: Comparison) -> str:
    sc = comp.scenario
    events = sum(f.events for f in comp.figures)
    return (
        f"scenario {sc.name}: {comp.workload_size:,} requests over {sc.duration:g} s of "
        f"virtual time, {sc.p_engines} P + {sc.d_engines} D engines, seed {comp.seed}; "
        f"{len(comp.figures)} policies, {events:,} events in {comp.wall_s:.1f} s wall, "
        f"{comp.cpu_s:.1f} s CPU"
    )


def _scenario_dict(comp: Comparison) -> dict[str, Any]:
    return asdict(comp.scenario)


def write_files(comp: Comparison, out: Path) -> list[Path]:
    """Write ``figures.json``, ``figures.csv``, ``series.csv`` and
    ``death_to_release.csv`` under ``out`` (created). Returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    figs = [f.as_dict() for f in comp.figures]
    doc = {
        "scenario": _scenario_dict(comp),
        "seed": comp.seed,
        "wall_s": comp.wall_s,
        "cpu_s": comp.cpu_s,
        "policies": [
            {"name": p.name, "heartbeats": p.heartbeats, "ttl": p.ttl, "config": p.config.as_dict()}
            for p in comp.policies
        ],
        "figures": figs,
        "series": {f.policy: asdict(s) for f, s in zip(comp.figures, comp.series, strict=True)},
    }
    paths = [
        out / "figures.json",
        out / "figures.csv",
        out / "series.csv",
        out / "death_to_release.csv",
    ]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    with paths[1].open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(figs[0]))
        w.writeheader()
        w.writerows(figs)
    with paths[2].open("w", newline="") as fh:
        w2 = csv.writer(fh)
        w2.writerow(["policy", "t", "p_blocks", "live_leases", "d_waiting", "hb_msgs"])
        for f, s in zip(comp.figures, comp.series, strict=True):
            for row in zip(s.t, s.p_blocks, s.live_leases, s.d_waiting, s.hb_msgs, strict=True):
                w2.writerow([f.policy, *row])
    with paths[3].open("w", newline="") as fh:
        w3 = csv.writer(fh)
        w3.writerow(["policy", "seconds"])
        for f in comp.figures:
            for v in f.death_to_release:
                w3.writerow([f.policy, v])
    return paths


#: One style per policy, in order (colour-blind-safe colours, after Okabe and Ito):
#: colour, line style, marker. No policy uses the markers' colours below.
POLICY_STYLES: tuple[tuple[str, Any, str], ...] = (
    ("#0072B2", "-", "o"),  # blue
    ("#D55E00", "--", "s"),  # vermillion
    ("#009E73", "-.", "^"),  # green
    ("#CC79A7", ":", "D"),  # reddish purple
    ("#56B4E9", (0, (5, 1)), "v"),  # sky blue
    ("#8C510A", (0, (3, 1, 1, 1)), "P"),  # brown
    ("#666666", (0, (1, 1)), "X"),  # grey
)
#: Scenario markers: (colour, line style) of a D crash; colours of the bands.
CRASH_STYLE = ("#000000", (0, (6, 2, 1, 2)))
SURGE_COLOUR = "#F0E442"  # yellow band
HANG_COLOUR = "#999999"  # grey band


def figure(comp: Comparison) -> Any:
    """The figure :func:`plot` saves (a matplotlib ``Figure``; close it when done).

    Every policy has its own colour, line style and marker, drawn widest first so
    a policy whose line equals another's still shows at its edges; crashes are
    black dash-dot lines, surges yellow bands and hangs grey ones.

    Raises:
        ImportError: matplotlib is missing (``pip install 'leaseproto[plot]'``).
    """
    try:
        import matplotlib  # noqa: PLC0415 - optional extra, imported on use

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install 'leaseproto[plot]'") from exc
    sc = comp.scenario
    fig, ax = plt.subplots(figsize=(10, 5), dpi=110)
    n = len(comp.figures)
    for k, (f, s) in enumerate(zip(comp.figures, comp.series, strict=True)):
        colour, style, marker = POLICY_STYLES[k % len(POLICY_STYLES)]
        every = max(1, len(s.t) // 12)
        ax.plot(
            s.t,
            s.p_blocks,
            label=f.policy,
            color=colour,
            linestyle=style,
            linewidth=1.2 + 1.4 * (n - 1 - k) / max(1, n - 1),
            marker=marker,
            markersize=5,
            markevery=(every * k // max(1, n), every),
            zorder=2 + k,
        )
    for k, surge in enumerate(sc.surges):
        ax.axvspan(
            surge.start,
            surge.start + surge.length,
            color=SURGE_COLOUR,
            alpha=0.3,
            label="surge" if k == 0 else None,
            zorder=0,
        )
    for k, crash in enumerate(sc.crashes):
        ax.axvline(
            crash.at,
            color=CRASH_STYLE[0],
            linestyle=CRASH_STYLE[1],
            linewidth=1.2,
            label="D crash" if k == 0 else None,
            zorder=1,
        )
    for k, hang in enumerate(sc.hangs):
        ax.axvspan(
            hang.at,
            hang.at + hang.length,
            color=HANG_COLOUR,
            alpha=0.2,
            label="D hung" if k == 0 else None,
            zorder=0,
        )
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("KV blocks held by P under a lease")
    ax.set_title(
        f"leaseproto sim --preset {sc.name} (seed {comp.seed}, {comp.workload_size:,} requests)"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def plot(comp: Comparison, path: Path) -> None:
    """Save :func:`figure` to ``path`` (PNG, or any format matplotlib knows by suffix).

    Raises:
        ImportError: matplotlib is missing (``pip install 'leaseproto[plot]'``).
    """
    fig = figure(comp)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(fig)
