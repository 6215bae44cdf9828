"""The workers' Prometheus metrics: names and types as promtool wants them,
engine_id/rank labels on every series, a build-info metric, the hold-time and
transfer-time histograms, and the core's counters read at scrape time."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from leaseproto import LeaseConfig, __version__
from leaseproto.core.events import Release, ReleaseReason
from leaseproto.core.table import LeaseTable
from leaseproto.core.tracker import HeartbeatTracker
from leaseproto.workers.metrics import DecodeMetrics, PrefillMetrics, RouterMetrics

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

#: What a dashboard may rely on: family name (as the parser names it) -> type.
EXPECTED = {
    "prefill": {
        "leaseproto_build_info": "gauge",
        "leaseproto_leases_granted": "counter",
        "leaseproto_leases_renewed": "counter",
        "leaseproto_leases_released": "counter",
        "leaseproto_late_transfer_notifications": "counter",
        "leaseproto_heartbeats_received": "counter",
        "leaseproto_nacks_sent": "counter",
        "leaseproto_leases_live": "gauge",
        "leaseproto_blocks_held": "gauge",
        "leaseproto_reclaim_after_expiry_seconds": "histogram",
        "leaseproto_lease_hold_seconds": "histogram",
    },
    "decode": {
        "leaseproto_build_info": "gauge",
        "leaseproto_heartbeats_sent": "counter",
        "leaseproto_heartbeats_deferred": "counter",
        "leaseproto_kv_transfers": "counter",
        "leaseproto_kv_transfer_seconds": "histogram",
        "leaseproto_requests_tracked": "gauge",
        "leaseproto_requests_completed": "counter",
    },
    "router": {
        "leaseproto_build_info": "gauge",
        "leaseproto_router_requests": "counter",
        "leaseproto_router_request_seconds": "histogram",
    },
}


def _families(metrics: object) -> dict[str, object]:
    text = generate_latest(metrics.registry).decode()  # type: ignore[attr-defined]
    return {f.name: f for f in text_string_to_metric_families(text)}


def _all() -> dict[str, object]:
    table = LeaseTable(LeaseConfig(3.0))
    tracker = HeartbeatTracker(LeaseConfig(3.0))
    return {
        "prefill": PrefillMetrics("pe", 1, table_stats=lambda: table.stats),
        "decode": DecodeMetrics("de", 0, tracker_stats=lambda: tracker.stats),
        "router": RouterMetrics(),
    }


@pytest.mark.parametrize("role", ["prefill", "decode", "router"])
def test_names_types_and_labels(role: str) -> None:
    metrics = _all()[role]
    fams = _families(metrics)
    for name, kind in EXPECTED[role].items():
        assert name in fams, name
        assert fams[name].type == kind, (name, fams[name].type)  # type: ignore[attr-defined]
    for fam in fams.values():
        assert fam.name.startswith("leaseproto_") and NAME.fullmatch(fam.name)  # type: ignore[attr-defined]
        assert fam.documentation  # type: ignore[attr-defined]
        if fam.type == "histogram" or fam.name.endswith("_seconds"):  # type: ignore[attr-defined]
            assert fam.name.endswith("_seconds"), fam.name  # type: ignore[attr-defined]
        for sample in fam.samples:  # type: ignore[attr-defined]
            assert {"engine_id", "rank"} <= set(sample.labels), sample
            if fam.type == "counter" and not sample.name.endswith("_created"):  # type: ignore[attr-defined]
                assert sample.name.endswith("_total"), sample.name


def test_build_info_names_version_and_role() -> None:
    fam = _families(_all()["prefill"])["leaseproto_build_info"]
    (sample,) = fam.samples  # type: ignore[attr-defined]
    assert sample.labels["version"] == __version__ and sample.labels["role"] == "prefill"
    assert sample.labels["engine_id"] == "pe" and sample.labels["rank"] == "1"


def _value(metrics: object, name: str, **labels: str) -> float:
    for fam in _families(metrics).values():
        for s in fam.samples:  # type: ignore[attr-defined]
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_core_counters_are_read_at_scrape_time() -> None:
    """No sync step: what a scrape shows is the table's count at that moment."""
    table = LeaseTable(LeaseConfig(3.0))
    m = PrefillMetrics("pe", 0, table_stats=lambda: table.stats)
    assert _value(m, "leaseproto_leases_granted_total") == 0
    table.grant("a", now=0.0)
    table.grant("b", now=0.0)
    table.renew(["a"], now=1.0)
    assert _value(m, "leaseproto_leases_granted_total") == 2
    assert _value(m, "leaseproto_leases_renewed_total") == 1
    assert _value(m, "leaseproto_leases_live") == 2
    for rel in table.expire(now=100.0):
        m.observe_release(rel)
    assert _value(m, "leaseproto_leases_released_total", reason="expired") == 2
    assert _value(m, "leaseproto_leases_live") == 0


def test_hold_time_by_reason() -> None:
    m = _all()["prefill"]
    rel = Release("a", ReleaseReason.TRANSFERRED, at=12.5, deadline=30.0, granted_at=10.0)
    m.observe_release(rel)  # type: ignore[attr-defined]
    assert _value(m, "leaseproto_lease_hold_seconds_sum", reason="transferred") == 2.5
    assert _value(m, "leaseproto_lease_hold_seconds_count", reason="expired") == 0


def test_transfer_time_histogram() -> None:
    m = _all()["decode"]
    m.transfer_time.observe(0.2)  # type: ignore[attr-defined]
    assert _value(m, "leaseproto_kv_transfer_seconds_count") == 1


def test_every_metric_is_in_the_docs_table() -> None:
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text()
    for role, metrics in _all().items():
        for fam in _families(metrics).values():
            name = fam.name + ("_total" if fam.type == "counter" else "")  # type: ignore[attr-defined]
            if name.endswith("_created") or name == "leaseproto_build_info":
                continue
            assert f"`{name}`" in doc, (role, name)
