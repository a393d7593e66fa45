"""`bench sd drafts` on a tiny model (the real run needs the trained toy target), and its command line."""

from __future__ import annotations

import json

import pytest

from tests.engine.conftest import build_tiny_model
from verl_tlt.bench import group_sd_bench, sd_cli
from verl_tlt.bench.group_sd_bench import GroupBenchConfig, measure
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.engine import RolloutEngine
from verl_tlt.engine.drafts.eagle import EagleDrafter

ROW_KEYS = {
    "source",
    "strategy",
    "temperature",
    "batch_size",
    "plain_tokens_per_s",
    "sd_tokens_per_s",
    "speedup",
    "acceptance_length",
    "num_verify_steps",
    "tail_tokens",
    "drafts_by_source",
    "identical",
}


def test_group_draft_comparison_is_lossless_and_suffix_drafts_take_greedy_siblings_answers(tmp_path):
    build_tiny_model("qwen2", tmp_path, weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path))
    # An untrained EAGLE drafter, the kind the real run loads: its drafts are mostly rejected.
    engine.set_drafter(EagleDrafter(EagleDrafterModel.from_target(engine.model), max_len=engine.cache.max_len))
    config = GroupBenchConfig(
        shapes=("3_1_3",), temperatures=(0.0, 1.0), batch_sizes=(1, 2), group_size=3, rounds=1, max_tokens=32
    )
    prompts = [[5 + i, 9 + 2 * i, 40 + 3 * i] for i in range(config.num_prompts)]
    measure(str(tmp_path / "group.json"), engine, prompts, config, target="tiny")
    result = json.loads((tmp_path / "group.json").read_text())

    assert result["benchmark"] == "sd_group_drafts" and result["target"] == "tiny" and result["sampling"] == "keyed"
    assert result["processor"] and result["torch_threads"] >= 1 and "commit" in result
    assert result["options"]["group_size"] == 3 and result["options"]["temperatures"] == [0.0, 1.0]
    assert result["strategies"] == ["3_1_3", "suffix:3_1_3", "mixed:3_1_3"] and result["skipped"] == []
    rows = result["rows"]
    assert len(rows) == 3 * 2 * 2  # sources x temperatures x batch sizes
    assert all(set(row) == ROW_KEYS for row in rows)
    assert all(row["identical"] for row in rows)  # keyed sampling: the same tail tokens in every arm
    assert all(row["tail_tokens"] > 0 and row["speedup"] > 0 for row in rows)
    greedy_suffix = [row for row in rows if row["source"] == "suffix" and row["temperature"] == 0]
    # Greedy siblings answer exactly as the tail will: their answers draft it.
    assert all(row["acceptance_length"] > 1 for row in greedy_suffix)
    assert all(set(row["drafts_by_source"]) == {"suffix"} for row in greedy_suffix)
    assert all(set(row["drafts_by_source"]) == {"eagle"} for row in rows if row["source"] == "eagle")
    assert engine.group_drafts is None  # nothing left indexing after the bench


def test_mixed_tree_shapes_are_skipped_with_a_note():
    config = GroupBenchConfig(shapes=("4_1_4", "3_2_4"))
    strategies, skipped = config.arms()
    assert strategies == ["4_1_4", "suffix:4_1_4", "mixed:4_1_4", "3_2_4", "suffix:3_2_4"]
    assert skipped == ["mixed:3_2_4 skipped: mixed drafts are chains (top_k 1)"]
    with pytest.raises(ValueError, match="without a source"):
        GroupBenchConfig(shapes=("suffix:4_1_4",))


def test_the_cli_defaults_match_the_bench_module():
    assert sd_cli.GROUP_SD_SHAPES == group_sd_bench.DEFAULT_SHAPES
    assert sd_cli.GROUP_SD_BATCH_SIZES == group_sd_bench.DEFAULT_BATCH_SIZES


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["drafts", "suffix", "--acceptance-prompts", "4"], "unrecognized arguments: --acceptance-prompts 4"),
        (["drafts", "mixed", "--compile"], "unrecognized arguments: --compile"),
        (["curve", "--group-size", "4"], "unrecognized arguments: --group-size 4"),
        (["vllm", "--strategies", "4_1_4"], "unrecognized arguments: --strategies 4_1_4"),
        (["drafts"], "the following arguments are required: sources"),
        (["drafts", "fast"], "invalid choice: 'fast'"),
        (["drafts", "suffix", "--strategies", "suffix:4_1_4"], "--strategies are shapes such as 4_1_4"),
        (["drafts", "suffix", "--temperatures", "-1"], "--temperatures must be >= 0"),
        (["curve", "--rounds", "0"], "--batch-sizes, --max-tokens and --rounds must be >= 1"),
    ],
)
def test_each_subcommand_takes_only_the_options_it_reads(argv, message, capsys):
    from verl_tlt.cli import main

    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "sd", *argv])
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def no_subject_built(monkeypatch):
    """The CLI's subject, without building the toy models (these tests check the options only)."""
    from verl_tlt.bench import subject

    monkeypatch.setattr(subject, "bench_subject", lambda model, shape, drafter: (model, shape))


def test_the_curve_runs_with_its_own_defaults(monkeypatch, no_subject_built):
    from verl_tlt.bench import sd_bench
    from verl_tlt.cli import main

    calls = []
    monkeypatch.setattr(sd_bench, "run", lambda *args, **kwargs: calls.append(args))
    assert main(["bench", "sd", "curve"]) == 0
    assert calls[0][1] == ["8_4_16", "4_1_4"] and calls[0][2] == [1, 2, 4, 8, 16, 32, 64]


def test_with_drafts_the_comparison_gets_its_own_defaults(monkeypatch, no_subject_built):
    from verl_tlt.cli import main

    calls = []
    monkeypatch.setattr(group_sd_bench, "run", lambda *args, **kwargs: calls.append(args))
    assert main(["bench", "sd", "drafts", "suffix", "mixed", "suffix"]) == 0
    config = calls[0][1]
    assert config == GroupBenchConfig(drafts=("suffix", "mixed"))
    assert calls[0][2] == ("toy", "default")


def test_the_bench_runs_on_a_subjects_target_and_drafter_with_the_sampling_asked(tmp_path):
    """`run`, as `bench sd drafts` calls it: the subject's folders and prompts, its own config beside the engine's."""
    from verl_tlt.drafter.export import export_eagle

    build_tiny_model("qwen2", tmp_path / "target", weight_std=0.2)
    engine = RolloutEngine.from_pretrained(str(tmp_path / "target"))
    exported = export_eagle(EagleDrafterModel.from_target(engine.model), tmp_path / "drafter")

    class Subject:
        target, drafter = tmp_path / "target", exported

        def prompts(self, num: int, seed: int) -> list[list[int]]:
            return [[5 + i, 9 + 2 * i, 40 + 3 * i] for i in range(num)]

        def about(self) -> dict[str, str]:
            return {"model": "tiny"}

    config = GroupBenchConfig(
        shapes=("2_1_2",), temperatures=(1.0,), batch_sizes=(1,), group_size=2, rounds=1, max_tokens=16
    )
    result = group_sd_bench.run(None, config, Subject(), sampling="rejection")
    assert result["model"] == "tiny" and result["sampling"] == "rejection"
    # Rejection sampling matches plain in distribution, not token for token: only the rows' presence is checked here.
    assert [row["source"] for row in result["rows"]] == ["eagle", "suffix", "mixed"]
    assert all(row["tail_tokens"] > 0 for row in result["rows"])
