"""DrafterPool against real Ray actors (stand-in workers): one owner, handoff, queued data, losing workers."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from verl_tlt.integrations.verl.drafter_pool import DrafterPool  # noqa: E402

pytestmark = pytest.mark.timeout(180)


class FakeWorker:
    """Records what it was asked, holds a 'state' that training bumps and handoffs copy."""

    def __init__(self, rank: int):
        self.rank, self.version, self.samples, self.calls = rank, 0, [], []

    def add_samples(self, samples):
        self.calls.append("add")
        self.samples += samples
        return len(samples)

    def evaluate(self, samples):
        self.calls.append("evaluate")
        if "slow" in samples:  # a score that outlasts the pool's call timeout
            time.sleep(3)
        # Scored before this worker holds the samples: the order of queued calls is kept.
        return {"held_before": float(len(self.samples)), "version": float(self.version)}

    def start(self):
        self.calls.append("start")
        return bool(self.samples)

    def stop(self):
        self.calls.append("stop")
        self.version += 1
        return {"rank": self.rank, "version": self.version, "burst_steps": 3}

    def status(self):
        return {"rank": self.rank, "version": self.version}

    def weights(self):
        return self.version, {"w": self.version}

    def training_state(self):
        return {"version": self.version}

    def load_training_state(self, state):
        self.calls.append("load_training_state")
        self.version = state["version"]

    def load_weights(self, version, weights):
        self.calls.append("load_weights")
        self.version = version

    def update_target_weights(self, named):
        return len(named)

    def save(self, directory):
        self.calls.append("save")
        self.saving = directory

    def wait_for_save(self):
        return "unwritable" not in self.saving  # as DrafterWorker: False when the checkpoint failed

    def try_load(self, directory, version, total_steps):
        if "corrupt" in directory:  # as DrafterWorker: the failure is logged, the worker keeps its drafter
            return False
        self.version = version
        return True

    def get_calls(self):
        return list(self.calls)


def kill_and_wait(actor) -> None:
    """ray.kill returns before the actor is gone; wait until calls to it fail."""
    ray.kill(actor)
    for _ in range(200):
        try:
            ray.get(actor.get_calls.remote(), timeout=5)
        except Exception:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture()
def workers(ray_cluster):
    actors = [ray.remote(FakeWorker).remote(rank) for rank in range(3)]
    yield actors
    for actor in actors:
        ray.kill(actor)


def test_samples_reach_every_worker_after_the_owner_scored_them(workers):
    pool = DrafterPool(workers)
    pool.score_and_add([1, 2])
    pool.score_and_add([3])
    scores = pool.settle()
    assert scores == {"held_before": 2.0, "version": 0.0}  # the last batch, scored before it was added
    for worker in workers:
        assert ray.get(worker.get_calls.remote()).count("add") == 2
    assert pool.settle() is None


def test_training_moves_to_the_drained_replica_with_the_owners_state(workers):
    pool = DrafterPool(workers)
    pool.score_and_add([1])
    assert pool.start([1]) == 1
    assert pool.stop()["version"] == 1 and pool.owner == 1
    # Replica 2 drains first next time: it continues the drafter that worker 1 trained.
    assert pool.start([2]) == 2
    assert "load_training_state" in ray.get(workers[2].get_calls.remote())
    assert pool.stop()["version"] == 2
    assert pool.latest_weights() == (2, {"w": 2})
    assert pool.start([0, 2]) == 0 and pool.stop()["version"] == 3


def test_the_chosen_worker_is_prepared_before_it_starts(workers):
    pool, prepared = DrafterPool(workers), []
    pool.score_and_add([1])
    assert pool.start([2, 1], prepare=prepared.append) == 2
    assert prepared == [2]  # the chosen one only, before its start


def test_nothing_to_train_on_means_no_start(workers):
    pool = DrafterPool(workers)
    assert pool.start([0]) is None and pool.training_on is None


def test_a_dead_owner_is_replaced_from_the_last_published_weights(workers):
    pool = DrafterPool(workers, call_timeout_s=20)
    pool.score_and_add([1])
    assert pool.start([0]) == 0 and pool.stop()["version"] == 1
    assert pool.latest_weights() == (1, {"w": 1})
    kill_and_wait(workers[0])
    assert pool.status() is None or not pool.alive[0]  # the owner's death is noticed on the next call
    pool.score_and_add([2])
    pool.settle()
    assert pool.alive == [False, True, True] and pool.failures == 1
    assert pool.owner == 1 and "drafter worker 0" in pool.last_error
    assert "load_weights" in ray.get(workers[1].get_calls.remote())
    assert pool.start([1]) == 1 and pool.stop()["version"] == 2  # continues from version 1


def test_losing_every_worker_leaves_the_pool_unavailable_not_raising(workers):
    pool = DrafterPool(workers, call_timeout_s=20)
    for worker in workers:
        kill_and_wait(worker)
    pool.score_and_add([1])
    assert pool.settle() is None
    assert not pool.available and pool.failures == 3
    assert pool.start([0, 1, 2]) is None and pool.stop() is None and pool.latest_weights() is None


def test_a_failed_checkpoint_is_reported_and_costs_no_worker(workers):
    pool = DrafterPool(workers)
    assert pool.save("/ckpt/unwritable") and pool.wait_for_save() is False
    assert pool.save("/ckpt/step_2") and pool.wait_for_save() is True
    assert pool.alive == [True, True, True] and pool.failures == 0


def test_an_unreadable_checkpoint_keeps_every_worker_and_its_drafter(workers):
    pool = DrafterPool(workers)
    assert pool.load("/ckpt/corrupt", 7, 100) is False
    assert pool.alive == [True, True, True] and pool.status()["version"] == 0
    assert pool.load("/ckpt/step_2", 7, 100) is True and pool.status()["version"] == 7


def test_a_slow_score_is_late_not_a_lost_worker(workers):
    pool = DrafterPool(workers, call_timeout_s=0.5)
    pool.score_and_add(["slow"])
    assert pool.settle() is None and pool.late_scores == 1
    assert all(pool.alive) and pool.failures == 0  # busy scoring is not dead
    assert pool.busy(0) and pool.start([0]) is None  # no burst queues behind the late score
    assert pool.status() is None  # the owner's last status (none yet): a status call would queue behind too
    pool.score_and_add([1])  # the next step's samples are added; it is not scored while the last score runs
    deadline = time.monotonic() + 30
    while pool.busy(0):
        assert time.monotonic() < deadline, "the slow score never finished"
        time.sleep(0.1)
    assert pool.settle() is None  # the late score is stale by now: dropped, not reported as this step's
    assert all(pool.alive) and ray.get(workers[0].get_calls.remote()).count("evaluate") == 1
    assert pool.start([0]) == 0  # free again


def test_an_injected_out_of_memory_in_a_real_worker_ends_the_burst_and_the_pool_goes_on(ray_cluster, tmp_path_factory):
    """A real DrafterWorker actor whose first burst runs out of device memory: the pool keeps it, the next burst
    trains (what keeps the RL run going: no exception reaches the trainer, no worker is lost)."""
    import torch

    from tests.engine.conftest import build_tiny_model
    from verl_tlt.config import DrafterConfig
    from verl_tlt.drafter.data import DrafterSample
    from verl_tlt.drafter.worker import DrafterWorker
    from verl_tlt.modeling.weights import load_drafter_parts

    path = tmp_path_factory.mktemp("oom_target")
    build_tiny_model("qwen2", path)
    target = load_drafter_parts(str(path))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, target.spec.vocab_size, (24,), generator=generator)
    hidden = torch.randn(24, target.spec.hidden_size, generator=generator)
    sample = DrafterSample(ids, hidden, torch.arange(24) >= 4)
    config = DrafterConfig(max_tokens_per_batch=64)
    actors = [
        ray.remote(DrafterWorker).remote(str(path), config, rank=rank, num_threads=1, fault="oom_on_start=1")
        for rank in range(2)
    ]
    try:
        pool = DrafterPool(actors)
        pool.score_and_add([sample])
        assert pool.start([0]) == 0
        status = pool.stop()
        assert status["memory_stops"] == 1 and status["burst_steps"] == 0 and "out of memory" in status["last_error"]
        assert all(pool.alive) and pool.failures == 0
        assert pool.start([0]) == 0  # the worker's second burst: no fault
        deadline = time.monotonic() + 60
        while not pool.status()["global_step"]:
            assert time.monotonic() < deadline, "hang guard: no training step within 60 s"
            time.sleep(0.05)
        status = pool.stop()
        assert status["total_steps"] >= 1 and status["version"] == 1 and status["last_error"] is None
    finally:
        for actor in actors:
            ray.kill(actor)
