"""`bench sd families` on a tiny target: every arm decodes the same tokens, and the table holds what it reports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tests.engine.conftest import build_tiny_model
from verl_tlt.bench.family_bench import format_table, run
from verl_tlt.drafter.family import export_drafter, new_drafter
from verl_tlt.engine import RolloutEngine


@dataclass
class TinySubject:
    target: Path
    model: str = "tiny"

    def prompts(self, num: int, seed: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randint(3, 90, (5,), generator=generator).tolist() for _ in range(num)]

    def about(self) -> dict:
        return {"model": self.model, "target": str(self.target)}


def test_the_arms_decode_the_same_tokens_and_the_ratios_compare_the_families(tmp_path):
    build_tiny_model("qwen2", tmp_path / "target", weight_std=0.2, num_layers=5)
    engine = RolloutEngine.from_pretrained(str(tmp_path / "target"))
    drafters = {}
    for family in ("eagle", "eagle3"):
        torch.manual_seed(0)
        model = new_drafter(engine.model, family, draft_vocab_size=64)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.02 * torch.randn_like(param))
        drafters[family] = export_drafter(model, tmp_path / family)
    result = run(
        str(tmp_path / "out.json"), TinySubject(tmp_path / "target"), drafters, k=3, num_prompts=4, max_tokens=12
    )
    assert result["identical"] is True  # keyed sampling: plain, both drafters and the control decode alike
    assert set(result["arms"]) == {"plain", "eagle", "eagle3", "eagle_repeat"}
    assert all(row["acceptance_length"] >= 1.0 for name, row in result["arms"].items() if name != "plain")
    eagle, eagle3 = result["arms"]["eagle"], result["arms"]["eagle3"]
    assert result["eagle3_over_eagle"]["acceptance_length"] == round(
        eagle3["acceptance_length"] / eagle["acceptance_length"], 3
    )
    assert (tmp_path / "out.json").is_file()
    assert "EAGLE-3 / EAGLE-1: acceptance" in format_table(result)
