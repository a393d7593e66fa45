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

    def receive(self, samples):
        self.calls.append("receive")
        for gate in samples:
            if isinstance(gate, ray.actor.ActorHandle):  # a call held until the test opens the gate
                ray.get(gate.wait.remote())
        self.samples += samples
        return len(samples)

    def start(self):
        self.calls.append("start")
        return bool(self.samples)

    def stop(self):
        self.calls.append("stop")
        if getattr(self, "step_gate", None) is not None:  # the burst's step in progress, until the test opens it
            ray.get(self.step_gate.wait.remote())
        self.version += 1
        return {"rank": self.rank, "version": self.version, "burst_steps": 3}

    def request_stop(self):
        self.calls.append("request_stop")
        # Still in a step: one held by the test's gate, or a short one (`brief_step`) that ends before stop() is asked.
        finishing = getattr(self, "step_gate", None) is not None or getattr(self, "brief_step", False)
        return {"rank": self.rank, "version": self.version, "burst_steps": 2, "finishing": finishing}

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
        return {"version": self.version, "total_steps": 10 * self.version}

    def wait_for_save(self):
        return "unwritable" not in self.saving  # as DrafterWorker: False when the checkpoint failed

    def try_load(self, directory, version, total_steps):
        if "corrupt" in directory:  # as DrafterWorker: the failure is logged, the worker keeps its drafter
            return False
        self.version = version
        return True

    def get_calls(self):
        return list(self.calls)


@ray.remote(num_cpus=0)
class Gate:
    """Holds a stand-in worker's call until the test opens it: a call certainly in flight, on any host."""

    def __init__(self):
        import asyncio

        self.opened = asyncio.Event()

    async def wait(self):
        await self.opened.wait()

    async def open(self):
        self.opened.set()


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


def settled(pool: DrafterPool, limit_s: float = 60) -> DrafterPool:
    """Settle until every queued call is collected (settle itself never waits)."""
    deadline = time.monotonic() + limit_s
    pool.settle()
    while pool._pending:
        assert time.monotonic() < deadline, "queued calls never finished"
        time.sleep(0.02)
        pool.settle()
    return pool


def test_samples_reach_every_worker_in_order(workers):
    pool = DrafterPool(workers)
    pool.deliver([1, 2])
    pool.deliver([3])
    settled(pool)
    for worker in workers:
        assert ray.get(worker.get_calls.remote()) == ["receive", "receive"]
        assert ray.get(worker.__ray_call__.remote(lambda self: self.samples)) == [1, 2, 3]


def test_the_step_end_never_waits_for_a_worker(workers):
    """settle() returns while a worker's call is held open (it would hang here, until the test's timeout, if it
    waited), and the worker is busy, not lost: no burst starts on it until the call is done."""
    gate = Gate.remote()
    pool = DrafterPool(workers)
    pool.deliver([gate])
    pool.settle()
    assert pool.busy(0) and all(pool.alive) and pool.failures == 0
    assert pool.start([0]) is None  # a burst would queue behind the held call
    assert pool.waiting_on_calls([0])  # so the coordinator asks again at its next poll
    pool.update_target_weights({"w": 1})  # queued too: nothing waits
    ray.get(gate.open.remote())
    settled(pool)
    assert not pool.waiting_on_calls([0])
    assert all(pool.alive) and pool.start([0]) == 0


def test_a_status_read_waits_for_quick_queued_calls_and_not_for_a_stuck_one(workers, monkeypatch):
    from verl_tlt.integrations.verl import drafter_pool

    pool = DrafterPool(workers)
    pool.deliver([1])
    pool.update_target_weights({"w": 1})
    assert pool.status() == {"rank": 0, "version": 0}  # read after the queued calls, not skipped for them
    gate = Gate.remote()
    monkeypatch.setattr(drafter_pool, "QUIET_WAIT_S", 0.2)
    pool.deliver([gate])
    assert pool.status() == {"rank": 0, "version": 0}  # the last status: a read would queue behind the held call
    assert pool.latest_weights() is None  # nothing published yet, and no read queued behind it
    ray.get(gate.open.remote())
    settled(pool)


def test_training_moves_to_the_drained_replica_with_the_owners_state(workers, monkeypatch):
    from verl_tlt.integrations.verl import drafter_pool

    monkeypatch.setattr(drafter_pool, "QUIET_WAIT_S", 0.2)
    pool = DrafterPool(workers)
    pool.deliver([1])
    settled(pool)
    assert pool.start([1]) == 1
    assert pool.stop()["version"] == 1 and pool.owner == 1
    gate = Gate.remote()
    pool.deliver([gate])  # the next step's captures, still being stored when the step's status is read
    assert pool.status()["version"] == 1  # the stop's report, not a status from before the burst
    ray.get(gate.open.remote())
    settled(pool)
    # Replica 2 drains first next time: it continues the drafter that worker 1 trained.
    assert pool.start([2]) == 2
    assert "load_training_state" in ray.get(workers[2].get_calls.remote())
    assert pool.stop()["version"] == 2
    assert pool.latest_weights() == (2, {"w": 2})
    assert pool.start([0, 2]) == 0 and pool.stop()["version"] == 3


def test_a_stop_in_the_background_answers_at_once_and_the_worker_is_busy_until_its_step_ends(workers):
    """With stop_in_background (CPU workers) the stop answers while the burst's step still runs (held by a gate,
    on any host): the worker is busy (no start, no hand-over from it; the coordinator asks again), status and
    weight reads do not wait for it, and settle() collects the burst's final report once the step ends."""
    pool = DrafterPool(workers, stop_in_background=True)
    pool.deliver([1])
    settled(pool)
    gate = Gate.remote()
    ray.get(workers[1].__ray_call__.remote(lambda self, g: setattr(self, "step_gate", g), gate))
    assert pool.start([1]) == 1
    early = pool.stop()
    assert early["finishing"] and early["burst_steps"] == 2 and pool.owner == 1
    assert pool.busy(1) and all(pool.alive)
    begin = time.monotonic()
    assert pool.status() == early and pool.latest_weights() is None  # neither waits for the step in progress
    assert time.monotonic() - begin < 2
    assert pool.start([2]) is None and pool.waiting_on_calls([2])  # the hand-over would wait for the step
    pool.update_target_weights({"w": 1})  # queued behind the stop: it runs once the burst has ended
    ray.get(gate.open.remote())
    settled(pool)
    assert pool.status()["version"] == 1 and pool.latest_weights() == (1, {"w": 1})
    calls = ray.get(workers[1].get_calls.remote())
    assert calls[-2:] == ["request_stop", "stop"]
    assert pool.start([2]) == 2  # the hand-over carries the step the burst finished
    assert "load_training_state" in ray.get(workers[2].get_calls.remote())


def test_a_step_that_ends_within_the_stop_wait_is_waited_for_as_before(workers):
    """A short step in progress (the toy's; STOP_WAIT_S bounds the wait) is not left to the background: the stop
    reports it, and the worker is free at once for what the step's end queues."""
    pool = DrafterPool(workers, stop_in_background=True)
    pool.deliver([1])
    settled(pool)
    ray.get(workers[0].__ray_call__.remote(lambda self: setattr(self, "brief_step", True)))
    assert pool.start([0]) == 0
    assert pool.stop() == {"rank": 0, "version": 1, "burst_steps": 3}
    assert not pool.busy(0) and not pool._finishing


def test_a_stop_in_the_background_of_a_burst_already_over_reports_it_at_once(workers):
    pool = DrafterPool(workers, stop_in_background=True)
    pool.deliver([1])
    settled(pool)
    assert pool.start([0]) == 0
    assert pool.stop() == {"rank": 0, "version": 1, "burst_steps": 3}  # stop()'s own report: nothing left to end
    assert not pool.busy(0) and ray.get(workers[0].get_calls.remote())[-2:] == ["request_stop", "stop"]


def test_the_chosen_worker_is_prepared_before_it_starts(workers):
    pool, prepared = DrafterPool(workers), []
    pool.deliver([1])
    settled(pool)
    assert pool.start([2, 1], prepare=prepared.append) == 2
    assert prepared == [2]  # the chosen one only, before its start


def test_nothing_to_train_on_means_no_start(workers):
    pool = DrafterPool(workers)
    assert pool.start([0]) is None and pool.training_on is None
    assert not pool.waiting_on_calls([0])  # refused for good in this rollout: no call would change it


def test_a_dead_owner_is_replaced_from_the_last_published_weights(workers):
    pool = DrafterPool(workers, call_timeout_s=20)
    pool.deliver([1])
    settled(pool)
    assert pool.start([0]) == 0 and pool.stop()["version"] == 1
    assert pool.latest_weights() == (1, {"w": 1})
    kill_and_wait(workers[0])
    assert pool.status() is None or not pool.alive[0]  # the owner's death is noticed on the next call
    pool.deliver([2])
    settled(pool)
    assert pool.alive == [False, True, True] and pool.failures == 1
    assert pool.owner == 1 and "drafter worker 0" in pool.last_error
    assert "load_weights" in ray.get(workers[1].get_calls.remote())
    assert pool.start([1]) == 1 and pool.stop()["version"] == 2  # continues from version 1


def test_losing_every_worker_leaves_the_pool_unavailable_not_raising(workers):
    pool = DrafterPool(workers, call_timeout_s=20)
    for worker in workers:
        kill_and_wait(worker)
    pool.deliver([1])
    settled(pool)
    assert not pool.available and pool.failures == 3
    assert pool.start([0, 1, 2]) is None and pool.stop() is None and pool.latest_weights() is None


def test_a_failed_checkpoint_is_reported_and_costs_no_worker(workers):
    pool = DrafterPool(workers)
    pool.save("/ckpt/unwritable")
    result = pool.wait_for_save()
    assert not result.saved and "could not write" in result.reason
    pool.save("/ckpt/step_2")
    assert pool.wait_for_save().saved
    assert pool.alive == [True, True, True] and pool.failures == 0


def test_a_checkpoint_taken_while_the_owner_is_busy_waits_for_it_and_carries_the_drafter(workers):
    """verl saves while the owner still runs a queued call (held open here, so on any host)."""
    gate = Gate.remote()
    pool = DrafterPool(workers)
    pool.deliver([gate, 1])
    pool.save("/ckpt/step_2")
    assert pool.busy(0)  # the call is held open: the save is queued behind it
    ray.get(gate.open.remote())
    result = pool.wait_for_save()
    assert result.saved and result.rank == 0 and result.info == {"version": 0, "total_steps": 0}
    assert ray.get(workers[0].get_calls.remote()) == ["receive", "save"]  # stored, then saved
    settled(pool)
    assert all(pool.alive) and pool.failures == 0


def test_a_checkpoint_whose_owner_stays_busy_past_the_limit_fails_loudly_and_keeps_the_worker(workers):
    gate = Gate.remote()
    pool = DrafterPool(workers, call_timeout_s=0.5)
    pool.deliver([gate])
    pool.save("/ckpt/step_2")
    result = pool.wait_for_save(timeout_s=0.5)
    assert not result.saved and "drafter worker 0 was still busy with its earlier calls" in result.reason
    assert result.waited_s >= 0.5  # the step waited that long: tlt/drafter/checkpoint_wait_s says so
    assert all(pool.alive) and pool.failures == 0 and pool.busy(0)  # busy is not dead; nothing queues behind it
    assert pool.start([0]) is None
    ray.get(gate.open.remote())
    settled(pool)
    pool.save("/ckpt/step_3")
    assert pool.wait_for_save().saved and all(pool.alive)


def test_a_checkpoint_preempts_a_running_burst_and_its_report_still_reaches_the_coordinator(workers):
    pool = DrafterPool(workers)
    pool.deliver([1])
    settled(pool)
    assert pool.start([1]) == 1
    pool.save("/ckpt/step_2")
    result = pool.wait_for_save()
    assert result.saved and result.rank == 1 and result.info["version"] == 1  # the burst's weights, after its stop
    assert ray.get(workers[1].get_calls.remote())[-2:] == ["stop", "save"]
    assert pool.stop() == {"rank": 1, "version": 1, "burst_steps": 3}  # the coordinator's stop gets the report
    assert pool.stop() is None


def test_a_checkpoint_whose_owner_died_says_so_and_the_next_one_uses_a_live_worker(workers):
    pool = DrafterPool(workers)
    kill_and_wait(workers[0])
    pool.save("/ckpt/step_2")
    result = pool.wait_for_save()
    assert not result.saved and "drafter worker 0 failed while saving" in result.reason
    pool.save("/ckpt/step_4")
    assert pool.wait_for_save().rank == 1
    for worker in workers[1:]:
        kill_and_wait(worker)
    for step, rank in ((6, 1), (8, 2)):  # each save finds its owner dead, and the next live worker takes over
        pool.save(f"/ckpt/step_{step}")
        assert f"drafter worker {rank} failed while saving" in pool.wait_for_save().reason
    pool.save("/ckpt/step_10")
    assert "no drafter worker is alive" in pool.wait_for_save().reason and not pool.available


def test_an_unreadable_checkpoint_keeps_every_worker_and_its_drafter(workers):
    pool = DrafterPool(workers)
    assert pool.load("/ckpt/corrupt", 7, 100) is False
    assert pool.alive == [True, True, True] and pool.status()["version"] == 0
    assert pool.load("/ckpt/step_2", 7, 100) is True and pool.status()["version"] == 7


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
        pool.deliver([sample])
        settled(pool)
        assert pool.start([0]) == 0
        deadline = time.monotonic() + 60
        while pool.status()["running"]:  # the burst's first step raises
            assert time.monotonic() < deadline, "hang guard: the injected out-of-memory burst did not end in 60 s"
            time.sleep(0.05)
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
