"""Where each drafter worker trains, from the replica's accelerator ids (pure)."""

from __future__ import annotations

import pytest

from verl_tlt.integrations.control.placement import (
    NOSET_VISIBLE_DEVICES,
    VISIBLE_DEVICES,
    WorkerPlacement,
    place_worker,
    replica_cpu_cores,
    visible_devices,
)


def test_a_gpu_replicas_worker_trains_on_its_first_gpu_as_verl_places_its_vllm_servers():
    placement = place_worker("auto", ["3", "5"], replica_rank=1)  # a TP=2 replica on GPUs 3 and 5
    assert placement == WorkerPlacement("cuda:0", {VISIBLE_DEVICES: "3", NOSET_VISIBLE_DEVICES: "1"})
    assert placement.describe() == "cuda:0 (CUDA_VISIBLE_DEVICES=3)"
    assert place_worker("cuda", ["7"], replica_rank=0).env_vars[VISIBLE_DEVICES] == "7"


def test_a_cpu_replica_or_device_cpu_means_todays_host_training():
    assert place_worker("auto", [], replica_rank=0) == WorkerPlacement("cpu")
    assert place_worker("auto", [" ", ""], replica_rank=0) == WorkerPlacement("cpu")
    assert place_worker("cpu", ["0"], replica_rank=0) == WorkerPlacement("cpu")
    assert WorkerPlacement("cpu").describe() == "cpu"


def test_cuda_without_a_gpu_and_unknown_settings_fail_naming_the_key_and_the_fix():
    with pytest.raises(ValueError, match=r"tlt.drafter.device=cuda, but rollout replica 2 runs on no GPU.*=auto"):
        place_worker("cuda", [], replica_rank=2)
    with pytest.raises(ValueError, match=r"tlt.drafter.device='gpu' is not one of \['auto', 'cpu', 'cuda'\]"):
        place_worker("gpu", ["0"], replica_rank=0)


def test_visible_devices_parses_the_environment_value():
    assert visible_devices("2,3") == ["2", "3"] and visible_devices("") == [] and visible_devices(None) == []
    assert visible_devices(" 1 , 4 ") == ["1", "4"]


def test_cpu_replicas_share_their_nodes_cores_equally_and_contiguously():
    assert [replica_cpu_cores([0, 1], i, 2) for i in range(2)] == [[0], [1]]  # the CPU quickstart: one core each
    assert [replica_cpu_cores(range(8), i, 3) for i in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert replica_cpu_cores([4, 6, 5, 7], 1, 2) == [6, 7]  # the cores the process may use, sorted: not 0..n-1
    assert replica_cpu_cores([0, 1, 2, 3], 0, 1) == [0, 1, 2, 3]


def test_fewer_cores_than_replicas_means_one_shared_core_each():
    assert [replica_cpu_cores([0, 1], i, 3) for i in range(3)] == [[0], [1], [0]]


def test_a_replica_outside_its_nodes_count_or_no_cores_fails():
    with pytest.raises(ValueError, match="replica index 2 is not one of 2"):
        replica_cpu_cores([0, 1], 2, 2)
    with pytest.raises(ValueError, match="at least one available core"):
        replica_cpu_cores([], 0, 1)
