"""The start-up check of the vLLM/verl symbols TLT relies on: a planted missing symbol of each kind is named.

Fake modules stand in for vLLM here (main tier); the vLLM tier checks the real build has everything
(tests/integrations/vllm/test_local_engine.py runs an engine, and test_compat_on_vllm below checks the list).
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from verl_tlt.integrations.vllm import compat


@dataclasses.dataclass
class _Output:
    total_num_scheduled_tokens: int = 0


class _Scheduler:
    def __init__(self):
        self.running = []
        self.dynamic_sd_lookup = None

    def update_from_output(self):
        pass

    def propose(self, num_speculative_tokens, common_attn_metadata, sampling_metadata=None):
        pass


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("fake_vllm_sched")
    module.Scheduler, module.SchedulerOutput = _Scheduler, _Output
    monkeypatch.setitem(sys.modules, "fake_vllm_sched", module)
    return module


def _check(**overrides):
    kwargs = {
        "symbols": ("fake_vllm_sched:Scheduler.update_from_output",),
        "fields": {"fake_vllm_sched:SchedulerOutput": ("total_num_scheduled_tokens",)},
        "assigned": {"fake_vllm_sched:Scheduler.__init__": ("dynamic_sd_lookup", "running")},
        "parameters": {"fake_vllm_sched:Scheduler.propose": ("num_speculative_tokens", "common_attn_metadata")},
    }
    return compat.missing_features(**{**kwargs, **overrides})


def test_a_complete_fake_passes(fake_vllm):
    assert _check() == []


def test_a_missing_method_module_field_or_instance_attribute_is_named(fake_vllm, monkeypatch):
    assert _check(symbols=("no_such_vllm_module:AsyncScheduler",)) == ["no_such_vllm_module:AsyncScheduler"]
    assert _check(fields={"fake_vllm_sched:SchedulerOutput": ("total_num_scheduled_tokens", "renamed")}) == [
        "fake_vllm_sched:SchedulerOutput.renamed"
    ]
    assert _check(assigned={"fake_vllm_sched:Scheduler.__init__": ("dynamic_sd_lookup", "waiting")}) == [
        "fake_vllm_sched:Scheduler.__init__ assigns self.waiting"
    ]
    assert _check(parameters={"fake_vllm_sched:Scheduler.propose": ("num_speculative_tokens", "slot_mappings")}) == [
        "fake_vllm_sched:Scheduler.propose(slot_mappings=...)"
    ]
    monkeypatch.delattr(_Scheduler, "update_from_output")
    assert _check() == ["fake_vllm_sched:Scheduler.update_from_output"]


def test_the_k_schedulers_needs_are_on_the_list():
    """Every symbol k_scheduler.py touches is checked at start-up (gpu_spot audit: these were not)."""
    fields = [f"{symbol}.{name}" for symbol, names in compat.FIELDS.items() for name in names]
    listed = " ".join([*compat.VLLM_SYMBOLS, *fields])
    listed += " " + " ".join(f"{k} {' '.join(v)}" for k, v in compat.ASSIGNED.items())
    for needed in (
        "AsyncScheduler",
        "Scheduler.update_from_output",
        "SchedulerConfig.scheduler_cls",
        "SchedulerConfig.async_scheduling",
        "SchedulerOutput.total_num_scheduled_tokens",
        "ModelRunnerOutput.sampled_token_ids",
        "Request.num_output_tokens",
        "dynamic_sd_lookup",
        "running",
    ):
        assert needed in listed, needed


@pytest.mark.vllm
def test_compat_on_vllm_has_everything_and_fails_on_a_planted_missing_scheduler(monkeypatch):
    assert compat.missing_features() == []
    import vllm.v1.core.sched.async_scheduler as async_scheduler

    monkeypatch.delattr(async_scheduler, "AsyncScheduler")
    assert compat.missing_features() == ["vllm.v1.core.sched.async_scheduler:AsyncScheduler"]
    with pytest.raises(RuntimeError, match="AsyncScheduler"):
        compat.check_vllm_supports_tlt()


@pytest.mark.vllm
def test_compat_on_vllm_names_a_planted_missing_need_of_the_deferred_first_pass(monkeypatch):
    from vllm.v1.attention.backends import utils
    from vllm.v1.spec_decode.eagle import EagleProposer

    def propose(self, num_speculative_tokens, target_token_ids, common_attn_metadata):  # a renamed vLLM
        pass

    monkeypatch.setattr(EagleProposer, "propose", propose)
    renamed = [
        f"vllm.v1.spec_decode.eagle:EagleProposer.propose({name}=...)"
        for name in compat.PARAMETERS["vllm.v1.spec_decode.eagle:EagleProposer.propose"]
        if name not in ("num_speculative_tokens", "target_token_ids", "common_attn_metadata")
    ]
    assert compat.missing_features() == renamed
    monkeypatch.undo()
    fields = dict(utils.CommonAttentionMetadata.__dataclass_fields__)
    del fields["block_table_tensor"]
    monkeypatch.setattr(utils.CommonAttentionMetadata, "__dataclass_fields__", fields)
    assert compat.missing_features() == ["vllm.v1.attention.backends.utils:CommonAttentionMetadata.block_table_tensor"]
