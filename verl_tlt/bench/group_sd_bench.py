"""`verl-tlt bench sd drafts ...`: group drafts (suffix, mixed) against the EAGLE drafter on the trained toy target.

In GRPO each prompt is answered `group_size` times, and the answers that decode last (the tail of a rollout) have
siblings that already finished. The bench measures that tail: for each temperature T, batch size B and round, B
fresh toy prompts each form a group of `group_size` samples with distinct seeds; sample 0 of each group is the tail
and samples 1.. are its siblings.

* plain: the B tail requests decode with no strategy and no group indexing (`engine.group_drafts = None`), timed;
* per draft source and shape: the siblings decode (untimed, plainly, with their group keys) on a fresh `GroupDrafts`,
  so that when they have left the engine their answers are the prompt's history; then the tail decodes with the
  strategy and the same group keys, timed. The siblings decode once per round: each arm gets a fresh `GroupDrafts`
  holding the history they left (keyed sampling makes a second decode of the siblings give the same tokens), so
  nothing of the timed plain run or of another arm leaks into an arm's drafts. The EAGLE drafter does not read
  them: its arm runs with no group indexing, as plain does.

Keyed sampling makes the tail's tokens the same in every arm at every temperature (`identical`); a row that is not is
a losslessness bug and is reported loudly. Each timed run is repeated (`repeats`, on fresh drafts each time) and its
fastest repeat kept: a run lasts tens of milliseconds, and a stall of the shared host would otherwise decide a row.
Tokens and seconds sum over the rounds; speedups are ratios from this one run. Acceptance length is tokens per
verify step including the bonus token (a suffix step in which no row has a match decodes plainly and is not a verify
step); the accepted share per source comes from the engine's counters.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field

from verl_tlt.bench.host import host_info
from verl_tlt.bench.sd_bench import PROBLEM_SEED, acceptance_length, timed_generate
from verl_tlt.bench.subject import BenchSubject
from verl_tlt.engine import CompletionOutput, RolloutEngine, SamplingParams
from verl_tlt.engine.config import EngineConfig
from verl_tlt.engine.drafts.group import GroupDrafts
from verl_tlt.files import write_json
from verl_tlt.progress import Progress
from verl_tlt.spec.strategy import EAGLE, MIXED, SOURCES, SpecStrategy

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)
DEFAULT_SHAPES = ("4_1_4", "8_1_8")
DEFAULT_TEMPERATURES = (0.0, 1.0, 2.0)


@dataclass(frozen=True)
class GroupBenchConfig:
    """What `bench sd drafts` measures: draft sources x shapes, at each temperature and batch size."""

    drafts: tuple[str, ...] = SOURCES
    shapes: tuple[str, ...] = DEFAULT_SHAPES
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    group_size: int = 8
    rounds: int = 4
    max_tokens: int = 512
    min_match: int = 3  # GroupDrafts(min_match=...)
    repeats: int = 3  # timed calls of each run, the fastest kept (see fastest_of)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.drafts) - set(SOURCES))
        if unknown:
            raise ValueError(f"drafts must be among {SOURCES}, got {unknown}")
        for shape in self.shapes:
            if SpecStrategy.parse(shape).source != EAGLE:
                raise ValueError(f"shapes are 'depth_topk_treetokens' without a source (e.g. 4_1_4), got {shape!r}")
        if min(self.batch_sizes + (self.group_size, self.rounds, self.max_tokens, self.repeats)) < 1:
            raise ValueError("batch_sizes, group_size, rounds, max_tokens and repeats must be >= 1")
        if min(self.temperatures) < 0:
            raise ValueError(f"temperatures must be >= 0, got {list(self.temperatures)}")

    def arms(self) -> tuple[list[str], list[str]]:
        """The strategies measured (each source with each shape) and notes on the pairs skipped (mixed trees)."""
        strategies, skipped = [], []
        for shape in self.shapes:
            for source in self.drafts:
                parsed = SpecStrategy.parse(shape)
                if source == MIXED and not parsed.is_chain:
                    skipped.append(f"mixed:{shape} skipped: mixed drafts are chains (top_k 1)")
                    continue
                strategies.append(shape if source == EAGLE else f"{source}:{shape}")
        return strategies, skipped

    @property
    def num_prompts(self) -> int:
        return len(self.temperatures) * sum(self.batch_sizes) * self.rounds


@dataclass
class _Tally:
    """One row's sums over its rounds."""

    plain_tokens: int = 0
    plain_s: float = 0.0
    sd_tokens: int = 0
    sd_s: float = 0.0
    identical: bool = True
    outputs: list[CompletionOutput] = field(default_factory=list)
    drafted: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)


class _Heartbeat:
    """Stands in for a Progress in an untimed `engine.generate`, which reports finished requests: keeps the run's
    own line (counted in generate calls) coming while a long call runs."""

    def __init__(self, progress: Progress, what: str):
        self.progress, self.what = progress, what

    def update(self, done: int) -> bool:
        return self.progress.heartbeat(f"{self.what}: {done} finished")


def sample_seed(prompt_number: int, sample: int, group_size: int) -> int:
    """Distinct per sample of every prompt of the run (prompt numbers already differ by temperature, batch size and
    round)."""
    return prompt_number * group_size + sample


def group_key(prompt_number: int) -> Hashable:
    return ("bench-group", prompt_number)


def decode_siblings(
    engine: RolloutEngine, prompts, numbers: list[int], temperature: float, config: GroupBenchConfig, heartbeat
) -> GroupDrafts:
    """Decode samples 1.. of each group on a fresh GroupDrafts; return it, holding their answers as history."""
    engine.group_drafts = GroupDrafts(min_match=config.min_match)
    sibling_prompts, params, groups = [], [], []
    for prompt, number in zip(prompts, numbers, strict=True):
        for sample in range(1, config.group_size):
            sibling_prompts.append(prompt)
            params.append(_params(temperature, config.max_tokens, sample_seed(number, sample, config.group_size)))
            groups.append(group_key(number))
    if sibling_prompts:
        engine.max_num_seqs = len(sibling_prompts)
        engine.generate(sibling_prompts, params, groups=groups, progress=heartbeat)
    return engine.group_drafts


def fresh_drafts(siblings: GroupDrafts, prompts) -> GroupDrafts:
    """A new GroupDrafts whose history is what the siblings left for these prompts, and nothing else."""
    drafts = GroupDrafts(min_match=siblings.min_match)
    for prompt in {tuple(p): p for p in prompts}.values():  # a problem drawn twice in a round has one history
        for answer in siblings.history.answers(prompt):
            drafts.history.add(prompt, answer)
    return drafts


@dataclass
class _Timed:
    """The fastest of a run's repeats: the first repeat's outputs and draft counts, whether every repeat decoded the
    same tokens."""

    outputs: list[CompletionOutput]
    seconds: float
    repeats_agree: bool
    drafted: Counter
    accepted: Counter


def fastest_of(
    engine: RolloutEngine, prompts, params, strategy: str | None, groups, drafts: GroupDrafts | None, repeats: int
) -> _Timed:
    """Decode the same requests `repeats` times, each on its own copy of `drafts` (None: no group indexing).

    A call lasts tens of milliseconds, so one stall of the shared host would decide a row; the fastest repeat is the
    call's cost. Each repeat gets fresh drafts: the tail's own answer from an earlier repeat must not draft for it.
    """
    timed = None
    for _ in range(repeats):
        engine.group_drafts = fresh_drafts(drafts, prompts) if drafts is not None else None
        engine.max_num_seqs = len(prompts)
        drafted_before = Counter(engine.stats.drafted_by_source)
        accepted_before = Counter(engine.stats.accepted_by_source)
        outputs, seconds = timed_generate(engine, prompts, params, strategy, groups)
        if timed is None:
            drafted = engine.stats.drafted_by_source - drafted_before
            accepted = engine.stats.accepted_by_source - accepted_before
            timed = _Timed(outputs, seconds, True, drafted, accepted)
        else:
            timed.seconds = min(timed.seconds, seconds)
            timed.repeats_agree &= [o.token_ids for o in outputs] == [o.token_ids for o in timed.outputs]
    engine.group_drafts = None
    return timed


def measure_round(
    engine: RolloutEngine,
    prompts,
    numbers: list[int],
    temperature: float,
    config: GroupBenchConfig,
    strategies: list[str],
    tallies: dict[str, _Tally],
    progress: Progress,
) -> None:
    """Plain, then every strategy, on the tails of one round's groups; adds to each strategy's tally."""
    params = [_params(temperature, config.max_tokens, sample_seed(n, 0, config.group_size)) for n in numbers]
    groups = [group_key(n) for n in numbers]
    label = f"T={temperature:g} bs={len(prompts)}"
    plain = fastest_of(engine, prompts, params, None, groups, None, config.repeats)  # plain indexes nothing
    progress.advance(extra=f"{label} plain")
    siblings = None
    if any(SpecStrategy.parse(s).uses_group_drafts for s in strategies):
        siblings = decode_siblings(engine, prompts, numbers, temperature, config, _Heartbeat(progress, label))
        progress.advance(extra=f"{label} siblings")
    for strategy in strategies:
        drafts = siblings if SpecStrategy.parse(strategy).uses_group_drafts else None
        spec = fastest_of(engine, prompts, params, strategy, groups, drafts, config.repeats)
        tally = tallies[strategy]
        tally.plain_tokens += _num_tokens(plain.outputs)
        tally.plain_s += plain.seconds
        tally.sd_tokens += _num_tokens(spec.outputs)
        tally.sd_s += spec.seconds
        same = [o.token_ids for o in plain.outputs] == [o.token_ids for o in spec.outputs]
        tally.identical &= same and plain.repeats_agree and spec.repeats_agree
        tally.outputs += spec.outputs
        tally.drafted += spec.drafted
        tally.accepted += spec.accepted
        progress.advance(extra=f"{label} {strategy}")


def make_row(strategy: str, temperature: float, batch_size: int, tally: _Tally) -> dict:
    plain_rate, sd_rate = tally.plain_tokens / tally.plain_s, tally.sd_tokens / tally.sd_s
    parsed = SpecStrategy.parse(strategy)
    return {
        "source": parsed.source,
        "strategy": strategy,
        "temperature": temperature,
        "batch_size": batch_size,
        "plain_tokens_per_s": round(plain_rate, 1),
        "sd_tokens_per_s": round(sd_rate, 1),
        "speedup": round(sd_rate / plain_rate, 3),
        "acceptance_length": round(acceptance_length(tally.outputs), 3),
        "num_verify_steps": sum(o.stats["num_verify_steps"] for o in tally.outputs),
        "tail_tokens": tally.sd_tokens,
        "drafts_by_source": {
            source: {
                "drafted": tally.drafted[source],
                "accepted": tally.accepted[source],
                "accepted_share": round(tally.accepted[source] / tally.drafted[source], 3),
            }
            for source in sorted(tally.drafted)
            if tally.drafted[source]
        },
        "identical": tally.identical,
    }


def format_row(row: dict) -> str:
    shares = ", ".join(f"{s} {d['accepted_share']:.0%} accepted" for s, d in row["drafts_by_source"].items())
    return (
        f"{row['strategy']:>13} T={row['temperature']:<3g} bs={row['batch_size']:>3}: plain "
        f"{row['plain_tokens_per_s']:>7.1f} tok/s, SD {row['sd_tokens_per_s']:>7.1f} tok/s, speedup "
        f"{row['speedup']:.2f}x, acceptance {row['acceptance_length']:.2f}"
        f"{', ' + shares if shares else ', nothing drafted'}, {'identical' if row['identical'] else 'NOT IDENTICAL'}"
    )


def compare(engine: RolloutEngine, prompts: Sequence[Sequence[int]], config: GroupBenchConfig) -> dict:
    """Every row of the comparison on `engine`, whose drafter serves the eagle and mixed arms; prompts: at least
    `config.num_prompts`, each used once. Returns the options and the rows."""
    if len(prompts) < config.num_prompts:
        raise ValueError(f"compare needs {config.num_prompts} prompts, got {len(prompts)}")
    strategies, skipped = config.arms()
    for note in skipped:
        print(note, flush=True)
    _warm_up(engine, prompts[:2], strategies)
    units = 1 + len(strategies) + (1 if any(SpecStrategy.parse(s).uses_group_drafts for s in strategies) else 0)
    total = len(config.temperatures) * len(config.batch_sizes) * config.rounds * units
    progress = Progress("bench sd drafts", total, unit="generate calls")
    rows, next_number = [], 0
    for temperature in config.temperatures:
        for batch_size in config.batch_sizes:
            tallies = {strategy: _Tally() for strategy in strategies}
            for _ in range(config.rounds):
                numbers = list(range(next_number, next_number + batch_size))
                next_number += batch_size
                batch = [prompts[n] for n in numbers]
                measure_round(engine, batch, numbers, temperature, config, strategies, tallies, progress)
            for strategy in strategies:
                rows.append(make_row(strategy, temperature, batch_size, tallies[strategy]))
                _report(rows[-1], engine.sampler.keyed)
    return {"options": asdict(config), "strategies": strategies, "skipped": skipped, "rows": rows}


def run(
    json_path: str | None,
    config: GroupBenchConfig,
    subject: BenchSubject,
    *,
    device: str = "cpu",
    sampling: str = "keyed",
) -> dict:
    """The comparison on the subject's target and warmed-up drafter; prints rows, optionally writes JSON."""
    engine = RolloutEngine.from_pretrained(
        str(subject.target), config=EngineConfig(sampling=sampling), drafter=str(subject.drafter), device=device
    )
    prompts = subject.prompts(config.num_prompts, PROBLEM_SEED)
    return measure(json_path, engine, prompts, config, **subject.about(), device=device)


def measure(json_path: str | None, engine: RolloutEngine, prompts, config: GroupBenchConfig, **about) -> dict:
    """`compare` with what was measured (`about`: the models), where and on what code; optionally written as JSON."""
    result = {
        "benchmark": "sd_group_drafts",
        **about,
        "sampling": "keyed" if engine.sampler.keyed else "rejection",
        "dtype": str(engine.dtype).removeprefix("torch."),
        **host_info(),
        **compare(engine, prompts, config),
    }
    if json_path:
        write_json(json_path, result)
    return result


def _params(temperature: float, max_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)


def _num_tokens(outputs: list[CompletionOutput]) -> int:
    return sum(len(o.token_ids) for o in outputs)


def _warm_up(engine: RolloutEngine, prompts, strategies: list[str]) -> None:
    """First calls of each path (plain, every strategy) pay one-off costs that must not land in a timed run."""
    params = SamplingParams(temperature=0, max_tokens=8)
    engine.max_num_seqs = len(prompts)
    for strategy in (None, *strategies):
        engine.group_drafts = GroupDrafts() if strategy and SpecStrategy.parse(strategy).uses_group_drafts else None
        engine.generate(prompts, params, strategy=strategy)
    engine.group_drafts = None


def _report(row: dict, keyed: bool) -> None:
    print(format_row(row), flush=True)
    if row["identical"]:
        return
    if keyed or row["temperature"] == 0:
        logger.warning(
            "%s at T=%g bs=%d decoded other tokens than plain decoding with the same seeds: a losslessness bug",
            row["strategy"],
            row["temperature"],
            row["batch_size"],
        )
    else:  # rejection sampling draws other (equally distributed) tokens when the steps differ
        print(f"  (sampling=rejection at T={row['temperature']:g}: other tokens than plain are expected)", flush=True)
