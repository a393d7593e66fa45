"""The parquet files match the columns and types verl's RLHFDataset and reward managers read."""

from __future__ import annotations

import pandas as pd
import pytest

from verl_tlt.toy.dataset import write_parquet
from verl_tlt.toy.task import make_problems, prompt_text


def test_parquet_round_trips_with_verl_columns_and_types(tmp_path):
    problems = make_problems(16, seed=5)
    path = write_parquet(problems, tmp_path / "nested" / "train.parquet", split="train")
    frame = pd.read_parquet(path)
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(frame) == len(problems)
    for index, (problem, row) in enumerate(zip(problems, frame.itertuples(index=False), strict=True)):
        assert row.data_source == "toy/csub"
        assert row.ability == "math"
        assert [dict(m) for m in row.prompt] == [{"role": "user", "content": prompt_text(problem)}]
        assert row.reward_model == {"style": "rule", "ground_truth": str(problem.answer)}
        assert row.extra_info == {
            "split": "train",
            "index": index,
            "num_steps": problem.num_steps,
            "n": problem.n,
            "d": problem.d,
        }


def test_write_parquet_refuses_an_empty_split(tmp_path):
    with pytest.raises(ValueError, match="empty 'val' split"):
        write_parquet([], tmp_path / "val.parquet", split="val")
