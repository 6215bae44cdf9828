"""The argparse ``type=`` checks every subcommand's flags use.

Each takes the flag's text and returns its value, or raises
:class:`argparse.ArgumentTypeError` with a message naming what is expected,
so argparse refuses the command line up front (``error: argument --port:
expected a port 1..65535, got '99999'``, exit status 2) rather than a worker
failing later, or binding another port than the one asked for.

:func:`device_problem` is the check a format cannot make: whether this
machine has the device (it imports torch, so a command calls it when it runs).
"""

from __future__ import annotations

import argparse
import math
import re

__all__ = [
    "address",
    "device",
    "device_problem",
    "metrics_port",
    "non_negative_float",
    "non_negative_int",
    "port",
    "port_or_zero",
    "positive_float",
    "positive_int",
]

_DEVICE = re.compile(r"cpu|cuda(?::(?P<index>\d+))?")
_ADDRESS = re.compile(r"tcp://[^\s:/]+:\d{1,5}|tcp://\[[0-9A-Fa-f:.]+\]:\d{1,5}")


def _int(text: str, expected: str, lowest: int, highest: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < lowest or (highest is not None and value > highest):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _float(text: str, expected: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 1..65535."""
    return _int(text, "a port 1..65535", 1, 65535)


def port_or_zero(text: str) -> int:
    """A port to listen on, 0..65535 (0: the system picks a free one)."""
    return _int(text, "a port 1..65535, or 0 to pick a free one", 0, 65535)


def metrics_port(text: str) -> int:
    """The metrics listener's port, 0..65535, or -1 (no metrics listener)."""
    return _int(text, "a port 1..65535, 0 to pick a free one, or -1 to disable", -1, 65535)


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    return _int(text, "a whole number >= 1", 1)


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return _int(text, "a whole number >= 0", 0)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _float(text, "a finite number > 0", zero=False)


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _float(text, "a finite number >= 0", zero=True)


def address(text: str) -> str:
    """A request-plane address, ``tcp://HOST:PORT``."""
    if _ADDRESS.fullmatch(text) and 0 < int(text.rsplit(":", 1)[1]) < 65536:
        return text
    hint = f" (did you mean tcp://{text}?)" if "://" not in text else ""
    raise argparse.ArgumentTypeError(
        f"expected an address tcp://HOST:PORT, e.g. tcp://127.0.0.1:17001, got {text!r}{hint}"
    )


def device(text: str) -> str:
    """A torch device: ``cpu``, ``cuda`` or ``cuda:N``."""
    if _DEVICE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N (N >= 0), got {text!r}")
    return text


def device_problem(name: str) -> str | None:
    """Why this machine cannot hold KV blocks on ``name`` (a :func:`device`), or
    None when it can. Imports torch."""
    m = _DEVICE.fullmatch(name)
    if m is None:
        return f"--device: expected cpu, cuda or cuda:N, got {name!r}"
    if name == "cpu":
        return None
    import torch  # noqa: PLC0415 - only a command that needs a device pays for it

    if not torch.cuda.is_available():
        return f"--device {name}: torch sees no CUDA device on this machine (use --device cpu)"
    count = torch.cuda.device_count()
    index = m["index"]
    if index is not None and int(index) >= count:
        return f"--device {name}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}"
    return None
