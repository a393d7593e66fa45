"""TLTRuntime's glue with fakes for Ray and the replicas: failures stay contained, bad set-ups fail at start."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

pytest.importorskip("ray")

from verl_tlt.config import TLTConfig  # noqa: E402
from verl_tlt.integrations.control.contract import CONTROL_CALLS  # noqa: E402
from verl_tlt.integrations.verl import tlt_runtime  # noqa: E402
from verl_tlt.integrations.verl.drafter_pool import SaveResult  # noqa: E402
from verl_tlt.integrations.verl.tlt_runtime import TLTRuntime  # noqa: E402


class Call:
    """What `.remote()` returns here: the result (or the error) of calling the method right away."""

    def __init__(self, fn, *args):
        try:
            self.value, self.error = fn(*args), None
        except Exception as error:
            self.value, self.error = None, error


class FakeRay:
    @staticmethod
    def put(value):
        return value

    @staticmethod
    def get(call, timeout=None):
        if isinstance(call, list):
            return [FakeRay.get(c, timeout) for c in call]
        if call.error is not None:
            raise call.error
        return call.value


class Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return Call(self.fn, *args)


class FakeServer:
    def __init__(self, fails: bool = False):
        self.loaded: list[int] = []
        self.fails = fails
        self.update_drafter = Remote(self._update)
        # The rest of the control contract (integrations/control/contract.py), unused by these tests.
        for name in CONTROL_CALLS:
            if name != "update_drafter":
                setattr(self, name, Remote(lambda *args, **kwargs: None))

    def _update(self, weights, version):
        if self.fails:
            raise ValueError("Drafter version does not fit this target's drafter")
        self.loaded.append(version)
        return True


class FakePool:
    def __init__(self, version: int = 3, saved: bool = True):
        self.version, self.saved, self.saves = version, saved, []
        self.available, self.calls = True, []

    def update_target_weights(self, named):
        self.calls.append(("targets", dict(named)))

    def deliver(self, samples):
        self.calls.append(("deliver", len(samples)))

    def latest_weights(self):
        return self.version, {"w": self.version}

    def status(self):
        return {"version": self.version, "total_steps": 10}

    def save(self, directory):
        self.saves.append(directory)

    def wait_for_save(self):
        if not self.saved:
            return SaveResult(False, "drafter worker 0 was still busy with its earlier calls after 600 s", 0)
        return SaveResult(True, "", 0, {"version": self.version, "total_steps": 10}, 2.5)


@pytest.fixture()
def runtime(monkeypatch):
    monkeypatch.setattr(tlt_runtime, "ray", FakeRay)
    runtime = TLTRuntime(config=None, tlt=TLTConfig.from_dict({"enabled": True}))
    runtime.pool = FakePool()
    return runtime


def test_a_replica_that_cannot_load_the_drafter_does_not_fail_the_step(runtime, caplog):
    good, bad = FakeServer(), FakeServer(fails=True)
    runtime.servers = [good, bad]
    assert runtime.push_drafter() is False
    assert good.loaded == [3] and runtime.pushed_version is None  # pushed again next time
    assert runtime.pop_metrics()["tlt/drafter/sync_failures"] == 1.0
    assert "rollout replica 1 could not load drafter version 3" in caplog.text
    bad.fails = False
    assert runtime.push_drafter() is True and runtime.pushed_version == 3 and bad.loaded == [3]


def test_the_drafter_meta_file_is_written_only_after_a_successful_save(runtime, tmp_path, caplog):
    runtime.save(str(tmp_path / "global_step_1"), 1)
    meta = tmp_path / "global_step_1" / tlt_runtime.CHECKPOINT_DIR / tlt_runtime.META_FILE
    assert not meta.exists()  # the drafter checkpoint is still being written
    runtime.wait_for_save()
    assert json.loads(meta.read_text()) == {"version": 3, "total_steps": 10, "step": 1}
    assert runtime.pop_metrics() == {"tlt/drafter/checkpoint_wait_s": 2.5}
    runtime.pool.saved = False
    runtime.save(str(tmp_path / "global_step_2"), 2)
    runtime.wait_for_save()
    assert not (tmp_path / "global_step_2" / tlt_runtime.CHECKPOINT_DIR / tlt_runtime.META_FILE).exists()
    assert runtime.pop_metrics()["tlt/drafter/checkpoint_failures"] == 1.0
    assert (
        "not saved with verl's checkpoint of step 2" in caplog.text
        and "still busy with its earlier calls" in caplog.text
    )


def test_a_resume_says_which_steps_drafter_it_took(runtime, tmp_path, caplog):
    runtime.save(str(tmp_path / "global_step_4"), 4)
    runtime.wait_for_save()
    runtime.pool.load = lambda directory, version, total_steps: True
    with caplog.at_level("INFO", logger=tlt_runtime.logger.name):
        runtime._restore(tmp_path / "global_step_4")
    assert "resuming at step 4 with drafter version 3 (10 optimizer steps) restored from" in caplog.text


def test_min_idle_replicas_that_can_never_be_reached_fail_at_start(monkeypatch):
    monkeypatch.setattr(tlt_runtime, "ray", FakeRay)
    tlt = TLTConfig.from_dict({"enabled": True, "drafter": {"min_idle_replicas": 2}})
    runtime = TLTRuntime(config=None, tlt=tlt)
    replicas = [SimpleNamespace(servers=[FakeServer()]) for _ in range(2)]
    actor_wg = SimpleNamespace(tlt_install_capture=lambda: [True])
    with pytest.raises(ValueError, match=r"set tlt.drafter.min_idle_replicas <= 1"):
        runtime.setup(replicas, actor_wg, target_path="unused")


def test_after_a_resume_the_workers_get_the_policys_shared_weights_before_scoring(runtime):
    """Workers build their target from model.path; resumed, the first step's drafter scores need the policy's."""
    server = FakeServer()
    server.target_shared_weights = Remote(lambda: {"model.embed_tokens.weight": "policy"})
    runtime.servers = [server]
    sample = SimpleNamespace(num_tokens=5)
    runtime.actor_wg = SimpleNamespace(tlt_pop_captured=lambda: [([sample], {"seconds": 0.01})])
    runtime._worker_targets_stale = True  # what setup sets after restoring a checkpoint
    runtime.collect_capture()
    assert runtime.pool.calls == [("targets", {"model.embed_tokens.weight": "policy"}), ("deliver", 1)]
    runtime.collect_capture()  # once only: afterwards on_step_end keeps them current
    assert runtime.pool.calls[-1] == ("deliver", 1) and len(runtime.pool.calls) == 3


def test_record_dir_saves_each_steps_captures_with_the_weights_its_rollout_used(monkeypatch, tmp_path, caplog):
    import torch

    from verl_tlt.drafter.capture_record import load_steps
    from verl_tlt.drafter.data import DrafterSample

    monkeypatch.setattr(tlt_runtime, "ray", FakeRay)
    record_dir = tmp_path / "record"
    runtime = TLTRuntime(
        config=None, tlt=TLTConfig.from_dict({"enabled": True, "drafter": {"record_dir": str(record_dir)}})
    )
    runtime.pool = FakePool()
    server = FakeServer()
    policy = {"model.embed_tokens.weight": torch.full((4, 2), 2.0)}
    server.target_shared_weights = Remote(lambda: policy)
    runtime.servers = [server]
    captured = {1: [], 2: []}
    step_of = {"now": 1}
    runtime.actor_wg = SimpleNamespace(
        tlt_arm_capture=lambda step, budget, teacher_top_k=0, windows=None, feature_layers=(): None,
        tlt_pop_captured=lambda: [(captured[step_of["now"]], {"seconds": 0.01})],
    )
    for step, length in ((1, 5), (2, 7)):
        captured[step] = [DrafterSample(torch.arange(length), torch.randn(length, 2), torch.arange(length) >= 2, step)]
        step_of["now"] = step
        runtime.arm_capture(step)
        runtime.collect_capture()
        runtime._push_target_weights()  # as on_step_end does after the actor update: the next rollout's weights
    steps = load_steps(record_dir)
    assert [s.step for s in steps] == [1, 2]
    assert steps[0].shared_weights is None  # step 1's rollout ran the initial target
    assert torch.equal(steps[1].shared_weights["model.embed_tokens.weight"], policy["model.embed_tokens.weight"])
    assert torch.equal(steps[1].samples[0].hidden_states, captured[2][0].hidden_states)
    assert steps[1].samples[0].num_tokens == 7

    runtime.tlt = TLTConfig.from_dict({"enabled": True, "drafter": {"record_dir": str(tmp_path / "a_file")}})
    (tmp_path / "a_file").write_text("not a directory")
    runtime.collect_capture()  # a failed write is logged, the step goes on
    assert "cannot record step 2's captures" in caplog.text


def test_record_dir_without_training_is_refused():
    with pytest.raises(ValueError, match=r"tlt.drafter.train=false captures nothing"):
        TLTConfig.from_dict({"enabled": True, "drafter": {"record_dir": "/tmp/x", "train": False}})


def start_workers(monkeypatch, tmp_path, replica_devices: list[list[str]], drafter: dict) -> list[tuple[dict, dict]]:
    """_make_workers against fake Ray and servers reporting `replica_devices`; (actor options, kwargs) per worker."""
    started = []

    class FakeActorClass:
        def options(self, **options):
            self.options_given = options
            return self

        def remote(self, *args, **kwargs):
            started.append((self.options_given, kwargs))
            return SimpleNamespace(ping=Remote(lambda: True))

    class WorkerRay(FakeRay):
        @staticmethod
        def remote(cls):
            return FakeActorClass()

        @staticmethod
        def get_runtime_context():
            return SimpleNamespace(get_node_id=lambda: "a" * 56)  # a node id's length (hex of 28 bytes)

    monkeypatch.setattr(tlt_runtime, "ray", WorkerRay)
    tlt = TLTConfig.from_dict({"enabled": True, "drafter": drafter})
    config = SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(rollout=OmegaConf.create({"engine_kwargs": {"torch": {"num_threads": 2}}})),
        trainer=SimpleNamespace(default_local_dir=str(tmp_path)),
    )
    runtime = TLTRuntime(config=config, tlt=tlt)
    runtime.servers = [
        SimpleNamespace(
            __ray_call__=Remote(lambda fn: fn(None)),
            accelerator_ids=Remote(lambda d=d: d),
            cpu_cores=Remote(lambda rank=rank: [rank]),  # each CPU replica pinned to a core of its own
        )
        for rank, d in enumerate(replica_devices)
    ]
    assert len(runtime._make_workers("target")) == len(replica_devices)
    return started


def test_drafter_workers_start_beside_their_replicas_with_the_configured_niceness_and_threads(monkeypatch, tmp_path):
    started = start_workers(monkeypatch, tmp_path, [[], []], {"cpu_niceness": 3})
    assert [kwargs["cpu_niceness"] for _, kwargs in started] == [3, 3]
    assert [kwargs["num_threads"] for _, kwargs in started] == [2, 2]  # as many threads as the replica's engine
    assert [kwargs["cpu_cores"] for _, kwargs in started] == [[0], [1]]  # pinned to its replica's cores
    assert [kwargs["idle_class"] for _, kwargs in started] == [True, True]  # the cycles nobody else wants
    assert [kwargs["rank"] for _, kwargs in started] == [0, 1]
    assert all(options["num_cpus"] == 0 for options, _ in started)
    assert started[1][1]["checkpoint_dir"] == str(tmp_path / "tlt_spot" / "worker_1")
    # CPU replicas: today's host training, no environment of their own.
    assert [kwargs["device"] for _, kwargs in started] == ["cpu", "cpu"]
    assert all("runtime_env" not in options for options, _ in started)


def test_drafter_workers_of_gpu_replicas_train_on_their_replicas_first_gpu(monkeypatch, tmp_path):
    started = start_workers(monkeypatch, tmp_path, [["4", "5"], ["6", "7"]], {})
    assert [kwargs["device"] for _, kwargs in started] == ["cuda:0", "cuda:0"]
    assert [kwargs["cpu_cores"] for _, kwargs in started] == [None, None]  # a GPU's worker is not pinned
    assert [kwargs["idle_class"] for _, kwargs in started] == [False, False]  # nor idle-class: it feeds the GPU
    envs = [options["runtime_env"]["env_vars"] for options, _ in started]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["4", "6"]
    assert all(env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1" for env in envs)
    assert all(options["num_cpus"] == 0 and "num_gpus" not in options for options, _ in started)  # the group holds it
    assert [kwargs["device"] for _, kwargs in start_workers(monkeypatch, tmp_path, [["4"]], {"device": "cpu"})] == [
        "cpu"
    ]
    with pytest.raises(ValueError, match="tlt.drafter.device=cuda, but rollout replica 0 runs on no GPU"):
        start_workers(monkeypatch, tmp_path, [[]], {"device": "cuda"})


def test_a_drained_replica_frees_memory_for_the_burst_and_takes_it_back_before_sleep(runtime, caplog):
    calls = []
    servers = [FakeServer(), FakeServer()]
    for rank, server in enumerate(servers):
        server.free_for_training = Remote(lambda rank=rank: calls.append(("free", rank)) or rank == 1)
        server.restore_after_training = Remote(lambda rank=rank: calls.append(("restore", rank)))
    runtime.servers = servers
    runtime.coordinator = SimpleNamespace(watching=False)
    runtime._free_replica(0)  # nothing to free there (e.g. vLLM where verl manages the memory)
    runtime._free_replica(1)
    runtime.before_sleep()
    assert calls == [("free", 0), ("free", 1), ("restore", 1)]  # only what was freed is restored
    runtime.before_sleep()
    assert calls[-1] == ("restore", 1) and len(calls) == 3  # once

    def fails():
        raise RuntimeError("engine dead")

    servers[0].free_for_training = Remote(fails)
    runtime._free_replica(0)  # logged, never raised: the burst trains in what memory is left
    assert "could not free memory for the drafter" in caplog.text


def test_a_failed_refresh_of_the_workers_policy_head_is_logged_counted_and_retried(runtime, caplog):
    server = FakeServer()

    def export_fails():
        raise OSError("No space left on device: /dev/shm/verl-tlt")

    server.target_shared_weights = Remote(export_fails)
    runtime.servers = [server]
    runtime._push_target_weights()  # must not raise: the RL step goes on
    assert runtime._worker_targets_stale  # the next capture retries
    assert runtime.pop_metrics()["tlt/drafter/target_refresh_failures"] == 1.0
    assert "No space left on device" in caplog.text and "next step retries" in caplog.text
    server.target_shared_weights = Remote(lambda: {"model.embed_tokens.weight": "policy"})
    runtime._push_target_weights()
    assert not runtime._worker_targets_stale and runtime.pool.calls[-1][0] == "targets"
