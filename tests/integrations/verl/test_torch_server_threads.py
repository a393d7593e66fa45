"""The torch rollout server's engine loop runs with `engine_kwargs.torch.num_threads`, in its own thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from tests.engine.conftest import tiny_qwen2  # noqa: F401
from tests.openmp_probe import openmp_max_threads_probe
from verl_tlt.integrations.verl.torch_server import TorchRolloutServer


class _RolloutConfig(SimpleNamespace):
    def get(self, key, default=None):
        return getattr(self, key, default)


def test_engine_thread_uses_the_configured_thread_count(tiny_qwen2):  # noqa: F811
    probe = openmp_max_threads_probe()
    server = TorchRolloutServer.__new__(TorchRolloutServer)  # no verl config objects needed for init_engine
    server.replica_rank = 0
    server.model_config = SimpleNamespace(local_path=str(tiny_qwen2[0]))
    server.config = _RolloutConfig(
        engine_kwargs={"torch": {"num_threads": 1}},
        max_model_len=64,
        prompt_length=16,
        response_length=16,
        dtype="float32",
        max_num_seqs=2,
        logprobs_mode=None,
    )
    seen, done = [], threading.Event()

    def engine_loop():  # stands in for the server's engine loop: report the thread's team size
        seen.append(probe())
        done.set()

    server._run_engine = engine_loop
    previous = torch.get_num_threads()
    try:
        server.init_engine()
        assert done.wait(30)
    finally:
        torch.set_num_threads(previous)
    assert seen == [1]
