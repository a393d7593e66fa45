"""A simulated RL setup, read from YAML or a preset: cluster, model, batch, lengths, costs, acceptance, drafter,
training, the TLT policy, and the runs to compare.

Every section has defaults only where a default is a fact or a project default (TLT's threshold, strategies); the
rest must be given, so that a preset states all of its assumptions. Unknown keys are refused with the key named.
`build(...)` turns the plain values into the models (`roofline`, `measured_cost`, `acceptance`, `lengths`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from verl_tlt.sim.acceptance import Acceptance, ChainAcceptance, TableAcceptance, draw_with_mean
from verl_tlt.sim.costs import LinearCost, SpeculativeCost
from verl_tlt.sim.drafter_drift import DrafterDrift
from verl_tlt.sim.lengths import GroupLengths, TraceLengths
from verl_tlt.sim.roofline import ACCELERATORS, MODELS, DraftLevelCost, RooflineCost

PRESETS_DIR = Path(__file__).parent / "presets"
RUNS = ("baseline", "tlt", "fixed", "sd_always", "frozen", "no_spot", "group_drafts", "partial", "partial_plain")


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    rollout_tp: int
    accelerator: str = "cpu"

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def replicas(self) -> int:
        return self.gpus // self.rollout_tp


@dataclass(frozen=True)
class Batch:
    group_size: int
    prompt_tokens: int
    prompts: int = 0  # prompts per RL step; or
    prompts_per_node: int = 0  # prompts per node and step (the batch grows with the cluster)
    arrival_spread_s: float = 0.0  # requests reach the replicas evenly over this many seconds (0: all at once)

    def prompts_for(self, nodes: int) -> int:
        return self.prompts or self.prompts_per_node * nodes


@dataclass(frozen=True)
class Training:
    """The RL step's phases besides rollout, on all GPUs: log-prob passes and the update (FLOPs at `mfu`), the
    weight sync to the rollout, and any other fixed seconds (reward, data)."""

    mfu: float
    forward_passes: int = 2  # old policy and reference log-probs
    weight_sync_s: float = 0.0
    other_s: float = 0.0


@dataclass(frozen=True)
class TLTSettings:
    threshold: int = 32
    strategies: tuple[str, ...] = ("8_4_16", "6_4_8", "4_1_4", "2_1_2")
    buckets: tuple[int, ...] | None = None
    fixed_strategy: str = ""  # the `fixed` and `sd_always` runs' strategy (default: the first of strategies)
    group_strategies: tuple[str, ...] = ("suffix:8_1_8", "mixed:4_1_4")
    partial_budget_tokens: int = 0  # the `partial` run: tokens a response may decode per step before it is paused


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    cluster: Cluster
    model: str
    batch: Batch
    lengths: Mapping[str, Any]
    decode: Mapping[str, Any]
    acceptance: Mapping[str, Any]
    drafter: DrafterDrift
    training: Training
    tlt: TLTSettings = field(default_factory=TLTSettings)
    runs: tuple[str, ...] = ("baseline", "tlt")
    steps: int = 5
    seed: int = 0
    max_num_seqs: int = 256
    sources: tuple[str, ...] = ()  # where the preset's numbers come from, one line each

    def __post_init__(self) -> None:
        for run in self.runs:
            if run not in RUNS:
                raise ValueError(f"runs: unknown run {run!r}; choose from {', '.join(RUNS)}")
        if "baseline" not in self.runs:
            raise ValueError("runs must include 'baseline' (every speedup is relative to it)")
        if self.steps < 1 or self.max_num_seqs < 1:
            raise ValueError("steps and max_num_seqs must be >= 1")
        if self.cluster.gpus % self.cluster.rollout_tp:
            raise ValueError(
                f"cluster: {self.cluster.gpus} GPUs do not split into rollout replicas of tp={self.cluster.rollout_tp}"
            )
        if self.model not in MODELS and self.decode.get("kind") == "roofline":
            raise ValueError(f"model: {self.model!r} has no shape; known: {', '.join(MODELS)}")
        if {"partial", "partial_plain"} & set(self.runs) and self.tlt.partial_budget_tokens < 1:
            raise ValueError("runs: 'partial' and 'partial_plain' need tlt.partial_budget_tokens >= 1")

    # ----- models --------------------------------------------------------------------------------------------

    @property
    def prefill_s(self) -> float | None:
        """decode.prefill_s: measured seconds per admission, instead of the cost model's price of the prompts."""
        value = self.decode.get("prefill_s")
        return None if value is None else float(value)

    def length_model(self, base_dir: Path | None = None) -> GroupLengths | TraceLengths:
        values = dict(self.lengths)
        if "trace" in values:
            path = Path(values.pop("trace"))
            _refuse_unknown("lengths", values, ())
            return TraceLengths.from_file(path if path.is_absolute() or base_dir is None else base_dir / path)
        return _construct("lengths", GroupLengths, values)

    def speculative_cost(self, base_dir: Path | None = None) -> SpeculativeCost:
        values = dict(self.decode)
        kind = values.pop("kind", None)
        values.pop("prefill_s", None)  # read by `prefill_s`, not a cost model's
        if kind == "roofline":
            if self.cluster.accelerator not in ACCELERATORS:
                raise ValueError(
                    f"cluster.accelerator: {self.cluster.accelerator!r} unknown for decode.kind=roofline; known: "
                    f"{', '.join(ACCELERATORS)}"
                )
            level_s = values.pop("draft_level_s")
            target = _construct(
                "decode",
                RooflineCost,
                values,
                model=MODELS[self.model],
                accelerator=ACCELERATORS[self.cluster.accelerator],
                tp=self.cluster.rollout_tp,
            )
            return SpeculativeCost(target, drafter=DraftLevelCost(target, level_s))
        if kind == "linear":
            fraction = values.pop("drafter_fraction", 0.0)
            return SpeculativeCost(_construct("decode", LinearCost, values), drafter_fraction=fraction)
        if kind == "measured":
            from verl_tlt.sim.measured_cost import MeasuredCost

            fraction = values.pop("drafter_fraction", 0.0)
            path = Path(values.pop("path"))
            _refuse_unknown("decode", values, ("dtype", "mode"))
            path = path if path.is_absolute() or base_dir is None else base_dir / path
            return SpeculativeCost(MeasuredCost.from_verify_json(path, **values), drafter_fraction=fraction)
        raise ValueError(f"decode.kind must be 'roofline', 'linear' or 'measured', got {kind!r}")

    def acceptance_model(self) -> Acceptance:
        values = dict(self.acceptance)
        kind = values.pop("kind", None)
        if kind == "chain":
            _refuse_unknown("acceptance", values, ("eagle", "suffix"))
            return ChainAcceptance(values)
        if kind == "table":
            lengths = values.pop("lengths")
            suffix = values.pop("suffix", None)
            _refuse_unknown("acceptance", values, ())
            table = TableAcceptance({_shape(key): float(length) for key, length in lengths.items()})
            return table if suffix is None else _WithSuffix(table, float(suffix))
        raise ValueError(f"acceptance.kind must be 'chain' or 'table', got {kind!r}")


@dataclass(frozen=True)
class _WithSuffix:
    """A table for drafter strategies and a per-position probability for suffix (group) drafts."""

    table: TableAcceptance
    suffix_alpha: float

    def expected(self, strategy):
        from verl_tlt.spec.strategy import SUFFIX

        if strategy.source == SUFFIX:
            return ChainAcceptance({"suffix": self.suffix_alpha}).expected(strategy)
        return self.table.expected(strategy)

    def draw(self, strategy, rng):
        return draw_with_mean(self.expected(strategy), strategy.depth, rng)

    def scaled(self, quality: float):
        return _WithSuffix(self.table.scaled(quality), self.suffix_alpha)


def load(source: str | Path, overrides: Mapping[str, Any] | None = None) -> tuple[Scenario, Path]:
    """A scenario from a preset name (`verl_tlt/sim/presets/<name>.yaml`) or a YAML path, with dotted overrides
    ({'cluster.nodes': 4}); also returns the directory relative paths in it are read from."""
    path = Path(source)
    if not path.is_file():
        preset = PRESETS_DIR / f"{source}.yaml"
        if not preset.is_file():
            raise ValueError(f"no scenario file or preset {str(source)!r}; presets: {', '.join(preset_names())}")
        path = preset
    values = yaml.safe_load(path.read_text()) or {}
    for key, value in (overrides or {}).items():
        _set_dotted(values, key, value)
    return from_dict(values, name=path.stem), path.parent


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def from_dict(values: Mapping[str, Any], name: str = "scenario") -> Scenario:
    values = dict(values)
    values.setdefault("name", name)
    values.setdefault("description", "")
    sections = {
        "cluster": Cluster,
        "batch": Batch,
        "drafter": DrafterDrift,
        "training": Training,
        "tlt": TLTSettings,
    }
    for key, cls in sections.items():
        if key in values:
            values[key] = _construct(key, cls, dict(values[key] or {}))
    for key in ("runs", "sources"):
        if key in values:
            values[key] = tuple(values[key])
    return _construct("scenario", Scenario, values)


def _construct(section: str, cls, values: dict, **fixed):
    known = {f.name for f in fields(cls)} - set(fixed)
    _refuse_unknown(section, values, known)
    missing = [f.name for f in fields(cls) if f.name in known and f.name not in values and _required(f)]
    if missing:
        raise ValueError(f"{section}: missing {', '.join(missing)} (every assumption is stated in the scenario)")
    for f in fields(cls):
        if f.name in values and isinstance(values[f.name], list):
            values[f.name] = tuple(values[f.name])
    try:
        return cls(**values, **fixed)
    except TypeError as error:
        raise ValueError(f"{section}: {error}") from None


def _required(f) -> bool:
    from dataclasses import MISSING

    return f.default is MISSING and f.default_factory is MISSING


def _refuse_unknown(section: str, values: Mapping[str, Any], known) -> None:
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def _shape(key: str) -> tuple[int, int]:
    """'8_48' (depth_verify) -> (8, 48)."""
    try:
        depth, verify = (int(part) for part in str(key).split("_"))
    except ValueError:
        raise ValueError(f"acceptance.lengths keys are depth_verifytokens, e.g. '8_48'; got {key!r}") from None
    return depth, verify


def _set_dotted(values: dict, key: str, value: Any) -> None:
    node = values
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {key}: {part} is not a section")
    node[parts[-1]] = value
