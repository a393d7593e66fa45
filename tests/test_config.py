"""TLTConfig: defaults, validation messages, and sync with the YAML files and the docs tables.

The YAML blocks and the docs tables are rendered by scripts/regen_config_docs.py, which is loaded here as a module.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from omegaconf import OmegaConf

from verl_tlt.config import TLTConfig
from verl_tlt.strict_config import format_value

REPO = Path(__file__).resolve().parents[1]
HYDRA_CONF = REPO / "verl_tlt" / "hydra_conf"
WRAPPER_YAML = HYDRA_CONF / "tlt_ppo_trainer.yaml"
OFF_YAML = HYDRA_CONF / "tlt" / "off.yaml"
ON_YAML = HYDRA_CONF / "tlt" / "on.yaml"
DOCS = REPO / "docs" / "config_reference.md"
REGEN_SCRIPT = REPO / "scripts" / "regen_config_docs.py"


def _load_regen_script():
    spec = importlib.util.spec_from_file_location("regen_config_docs", REGEN_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module


regen = _load_regen_script()
REGENERATE = "run `python scripts/regen_config_docs.py`"


# A TLTConfig with nested knob groups, to exercise the generic loader before real groups exist.
@dataclass(frozen=True)
class _SpecKnobs:
    """Speculative decoding knobs."""

    num_speculative_tokens: int = field(default=4, metadata={"help": "Draft tokens per step."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    method: Literal["eagle", "eagle3"] = field(default="eagle3", metadata={"help": "Drafter kind."})
    drafter_path: str | None = field(default=None, metadata={"help": "Drafter checkpoint."})
    buckets: tuple[int, ...] = field(default=(1, 8), metadata={"help": "Batch-size buckets."})


@dataclass(frozen=True)
class _NestedTLTConfig:
    """TLT (Taming the Long-Tail): adaptive speculative rollouts and online drafter training."""

    enabled: bool = field(default=False, metadata={"help": "Turn TLT on."})
    spec: _SpecKnobs = field(default_factory=_SpecKnobs, metadata={"help": "Speculative decoding knobs."})

    from_dict = classmethod(TLTConfig.from_dict.__func__)


def _message(excinfo: pytest.ExceptionInfo) -> str:
    return str(excinfo.value)


# ---------------------------------------------------------------- defaults and loading


def test_defaults_are_off():
    assert TLTConfig().enabled is False
    assert TLTConfig.from_dict(None) == TLTConfig.from_dict({}) == TLTConfig()
    assert TLTConfig().to_dict()["enabled"] is False
    assert TLTConfig().to_dict()["speculative"]["threshold"] == 32


def test_speculative_group_validates_values_with_the_key_and_a_fix():
    cfg = TLTConfig.from_dict({"speculative": {"threshold": 8, "buckets": [1, 4], "strategies": ["4_1_4"]}})
    assert cfg.speculative.buckets == (1, 4) and cfg.speculative.strategies == ("4_1_4",)
    cases = [
        ({"threshold": 0}, "tlt.speculative.threshold must be >= 1"),
        ({"buckets": [2, 4]}, "tlt.speculative.buckets must ascend strictly from 1"),
        ({"threshold": 4, "buckets": [1, 8]}, "stay <= tlt.speculative.threshold=4"),
        ({"strategies": ["4-1-4"]}, "depth_topk_treetokens"),
        ({"strategies": []}, "non-empty"),
        ({"strategies": ["4_1_8"]}, "tlt.speculative.strategies: '4_1_8' is not a usable strategy"),
        ({"strategies": ["2_4_100"]}, "tlt.speculative.strategies: '2_4_100' is not a usable strategy"),
        ({"epsilon": 2.0}, "tlt.speculative.epsilon must be in [0, 1]"),
        ({"probe_rate": 2.0}, "tlt.speculative.probe_rate must be in [0, 1]"),
        ({"strategies": ["suffix:4_1_4"]}, "tlt.speculative.strategies must be a non-empty list"),
        ({"group_strategies": ["4_1_4"]}, "'4_1_4' drafts with the drafter; group strategies name their source"),
        ({"group_strategies": ["mixed:4_2_6"]}, "Mixed drafts are chains"),
        ({"group_strategies": ["ngram:4_1_4"]}, "'ngram:4_1_4' is not a usable strategy"),
        ({"group_drafts": True, "group_strategies": []}, "group_drafts=true needs at least one"),
        ({"suffix_min_match": 0}, "tlt.speculative.suffix_min_match must be >= 1"),
        ({"suffix_history_tokens": -1}, "tlt.speculative.suffix_history_tokens must be >= 0"),
    ]
    for values, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            TLTConfig.from_dict({"speculative": values})


def test_drafter_group_rejects_values_that_would_fail_later():
    cases = [
        ({"max_tokens_per_batch": 1}, "tlt.drafter.max_tokens_per_batch must be >= 2"),
        ({"lr": float("inf")}, "tlt.drafter.lr must be finite and > 0"),
        ({"poll_interval_s": float("inf")}, "tlt.drafter.poll_interval_s must be in (0, 60.0]"),
        ({"poll_interval_s": 0}, "tlt.drafter.poll_interval_s must be in (0, 60.0]"),
        ({"cpu_niceness": -1}, "tlt.drafter.cpu_niceness must be in 0..19 (a process's niceness), got -1"),
        ({"cpu_niceness": 20}, "tlt.drafter.cpu_niceness must be in 0..19"),
        ({"train_depth": -1}, "tlt.drafter.train_depth must be >= 0"),
        ({"depth_decay": 0.0}, "tlt.drafter.depth_decay must be in (0, 1], got 0.0"),
        ({"depth_decay": 1.5}, "tlt.drafter.depth_decay must be in (0, 1]"),
        ({"hidden_loss_weight": -1.0}, "tlt.drafter.hidden_loss_weight must be finite and >= 0, got -1.0"),
        ({"logit_loss_weight": float("nan")}, "tlt.drafter.logit_loss_weight must be finite and >= 0"),
        ({"input_noise": -0.1}, "tlt.drafter.input_noise must be finite and >= 0"),
        ({"hidden_loss_weight": 0.0, "logit_loss_weight": 0.0}, "both 0, so the drafter would learn nothing"),
    ]
    for values, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            TLTConfig.from_dict({"drafter": values})


@pytest.mark.parametrize("bad", [["4-1-4"], [414, 212]])
def test_the_suggested_strategies_override_parses_to_strings_that_validate(bad):
    """Hydra reads an unquoted 4_1_4 as the integer 414: the fix an error suggests must survive Hydra's parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with pytest.raises(ValueError) as error:
        TLTConfig.from_dict({"speculative": {"strategies": bad}})
    suggested = re.search(r"e\.g\. (tlt\.speculative\.strategies=\S+(?:, \S+)*\])", str(error.value)).group(1)
    value = OverridesParser.create().parse_override(suggested.replace("'", "")).value()
    assert all(isinstance(name, str) for name in value)
    assert TLTConfig.from_dict({"speculative": {"strategies": value}}).speculative.strategies == tuple(value)


def test_from_dict_reads_plain_dict_and_dictconfig_with_interpolation():
    assert TLTConfig.from_dict({"enabled": True}).enabled is True
    root = OmegaConf.create({"flag": True, "tlt": {"enabled": "${flag}"}})
    assert TLTConfig.from_dict(root.tlt).enabled is True


def test_config_is_frozen():
    cfg = _NestedTLTConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.enabled = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.spec.num_speculative_tokens = 2  # type: ignore[misc]


def test_unknown_key_names_full_path_valid_keys_and_fix():
    with pytest.raises(ValueError) as e:
        TLTConfig.from_dict({"enabled": False, "foo": 1})
    msg = _message(e)
    assert "'tlt.foo'" in msg and "(value 1)" in msg
    assert "Valid keys under 'tlt': enabled" in msg
    assert "Fix: remove the override that sets tlt.foo" in msg and "+tlt.foo=" in msg


def test_wrong_bool_names_key_value_type_and_override():
    with pytest.raises(ValueError) as e:
        TLTConfig.from_dict({"enabled": "maybe"})
    msg = _message(e)
    assert "tlt.enabled must be bool" in msg
    assert "got 'maybe' (str)" in msg
    assert "set tlt.enabled=true or tlt.enabled=false" in msg


@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_bool_is_not_coerced(value):
    with pytest.raises(ValueError, match="tlt.enabled must be bool"):
        TLTConfig.from_dict({"enabled": value})


def test_nested_group_loads_and_normalises():
    cfg = _NestedTLTConfig.from_dict(
        {"enabled": True, "spec": {"num_speculative_tokens": 2, "temperature": 1, "buckets": [1, 2, 4]}}
    )
    assert cfg.spec == _SpecKnobs(num_speculative_tokens=2, temperature=1.0, buckets=(1, 2, 4))
    assert isinstance(cfg.spec.temperature, float)
    assert _NestedTLTConfig.from_dict({"spec": None}).spec == _SpecKnobs()


def test_nested_unknown_key_names_nested_path():
    with pytest.raises(ValueError) as e:
        _NestedTLTConfig.from_dict({"spec": {"num_speculative_token": 3}})
    msg = _message(e)
    assert "'tlt.spec.num_speculative_token'" in msg
    assert "num_speculative_tokens, temperature, method, drafter_path, buckets" in msg


@pytest.mark.parametrize(
    ("key", "value", "expected_type", "fix"),
    [
        (
            "num_speculative_tokens",
            "x",
            "int",
            "set tlt.spec.num_speculative_tokens=<int>, e.g. tlt.spec.num_speculative_tokens=4",
        ),
        ("num_speculative_tokens", True, "int", "tlt.spec.num_speculative_tokens=4 (the default)"),
        ("temperature", "hot", "float", "tlt.spec.temperature=1.0"),
        ("method", "medusa", "'eagle' | 'eagle3'", "set tlt.spec.method=eagle or tlt.spec.method=eagle3"),
        ("drafter_path", 3, "str | None", "tlt.spec.drafter_path=null"),
        ("buckets", [1, "a"], "tuple[int, ...]", "tlt.spec.buckets=[1, 8]"),
    ],
)
def test_nested_wrong_type_names_key_value_type_and_fix(key, value, expected_type, fix):
    with pytest.raises(ValueError) as e:
        _NestedTLTConfig.from_dict({"spec": {key: value}})
    msg = _message(e)
    assert f"tlt.spec.{key} must be {expected_type}, got {value!r}" in msg
    assert fix in msg


def test_group_that_is_not_a_mapping_is_rejected():
    expected = r"tlt.spec must be a mapping .* got 3 \(int\).*tlt.spec.num_speculative_tokens=4"
    with pytest.raises(ValueError, match=expected):
        _NestedTLTConfig.from_dict({"spec": 3})
    with pytest.raises(ValueError, match=r"tlt must be a mapping"):
        TLTConfig.from_dict(["enabled"])  # type: ignore[arg-type]


def test_iter_fields_flattens_nested_groups():
    keys = [s.key for s in regen.iter_fields(_NestedTLTConfig)]
    assert keys == [
        "enabled",
        "spec.num_speculative_tokens",
        "spec.temperature",
        "spec.method",
        "spec.drafter_path",
        "spec.buckets",
    ]


def test_render_yaml_block_nests_groups_in_verl_style():
    text = regen.render_yaml_block({"spec.method": "eagle"}, cls=_NestedTLTConfig)
    assert "  # Speculative decoding knobs.\n  spec:\n\n    # Draft tokens per step.\n" in text
    assert "    num_speculative_tokens: 4\n" in text and "    method: eagle\n" in text
    assert OmegaConf.to_container(OmegaConf.create(text))["tlt"] == {
        "enabled": False,
        "spec": {
            "num_speculative_tokens": 4,
            "temperature": 1.0,
            "method": "eagle",
            "drafter_path": None,
            "buckets": [1, 8],
        },
    }


def test_format_value_quotes_strings_yaml_would_misread():
    assert [format_value(v) for v in (True, None, 4, "eagle3", "on", "1.5", [1, 2])] == [
        "true",
        "null",
        "4",
        "eagle3",
        '"on"',
        '"1.5"',
        "[1, 2]",
    ]


# ---------------------------------------------------------------- imports


def test_config_module_imports_nothing_heavy():
    code = (
        "import sys, verl_tlt.config; "
        "verl_tlt.config.TLTConfig.from_dict({'speculative': {'strategies': ['4_1_4']}}); "  # validation too
        "bad = [m for m in ('verl', 'ray', 'torch', 'vllm', 'omegaconf', 'hydra') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------- YAML <-> dataclass


@pytest.mark.parametrize(
    ("path", "overrides"),
    [(WRAPPER_YAML, None), (OFF_YAML, None), (ON_YAML, {"enabled": True})],
    ids=["wrapper", "tlt-off", "tlt-on"],
)
def test_yaml_tlt_block_matches_dataclass(path, overrides):
    text = path.read_text()
    assert regen.render_yaml_block(overrides) in text, f"{path.name}: the tlt block is stale; {REGENERATE}"
    expected = {**TLTConfig().to_dict(), **(overrides or {})}
    loaded = OmegaConf.load(path)
    assert OmegaConf.to_container(loaded.tlt) == expected
    assert TLTConfig.from_dict(loaded.tlt) == TLTConfig.from_dict(expected)
    # The rollout side sees the same block, by interpolation.
    assert OmegaConf.to_container(loaded.actor_rollout_ref.rollout.custom) == {"tlt": "${tlt}"}


def test_regen_script_covers_every_yaml_file_with_a_tlt_block():
    holders = {path for path in HYDRA_CONF.rglob("*.yaml") if re.search(r"^tlt:$", path.read_text(), re.M)}
    assert holders == set(regen.YAML_FILES)


def test_group_files_are_global_and_only_on_selects_the_tlt_trainer():
    for path in (OFF_YAML, ON_YAML):
        assert path.read_text().splitlines()[0] == "# @package _global_"
    assert OmegaConf.load(ON_YAML).trainer.v1.trainer_mode == "tlt_sync"
    assert "trainer" not in OmegaConf.load(OFF_YAML)
    off, wrapper = OmegaConf.load(OFF_YAML), OmegaConf.load(WRAPPER_YAML)
    # Hydra's own settings differ (the group files add a callback, the wrapper a search path); the job's keys agree.
    assert {k: v for k, v in OmegaConf.to_container(off).items() if k != "hydra"} == {
        k: v for k, v in OmegaConf.to_container(wrapper).items() if k not in ("hydra", "defaults")
    }


@pytest.mark.parametrize("path", [WRAPPER_YAML, OFF_YAML, ON_YAML], ids=lambda p: p.name)
def test_yaml_follows_verl_comment_style(path):
    """verl's rule (tests/special_sanity/test_config_docs.py): comment above each key, blank line
    between fields, no inline comments."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assert " #" not in stripped, f"{path.name}:{i + 1}: inline comment: {line!r}"
        if stripped.startswith("- "):
            continue
        assert re.match(r"^\s*[\w.]+:", line), f"{path.name}:{i + 1}: unexpected line {line!r}"
        assert lines[i - 1].strip().startswith("#"), f"{path.name}:{i + 1}: no comment above {stripped!r}"
        before_comment = i - 1
        while before_comment >= 0 and lines[before_comment].strip().startswith("#"):
            before_comment -= 1
        if before_comment >= 0:
            assert lines[before_comment].strip() == "", f"{path.name}:{i + 1}: no blank line before the field"


# ---------------------------------------------------------------- docs <-> dataclass


@pytest.mark.parametrize("name", sorted(regen.DOCS_TABLES))
def test_docs_table_matches_its_dataclass(name):
    cls, prefix = regen.DOCS_TABLES[name]
    section = regen.generated_section(DOCS.read_text(), name)
    assert section == regen.render_docs_table(cls, prefix), f"docs/config_reference.md: {name} is stale; {REGENERATE}"


def test_docs_tables_cover_the_tlt_block_and_the_torch_rollout_options():
    from verl_tlt.integrations.torch_rollout.options import TorchRolloutConfig

    assert {cls for cls, _ in regen.DOCS_TABLES.values()} == {TLTConfig, TorchRolloutConfig}


def test_docs_table_has_a_row_per_leaf_key_with_type_default_and_help():
    lines = regen.render_docs_table(_NestedTLTConfig, "tlt.").splitlines()
    assert lines[:2] == ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| `tlt.enabled`",
        "| `tlt.spec.num_speculative_tokens`",
        "| `tlt.spec.temperature`",
        "| `tlt.spec.method`",
        "| `tlt.spec.drafter_path`",
        "| `tlt.spec.buckets`",
    ]
    # A bare | would split the cell in a markdown table.
    assert "| `tlt.spec.drafter_path` | `str \\| None` | `null` | Drafter checkpoint. |" in lines


# ---------------------------------------------------------------- the regen script


def _copies(tmp_path: Path) -> tuple[dict[Path, dict], Path]:
    yaml_files = {}
    for path, overrides in regen.YAML_FILES.items():
        copy = tmp_path / path.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
        yaml_files[copy] = overrides
    docs = tmp_path / "config_reference.md"
    shutil.copy(DOCS, docs)
    return yaml_files, docs


def test_regeneration_rewrites_only_the_generated_parts(tmp_path):
    yaml_files, docs = _copies(tmp_path)
    on_yaml = next(path for path in yaml_files if path.name == "on.yaml")
    text = on_yaml.read_text()
    # Someone else's edits outside the block, and a stale block (a changed default and comment).
    text = text.replace("# @package _global_\n", "# @package _global_\n# An edited header line.\n", 1)
    text = text.replace("    threshold: 32\n", "    threshold: 8\n", 1).replace(
        "  # Turn TLT", "  # Stale: turn TLT", 1
    )
    text += "\n# A key added after the block.\nextra_key: 1\n"
    on_yaml.write_text(text)
    docs.write_text(
        docs.read_text().replace("## Setting it", "## Setting it (edited)").replace("| `tlt.enabled` |", "| `tlt.on` |")
    )

    changed = regen.regenerate(yaml_files, docs)

    assert set(changed) == {on_yaml, docs}
    text = on_yaml.read_text()
    assert "# An edited header line.\n" in text and text.endswith("\n# A key added after the block.\nextra_key: 1\n")
    assert regen.render_yaml_block({"enabled": True}) in text and "Stale" not in text
    assert "## Setting it (edited)" in docs.read_text() and "`tlt.on`" not in docs.read_text()
    assert regen.regenerate(yaml_files, docs) == []  # a second run finds nothing to change


def test_yaml_block_at_the_end_of_a_file_is_replaced_up_to_the_end():
    text = "# Header.\nother: 1\n\n# Old comment.\ntlt:\n\n  # Old.\n  enabled: true\n"
    new = regen.replace_yaml_block(text, regen.render_yaml_block(cls=_NestedTLTConfig))
    assert new.startswith("# Header.\nother: 1\n\n# TLT (Taming the Long-Tail)")
    assert "Old" not in new and OmegaConf.create(new).tlt.spec.method == "eagle3"


def test_regeneration_refuses_a_file_without_its_markers():
    with pytest.raises(ValueError, match="BEGIN GENERATED TLTConfig"):
        regen.replace_generated_section("# Config reference\n| key |\n", "TLTConfig", "| new |")
