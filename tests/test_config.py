"""TLTConfig: defaults, validation messages, and sync with the YAML files and the docs table."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from omegaconf import OmegaConf

from verl_tlt.config import (
    TLTConfig,
    format_value,
    iter_fields,
    render_yaml_block,
)

REPO = Path(__file__).resolve().parents[1]
HYDRA_CONF = REPO / "verl_tlt" / "hydra_conf"
WRAPPER_YAML = HYDRA_CONF / "tlt_ppo_trainer.yaml"
OFF_YAML = HYDRA_CONF / "tlt" / "off.yaml"
ON_YAML = HYDRA_CONF / "tlt" / "on.yaml"
DOCS = REPO / "docs" / "config_reference.md"


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
    keys = [s.key for s in iter_fields(_NestedTLTConfig)]
    assert keys == [
        "enabled",
        "spec.num_speculative_tokens",
        "spec.temperature",
        "spec.method",
        "spec.drafter_path",
        "spec.buckets",
    ]


def test_render_yaml_block_nests_groups_in_verl_style():
    text = render_yaml_block({"spec.method": "eagle"}, cls=_NestedTLTConfig)
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


def _regenerate_hint(overrides: dict | None) -> str:
    return "the tlt block must be exactly (verl_tlt.config.render_yaml_block()):\n" + render_yaml_block(overrides)


@pytest.mark.parametrize(
    ("path", "overrides"),
    [(WRAPPER_YAML, None), (OFF_YAML, None), (ON_YAML, {"enabled": True})],
    ids=["wrapper", "tlt-off", "tlt-on"],
)
def test_yaml_tlt_block_matches_dataclass(path, overrides):
    text = path.read_text()
    assert render_yaml_block(overrides) in text, f"{path.name}: {_regenerate_hint(overrides)}"
    expected = {**TLTConfig().to_dict(), **(overrides or {})}
    loaded = OmegaConf.load(path)
    assert OmegaConf.to_container(loaded.tlt) == expected
    assert TLTConfig.from_dict(loaded.tlt) == TLTConfig.from_dict(expected)
    # The rollout side sees the same block, by interpolation.
    assert OmegaConf.to_container(loaded.actor_rollout_ref.rollout.custom) == {"tlt": "${tlt}"}


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


def _docs_rows() -> list[dict[str, str]]:
    lines = DOCS.read_text().splitlines()
    header = lines.index("| key | type | default | meaning |")
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        key, type_, default, meaning = (c.strip() for c in line.strip().strip("|").split("|"))
        rows.append(
            {
                "key": key.strip("`"),
                "type": type_.strip("`"),
                "default": default.strip("`"),
                "meaning": meaning.replace("`", ""),
            }
        )
    return rows


def test_docs_table_lists_exactly_the_dataclass_fields():
    expected = [
        {"key": f"tlt.{s.key}", "type": s.type_name, "default": format_value(s.default), "meaning": s.help}
        for s in iter_fields()
    ]
    assert _docs_rows() == expected, "update the table in docs/config_reference.md from TLTConfig"
