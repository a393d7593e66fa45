"""A chat prompt as token ids, through the tokenizer's own chat template (what verl's RLHFDataset renders)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The template's ids for `messages`, ending with the assistant turn's opening.

    transformers 5 returns a BatchEncoding from `apply_chat_template(..., tokenize=True)` where 4.x returned a
    list; both are accepted.
    """
    ids = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
