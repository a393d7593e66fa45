from __future__ import annotations

import pytest

from verl_tlt.engine import SamplingParams


def test_request_dict_from_verl_agent_loop_is_accepted():
    params = SamplingParams.from_request_dict(
        {"temperature": 0.9, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True},
        default_max_tokens=64,
    )
    assert params.max_tokens == 64 and params.temperature == 0.9


def test_unknown_sampling_keys_are_named_in_the_error():
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams.from_request_dict({"min_p": 0.1}, default_max_tokens=8)


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"repetition_penalty": 1.1}, "repetition_penalty=1.0"),
    ],
)
def test_bad_values_fail_with_the_field_name(kwargs, text):
    with pytest.raises(ValueError, match=text):
        SamplingParams(**kwargs)
