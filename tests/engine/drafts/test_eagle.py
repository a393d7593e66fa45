"""The EAGLE drafter in the engine: incremental tree drafting equals recomputation; SD with it stays exact."""

from __future__ import annotations

import pytest
import torch

from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.drafts.base import DraftContext
from verl_tlt.engine.drafts.eagle import EagleDrafter
from verl_tlt.modeling.model import AttentionBatch

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21], [30, 31, 32]]


@pytest.fixture()
def engine(varied_qwen2):
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), max_num_seqs=3)
    model = EagleDrafterModel.from_target(engine.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the start (zeroed residual branches), so the layer attends and mixes
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    engine.set_drafter(EagleDrafter(model))
    return engine


def close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal up to float32 rounding of a differently batched computation (logits here reach ~100)."""
    return torch.allclose(actual, expected, rtol=1e-5, atol=1e-4)


def reference_features(model: EagleDrafterModel, tokens: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """Drafter outputs [T, H] for pairs (hidden[j], tokens[j]) at positions 0..T-1, causal, no cache reuse."""
    length = len(tokens)
    spec = model.spec
    k = torch.zeros(1, spec.num_kv_heads, length, spec.head_dim)
    v = torch.zeros_like(k)
    positions = torch.arange(length).unsqueeze(0)
    cos, sin = model.target.rotary_tables(positions, torch.float32)
    mask = torch.ones(length, length, dtype=torch.bool).tril().view(1, 1, length, length)
    batch = AttentionBatch(row_start=0, write_pos=positions, attn_mask=mask, cos=cos, sin=sin)
    with torch.no_grad():
        return model(torch.tensor([tokens]), hidden.unsqueeze(0), batch, k, v)[0]


def test_tree_expansion_matches_recomputing_each_path(engine):
    drafter: EagleDrafter = engine.drafter
    model = drafter.model
    sequence = [3, 17, 42, 8, 60, 9]
    hidden = torch.randn(len(sequence) - 1, model.spec.hidden_size, generator=torch.Generator().manual_seed(0))
    root_logits = drafter.begin([DraftContext(sequence, 0, hidden)])
    pairs_tokens = sequence[1:]
    features = reference_features(model, pairs_tokens, hidden)
    assert close(root_logits[0], model.logits(features[-1]))
    # Two siblings under the root, then a child under the second sibling (depth 2) and one under the first.
    level1 = drafter.expand(torch.tensor([[1, 2]]), torch.tensor([[0, 0]]), torch.tensor([[11, 12]]))
    level2 = drafter.expand(torch.tensor([[5, 3]]), torch.tensor([[2, 1]]), torch.tensor([[13, 14]]))
    root_feature = features[-1]
    for token, logits in ((11, level1[0, 0]), (12, level1[0, 1])):
        path = reference_features(model, pairs_tokens + [token], torch.cat([hidden, root_feature[None]]))
        assert close(logits, model.logits(path[-1]))
    for parent_token, token, logits in ((12, 13, level2[0, 0]), (11, 14, level2[0, 1])):
        first = reference_features(model, pairs_tokens + [parent_token], torch.cat([hidden, root_feature[None]]))
        feats = torch.cat([hidden, root_feature[None], first[-1][None]])
        path = reference_features(model, pairs_tokens + [parent_token, token], feats)
        assert close(logits, model.logits(path[-1]))


def test_incremental_begin_equals_one_shot(engine):
    drafter: EagleDrafter = engine.drafter
    sequence = list(range(3, 15))
    hidden = torch.randn(len(sequence) - 1, drafter.model.spec.hidden_size, generator=torch.Generator().manual_seed(1))
    one_shot = drafter.begin([DraftContext(sequence, 0, hidden)])
    drafter.reset()
    drafter.begin([DraftContext(sequence[:5], 0, hidden[:4])])
    incremental = drafter.begin([DraftContext(sequence, 4, hidden[4:])])
    assert close(one_shot, incremental)


@pytest.mark.parametrize("strategy", ["4_1_4", "3_3_8", "5_2_10"])
def test_greedy_sd_with_eagle_drafter_equals_plain(engine, varied_qwen2, strategy):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = RolloutEngine.from_pretrained(str(varied_qwen2[0]), max_num_seqs=3).generate(PROMPTS, params)
    sd = engine.generate(PROMPTS, params, strategy=strategy)
    assert [o.token_ids for o in sd] == [o.token_ids for o in plain]
    assert sum(o.stats["num_verify_steps"] for o in sd) > 0


def test_drafter_cannot_change_mid_flight(engine):
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match="in flight"):
        engine.set_drafter(None)


def test_drafter_rejects_a_target_of_another_size(engine, tiny_qwen2):
    other = RolloutEngine.from_pretrained(str(tiny_qwen2[0]))
    model = EagleDrafterModel(engine.model.spec)
    model.attach(other.model)  # same sizes: fine
    wider = EagleDrafterModel(type(engine.model.spec)(**{**engine.model.spec.__dict__, "hidden_size": 32}))
    with pytest.raises(ValueError, match="does not fit the target"):
        wider.attach(other.model)


def begin_rows(drafter: EagleDrafter, lengths: list[int], seed: int) -> list[DraftContext]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        sequence = torch.randint(3, 60, (length,), generator=generator).tolist()
        hidden = torch.randn(length - 1, drafter.model.spec.hidden_size, generator=generator)
        rows.append(DraftContext(sequence, 0, hidden))
    return rows


@pytest.mark.parametrize("lengths", [[7], [6, 6], [9, 4, 6]], ids=["one_row", "equal_rows", "ragged_rows"])
def test_chain_extension_equals_the_general_tree_path(engine, lengths):
    """extend_chain (no ancestor masks; no mask at all for equal rows) drafts exactly what expand does."""
    drafter: EagleDrafter = engine.drafter
    rows = begin_rows(drafter, lengths, seed=3)
    tokens = torch.tensor([[11, 12, 13, 14]]).expand(len(rows), -1)
    drafter.begin(rows)
    via_tree = [
        drafter.expand(torch.full((len(rows), 1), d), torch.full((len(rows), 1), d - 1), tokens[:, d - 1 : d])[:, 0]
        for d in range(1, 4)
    ]
    drafter.reset()
    drafter.begin(rows)
    via_chain = [drafter.extend_chain(d, tokens[:, d - 1]) for d in range(1, 4)]
    for chain_logits, tree_logits in zip(via_chain, via_tree, strict=True):
        assert close(chain_logits, tree_logits)


def test_chain_extension_refuses_nodes_out_of_order(engine):
    drafter: EagleDrafter = engine.drafter
    with pytest.raises(RuntimeError, match="before begin"):
        drafter.extend_chain(1, torch.tensor([5]))
    drafter.begin(begin_rows(drafter, [5], seed=4))
    with pytest.raises(RuntimeError, match="does not continue the chain"):
        drafter.extend_chain(2, torch.tensor([5]))
    drafter.extend_chain(1, torch.tensor([5]))
    with pytest.raises(RuntimeError, match="after extend_chain"):
        drafter.expand(torch.tensor([[2]]), torch.tensor([[1]]), torch.tensor([[6]]))
    drafter.begin(begin_rows(drafter, [5], seed=5))  # a new step starts a new chain
    drafter.expand(torch.tensor([[1]]), torch.tensor([[0]]), torch.tensor([[6]]))
    with pytest.raises(RuntimeError, match="after tree expansions"):
        drafter.extend_chain(1, torch.tensor([5]))


def eagle_engine(varied_qwen2, **kwargs) -> RolloutEngine:
    engine = RolloutEngine.from_pretrained(str(varied_qwen2[0]), **kwargs)
    engine.set_drafter(EagleDrafter(EagleDrafterModel.from_target(engine.model), max_len=engine.cache.max_len))
    return engine


def test_a_long_prompt_joining_a_row_near_max_model_len_keeps_speculation_on(varied_qwen2):
    """begin pads shorter rows; the padding must stay within each row's own length, or a row near max_model_len
    beside a long new prompt overflows the drafter's cache, and the drafter is switched off."""
    kwargs = {"max_num_seqs": 2, "max_model_len": 64, "max_draft_tokens": 4}
    engine = eagle_engine(varied_qwen2, **kwargs)
    long_row = SamplingParams(temperature=0, max_tokens=57, ignore_eos=True)
    joiner = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = engine.add_request(list(range(5, 12)), long_row)
    outputs = {}
    while not engine.running or len(engine.running[0].output_ids) < 45:
        outputs.update({o.request_id: o for o in engine.step("4_1_4")})
    second = engine.add_request(list(range(10, 50)), joiner)
    while engine.has_unfinished():
        outputs.update({o.request_id: o for o in engine.step("4_1_4")})
    assert engine.drafter_error is None
    assert engine.drafter.cache.max_len == engine.cache.max_len  # no row's padding reached past its own length
    plain = RolloutEngine.from_pretrained(str(varied_qwen2[0]), **kwargs)
    reference = plain.generate([list(range(5, 12)), list(range(10, 50))], [long_row, joiner])
    assert [outputs[first].token_ids, outputs[second].token_ids] == [o.token_ids for o in reference]


def test_a_wide_tree_search_at_the_end_of_the_context_keeps_speculation_on(varied_qwen2):
    """8_4_16 expands (8 - 1) * 4 = 28 nodes into the drafter's scratch, more than the 16 + 1 columns the engine
    reserves past max_model_len for verification."""
    kwargs = {"max_num_seqs": 1, "max_model_len": 40, "max_draft_tokens": 16}
    engine = eagle_engine(varied_qwen2, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    (output,) = engine.generate([[5, 6, 7]], params, strategy="8_4_16")
    assert engine.drafter_error is None and output.finish_reason == "length"
    (plain,) = RolloutEngine.from_pretrained(str(varied_qwen2[0]), **kwargs).generate([[5, 6, 7]], params)
    assert output.token_ids == plain.token_ids


def test_release_cache_frees_the_drafters_cache_too(engine):
    engine.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=6), strategy="4_1_4")
    assert engine.drafter.cache.k
    engine.release_cache()
    assert not engine.drafter.cache.k
    engine.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=6), strategy="4_1_4")  # and works after
    assert engine.drafter_error is None


def test_weights_changed_in_place_take_effect_at_the_next_begin(engine):
    drafter: EagleDrafter = engine.drafter
    model = drafter.model
    sequence = [3, 17, 42, 8, 60, 9]
    hidden = torch.randn(len(sequence) - 1, model.spec.hidden_size, generator=torch.Generator().manual_seed(1))
    drafter.begin([DraftContext(sequence, 0, hidden)])
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        model.load_state_dict({k: v * 1.1 for k, v in original.items()})
        drafter.reset()
        root_logits = drafter.begin([DraftContext(sequence, 0, hidden)])
        assert close(root_logits[0], model.logits(reference_features(model, sequence[1:], hidden)[-1]))
    finally:
        model.load_state_dict(original)
