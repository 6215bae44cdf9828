"""How the subcommands report a problem: one line on stderr, exit status 2.

A user's mistake (a bad flag value, a path that cannot be written, a port in
use, a missing optional dependency) is a message naming what to change, never
a traceback. :func:`missing_extra` names the extra (``pip install
'leaseproto[EXTRA]'``) that provides a module that failed to import.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

__all__ = ["EXTRA_OF", "USAGE", "check_writable", "fail", "missing_extra"]

#: Exit status of every usage error (argparse's own errors use it too).
USAGE = 2

#: The top-level module a ``pip install 'leaseproto[EXTRA]'`` provides.
EXTRA_OF = {
    "zmq": "serve",
    "msgspec": "serve",
    "prometheus_client": "serve",
    "rich": "serve",
    "torch": "torch",
    "nixl": "nixl",
    "nixl_cu12": "nixl",
    "matplotlib": "plot",
    "z3": "prove",
}


def fail(command: str, message: str) -> int:
    """Print ``leaseproto COMMAND: MESSAGE`` on stderr; returns :data:`USAGE`."""
    print(f"leaseproto {command}: {message}", file=sys.stderr)
    return USAGE


def missing_extra(exc: ImportError) -> str:
    """What to install for a failed import, e.g. ``needs pyzmq (No module named
    'zmq'): pip install 'leaseproto[serve]'``."""
    name = (exc.name or "").split(".")[0]
    extra = EXTRA_OF.get(name)
    if extra is None:
        return f"a module failed to import: {exc}"
    hint = "pip install torch==2.13.0 && " if extra == "torch" else ""
    return f"needs the '{extra}' extra ({exc}): {hint}pip install 'leaseproto[{extra}]'"


def check_writable(path: Path, *, folder: bool) -> None:
    """Fail before a long run, not after it: ``path`` (a folder to create, or a
    file to write) must be writable now.

    Raises:
        ValueError: it is not, with the reason.
    """
    where = path if folder else path.parent
    try:
        if folder and path.exists() and not path.is_dir():
            raise ValueError(f"{path} exists and is not a folder")
        if not folder and path.is_dir():
            raise ValueError(f"{path} is a folder")
        if where.exists() and not where.is_dir():
            raise ValueError(f"{where} is not a folder")
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write to {where}: {exc.strerror or exc}") from exc
