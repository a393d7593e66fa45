"""What a speculative-decoding benchmark decodes: a target, its warmed-up drafter and fresh prompts.

`--model toy` (the default: fast, trained on first use) is the character-level toy target with its csub problems;
a real model's name (`verl-tlt models list`) is that model, prepared once, with the drafter warmed up on its own
answers to the real tasks and chat prompts of fresh reasoning-gym problems (`verl_tlt.tasks.drafter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TOY = "toy"


@dataclass(frozen=True)
class BenchSubject:
    model: str  # `toy` or a real model's registry name
    target: Path
    drafter: Path
    toy_shape: str = "default"

    def prompts(self, num: int, seed: int) -> list[list[int]]:
        """`num` fresh token-id prompts from problem seed `seed` (a seed apart from the drafter's warm-up)."""
        if self.model == TOY:
            from verl_tlt.toy.drafter import toy_prompts

            return toy_prompts(self.target, num, seed)
        from verl_tlt.tasks.drafter import task_prompts
        from verl_tlt.tasks.registry import DEFAULT_TASKS

        per_task = -(-num // len(DEFAULT_TASKS))
        return task_prompts(self.target, per_task, seed)[:num]

    def about(self) -> dict[str, str]:
        """What the result JSON records about the subject."""
        about = {"model": self.model, "target": str(self.target), "drafter": str(self.drafter)}
        if self.model == TOY:
            about["toy_shape"] = self.toy_shape
        return about


def known_subjects() -> list[str]:
    from verl_tlt.models.registry import REAL_MODELS

    return [TOY, *REAL_MODELS]


def bench_subject(model: str = TOY, toy_shape: str = "default", drafter: str | None = None) -> BenchSubject:
    """The subject named `model`, built or prepared on first use (a real model's drafter: minutes on 2 cores).

    drafter: an exported drafter folder to use instead of the subject's cached warm-up drafter (which is then not
    built), e.g. the output of `verl-tlt drafter warmup`.
    """
    chosen = _drafter_folder(drafter) if drafter is not None else None
    if model == TOY:
        from verl_tlt.toy.drafter import ensure_toy_drafter
        from verl_tlt.toy.sft import ensure_toy_target

        target = ensure_toy_target(shape=toy_shape)
        return BenchSubject(TOY, target, chosen or ensure_toy_drafter(shape=toy_shape), toy_shape)
    if toy_shape != "default":
        raise ValueError(f"--toy-shape {toy_shape!r} applies to --model toy only, not to {model!r}")
    if model not in known_subjects():
        raise ValueError(f"unknown model {model!r}; known: {', '.join(known_subjects())} (`verl-tlt models list`)")
    from verl_tlt.models.prepare import ensure_model
    from verl_tlt.tasks.drafter import ensure_task_drafter

    return BenchSubject(model, ensure_model(model), chosen or ensure_task_drafter(model))


def family_drafters(model: str, given: dict[str, str | None]) -> tuple[BenchSubject, dict[str, Path]]:
    """The subject `model` and one drafter per family ({"eagle": ..., "eagle3": ...}): the folders `given`, or the
    model's cached warm-up drafter of that family (trained on first use: minutes for the toy, tens of minutes for a
    real model on 2 cores). Each folder must hold a drafter of its family."""
    from verl_tlt.drafter.load import read_export_config
    from verl_tlt.drafter.load_eagle3 import is_eagle3_config

    drafters = {}
    for family, folder in given.items():
        if folder is not None:
            path = _drafter_folder(folder)
        elif model == TOY:
            from verl_tlt.toy.drafter import ensure_toy_drafter

            path = ensure_toy_drafter(family=family)
        else:
            from verl_tlt.tasks.drafter import ensure_task_drafter

            path = ensure_task_drafter(model, family=family)
        found = "eagle3" if is_eagle3_config(read_export_config(path)) else "eagle"
        if found != family:
            raise ValueError(f"--{family} {path} holds an {found} drafter, not an {family} one")
        drafters[family] = path
    return bench_subject(model, drafter=str(drafters["eagle"])), drafters


def _drafter_folder(drafter: str) -> Path:
    from verl_tlt.drafter.export import CONFIG_FILE

    folder = Path(drafter).expanduser()
    if not (folder / CONFIG_FILE).is_file():
        raise ValueError(
            f"--drafter {drafter!r} is not an exported drafter (no {CONFIG_FILE} there); pass the --out folder of "
            "`verl-tlt drafter warmup`, or leave --drafter out to use the model's cached warm-up drafter"
        )
    return folder
