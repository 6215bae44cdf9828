"""One proof obligation: what ``leaseproto prove`` hands z3 and prints a line for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Obligation:
    system: str
    label: str
    ids: tuple[str, ...]
    expect: str  # "unsat": a proof; "sat": a witness must exist
    assertions: list[Any]
    show: Callable[[Any], list[str]] = field(default=lambda m: [])
    why: str = ""
    #: the code under proof raised while the obligation was built (a crash, not a
    #: behaviour the obligation refutes): it fails all the same
    crashed: bool = False
