"""The vLLM integration's configuration and import discipline; no vLLM needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from leaseproto import LeaseConfig
from leaseproto.integrations.vllm.config import lease_config_from_extra_config, vllm_derivation
from leaseproto.integrations.vllm.differences import DIFFERENCES

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("duration", [6, 7, 11, 12, 13, 29, 30, 31, 300, 6.5, 31.5])
def test_same_interval_and_extension_as_vllm(duration: float) -> None:
    """vLLM: ``d // 6`` (D scheduler) and ``d * 2 // 3`` (P worker); a mixed pair agrees."""
    cfg = lease_config_from_extra_config({"kv_lease_duration": duration})
    assert (cfg.heartbeat_interval, cfg.lease_extension) == (duration // 6, duration * 2 // 3)
    assert vllm_derivation(duration) == (duration // 6, duration * 2 // 3)
    assert cfg.kv_lease_duration == duration


def test_default_is_vllms() -> None:
    cfg = lease_config_from_extra_config({})
    assert (cfg.kv_lease_duration, cfg.heartbeat_interval, cfg.lease_extension) == (30, 5, 20)
    assert lease_config_from_extra_config(None) == cfg


@pytest.mark.parametrize("duration", [5, 1, 5.99])
def test_degenerate_vllm_derivation_is_refused(duration: float) -> None:
    with pytest.raises(ValueError, match=r"kv_lease_duration=.*rule V1"):
        lease_config_from_extra_config({"kv_lease_duration": duration})


@pytest.mark.parametrize(
    ("extra", "rule"),
    [
        ({"kv_lease_duration": 0}, "C1"),
        ({"kv_lease_duration": "30"}, "C1"),
        ({"kv_lease_duration": True}, "C1"),
        ({"kv_lease_duration": float("nan")}, "C1"),
        ({"kv_lease_duration": 30, "lease_extension": 4}, "C2"),
        ({"kv_lease_duration": 30, "max_notification_bytes": 10}, "C5"),
    ],
)
def test_bad_values_name_key_and_rule(extra: dict[str, object], rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        lease_config_from_extra_config(extra)


def test_explicit_settings_and_foreign_keys() -> None:
    cfg = lease_config_from_extra_config(
        {
            "kv_lease_duration": 30,
            "heartbeat_interval": 2.5,
            "backends": ["UCX"],
            "bidirectional_kv_xfer": False,
        }
    )
    assert cfg == LeaseConfig(30, heartbeat_interval=2.5, lease_extension=20)


def test_import_leaseproto_never_imports_vllm() -> None:
    code = (
        "import sys, leaseproto, leaseproto.integrations.vllm, "
        "leaseproto.integrations.vllm.config, leaseproto.integrations.vllm.differences, "
        "leaseproto.integrations.vllm.leases; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'transformers')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_docs_list_every_difference() -> None:
    text = (ROOT / "docs" / "vllm.md").read_text()
    for node, (_, _, ours) in DIFFERENCES.items():
        assert node.split("::", 1)[1] in text, node
        assert ours.split("::", 1)[1] in text, ours
