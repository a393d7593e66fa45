"""How well a drafter drafts for samples it has not trained on (teacher-forced): the scores behind
`tlt/drafter/eval_*` and `verl-tlt bench drafter-replay`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.drafter.unroll import unrolled_forward

# The shared-noise estimate: draws per position, and their seed (fixed, so two drafters' scores are paired).
COUPLING_DRAWS = 8
COUPLING_SEED = 1234
# Chain depth of the acceptance-length estimates; the trainer's per-step estimate uses it too, so that one and a
# held-out score compare.
ESTIMATE_DEPTH = 4
# Positions per head call when scoring: bounds the [positions, vocabulary] tensors (50 MB each at a 49k vocabulary).
EVAL_CHUNK_POSITIONS = 256
# Tokens per group of a time-bounded score: the bound is checked between groups, so a group is what it can overrun
# by. A whole optimizer batch (4096 tokens) took about a minute per drafter at a 49k vocabulary on one CPU core, which
# let a 20 s bound run to 127-157 s.
EVAL_GROUP_TOKENS = 512


class ScoreInterrupted(Exception):
    """A score's caller asked it to stop (`should_stop`) in the middle of a group: that group is not scored."""


def _check(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise ScoreInterrupted


@torch.no_grad()
def evaluate_drafter(
    model: EagleDrafterModel,
    samples: list,
    max_tokens_per_batch: int = 4096,
    depth: int = ESTIMATE_DEPTH,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """How well `model` drafts for `samples` it has not trained on (teacher-forced, over response positions).

    top1_accuracy: the drafter's argmax equals the target's. accept_prob: the target's probability of the
    drafter's argmax, i.e. the chance a greedy draft token survives speculative sampling at temperature 1 (1 for
    a matching argmax at temperature 0 too, so it is the sharper of the two at T=1). est_acceptance_length: a
    depth-`depth` chain's tokens per verify step if every draft token survived with accept_prob.

    coupled_accept_prob: the chance that the drafter's and the target's Gumbel-max draws at temperature 1 agree
    when they share the noise, which is how the engine's keyed sampling drafts and verifies (1 for a drafter with
    the target's distribution, however flat); a Monte-Carlo estimate over COUPLING_DRAWS seeded draws per position,
    the same draws for every model, so two drafters compare on equal noise. est_coupled_acceptance_length: the
    chain estimate from it.

    chain_acceptance_length: a depth-`depth` keyed chain's tokens per verify step, averaged over every response
    position as a start, with the drafts past the first made from the drafter's own features as at inference
    (`verl_tlt.drafter.unroll`): 1 + the sum over depths of the product of the shared-noise agreements so far. A
    chain that would run past the end of its sample stops there. chain_greedy_acceptance_length: the same for
    greedy drafts accepted with the target's probability of them.

    should_stop(): checked before every noise draw; once it says so, ScoreInterrupted is raised (what a burst's
    stop needs: a draw over [EVAL_CHUNK_POSITIONS, vocabulary], not a whole score, at a 49k vocabulary).
    """
    was_training = model.training
    model.eval()
    try:
        return _evaluate(model, samples, max_tokens_per_batch, depth, should_stop)
    finally:
        model.train(was_training)


def _evaluate(model, samples, max_tokens_per_batch: int, depth: int, should_stop) -> dict[str, float]:
    from verl_tlt.drafter.data import pack, windows

    device, dtype = model.fc.weight.device, model.fc.weight.dtype
    pairs = agree = accept = coupled = 0.0
    noise_generator = torch.Generator().manual_seed(COUPLING_SEED)
    # Long samples in windows, as in training: a packed batch's attention is quadratic in its length.
    chunks = token_groups(
        (piece for whole in samples for piece in windows(whole, max_tokens_per_batch)), max_tokens_per_batch
    )
    chain_coupled = chain_greedy = 0.0
    for part in chunks:
        batch = pack(part).to(device, dtype)
        mask = batch.loss_mask
        # Each start's chain along its response: survival of every depth so far, under keyed and greedy drafting.
        alive_coupled = alive_greedy = mask.float()
        chain_coupled += float(alive_coupled.sum())  # the verify step's own token
        chain_greedy += float(alive_greedy.sum())
        for level, drafted in enumerate(unrolled_forward(model, batch, depth), start=1):
            reachable = drafted.loss_mask(mask)
            greedy, shared, same_argmax = _level_scores(
                model, batch.target_hidden, drafted, reachable, noise_generator, should_stop
            )
            if level == 1:
                agree += float((same_argmax & mask).sum())
                accept += float((greedy * mask).sum())
                coupled += float((shared * mask).sum())
            alive_coupled, alive_greedy = alive_coupled * shared, alive_greedy * greedy
            chain_coupled += float(alive_coupled.sum())
            chain_greedy += float(alive_greedy.sum())
        pairs += float(mask.sum())
    if not pairs:
        return {}
    accept_prob = accept / pairs
    return {
        "top1_accuracy": agree / pairs,
        "accept_prob": accept_prob,
        "est_acceptance_length": estimated_acceptance_length(accept_prob, depth),
        "coupled_accept_prob": coupled / pairs,
        "est_coupled_acceptance_length": estimated_acceptance_length(coupled / pairs, depth),
        "chain_acceptance_length": chain_coupled / pairs,
        "chain_greedy_acceptance_length": chain_greedy / pairs,
        "num_pairs": pairs,
    }


def _level_scores(
    model: EagleDrafterModel,
    target_hidden: torch.Tensor,
    drafted,
    scored: torch.Tensor,
    generator: torch.Generator,
    should_stop: Callable[[], bool] | None = None,
):
    """[1, N] each, for one depth of the unrolled chain: the target's probability of the drafter's argmax, the
    shared-noise agreement, and whether the two argmaxes match; computed where `scored` [1, N] is True (response
    positions whose chain reaches this depth), zero elsewhere.

    Both distributions are made EVAL_CHUNK_POSITIONS positions at a time (the target's from the features of the
    pairs the depth predicts), so memory holds a few [chunk, vocabulary] tensors whatever the batch's tokens: a
    whole batch at once was [tokens, vocabulary] per distribution and COUPLING_DRAWS times that for the noise (6 GB
    at 4096 tokens and a 49k vocabulary, which got drafter workers killed for memory).
    """
    num_positions = drafted.features.shape[1]
    greedy = torch.zeros(1, num_positions, device=drafted.features.device)
    shared = torch.zeros_like(greedy)
    same_argmax = torch.zeros(1, num_positions, dtype=torch.bool, device=greedy.device)
    positions = scored[0].nonzero().squeeze(-1)
    for start in range(0, positions.numel(), EVAL_CHUNK_POSITIONS):
        _check(should_stop)
        rows = positions[start : start + EVAL_CHUNK_POSITIONS]
        logits = model.logits(drafted.features[:, rows])
        probs = model.target_logits(target_hidden[:, drafted.target_index[rows]]).float().softmax(-1)
        pick = logits.argmax(-1, keepdim=True)
        greedy[:, rows] = probs.gather(-1, pick).squeeze(-1)
        shared[:, rows] = _coupled_agreement(logits, probs, generator, should_stop)
        same_argmax[:, rows] = pick.squeeze(-1) == probs.argmax(-1)
    return greedy, shared, same_argmax


def _coupled_agreement(
    draft_logits: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
    should_stop: Callable[[], bool] | None = None,
):
    """[..., N]: the share of COUPLING_DRAWS shared-noise Gumbel-max draws on which drafter and target pick alike
    (one draw at a time: each is a [..., N, V] tensor)."""
    draft_log_probs = draft_logits.float().log_softmax(-1)
    target_log_probs = target_probs.clamp(min=1e-30).log()
    agree = torch.zeros(target_probs.shape[:-1], device=target_probs.device)
    for _ in range(COUPLING_DRAWS):
        _check(should_stop)
        uniform = torch.rand(target_probs.shape, generator=generator).clamp_(min=1e-20).to(target_probs.device)
        gumbel = -torch.log(-torch.log(uniform))
        agree += ((draft_log_probs + gumbel).argmax(-1) == (target_log_probs + gumbel).argmax(-1)).float()
    return agree / COUPLING_DRAWS


def token_groups(samples: Iterable, max_tokens: int, size: Callable[[object], int] | None = None) -> list[list]:
    """`samples` in order, in consecutive groups of at most `max_tokens` tokens (a longer sample alone); size(item):
    an item's tokens (default: its num_tokens)."""
    size = size or (lambda sample: sample.num_tokens)
    groups: list[list] = []
    tokens = 0
    for sample in samples:
        if groups and groups[-1] and tokens + size(sample) <= max_tokens:
            groups[-1].append(sample)
            tokens += size(sample)
        else:
            groups.append([sample])
            tokens = size(sample)
    return groups


# Per-pair means among evaluate_drafter's keys (merged across groups by their pairs); the est_* keys follow from them.
_MEAN_KEYS = (
    "top1_accuracy",
    "accept_prob",
    "coupled_accept_prob",
    "chain_acceptance_length",
    "chain_greedy_acceptance_length",
)


def evaluate_within(
    models: dict[str, EagleDrafterModel],
    samples: list,
    max_tokens_per_batch: int,
    max_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[dict[str, dict[str, float]], int]:
    """`evaluate_drafter` for every model on the same samples (a `ScoreRun` taken to its end at once): until
    `max_seconds` have passed (0 = no limit; the first group is always scored) or `should_stop()` says so (checked
    before every group, the first included); (scores per model over the groups scored, samples scored)."""
    run = ScoreRun(models, samples, max_tokens_per_batch, max_seconds, clock)
    while not (should_stop is not None and should_stop()) and run.step():
        pass
    return run.result()


class ScoreRun:
    """Scoring a set of samples a group at a time, so the scoring can be spread between other work (a burst's
    optimizer steps) and stop at any group: at most EVAL_GROUP_TOKENS tokens (or `max_tokens_per_batch`, if fewer)
    a group, long samples in windows of that size.

    Group by group, so each model is scored on exactly the samples the others were, whatever cut the scoring short;
    the shared noise restarts per group (the same for every model). `max_seconds` bounds the seconds spent in
    `step()` calls (0 = no limit; the first group is always scored).
    """

    def __init__(
        self,
        models: dict[str, EagleDrafterModel],
        samples: list,
        max_tokens_per_batch: int,
        max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        should_stop: Callable[[], bool] | None = None,
    ):
        """should_stop(): interrupts a group in the middle (`evaluate_drafter`); the group is scored afresh by the
        next `step()`."""
        from verl_tlt.drafter.data import windows

        self.models, self.max_tokens_per_batch, self.max_seconds, self.clock = (
            models,
            max_tokens_per_batch,
            max_seconds,
            clock,
        )
        self.should_stop = should_stop
        group_tokens = min(max_tokens_per_batch, EVAL_GROUP_TOKENS)
        self.num_samples = len(samples)
        # (sample index, window): a sample counts as scored once its last window is.
        self.pieces = [(index, piece) for index, whole in enumerate(samples) for piece in windows(whole, group_tokens)]
        self.groups = token_groups(self.pieces, group_tokens, size=lambda item: item[1].num_tokens)
        self.parts: dict[str, list[dict[str, float]]] = {name: [] for name in models}
        self.done = 0  # pieces scored
        self.scored = 0  # whole samples scored
        self.seconds = 0.0

    @property
    def finished(self) -> bool:
        """Every group scored, or the time bound spent (after at least one group)."""
        out_of_time = self.max_seconds > 0 and self.seconds >= self.max_seconds
        return len(self.parts_scored()) == len(self.groups) or (bool(self.done) and out_of_time)

    def parts_scored(self) -> list[dict[str, float]]:
        return self.parts[next(iter(self.models))] if self.models else []

    def step(self) -> bool:
        """Score the next group with every model; False (and nothing scored) once `finished`, or when `should_stop`
        interrupted it (the group is scored afresh next time)."""
        if self.finished:
            return False
        begin = self.clock()
        group = self.groups[len(self.parts_scored())]
        found = {}
        try:
            for name, model in self.models.items():
                pieces = [piece for _, piece in group]
                found[name] = evaluate_drafter(model, pieces, self.max_tokens_per_batch, should_stop=self.should_stop)
        except ScoreInterrupted:
            return False
        finally:
            self.seconds += self.clock() - begin
        for name, scores in found.items():
            self.parts[name].append(scores)
        self.done += len(group)
        last = self.pieces[self.done - 1][0]
        self.scored = last + 1 if self.done == len(self.pieces) or self.pieces[self.done][0] != last else last
        return True

    def result(self) -> tuple[dict[str, dict[str, float]], int]:
        """(scores per model over the groups scored, samples scored)."""
        return {name: merge_scores(found) for name, found in self.parts.items()}, self.scored


def merge_scores(parts: list[dict[str, float]]) -> dict[str, float]:
    """`evaluate_drafter` scores of disjoint sample groups as one score over all their pairs."""
    parts = [part for part in parts if part.get("num_pairs")]
    if not parts:
        return {}
    pairs = sum(part["num_pairs"] for part in parts)
    merged = {key: sum(part[key] * part["num_pairs"] for part in parts) / pairs for key in _MEAN_KEYS}
    merged["est_acceptance_length"] = estimated_acceptance_length(merged["accept_prob"], ESTIMATE_DEPTH)
    merged["est_coupled_acceptance_length"] = estimated_acceptance_length(merged["coupled_accept_prob"], ESTIMATE_DEPTH)
    merged["num_pairs"] = pairs
    return merged


def subsample_for_evaluation(samples: list, max_pairs: int) -> list:
    """Whole samples, evenly spaced over `samples`, holding about `max_pairs` response positions (all of them when
    they hold fewer): a step's score then costs about the same whatever it captured. Deterministic."""
    return [samples[i] for i in evaluation_indices(samples, max_pairs)]


def evaluation_indices(samples: list, max_pairs: int) -> list[int]:
    """The positions in `samples` of `subsample_for_evaluation`'s choice (none when max_pairs < 1)."""
    total = sum(sample.num_loss_pairs for sample in samples)
    if max_pairs < 1 or not samples:
        return []
    if total <= max_pairs:
        return list(range(len(samples)))
    keep = max(1, round(len(samples) * max_pairs / total))
    stride = len(samples) / keep
    return [int(i * stride) for i in range(keep)]


def estimated_acceptance_length(accuracy: float, depth: int) -> float:
    """Tokens per verify step (incl. bonus) of a depth-`depth` chain if each draft is right with p = accuracy.

    (1 - p^(k+1)) / (1 - p) (Leviathan et al.); optimistic for EAGLE, whose later drafts read its own features.
    """
    if accuracy >= 1.0:
        return float(depth + 1)
    return (1.0 - accuracy ** (depth + 1)) / (1.0 - accuracy)
