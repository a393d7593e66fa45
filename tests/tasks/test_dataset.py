import pandas as pd
import pytest

from verl_tlt.tasks.answers import SYSTEM_PROMPT
from verl_tlt.tasks.dataset import write_splits
from verl_tlt.tasks.reward import compute_score

pytest.importorskip("reasoning_gym")


def test_the_splits_are_verl_rl_parquet_whose_rows_score_with_the_reward_function(tmp_path):
    paths = write_splits(tmp_path, ["chain_sum", "gsm_symbolic"], train=6, val=3, seed=0)
    train, val = (pd.read_parquet(paths[split]) for split in ("train", "val"))
    assert len(train) == 12 and len(val) == 6
    assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(train.columns)
    # Interleaved, so any prefix (a first small batch) mixes the tasks.
    assert list(train["data_source"][:4]) == ["reasoning_gym/chain_sum", "reasoning_gym/gsm_symbolic"] * 2
    assert train["prompt"][0][0]["content"] == SYSTEM_PROMPT and train["prompt"][0][1]["role"] == "user"
    assert not set(train["prompt"].map(lambda p: p[1]["content"])) & set(val["prompt"].map(lambda p: p[1]["content"]))
    for _, row in pd.concat([train, val]).iterrows():
        truth = row["reward_model"]["ground_truth"]
        extra = dict(row["extra_info"])
        assert compute_score(row["data_source"], f"<answer>{truth}</answer>", truth, extra) == 1.0
        assert compute_score(row["data_source"], "no idea", truth, extra) == 0.0


def test_no_tasks_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no tasks given"):
        write_splits(tmp_path, [], train=1, val=1, seed=0)


def test_the_reward_function_refuses_rows_it_cannot_find_again():
    with pytest.raises(ValueError, match=r"no extra_info \['size', 'index'\].*verl-tlt tasks write"):
        compute_score("reasoning_gym/chain_sum", "<answer>1</answer>", "1", {"seed": 0})
    with pytest.raises(ValueError, match="not a reasoning-gym task"):
        compute_score("openai/gsm8k", "<answer>1</answer>", "1", {"seed": 0, "size": 1, "index": 0})
