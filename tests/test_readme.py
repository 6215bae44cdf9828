"""The README's commands and tables say what the code and CI do: the test command is
the one ``.ci/run`` runs, the vLLM flag names a connector this package exports with
settings ``LeaseConfig`` accepts, and the configuration table lists every key."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import leaseproto.integrations.vllm as vllm_integration
from leaseproto import LeaseConfig
from leaseproto.integrations.vllm.config import lease_config_from_extra_config

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _bash_blocks(text: str = README) -> list[str]:
    """The README's ``bash`` blocks, continuation lines joined."""
    return [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def _bash_commands() -> list[str]:
    return [c for b in _bash_blocks() for c in b.splitlines() if c.strip()]


def _section(title: str) -> str:
    body = README.split(f"\n## {title}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def test_readme_gives_the_test_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = next(i for i, line in enumerate(ci) if "exactly as README.md gives it" in line)
    command = ci[marker + 1].strip()
    assert command == "python -m pytest"
    assert any(c.split(" # ")[0].rstrip().endswith(f"&& {command}") for c in _bash_commands())


def test_readme_first_screen_has_the_demo_and_the_vllm_flag() -> None:
    blocks = _bash_blocks(README.split("\n## ", 1)[0])
    assert any(b.strip().endswith("leaseproto demo") for b in blocks)
    assert any("--kv-transfer-config" in b for b in blocks)


def test_readme_vllm_flag_names_our_connector_with_valid_settings() -> None:
    (block,) = [b for b in _bash_blocks() if "--kv-transfer-config" in b]
    words = shlex.split(block)
    config = json.loads(words[words.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] in vllm_integration.__all__
    assert config["kv_connector_module_path"] == vllm_integration.__name__
    assert config["kv_role"] in ("kv_producer", "kv_consumer")
    extra = config["kv_connector_extra_config"]
    assert set(extra) <= set(LeaseConfig.known_keys())
    lease_config_from_extra_config(extra)  # raises on a value the connector refuses at start-up


def test_readme_configuration_table_lists_every_key() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", _section("Configuration"), flags=re.M)
    assert rows == list(LeaseConfig.known_keys())
