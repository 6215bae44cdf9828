"""vLLM 0.32.0's own lease tests, run against LeaseprotoConnector's scheduler and
worker (our pytest plugin swaps them in under vLLM's suite), from a temporary
directory: the peers' tarball is unpacked there, never copied into the repo.

Needs vLLM and the tarball (``../shared/peers/vllm-0.32.0-tests.tar.gz`` next to
the repository, or ``LEASEPROTO_VLLM_TESTS``); skipped with the reason otherwise.
``LEASEPROTO_VLLM_SUITE=full`` runs the three files whole instead of the lease selection.
vLLM's bidirectional and push-mode files always run whole.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseproto.integrations.vllm.differences import (
    DIFFERENCES,
    LEASE_TEST_FILES,
    LEASE_TEST_SELECTION,
    PUSH_TEST_FILE,
    WHOLE_TEST_FILES,
)

ROOT = Path(__file__).resolve().parent.parent
_NAME = "vllm-0.32.0-tests.tar.gz"
#: the peers' tarball: $LEASEPROTO_VLLM_TESTS, else ../shared/peers next to the repository,
#: else the workplace's /work/shared/peers (a clone elsewhere, e.g. CI's temporary one)
TARBALL = Path(
    os.environ.get("LEASEPROTO_VLLM_TESTS")
    or next(
        (
            p
            for p in (ROOT.parent / "shared" / "peers" / _NAME, Path("/work/shared/peers") / _NAME)
            if p.exists()
        ),
        ROOT.parent / "shared" / "peers" / _NAME,
    )
)
HF_OFFLINE = TARBALL.parent / "hf-offline"
PLUGIN = "leaseproto.integrations.vllm.pytest_plugin"
REAL_ENGINE = (
    "tests/v1/kv_connector/unit/test_nixl_connector.py::test_abort_timeout_on_prefiller[None]"
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (the vLLM venv of .ci/run has it)",
    ),
    pytest.mark.skipif(not TARBALL.exists(), reason=f"vLLM's tests not found at {TARBALL}"),
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    from leaseproto.integrations.vllm.tinymodel import build_tiny_model, hf_cache_with

    top = tmp_path_factory.mktemp("vllm-tests")
    with tarfile.open(TARBALL) as tar:
        tar.extractall(top, filter="data")
    model = build_tiny_model(top / "tiny-qwen3")
    home = hf_cache_with(
        top / "hf", {"Qwen/Qwen3-0.6B": model}, base=HF_OFFLINE if HF_OFFLINE.exists() else None
    )
    env = {
        **os.environ,
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONPATH": str(ROOT),
    }
    yield top, env


def run_vllm_tests(
    suite: tuple[Path, dict[str, str]], args: list[str], *, ours: bool, name: str
) -> dict[str, str]:
    """Run pytest in the unpacked tree; returns node id -> passed|failed|error|skipped."""
    top, env = suite
    junit = top / f"{name}.xml"
    plugin = ["-p", PLUGIN] if ours else []
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *plugin,
            f"--junitxml={junit}",
            *args,
        ],
        cwd=top,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    if not junit.exists():
        pytest.fail(
            f"vLLM's tests did not run (rc {r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        )
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        cls_split = path.rsplit("/", 1)
        # classname is "tests.v1....test_file" or "...test_file.TestClass"
        file = path + ".py" if not cls_split[-1][:1].isupper() else cls_split[0] + ".py"
        node = (
            f"{file}::{cls_split[-1]}::{case.get('name')}"
            if cls_split[-1][:1].isupper()
            else f"{file}::{case.get('name')}"
        )
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed"}.get(child.tag, child.tag)
        out[node] = status
    out["__tail__"] = r.stdout[-3000:]
    return out


def test_vllm_lease_tests_pass_under_leaseproto(suite: tuple[Path, dict[str, str]]) -> None:
    full = os.environ.get("LEASEPROTO_VLLM_SUITE") == "full"
    select = [] if full else ["-k", LEASE_TEST_SELECTION]
    deselect = [a for node in DIFFERENCES for a in ("--deselect", node)]
    res = run_vllm_tests(suite, [*LEASE_TEST_FILES, *select, *deselect], ours=True, name="ours")
    tail = res.pop("__tail__")
    bad = {n: s for n, s in res.items() if s not in ("passed", "skipped")}
    if full:  # ray executors are unsupported on the CPU platform
        bad = {n: s for n, s in bad.items() if "[ray]" not in n}
    assert not bad, f"{bad}\n{tail}"
    passed = [n for n, s in res.items() if s == "passed"]
    assert len(passed) >= 25, tail
    assert REAL_ENGINE in passed, tail  # the real in-process engine ran on our code
    assert any("test_nixl_heartbeat.py" in n for n in passed)


def test_vllm_bidirectional_file_passes_whole_under_leaseproto(
    suite: tuple[Path, dict[str, str]],
) -> None:
    """vLLM's bidirectional tests (turn-2 gate, D's exported deadline, clock offset),
    every one of them, on our scheduler and worker: D's cached turn now advertises
    leaseproto/1 and P heartbeats it, and none of vLLM's assertions notices."""
    deselect = [a for node in DIFFERENCES for a in ("--deselect", node)]
    res = run_vllm_tests(suite, [*WHOLE_TEST_FILES, *deselect], ours=True, name="whole")
    tail = res.pop("__tail__")
    bad = {n: s for n, s in res.items() if s not in ("passed", "skipped")}
    assert not bad, f"{bad}\n{tail}"
    assert sum(s == "passed" for s in res.values()) >= 30, tail


def test_vllm_push_file_passes_whole_under_leaseproto(
    suite: tuple[Path, dict[str, str]],
) -> None:
    """vLLM's push-mode tests (92) on LeaseprotoPushConnector's scheduler and worker:
    every one passes but those listed in differences.py (checked below)."""
    listed = [node for node in DIFFERENCES if node.startswith(PUSH_TEST_FILE)]
    deselect = [a for node in listed for a in ("--deselect", node)]
    res = run_vllm_tests(suite, [PUSH_TEST_FILE, *deselect], ours=True, name="push")
    tail = res.pop("__tail__")
    bad = {n: s for n, s in res.items() if s not in ("passed", "skipped")}
    assert not bad, f"{bad}\n{tail}"
    passed = sum(s == "passed" for s in res.values())
    assert passed + len(listed) >= 92, tail


def test_listed_differences_fail_under_leaseproto_and_pass_on_stock(
    suite: tuple[Path, dict[str, str]],
) -> None:
    nodes = list(DIFFERENCES)
    ours = run_vllm_tests(suite, nodes, ours=True, name="diff-ours")
    stock = run_vllm_tests(suite, nodes, ours=False, name="diff-stock")
    for node in nodes:
        assert ours.get(node) == "failed", (node, ours.get("__tail__"))
        assert stock.get(node) == "passed", (node, stock.get("__tail__"))


#: our probe (tests/vllm_turn2_probe.py), copied into the unpacked tree beside vLLM's
#: bidirectional tests, whose helpers it uses
PROBE = "tests/v1/kv_connector/unit/test_lp_turn2_probe.py"


def test_a_failed_turn2_read_hangs_stock_vllm_and_is_prefilled_on_ours(
    suite: tuple[Path, dict[str, str]],
) -> None:
    """vLLM's own scheduler, a turn-2 read failed under the recompute policy: stock
    vLLM 0.32 parks the request in WAITING_FOR_REMOTE_KVS again with no read to end
    the wait (a real P hung so); under our scheduler P prefills it itself."""
    top, _ = suite
    (top / PROBE).write_text((ROOT / "tests" / "vllm_turn2_probe.py").read_text())
    node = PROBE + "::test_failed_turn2_read_is_prefilled_locally"
    ours = run_vllm_tests(suite, [PROBE], ours=True, name="probe-ours")
    stock = run_vllm_tests(suite, [PROBE], ours=False, name="probe-stock")
    assert ours.get(node) == "passed", ours.get("__tail__")
    assert stock.get(node) == "failed", stock.get("__tail__")
    assert "WAITING_FOR_REMOTE_KVS" in (top / "probe-stock.xml").read_text()


def test_plugin_swaps_every_name() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1 import nixl
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import connector, scheduler, worker

    from leaseproto.integrations.vllm import pytest_plugin

    saved = {
        m: {n: getattr(importlib.import_module(m), n) for n, _ in names}
        for m, names in pytest_plugin.SWAPPED.items()
    }
    try:
        ours = pytest_plugin.install()
        assert nixl.NixlConnectorWorker is ours["worker"] is worker.NixlConnectorWorker
        assert scheduler.NixlConnectorScheduler is ours["scheduler"]
        assert connector.NixlPullConnectorWorker is ours["worker"]
        assert connector.NixlPullConnectorScheduler is ours["scheduler"]
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import push_scheduler, push_worker

        assert push_worker.NixlPushConnectorWorker is ours["push_worker"]
        assert push_scheduler.NixlPushConnectorScheduler is ours["push_scheduler"]
        assert connector.NixlPushConnectorWorker is ours["push_worker"]
    finally:
        for m, names in saved.items():
            for n, v in names.items():
                setattr(importlib.import_module(m), n, v)
