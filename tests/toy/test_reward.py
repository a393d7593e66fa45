"""verl's custom reward entry point: same rule as the task, and light enough to load by file path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verl_tlt.toy import reward
from verl_tlt.toy.task import COMPACT, Problem, score, solution_steps, solution_text


def test_compute_score_uses_extra_info_for_partial_credit():
    problem = Problem.from_nd(20, 3)
    partial = " ".join(solution_steps(problem)[:3]) + " 1 - 3 < 0 ; # 1"
    extra_info = {"split": "train", "index": 0, "num_steps": problem.num_steps, "n": 20, "d": 3}
    assert reward.compute_score("toy/csub", solution_text(problem), "2", extra_info) == 1.0
    assert reward.compute_score("toy/csub", partial, "2", extra_info) == score(partial, "2", problem) > 0.0
    # verl adds keys of its own (num_turns, ...) and may pass extra kwargs.
    assert reward.compute_score("toy/csub", partial, "2", {**extra_info, "num_turns": 2}, foo=1) > 0.0
    assert reward.compute_score("toy/csub", partial, "2", None) == 0.0


def test_compute_score_rejects_other_data_sources():
    with pytest.raises(ValueError, match="toy/csub"):
        reward.compute_score("openai/gsm8k", "# 2", "2")


def test_reward_file_loads_by_path_without_heavy_imports():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('toy_reward', {str(Path(reward.__file__))!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "assert module.compute_score('toy/csub', '3 - 4 < 0 ; # 3', '3') == 1.0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'verl', 'pandas', 'numpy') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_concise_reward_keeps_full_score_only_for_the_compact_style():
    problem = Problem.from_nd(20, 3)
    extra_info = {"n": 20, "d": 3}
    standard, compact = solution_text(problem), solution_text(problem, COMPACT)
    assert reward.compute_score_concise("toy/csub", compact, "2", extra_info) == 1.0
    assert reward.compute_score_concise("toy/csub", standard, "2", extra_info) == reward.VERBOSE_REWARD_FACTOR
    wrong = " ".join(solution_steps(problem)[:3]) + " 1 - 3 < 0 ; # 1"
    assert reward.compute_score_concise("toy/csub", wrong, "2", extra_info) == pytest.approx(
        reward.VERBOSE_REWARD_FACTOR * score(wrong, "2", problem)
    )
