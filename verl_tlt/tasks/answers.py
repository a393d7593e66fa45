"""How a task's question is asked and its answer read back: the chat prompt and the answer extraction (pure)."""

from __future__ import annotations

import re

# Asks for the answer in the tags reasoning-gym's own prompts use, after step-by-step work: the work is the long
# tail a reasoning rollout has, the tags make the answer unambiguous.
SYSTEM_PROMPT = (
    "Solve the problem step by step. Then give only the final answer between <answer> and </answer> tags, "
    "for example <answer>42</answer>."
)

_TAGGED = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def chat_prompt(question: str) -> list[dict[str, str]]:
    """The messages verl renders with the model's chat template."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def extract_answer(response: str, numeric: bool) -> str | None:
    """The last tagged answer; for a numeric task without tags, the response's last number (a 135M model often
    states the result in prose); None when there is nothing to score."""
    tagged = _TAGGED.findall(response)
    if tagged:
        return tagged[-1].strip()
    if numeric:
        numbers = _NUMBER.findall(response)
        if numbers:
            return numbers[-1]
    return None
