"""Reading the cluster key file (spec §10.3): the one file read behind
``--cluster-key-file`` in the workers and ``cluster_key_file`` in the vLLM
connector. It reads the bytes and checks who else may read them; the keys are
derived from them by the core (:meth:`leaseproto.core.mac.ClusterKey.from_bytes`).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["read_key_file"]


def read_key_file(path: str | os.PathLike[str], *, log: logging.Logger) -> bytes:
    """The contents of the key file at ``path``. Raises ``ValueError`` naming
    the file when it cannot be read; warns on ``log`` when other users may read
    it."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        mode = p.stat().st_mode
    except OSError as exc:
        raise ValueError(f"cannot read the cluster key file {p}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("cluster key file %s can be read by other users (chmod 600 it)", p)
    return raw
