"""The control contract: both rollout servers implement every call with the contract's parameters, and the runtime's
start-up check names a server that does not."""

from __future__ import annotations

import inspect

import pytest

from verl_tlt.integrations.control.contract import CONTROL_CALLS, RolloutControl, check_rollout_servers
from verl_tlt.integrations.torch_rollout.server import TorchRolloutServer


def parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def test_the_contract_lists_the_calls_the_runtime_makes():
    assert set(CONTROL_CALLS) == {
        "update_drafter",
        "drafter_version",
        "target_shared_weights",
        "sd_stats",
        "wait_for_drain",
        "pop_last_rollout",
        "end_validation",
        "accelerator_ids",
        "cpu_cores",
        "free_for_training",
        "restore_after_training",
    }


def test_the_torch_server_implements_every_call_with_the_contracts_parameters():
    for name in CONTROL_CALLS:
        assert parameters(getattr(TorchRolloutServer, name)) == parameters(getattr(RolloutControl, name)), name
    check_rollout_servers([TorchRolloutServer.__new__(TorchRolloutServer)])


@pytest.mark.vllm
def test_the_vllm_server_implements_every_call_with_the_contracts_parameters():
    pytest.importorskip("vllm")
    from verl_tlt.integrations.vllm.server import TLTvLLMHttpServer

    for name in CONTROL_CALLS:
        assert parameters(getattr(TLTvLLMHttpServer, name)) == parameters(getattr(RolloutControl, name)), name


class StockServer:
    """A rollout server without TLT's calls (verl's own vLLM server, say)."""

    def generate(self, prompt_ids, sampling_params, request_id): ...

    def update_drafter(self, state, version): ...


def test_a_server_without_the_calls_is_refused_at_start_up_by_name():
    with pytest.raises(RuntimeError) as error:
        check_rollout_servers([TorchRolloutServer.__new__(TorchRolloutServer), StockServer()])
    message = str(error.value)
    assert "rollout server 1 (StockServer) lacks ['drafter_version', 'target_shared_weights'" in message
    assert "actor_rollout_ref.rollout.name=torch" in message and "tlt.enabled=false" in message
    with pytest.raises(RuntimeError, match="no rollout servers"):
        check_rollout_servers([])
