"""The cluster key in LeaseprotoConnector (issue 17, spec §10.3): with
``kv_connector_extra_config: {"cluster_key_file": PATH}`` on both sides, the
hello, P's answer, verdicts, heartbeats and the transfer-done vLLM attaches to
a READ are sealed frames; an agent that cannot prove the key is a stranger;
a keyed D refuses a P that advertised no key or another one; a replayed frame
is refused; without a key nothing changes. On vLLM's own classes
(``_read_blocks_for_req``, ``_send_pending_recv_notifs``, ``_pop_done_transfers``);
only the NIXL post in ``_read_blocks`` is replaced, by one that builds the
transfer-done and calls ``make_prepped_xfer`` as vLLM does. A virtual clock.
Needs vLLM."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm_stubs import (
    RecordingNixl,
    d_request,
    make_reader,
    make_scheduler,
    make_worker,
    recv_meta,
    virtual_clock,
    worker_stat,
)

from leaseproto.core.mac import FRAME_PREFIX
from leaseproto.integrations.vllm.sealing import load_key

pytestmark = pytest.mark.vllm

KEYS = {"a": b"0123456789abcdef0123456789abcdef", "b": b"another key of 32 bytes, not a!!"}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    return virtual_clock(monkeypatch)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, raw in KEYS.items():
        f = tmp_path / f"{name}.key"
        f.write_bytes(raw)
        f.chmod(0o600)
        out[name] = str(f)
    return out


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """vLLM's NIXL post of one READ, replaced by what it does around NIXL: the
    transfer-done ``<P id>:<n>`` handed to ``make_prepped_xfer``, then ``transfer``."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
        NixlPullConnectorWorker,
    )

    calls: list[dict[str, Any]] = []

    def post(self: Any, **kw: Any) -> bool:
        notif_id = f"{kw['remote_request_id']}:{kw['expected_consumers']}".encode()
        handle = self.nixl_wrapper.make_prepped_xfer("READ", 0, [0], 0, [0], notif_msg=notif_id)
        self.nixl_wrapper.transfer(handle)
        self._recving_transfers.setdefault(kw["request_id"], []).append(handle)
        calls.append(kw)
        return True

    monkeypatch.setattr(NixlPullConnectorWorker, "_read_blocks", post)
    return calls


def _extra(path: str | None) -> dict[str, Any] | None:
    return None if path is None else {"cluster_key_file": path}


def _nixl(w: Any) -> RecordingNixl:
    """The NIXL agent itself (what goes on and comes off the wire)."""
    raw: RecordingNixl = w.__dict__["_lp_nixl"]
    return raw


def _prefill(path: str | None, clock: dict[str, float], rid: str = "p1") -> Any:
    p = make_worker(True, name="p0", extra=_extra(path))
    p._reqs_to_process.add(rid)
    p._reqs_to_send[rid] = clock["t"] + 12
    return p


def _decoder(path: str | None) -> Any:
    return make_reader(1, 0, 1, name="d0", extra=_extra(path))


def _key_id(path: str) -> str:
    key = load_key({"cluster_key_file": path})
    assert key is not None
    return key.key_id


def _read(d: Any, key_id: str | None, local: str = "d1", remote: str = "p1") -> None:
    """D reads ``remote`` from a P that advertised ``leaseproto/1`` with ``key_id``."""
    d._lp_set("_lp_advertised").add(local)
    d._key_ids()[local] = key_id
    d._read_blocks_for_req(local, recv_meta(local, remote))


def _carry(src: Any, dst: Any) -> list[bytes]:
    """Deliver everything ``src`` sent to ``dst``; returns it."""
    raw = _nixl(src)
    msgs = [m for _, m in raw.sent]
    raw.sent = []
    _nixl(dst).deliver(raw.name, *msgs)
    return msgs


def _handshake(d: Any, p: Any) -> None:
    """D's hello to P, and P's answer back."""
    [hello] = _carry(d, p)
    assert hello.startswith(FRAME_PREFIX) and b"leaseproto/1,hello," in hello
    p._get_new_notifs()
    [answer] = _carry(p, d)
    assert answer.startswith(FRAME_PREFIX)
    d._get_new_notifs()


# -- a keyed pair ---------------------------------------------------------------------------
def test_a_keyed_pair_verifies_reads_over_sealed_messages(
    keys: dict[str, str], clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    d, p = _decoder(keys["a"]), _prefill(keys["a"], clock)
    _read(d, _key_id(keys["a"]))
    # P has not answered the hello: the READ goes, its transfer-done waits for the READ's end
    assert _nixl(d).xfers == [b""]
    assert d._pending_recv_notifs == {"d1": [("p0", b"p1:1")]}
    _handshake(d, p)
    assert _nixl(p).added == [b"meta:d0"]
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())  # held for OK
    d._send_pending_recv_notifs("d1")  # vLLM's own step once the READ is done
    [done] = _carry(d, p)
    assert done.startswith(FRAME_PREFIX) and done.endswith(b"p1:1")
    assert p._get_new_notifs() == {"p1"}
    [ok] = [m for _, m in _nixl(p).sent]
    assert ok.startswith(FRAME_PREFIX) and ok.endswith(b"OK:p1")
    # an unsealed OK naming P's agent changes nothing; the sealed one verifies the read
    _nixl(d).deliver("p0", b"OK:p1")
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == (set(), set())
    assert worker_stat(d, "lp_auth_dropped") == 1
    _carry(p, d)
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == ({"d1"}, set())
    assert worker_stat(d, "lp_reads_verified") == 1
    # connected now: the next READ carries its transfer-done, sealed, as NIXL's notification
    p._reqs_to_process.add("p2")
    p._reqs_to_send["p2"] = clock["t"] + 12
    _read(d, _key_id(keys["a"]), "d2", "p2")
    note = _nixl(d).xfers[-1]
    assert note.startswith(FRAME_PREFIX) and note.endswith(b"p2:1")
    _nixl(p).deliver("d0", note)
    assert p._get_new_notifs() == {"p2"}
    assert worker_stat(p, "lp_auth_dropped") == 0


def test_keyed_heartbeats_greet_first_and_are_sealed(
    keys: dict[str, str], clock: dict[str, float]
) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        HeartbeatInfo,
        NixlConnectorMetadata,
    )

    from leaseproto.integrations.vllm.tracking import ENGINE_AUTH_ATTR

    d = make_worker(True, name="d0", agents={"P0": {(0, 0): b"p0"}}, extra=_extra(keys["a"]))
    p = _prefill(keys["a"], clock)

    def beat(key_id: str | None) -> None:
        meta = NixlConnectorMetadata()
        meta.heartbeat_by_engine = {"P0": HeartbeatInfo({"p1"}, "p-host", 5600, 1)}
        setattr(meta, ENGINE_AUTH_ATTR, {"P0": key_id})
        d._send_heartbeats(meta)

    beat(_key_id(keys["a"]))
    [hello] = [m for _, m in _nixl(d).sent]  # the heartbeat waits for P's answer
    assert b"hello" in hello
    _carry(d, p)
    p._get_new_notifs()
    _carry(p, d)
    d._get_new_notifs()  # the answer: the held heartbeat goes, sealed
    [hb] = _carry(d, p)
    assert hb.startswith(FRAME_PREFIX) and hb.endswith(b"HB:p1")
    clock["t"] += 5.0
    p._get_new_notifs()
    assert p._reqs_to_send["p1"] == clock["t"] + 20  # renewed: now + E
    # a replayed heartbeat is refused
    _nixl(p).deliver("d0", hb)
    clock["t"] += 5.0
    p._get_new_notifs()
    assert p._reqs_to_send["p1"] == clock["t"] + 15  # not renewed again
    assert worker_stat(p, "lp_auth_dropped") == 1
    assert p.nixl_wrapper.auth.dropped["replayed"] == 1


def test_a_replayed_transfer_done_does_not_complete_a_two_reader_lease(
    keys: dict[str, str], clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """D TP 2 over P TP 1: n = 2. D rank 0's sealed transfer-done, replayed, must
    not stand for rank 1's."""
    ds = [make_reader(2, r, 1, name=f"d{r}", extra=_extra(keys["a"])) for r in range(2)]
    p = _prefill(keys["a"], clock)
    _read(ds[0], _key_id(keys["a"]))
    _handshake(ds[0], p)
    ds[0]._send_pending_recv_notifs("d1")
    [done] = _carry(ds[0], p)
    assert done.endswith(b"p1:2")
    assert p._get_new_notifs() == set()  # 1 of 2 readers
    _nixl(p).deliver("d0", done)
    assert p._get_new_notifs() == set()
    assert "p1" in p._reqs_to_send and p.nixl_wrapper.auth.dropped["replayed"] == 1


# -- strangers ----------------------------------------------------------------------------
def test_a_keyed_p_acts_on_no_unsealed_or_wrongly_sealed_message(
    keys: dict[str, str], clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """A D with another key (it greets with it), and a stock D (plain vLLM
    messages): P loads nothing, answers nothing, renews and completes nothing;
    the stock D's lease ends by expiry."""
    p = _prefill(keys["a"], clock)
    deadline = p._reqs_to_send["p1"]
    wrong = _decoder(keys["b"])
    _read(wrong, _key_id(keys["b"]))  # it believes P holds its key
    _carry(wrong, p)
    _nixl(p).deliver("d0", b"HB:p1", b"p1:1", b"AB:p1", b"leaseproto/1,hello,meta:d0")
    assert p._get_new_notifs() == set()
    assert _nixl(p).sent == [] and getattr(_nixl(p), "added", []) == []
    assert worker_stat(p, "lp_auth_dropped") == 5
    assert p.nixl_wrapper.auth.dropped["bad mac"] == 1
    assert p._reqs_to_send["p1"] == deadline
    clock["t"] = deadline + 0.1
    freed: set[str] = set()
    p._reap_expired_send_leases(freed)
    assert freed == {"p1"}


@pytest.mark.parametrize(
    ("mine", "theirs"), [("a", "b"), ("a", None), (None, "a")], ids=["other", "none", "keyless-d"]
)
@pytest.mark.usefixtures("clock")
def test_d_refuses_a_p_that_advertised_another_key(
    keys: dict[str, str],
    posted: list[dict[str, Any]],
    mine: str | None,
    theirs: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = _decoder(None if mine is None else keys[mine])
    with caplog.at_level(logging.WARNING, logger="vllm.leaseproto.worker"):
        _read(d, None if theirs is None else _key_id(keys[theirs]))
    assert posted == [] and _nixl(d).sent == []  # nothing read, nobody greeted
    assert d._recv_failures == {"d1"}  # vLLM's failure path: recomputed
    assert worker_stat(d, "lp_key_mismatch") == 1
    assert "d1" not in d._lp_set("_lp_advertised")
    assert any("cluster key" in r.getMessage() for r in caplog.records)


def test_a_keyed_d_reads_a_stock_p_unverified(
    keys: dict[str, str], clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """A P that did not advertise ``leaseproto/1``: vLLM's plain messages, the
    READ used unverified (logged once), as without a key."""
    d = _decoder(keys["a"])
    d._read_blocks_for_req("d1", recv_meta("d1", "p1"))
    assert _nixl(d).xfers == [b"p1:1"] and _nixl(d).sent == []
    assert d._pop_done_transfers(d._recving_transfers) == ({"d1"}, set())


# -- without a key ------------------------------------------------------------------------
def _started(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any] | None) -> Any:
    """LeaseprotoConnectorWorker's own __init__, vLLM's (NIXL) replaced."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
        NixlPullConnectorWorker,
    )

    from leaseproto.integrations.vllm.worker import LeaseprotoConnectorWorker

    def vllm_init(self: Any, *args: Any) -> None:
        self.nixl_wrapper = RecordingNixl("p0")

    monkeypatch.setattr(NixlPullConnectorWorker, "__init__", vllm_init)
    config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra or {}),
        device_config=None,
    )
    return LeaseprotoConnectorWorker(config, "E0", None)


def test_without_a_key_the_agent_is_vllms_and_start_up_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, keys: dict[str, str]
) -> None:
    with caplog.at_level(logging.INFO, logger="vllm.leaseproto.auth"):
        w = _started(monkeypatch, None)
    assert w.nixl_wrapper is _nixl(w) and w._auth() is None  # nothing wraps vLLM's calls
    [line] = [r.getMessage() for r in caplog.records]
    assert "UNAUTHENTICATED" in line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm.leaseproto.auth"):
        keyed = _started(monkeypatch, {"cluster_key_file": keys["a"]})
    assert keyed._auth() is not None and keyed._auth().agent == "p0"
    assert [_key_id(keys["a"]) in r.getMessage() for r in caplog.records] == [True]


def test_a_bad_key_file_is_refused_at_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    short = tmp_path / "short.key"
    short.write_bytes(b"too short")
    with pytest.raises(ValueError, match=r"cluster_key_file.*at least 16 bytes"):
        _started(monkeypatch, {"cluster_key_file": str(short)})
    with pytest.raises(ValueError, match="cannot read the cluster key file"):
        _started(monkeypatch, {"cluster_key_file": str(tmp_path / "missing")})


def test_p_advertises_its_key_id(
    keys: dict[str, str], clock: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LeaseprotoConnectorScheduler's own __init__ (vLLM's replaced) reads the key."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
        NixlPullConnectorScheduler,
    )
    from vllm.v1.request import RequestStatus

    from leaseproto.integrations.vllm.scheduler import LeaseprotoConnectorScheduler
    from leaseproto.integrations.vllm.tracking import ENGINE_AUTH_ATTR, PARAMS_KEY

    base = make_scheduler(True)
    monkeypatch.setattr(
        NixlPullConnectorScheduler, "__init__", lambda self, *a: self.__dict__.update(base.__dict__)
    )
    config = SimpleNamespace(
        num_prefill_lookahead_tokens=0,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, pipeline_parallel_size=1),
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=_extra(keys["a"])),
    )
    s = LeaseprotoConnectorScheduler(config, "P0", None)
    s.engine_id, s.side_channel_host, s.side_channel_port = "P0", "h", 5600
    s.transfer_tp_size = 1
    s.is_bidirectional_kv_xfer_enabled = False
    s.vllm_config = config
    s.kv_cache_config = SimpleNamespace(select_transfer_block_ids=lambda b: b)
    req = SimpleNamespace(
        request_id="p1",
        status=RequestStatus.FINISHED_LENGTH_CAPPED,
        num_computed_tokens=32,
        kv_transfer_params={"do_remote_decode": True},
    )
    _, params = s.request_finished(req, ([1, 2],))
    assert params is not None and params[PARAMS_KEY]["auth"] == _key_id(keys["a"])
    # D's scheduler passes the id on with the engine's heartbeats
    d = make_scheduler(True)
    advertised = d_request("d1", "p1")
    advertised.kv_transfer_params[PARAMS_KEY] = params[PARAMS_KEY]
    d.on_new_request(advertised)
    meta = d.build_connector_meta(SimpleNamespace())
    assert getattr(meta, ENGINE_AUTH_ATTR) == {"P0": _key_id(keys["a"])}
