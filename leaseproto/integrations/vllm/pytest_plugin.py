"""Run vLLM's own tests with leaseproto's scheduler and worker under them.

``python -m pytest -p leaseproto.integrations.vllm.pytest_plugin <vllm tests>``
rebinds vLLM's NIXL scheduler and worker names (the ``nixl`` package,
``nixl.scheduler``, ``nixl.worker`` and the pull classes ``nixl.connector``
builds) to :class:`LeaseprotoConnectorScheduler` / :class:`LeaseprotoConnectorWorker`
before any test module is imported, so every test, including those that start a
real in-process engine with ``NixlConnector``, exercises our lease code. The
push classes (``nixl.push_scheduler``, ``nixl.push_worker`` and those
``nixl.connector`` builds for ``NixlPushConnector``) are rebound to
:class:`LeaseprotoPushConnectorScheduler` / :class:`LeaseprotoPushConnectorWorker`
the same way.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SWAPPED", "install"]

_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"

#: module -> names rebound there: (name, "scheduler" | "worker" | "push_scheduler" | "push_worker")
SWAPPED: dict[str, tuple[tuple[str, str], ...]] = {
    _NIXL: (
        ("NixlConnectorScheduler", "scheduler"),
        ("NixlPullConnectorScheduler", "scheduler"),
        ("NixlConnectorWorker", "worker"),
        ("NixlPullConnectorWorker", "worker"),
    ),
    _NIXL + ".scheduler": (
        ("NixlConnectorScheduler", "scheduler"),
        ("NixlPullConnectorScheduler", "scheduler"),
    ),
    _NIXL + ".worker": (("NixlConnectorWorker", "worker"), ("NixlPullConnectorWorker", "worker")),
    _NIXL + ".connector": (
        ("NixlPullConnectorScheduler", "scheduler"),
        ("NixlPullConnectorWorker", "worker"),
        ("NixlPushConnectorScheduler", "push_scheduler"),
        ("NixlPushConnectorWorker", "push_worker"),
    ),
    _NIXL + ".push_scheduler": (("NixlPushConnectorScheduler", "push_scheduler"),),
    _NIXL + ".push_worker": (("NixlPushConnectorWorker", "push_worker"),),
}


def install() -> dict[str, type]:
    """Rebind the names; returns the classes now bound. Idempotent."""
    from .push_scheduler import LeaseprotoPushConnectorScheduler
    from .push_worker import LeaseprotoPushConnectorWorker
    from .scheduler import LeaseprotoConnectorScheduler
    from .worker import LeaseprotoConnectorWorker

    ours: dict[str, type] = {
        "scheduler": LeaseprotoConnectorScheduler,
        "worker": LeaseprotoConnectorWorker,
        "push_scheduler": LeaseprotoPushConnectorScheduler,
        "push_worker": LeaseprotoPushConnectorWorker,
    }
    for module_name, names in SWAPPED.items():
        module = importlib.import_module(module_name)
        for name, side in names:
            setattr(module, name, ours[side])
    return ours


def pytest_configure(config: Any) -> None:
    install()


def pytest_report_header(config: Any) -> str:
    return "leaseproto: vLLM's NIXL scheduler/worker swapped for LeaseprotoConnector's"
