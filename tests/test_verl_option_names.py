"""The layers below the verl glue speak of their own parameters: no verl option in their strings.

spec, modeling, drafter and engine run without verl (test_layering.py), and their messages name their own
parameters (`RolloutEngine(sampling=...)`, `SamplingParams.top_p`). Where a verl user needs the override path, the
integration layer (`verl_tlt/integrations/verl/`) validates, or catches and re-raises, naming the verl key. This test
reads every string literal of those layers (docstrings and the text of f-strings included) and fails on anything
shaped like a verl option.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "verl_tlt"
LOWER_LAYERS = ("spec", "modeling", "drafter", "engine")

# verl's top-level config groups followed by a key (`trainer.n_gpus_per_node`), the rollout group's keys written
# short (`rollout.name=vllm`), any engine_kwargs, and verl-tlt's Hydra preset for a CPU run (`+cpu=torch`). A file
# name (`trainer.py`) is not an option.
_GROUPS = (
    "actor_rollout_ref|critic|reward_model|reward|algorithm|trainer|data|custom_reward_function|ray_kwargs|rollout"
)
_FILE_SUFFIXES = "py|pt|json|jsonl|yaml|md|parquet|txt|csv"
VERL_OPTION = re.compile(rf"\b(?:{_GROUPS})\.(?!(?:{_FILE_SUFFIXES})\b)[A-Za-z_]|\bengine_kwargs\b|\+cpu=")


def verl_options_in_strings(root: Path, layers: tuple[str, ...] = LOWER_LAYERS) -> list[str]:
    """`path:line: text` for every string literal under root/<layer> that names a verl option."""
    found = []
    for layer in layers:
        for path in sorted((root / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found += [
                        f"{path.relative_to(root)}:{node.lineno}: {match.group(0)!r} in {node.value[:120]!r}"
                        for match in VERL_OPTION.finditer(node.value)
                    ]
    return found


def test_the_lower_layers_name_no_verl_option():
    for layer in LOWER_LAYERS:
        assert (PACKAGE_ROOT / layer).is_dir(), f"layer {layer} is gone: rename it here too"
    found = verl_options_in_strings(PACKAGE_ROOT)
    assert not found, (
        "a lower layer names a verl option; say it with the layer's own parameter and let "
        "verl_tlt/integrations/verl/ add the verl key:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "planted",
    [
        'raise ValueError("set actor_rollout_ref.rollout.dtype=float32")',
        'raise ValueError(f"got {0}; use rollout.name=vllm")',
        'raise ValueError("run two replicas (trainer.n_gpus_per_node=2)")',
        'raise ValueError("engine_kwargs.torch.compile must be true or false")',
        'raise ValueError("on CPU: +cpu=torch")',
        'raise ValueError("lower data.train_batch_size")',
    ],
)
def test_the_scan_finds_a_verl_option_planted_in_a_copy_of_the_engine(tmp_path, planted):
    shutil.copytree(PACKAGE_ROOT / "engine", tmp_path / "engine")
    module = tmp_path / "engine" / "engine.py"
    module.write_text(module.read_text() + f"\n\ndef _planted():\n    {planted}\n")
    (found,) = verl_options_in_strings(tmp_path, ("engine",))
    assert found.startswith(f"{Path('engine') / 'engine.py'}:")


@pytest.mark.parametrize(
    "text",
    [
        "see verl_tlt/drafter/trainer.py",
        "the long tail of a rollout. Then",
        "reads data.parquet",
        "tlt.drafter.lr must be > 0",
        "RolloutEngine(sampling='keyed')",
        "max_num_seqs must be >= 1",
    ],
)
def test_the_scan_leaves_the_layers_own_words_alone(tmp_path, text):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "words.py").write_text(f"MESSAGE = {text!r}\n")
    assert verl_options_in_strings(tmp_path, ("engine",)) == []
