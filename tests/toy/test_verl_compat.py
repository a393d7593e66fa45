"""verl 0.9.1 itself accepts the toy world: its dataset, its tokenizer loader, its prompt builder, its reward loader.

These call verl's own code (no Ray, no GPU), so a verl upgrade that breaks the toy world fails here first.
"""

from __future__ import annotations

import pytest

from verl_tlt.toy.task import parse_prompt


@pytest.fixture(scope="module")
def verl_modules():
    # Keep other plugins (this repo's included) out of this test: it checks the toy world, not the plugin.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
        pytest.importorskip("verl")
        from verl.utils.dataset.rl_dataset import RLHFDataset
        from verl.utils.import_utils import load_extern_object
        from verl.utils.tokenizer import hf_tokenizer
        from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder
    return RLHFDataset, load_extern_object, hf_tokenizer, create_continuous_token_builder


@pytest.fixture()
def verl_tokenizer(verl_modules, toy_world):
    _, _, hf_tokenizer, _ = verl_modules
    return hf_tokenizer(str(toy_world.model_dir))


def test_rlhf_dataset_keeps_every_toy_prompt(verl_modules, toy_world, verl_tokenizer, tmp_path, monkeypatch):
    import datasets
    from omegaconf import OmegaConf

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    RLHFDataset = verl_modules[0]
    # The longest prompt is "<bos>nnn:d<sep>", 7 tokens.
    config = OmegaConf.create({"max_prompt_length": 8, "filter_overlong_prompts": True, "cache_dir": str(tmp_path)})
    dataset = RLHFDataset(str(toy_world.val_parquet), verl_tokenizer, config)
    assert len(dataset) == 8
    row = dataset[0]
    assert row["data_source"] == "toy/csub"
    assert parse_prompt(row["raw_prompt"][0]["content"]).answer == int(row["reward_model"]["ground_truth"])


def test_qwen_continuous_token_builder_renders_the_toy_prompt(verl_modules, verl_tokenizer):
    create_continuous_token_builder = verl_modules[3]
    # model_type "qwen2" selects verl's Qwen builder, which needs <|im_end|> and a one-token "\n".
    builder = create_continuous_token_builder(verl_tokenizer, hf_model_type="qwen2")
    assert type(builder).__name__ == "QwenContinuousTokenBuilder"
    prompt_ids = builder.build_initial_tokens([{"role": "user", "content": "11 : 4"}])
    assert prompt_ids == verl_tokenizer.convert_tokens_to_ids(["<bos>", "1", "1", ":", "4", "<sep>"])


def test_verl_loads_the_reward_function_by_path(verl_modules, toy_world):
    load_extern_object = verl_modules[1]
    compute_score = load_extern_object(str(toy_world.reward_fn), "compute_score")
    assert compute_score("toy/csub", "11 - 4 = 7 ; 7 - 4 = 3 ; 3 - 4 < 0 ; # 3", "3", {"n": 11, "d": 4}) == 1.0
