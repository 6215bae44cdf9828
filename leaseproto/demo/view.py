"""What ``leaseproto demo`` prints, drawn by ``rich``.

On a terminal: a live status (a bar and the figures that move) that always
fits on one line of the terminal's width and disappears when the phase ends;
lines meant to stay (intents, the moment of the SIGKILL, verdicts) are
printed above it and kept; the final table is fitted to the width. Piped to
a file or ``head``: plain text with no control sequences, the status as a
line every two seconds.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Column, Table
from rich.text import Text

__all__ = ["DemoDisplay", "surge_status", "turns_status", "wrap"]

#: Seconds between two status lines when the output is not a terminal.
PLAIN_EVERY_S = 2.0

#: The space between a number and its unit ("2 s", "0.5 ms"): a line never breaks there.
_UNIT_SPACE = re.compile(r"(?<=\d) (?=m?s\b)")
_NO_BREAK = "\xa0"  # textwrap breaks only at ASCII whitespace


def wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped at spaces to ``width`` columns, never between a number
    and its unit; a continuation line is indented as its first line is."""
    out: list[str] = []
    for para in text.split("\n"):
        indent = para[: len(para) - len(para.lstrip(" "))]
        lines = textwrap.wrap(
            _UNIT_SPACE.sub(_NO_BREAK, para),
            max(20, width),
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        out += [ln.replace(_NO_BREAK, " ") for ln in lines] or [""]
    return out


def surge_status(d: Mapping[str, Any], p: Mapping[str, Any]) -> str:
    """The figures of a surge, after its ``answered/total`` count: what the phase
    shows first (leases expired, late transfers), then P's and D's load, so a
    narrow terminal that cuts the line cuts the least telling part."""
    t = p.get("table", {})
    return (
        f"answered | expired {t.get('released_expired')} late {t.get('late_transfers')} | "
        f"P holds {p.get('blocks_held')} blocks | D waiting {d.get('waiting')} "
        f"running {d.get('running')}"
    )


def turns_status(d: Mapping[str, Any], p: Mapping[str, Any]) -> str:
    """The figures of a multi-turn phase, after its ``done/total`` count: D's
    cached turns (how many expired), then P's queue and its heartbeats to D."""
    t = d.get("turn_table", {})
    return (
        f"done | D turns {d.get('turn_leases_live')} held {t.get('released_expired')} "
        f"expired | P queue {p.get('queued')}, {p.get('prefix_heartbeats_sent')} heartbeats "
        f"to D | D waiting {d.get('waiting')}"
    )


class DemoDisplay:
    """The demo's output stream: kept lines, a transient status, tables."""

    def __init__(self, out: TextIO, *, width: int | None = None) -> None:
        self.console = Console(file=out, width=width, highlight=False, markup=False)
        self.live = self.console.is_terminal
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._last = 0.0

    # -- lines that stay ------------------------------------------------------------------
    def line(self, text: str) -> None:
        """A line that stays, wrapped to the width (:func:`wrap`)."""
        for part in wrap(text, self.console.width):
            self.console.print(Text(part))

    def verdict(self, text: str) -> None:
        """``  -> verdict``, continuation lines indented under the verdict."""
        lead = "  -> "
        for i, part in enumerate(wrap(text, self.console.width - len(lead))):
            self.console.print(Text((lead if i == 0 else " " * len(lead)) + part))

    # -- the status that moves ------------------------------------------------------------
    def status(
        self,
        name: str,
        text: str,
        *,
        done: int | None = None,
        total: int | None = None,
        force: bool = False,
    ) -> None:
        """Show how the phase ``name`` is going; ``done``/``total`` draw a bar."""
        if not self.live:
            now = time.monotonic()
            if force or now - self._last >= PLAIN_EVERY_S:
                count = "" if total is None else f"{done or 0}/{total} "
                self.console.print(Text(f"  {name}: {count}{text}"), soft_wrap=True)
                self._last = now
            return
        if self._bar is None:
            self._bar = Progress(
                TextColumn("  {task.description}", markup=False),
                BarColumn(bar_width=16),
                MofNCompleteColumn(),
                TextColumn(
                    "{task.fields[status]}",
                    markup=False,
                    table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1),
                ),
                console=self.console,
                transient=True,
                auto_refresh=False,
                expand=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(name, total=total, status=text)
        assert self._task is not None
        self._bar.update(
            self._task, description=name, total=total, completed=done or 0, status=text
        )
        self._bar.refresh()

    def end_status(self) -> None:
        """Remove the status (the lines kept above it stay)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = None

    # -- tables ---------------------------------------------------------------------------
    def table(
        self, head: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str]
    ) -> None:
        """A table fitted to the width (numbers right-aligned; a head may hold a
        newline to fit in fewer columns), then its notes. Lines end without
        trailing blanks."""
        t = Table(
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            show_edge=False,
            padding=(0, 1, 0, 0),
            header_style="",
        )
        for i, h in enumerate(head):
            t.add_column(h, justify="left" if i < 2 else "right", no_wrap=i == 0)
        for row in rows:
            t.add_row(*row)
        with self.console.capture() as captured:
            self.console.print(t)
        for line in captured.get().splitlines():
            self.console.file.write(line.rstrip() + "\n")
        self.console.file.flush()
        for note in notes:
            self.line(note)

    def close(self) -> None:
        self.end_status()
