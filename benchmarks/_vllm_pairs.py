"""The connector pairs of ``benchmarks/vllm_pd.py`` (``vllm_push.py`` uses some of it),
their P and D servers' shape, the prompts, and the router's requests to a server
(completions, ``/metrics``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _vllm_server import Server

from leaseproto.integrations.vllm.tinymodel import WORDS

PAIRS = {
    "stock": ("NixlConnector", "NixlConnector"),
    "leaseproto": ("LeaseprotoConnector", "LeaseprotoConnector"),
    "ours P + stock D": ("LeaseprotoConnector", "NixlConnector"),
    "stock P + ours D": ("NixlConnector", "LeaseprotoConnector"),
}


def prompt(i: int, n: int = 90) -> str:
    return " ".join(WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(n))


def post(port: int, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def references(port: int, n: int, max_tokens: int) -> dict[int, str]:
    """Prompts ``0..n-1`` completed greedily by the server on ``port`` (a P serving alone):
    what a P/D pair must answer for each."""
    body = {"max_tokens": max_tokens, "model": "m", "temperature": 0}
    return {
        i: str(post(port, {**body, "prompt": prompt(i)})["choices"][0]["text"]) for i in range(n)
    }


def metrics(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("vllm:nixl_", "vllm:leaseproto_")) and "_total" in line:
            name = line.split("{", 1)[0].split(" ", 1)[0].removesuffix("_total")
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


#: role -> (CPU to bind, most requests running at once, KV blocks): P small enough that freed
#: blocks are reused soon; D running two at a time, so requests queue
SHAPE = {"kv_producer": ("0", 8, 32), "kv_consumer": ("1", 2, 256)}


def server(
    model: Path,
    role: str,
    connector: str,
    log: Path,
    traces: Path,
    *,
    bidirectional: bool = False,
    more: dict[str, Any] | None = None,
) -> Server:
    cpu, seqs, blocks = SHAPE[role]
    return Server(
        model=model,
        role=role,
        connector=connector,
        cpu=cpu,
        log=log,
        max_num_seqs=seqs,
        blocks=blocks,
        traces=traces,
        bidirectional=bidirectional,
        more=more,
    )
