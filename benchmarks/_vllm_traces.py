"""check-trace over the traces ``LeaseprotoConnector`` wrote in one run of
``benchmarks/vllm_pd.py`` (``kv_connector_extra_config: {"trace_dir": ...}``), and
what P's grants and expiries say about the lease's timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from leaseproto.checker.trace import check_files

__all__ = ["grant_leases", "report_traces", "validate"]


def validate(traces: Path) -> dict[str, Any] | None:
    """``leaseproto check-trace`` over the connector's traces of one pair (None: no trace)."""
    files = sorted(traces.glob("*.jsonl")) if traces.is_dir() else []
    if not files:
        return None
    report = check_files(files)
    out = report.as_dict()
    out["violation_list"] = [str(v) for v in report.violations[:20]]
    out["grants"] = grant_leases(files)
    print(
        f"trace validation: {report.events} events, {len(report.violations)} violations "
        f"({report.leases} leases, {report.uses} verified reads used; {len(files)} files)",
        flush=True,
    )
    print(report.verdicts.summary(), flush=True)
    for v in report.violations[:5]:
        print("  ", v, flush=True)
    return out


def report_traces(results: dict[str, Any], json_path: Path | None) -> None:
    """The end of a benchmark's run: one line per pair whose connector wrote traces
    (what :func:`validate` found), then every result as JSON to ``json_path``."""
    for name, r in results.items():
        t = r.get("trace")
        if t is not None:
            print(f"{name}: trace validation: {t['events']} events, {t['violations']} violations")
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=1))


def grant_leases(files: list[Path]) -> dict[str, Any]:
    """What P's grants say: the lease left at the worker's grant (vLLM's scheduler
    stamps it earlier), and each expiry's time from its grant and last renewal."""
    left: list[float] = []
    expiries: list[dict[str, Any]] = []
    for f in files:
        if not f.name.startswith("prefill-"):
            continue
        for line in f.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if e.get("ev") == "grant" and e.get("lease") is not None:
                left.append(float(e["lease"]))
            elif e.get("ev") == "release" and e.get("reason") == "expired":
                last = e.get("last_renewal")
                expiries.append(
                    {
                        "req": e["req"],
                        "at": e["at"],
                        "after_grant_s": round(e["at"] - e["granted_at"], 3),
                        "after_last_renewal_s": None if last is None else round(e["at"] - last, 3),
                    }
                )
    return {
        "lease_left_at_grant_s": None
        if not left
        else {"min": round(min(left), 3), "max": round(max(left), 3), "n": len(left)},
        "expiries": expiries,
    }
