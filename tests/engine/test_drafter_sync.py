"""Versioned drafter updates into a running engine."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.config import SpeculativeConfig
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafter_sync import DrafterSync
from verl_tlt.policy.adaptive import AdaptivePolicy

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7], [10, 11], [12]]


def test_versions_load_once_and_the_engines_policy_speculates_with_the_drafter(varied_qwen2):
    policy = AdaptivePolicy(SpeculativeConfig(threshold=4, buckets=(1, 2)))
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), policy=policy)
    assert engine.generate(PROMPTS, GREEDY) and engine.stats.steps_sd == 0  # no drafter yet: every step plain
    sync = DrafterSync(engine)
    state = EagleDrafterModel.from_target(engine.model).state_dict()
    assert sync.update(state, version=1) is True and sync.update(state, version=1) is False
    assert engine.drafter is not None and engine.policy is policy
    plain = RolloutEngine.from_pretrained(str(varied_qwen2[0])).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in engine.generate(PROMPTS, GREEDY)] == [o.token_ids for o in plain]
    assert engine.stats.steps_sd > 0  # the policy speculated with the loaded drafter
    changed = {k: v + 0.01 for k, v in state.items()}
    assert sync.update(changed, version=2) is True
    assert torch.allclose(engine.drafter.model.fc.weight, changed["fc.weight"])


def test_bad_state_and_in_flight_updates_are_refused(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]))
    sync = DrafterSync(engine)
    with pytest.raises(ValueError, match="does not fit"):
        sync.update({"fc.weight": torch.zeros(2, 2)}, version=1)
    engine.add_request([1, 2], GREEDY)
    state = EagleDrafterModel.from_target(engine.model).state_dict()
    with pytest.raises(RuntimeError, match="in flight"):
        sync.update(state, version=1)


def test_a_failed_update_leaves_the_running_drafter_untouched(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]))
    sync = DrafterSync(engine)
    state = EagleDrafterModel.from_target(engine.model).state_dict()
    sync.update(state, version=1)
    running = {k: v.clone() for k, v in engine.drafter.model.state_dict().items()}
    broken = {k: v + 1.0 for k, v in state.items()}
    broken["fc.weight"] = torch.zeros(2, 2)  # does not fit: the other tensors would have been copied before the error
    with pytest.raises(ValueError, match="does not fit"):
        sync.update(broken, version=2)
    assert sync.version == 1
    assert all(torch.equal(running[k], v) for k, v in engine.drafter.model.state_dict().items())


def test_a_corrupted_drafter_is_refused_by_the_self_test_and_the_previous_one_kept(varied_qwen2):
    from tests.engine.drafters import HFModelDrafter
    from verl_tlt.engine.drafts.self_test import DrafterSelfTest

    good = HFModelDrafter(varied_qwen2[1])  # the drafter the engine runs (a perfect one)
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), drafter=good)
    self_test = DrafterSelfTest(tokens=8, min_ratio=0.5, max_model_len=engine.max_model_len)
    self_test.remember(PROMPTS[0])
    assert self_test.check(engine).passed and self_test.reference == 1.0
    sync = DrafterSync(engine, self_test)
    corrupted = EagleDrafterModel.from_target(engine.model).state_dict()
    corrupted["fc.weight"] = torch.full_like(corrupted["fc.weight"], float("nan"))  # a sync gone wrong
    assert sync.update(corrupted, version=1) is False
    assert engine.drafter is good and sync.version is None and self_test.take()["refused"] == 1
    outputs = engine.generate(PROMPTS, GREEDY, strategy="3_1_3")  # the run goes on, with the drafter it had
    assert all(o.stats["num_accepted_tokens"] == o.stats["num_draft_tokens"] > 0 for o in outputs)
