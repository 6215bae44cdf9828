"""``leaseproto demo``: the protocol on real workers, phase by phase, measured.

- :mod:`.run`: :func:`run_demo`, the five phases, and phases 1-3 (surge, D
  killed, fixed timeout) themselves;
- :mod:`.turns`: phases 4 and 5, two-turn conversations (verified and
  gate-only turn-2 reads);
- :mod:`.settings`: :class:`DemoSettings` and a phase's measured figures;
- :mod:`.summary`: the words and tables the figures become;
- :mod:`.view`: the terminal display (the live status line, the tables).

The workers run as processes of the harness (:mod:`leaseproto.harness`).
"""

from __future__ import annotations

from .run import run_demo
from .settings import DemoSettings, PhaseResult

__all__ = ["DemoSettings", "PhaseResult", "run_demo"]
