"""``leaseproto trace REQ_ID FILE...``: one request's history across workers.

Reads the workers' logs (``leaseproto serve`` writes one line per event:
``2026-12-01 17:53:26,123 leaseproto.prefill INFO granted req s3-1a2b3c4d ...``)
and JSON-lines event files (one object per line: the traces ``serve
--trace`` writes, whose notifications name requests in their wire text), keeps
what names the request, and prints it in time order, each line with the file it came from:
grant, every renewal (at ``--log-level DEBUG``), heartbeats naming it, the
read, NACKs, the release and why.

``REQ_ID`` is the router's id for the request (``<client id>-<8 hex>``) or the
client's id alone, which matches every request the router named after it.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..core import wire
from ._errors import fail

__all__ = ["Event", "events", "register"]

#: A log line of ``leaseproto serve``: time, logger, level, message.
_LOG = re.compile(
    r"(?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<who>\S+) (?P<level>[A-Z]+) (?P<msg>.*)"
)
#: JSON event fields that may name a request, and that may give its time.
_ID_FIELDS = ("req_id", "remote_req_id", "id", "ids", "req", "remote", "leases")
_TIME_FIELDS = ("t", "ts", "time", "now")


def _wire_ids(data: object) -> list[str]:
    """The request ids a traced notification (``data``, latin-1 text) names."""
    if not isinstance(data, str):
        return []
    try:
        msg = wire.decode(data.encode("latin-1"))
    except (wire.MalformedMessage, UnicodeEncodeError):
        return []
    if isinstance(msg, wire.Heartbeat):
        return list(msg.ids)
    req_id = getattr(msg, "req_id", None)
    return [req_id] if isinstance(req_id, str) else []


@dataclass(frozen=True)
class Event:
    """One line about the request: when (seconds, comparable within a kind of
    source), where it came from, and what it says."""

    t: float
    source: str
    text: str


def _matcher(req_id: str) -> re.Pattern[str]:
    # the id as a whole word; a client id also matches the router's "<id>-<hex>"
    return re.compile(rf"(?<![\w.:-]){re.escape(req_id)}(?:-[0-9a-f]{{8}})?(?![\w.])")


def _names(value: Any, match: re.Pattern[str]) -> bool:
    if isinstance(value, str):
        return match.fullmatch(value) is not None
    if isinstance(value, list):
        return any(_names(v, match) for v in value)
    if isinstance(value, dict):  # a trace's renewals: id -> time left
        return any(_names(k, match) for k in value)
    return False


def _json_event(line: str, match: re.Pattern[str], source: str) -> Event | bool | None:
    """A JSON-lines event naming the request, False for one that does not, None
    for a line that is not a JSON object."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    if not any(_names(obj.get(k), match) for k in _ID_FIELDS) and not _names(
        _wire_ids(obj.get("data")), match
    ):
        return False
    t = next((obj[k] for k in _TIME_FIELDS if isinstance(obj.get(k), (int, float))), 0.0)
    text = " ".join(f"{k}={v}" for k, v in obj.items() if k not in _TIME_FIELDS)
    return Event(float(t), source, text)


def events(req_id: str, path: Path) -> list[Event]:
    """The lines of ``path`` that name ``req_id``.

    Raises:
        OSError: ``path`` cannot be read.
    """
    match = _matcher(req_id)
    out: list[Event] = []
    source = path.name
    with path.open(encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            line = raw.rstrip("\n")
            if line.startswith("{"):
                event = _json_event(line, match, source)
                if isinstance(event, Event):
                    out.append(event)
                if event is not None:
                    continue
            m = _LOG.match(line)
            if m is None or not match.search(m["msg"]):
                continue
            t = datetime.strptime(m["t"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            who = m["who"].removeprefix("leaseproto.")
            out.append(Event(t, source, f"{who} {m['level']} {m['msg']}"))
    return out


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "trace",
        help="one request's history from the workers' logs or event files",
        description="Print, in time order, every line of the given worker logs (or JSON-lines "
        "event files) that names the request: grant, renewals (workers at --log-level "
        "DEBUG), heartbeats, reads, NACKs, the release and why. Exit status 1 if no line "
        "names it.",
    )
    p.add_argument("req_id", metavar="REQ_ID", help="the router's request id, or the client's id")
    p.add_argument("files", metavar="FILE", nargs="+", help="worker log or event file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    found: list[Event] = []
    for name in args.files:
        try:
            found += events(args.req_id, Path(name))
        except OSError as exc:
            return fail("trace", f"cannot read {name}: {exc.strerror or exc}")
    if not found:
        print(f"leaseproto trace: no line of {len(args.files)} file(s) names {args.req_id}")
        return 1
    t0 = min(e.t for e in found)
    width = max(len(e.source) for e in found)
    for e in sorted(found, key=lambda e: e.t):  # stable: a file's own order within a tick
        print(f"{e.t - t0:9.3f}  {e.source:<{width}}  {e.text}")
    return 0
