"""Tools for protocol designers (spec §6 and §12), one floor above the core.

- :mod:`.format`: the scenario file format (JSON lines) and its parser.
- :mod:`.replay_state`: the state a replay runs on; :mod:`.replay` drives the real
  core through a scenario; :mod:`.expect` checks its ``expect`` lines.
- :mod:`.diagram`: the state diagrams embedded in ``spec/``, drawn from
  :data:`~leaseproto.TRANSITIONS`.
- :mod:`.examples`: the scenarios of ``spec/scenarios/``, installed with the
  package (:func:`example_paths`).
"""

from __future__ import annotations

from .examples import example_path, example_paths
from .format import Scenario, ScenarioError, parse_scenario
from .replay import Event, ReplayResult, replay, replay_text

__all__ = [
    "Event",
    "ReplayResult",
    "Scenario",
    "ScenarioError",
    "example_path",
    "example_paths",
    "parse_scenario",
    "replay",
    "replay_text",
]
