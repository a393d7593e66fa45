"""Test-only reward: share of digit characters in the response.

A randomly initialised toy model never solves csub, so the real reward is 0 for every sample and GRPO's
advantages (and gradients) vanish. This dense reward varies within every group, so the e2e test can check
that gradients flow and the updated weights reach the rollout.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    text = solution_str.replace(" ", "")
    return sum(ch.isdigit() for ch in text) / max(1, len(text))
