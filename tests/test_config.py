import math

import pytest

from leaseproto import LeaseConfig
from leaseproto.cli import main


def test_defaults_match_vllm() -> None:
    c = LeaseConfig()
    assert (c.kv_lease_duration, c.heartbeat_interval, c.lease_extension) == (30.0, 5.0, 20.0)
    assert c.decoder_kv_blocks_ttl == 480.0 and c.max_lease_lifetime is None
    assert c.tolerated_missed_heartbeats == 2
    assert LeaseConfig(kv_lease_duration=30, heartbeat_interval=4).tolerated_missed_heartbeats == 3


def test_our_keys_default_as_the_spec_s_table_says() -> None:
    c = LeaseConfig()
    assert (c.safety_margin, c.max_notification_bytes) == (5.0, 4096)
    assert (c.tombstone_ttl, c.tombstone_capacity) == (480.0, 100_000)
    assert (c.staging_ttl, c.staging_capacity) == (30.0, 10_000)


def test_derived_values_follow_the_duration() -> None:
    c = LeaseConfig(kv_lease_duration=60)
    assert (c.heartbeat_interval, c.lease_extension) == (10.0, 40.0)
    assert c.staging_ttl == 60.0 and c.tombstone_ttl == 480.0


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        LeaseConfig().kv_lease_duration = 3.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kv_lease_duration": 0}, r"kv_lease_duration=0 must be > 0 \(rule C1\)"),
        ({"kv_lease_duration": -5.0}, "rule C1"),
        ({"kv_lease_duration": math.inf}, "finite"),
        ({"kv_lease_duration": math.nan}, "finite"),
        ({"kv_lease_duration": "30"}, "expected a number"),
        ({"kv_lease_duration": True}, "expected a number"),
        ({"heartbeat_interval": 20.0}, r"rule C2"),
        ({"lease_extension": 5.0}, r"lease_extension=5 must be greater than heartbeat_interval=5"),
        ({"heartbeat_interval": 30.0, "lease_extension": 40.0}, "rule C3"),
        ({"max_lease_lifetime": 10.0}, "rule C4"),
        ({"max_notification_bytes": 10}, "rule C5"),
        ({"max_notification_bytes": 4096.0}, "expected an integer"),
        ({"tombstone_capacity": 0}, "tombstone_capacity"),
        ({"staging_capacity": -1}, "staging_capacity"),
        ({"safety_margin": -1.0}, "safety_margin"),
        ({"decoder_kv_blocks_ttl": 0}, "decoder_kv_blocks_ttl"),
    ],
)
def test_unsafe_values_name_key_and_rule(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LeaseConfig(**kwargs)  # type: ignore[arg-type]


def test_a_cap_equal_to_the_initial_lease_is_allowed_C4() -> None:
    assert LeaseConfig(kv_lease_duration=30, max_lease_lifetime=30).max_lease_lifetime == 30.0
    with pytest.raises(ValueError, match="C4"):
        LeaseConfig(kv_lease_duration=30, max_lease_lifetime=29.9)


def test_zero_margin_is_allowed() -> None:
    assert LeaseConfig(safety_margin=0).safety_margin == 0.0


def test_from_extra_config_reads_vllm_and_own_keys_ignores_others() -> None:
    c = LeaseConfig.from_extra_config(
        {
            "kv_lease_duration": 60,
            "decoder_kv_blocks_ttl": 300,
            "max_lease_lifetime": 600,
            "backends": ["UCX"],
            "kv_buffer_device": "cuda",
        }
    )
    assert c.kv_lease_duration == 60.0 and c.decoder_kv_blocks_ttl == 300.0
    assert c.max_lease_lifetime == 600.0 and c.lease_extension == 40.0
    assert LeaseConfig.from_extra_config({}) == LeaseConfig()


def test_from_extra_config_rejects_non_mapping_and_bad_values() -> None:
    with pytest.raises(ValueError, match="C6"):
        LeaseConfig.from_extra_config([("kv_lease_duration", 3)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kv_lease_duration"):
        LeaseConfig.from_extra_config({"kv_lease_duration": "60"})


def test_as_dict_has_every_key() -> None:
    assert set(LeaseConfig().as_dict()) == set(LeaseConfig.known_keys())


def test_cli_config_prints_effective_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--kv-lease-duration", "3"]) == 0
    out = capsys.readouterr().out
    assert "heartbeat_interval           0.5" in out and "lease_extension              2" in out


def test_cli_config_json_and_extra_config(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert (
        main(
            [
                "config",
                "--json",
                "--extra-config",
                '{"kv_lease_duration": 60}',
                "--max-lease-lifetime",
                "120",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["lease_extension"] == 40.0
    assert data["bounds"]["max_hold"] == 120.0


def test_cli_config_rejects_unsafe_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--kv-lease-duration", "3", "--lease-extension", "0.4"]) == 2
    err = capsys.readouterr().err
    assert "rule C2" in err and "lease_extension" in err
    assert main(["config", "--extra-config", "{not json"]) == 2
