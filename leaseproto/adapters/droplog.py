"""Rate-limited log lines for input a peer or a client can trigger.

:class:`DropLog` writes at most one line per ``interval`` seconds per kind,
each at most ``max_detail`` characters, and then one summary of how many
more there were: a flood of bad input costs a few lines of log, not a copy of
the flood. It reads the monotonic clock (an adapter may; the core never
does), so the workers and the vLLM connector share it from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["DropLog"]


class DropLog:
    """Rate-limited warnings about dropped input (``prefix`` begins each line:
    ``""`` for a log of other lines a peer or client can trigger)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 1.0,
        max_detail: int = 160,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "dropped ",
    ) -> None:
        self.log = logger
        self.prefix = prefix
        self.interval = interval
        self.max_detail = max_detail
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def _short(self, text: str) -> str:
        if len(text) <= self.max_detail:
            return text
        return f"{text[: self.max_detail]}... ({len(text)} characters)"

    def drop(self, kind: str, detail: str, *, level: int = logging.WARNING) -> None:
        """Note one dropped item of ``kind``; log it (at ``level``) unless one
        was logged less than ``interval`` ago."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self.flush(force=True, kinds=(kind,))
        self._last[kind] = now
        self.log.log(level, "%s%s: %s", self.prefix, kind, self._short(detail))

    def flush(self, *, force: bool = False, kinds: tuple[str, ...] | None = None) -> None:
        """Write the summaries that are due (all of them with ``force``)."""
        now = self.clock()
        for kind in list(kinds if kinds is not None else self._suppressed):
            n = self._suppressed.get(kind, 0)
            if not n:
                continue
            last = self._last.get(kind, now)
            if force or now - last >= self.interval:
                self.log.warning(
                    "%s%d more (%s) in the last %.1f s", self.prefix, n, kind, now - last
                )
                self._suppressed[kind] = 0
                self._last[kind] = now
