"""engine_kwargs.torch: one dataclass of defaults, read and validated in one place, errors with the key path."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from verl_tlt.engine.config import SAMPLING_MODES
from verl_tlt.integrations.torch_rollout.options import TorchRolloutConfig, torch_rollout_config

KEY = "actor_rollout_ref.rollout.engine_kwargs.torch"


@pytest.mark.parametrize("rollout", [{}, {"engine_kwargs": None}, {"engine_kwargs": {"vllm": {}}}])
def test_no_torch_options_means_the_defaults(rollout):
    options = torch_rollout_config(rollout)
    assert options == TorchRolloutConfig()
    assert (options.num_threads, options.max_num_seqs, options.trace_path) == (1, None, None)
    assert (options.compile, options.cuda_graphs, options.sampling) == (False, False, "keyed")
    assert options.cpu_kernels == "measure"


def test_options_are_read_from_verls_omegaconf_node_with_interpolations():
    root = OmegaConf.create(
        {"threads": 2, "rollout": {"engine_kwargs": {"torch": {"num_threads": "${threads}", "sampling": "rejection"}}}}
    )
    options = torch_rollout_config(root.rollout)
    assert options == TorchRolloutConfig(num_threads=2, sampling="rejection")


def test_the_sampling_choices_are_the_engines():
    for mode in SAMPLING_MODES:
        assert torch_rollout_config({"engine_kwargs": {"torch": {"sampling": mode}}}).sampling == mode


@pytest.mark.parametrize(
    ("options", "messages"),
    [
        (
            {"num_thread": 2},
            [
                f"Unknown config key '{KEY}.num_thread' (value 2)",
                "num_threads, cpu_affinity, max_num_seqs, trace_path, compile, cuda_graphs, sampling",
                f"+{KEY}.num_thread=",
            ],
        ),
        ({"compile": "yes"}, [f"{KEY}.compile must be bool, got 'yes'", f"set {KEY}.compile=true or"]),
        ({"num_threads": 1.5}, [f"{KEY}.num_threads must be int, got 1.5", f"e.g. {KEY}.num_threads=1"]),
        ({"num_threads": 0}, [f"{KEY}.num_threads must be >= 1, got 0"]),
        ({"max_num_seqs": 0}, [f"{KEY}.max_num_seqs must be >= 1 or null"]),
        ({"trace_path": 3}, [f"{KEY}.trace_path must be str | None, got 3"]),
        ({"sampling": "nucleus"}, ["got 'nucleus'", f"set {KEY}.sampling=keyed or {KEY}.sampling=rejection"]),
        ({"cpu_kernels": "fastest"}, ["got 'fastest'", "'measure' | 'thresholds'", f"{KEY}.cpu_kernels=measure"]),
    ],
)
def test_bad_options_name_the_key_path_the_value_and_the_fix(options, messages):
    with pytest.raises(ValueError) as error:
        torch_rollout_config({"engine_kwargs": {"torch": options}})
    for message in messages:
        assert message in str(error.value), (message, str(error.value))


def test_options_that_are_not_a_mapping_are_refused():
    with pytest.raises(ValueError, match=re.escape(f"{KEY} must be a mapping of keys")):
        torch_rollout_config({"engine_kwargs": {"torch": ["compile"]}})
