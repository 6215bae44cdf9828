"""A turn-2 read on P that fails under kv_load_failure_policy = "recompute", on
vLLM's own scheduler. tests/test_vllm_suite.py copies this file into the unpacked
tree of vLLM's tests, beside the bidirectional tests whose helpers it imports, and
runs it there on our scheduler and on stock vLLM's (it does not run from here)."""

import copy

from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput
from vllm.v1.request import RequestStatus

from .test_bidirectional_kv_transfer import BIDIR_KV_EXTRA_CONFIG, _make_p_node_turn2_request
from .utils import create_scheduler, create_vllm_config


def test_failed_turn2_read_is_prefilled_locally():
    cfg = create_vllm_config(
        kv_connector_extra_config=BIDIR_KV_EXTRA_CONFIG, kv_load_failure_policy="recompute"
    )
    sched = create_scheduler(cfg)
    bs = cfg.cache_config.block_size
    req = _make_p_node_turn2_request(700, bs, int(bs * 2.5))
    rid = req.request_id
    sched.add_request(req)
    out = sched.schedule()
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert rid in out.kv_connector_metadata.reqs_to_recv  # the read of D's blocks
    blocks = set(sched.kv_cache_manager.get_block_ids(rid)[0])
    sched.update_from_output(out, EMPTY_MODEL_RUNNER_OUTPUT)
    out = sched.schedule()
    failed = copy.deepcopy(EMPTY_MODEL_RUNNER_OUTPUT)  # as NIXL's worker reports a failed read
    failed.kv_connector_output = KVConnectorOutput(
        finished_recving={rid}, failed_recving={rid}, invalid_block_ids=blocks
    )
    sched.update_from_output(out, failed)
    for _ in range(3):
        out = sched.schedule()
        assert rid not in out.kv_connector_metadata.reqs_to_recv  # one read per request
        if req.status == RequestStatus.RUNNING:
            break
        sched.update_from_output(out, EMPTY_MODEL_RUNNER_OUTPUT)
    # stock vLLM 0.32: WAITING_FOR_REMOTE_KVS again, with no read to end the wait
    assert req.status == RequestStatus.RUNNING, req.status
    assert out.num_scheduled_tokens[rid] == req.num_prompt_tokens  # the whole prompt, here
