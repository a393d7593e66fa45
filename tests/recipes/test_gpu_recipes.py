"""recipes/gpu/: every GPU recipe's exact command, composed and checked on a CPU; nothing here needs a GPU or Ray.

Each recipe prints its command, one argument per line, with VERL_TLT_RECIPE_PRINT=1. The GRPO recipes' overrides
are composed in-process with verl-tlt's primary config (what ``python -m verl_tlt.main_ppo ... --cfg job`` prints,
without a subprocess), then handed to the real entry point with verl's ``run_ppo`` stubbed: TLT's start-up checks
and verl's own ``validate_config`` run, Ray never starts. Hydra's struct mode fails composition on a key verl's
config does not have, so a recipe cannot rot silently when verl renames something. The drafter warm-up recipe runs
for real, tiny, on the toy world, and its export is the drafter every TLT recipe is composed with. The Slurm script
runs against fake ``scontrol``/``srun``/``ray``/Python commands, which record what it would start.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from verl_tlt.config import TLTConfig
from verl_tlt.integrations.verl.requirements import check_requirements

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "gpu"
ENTRY = ["-m", "verl_tlt.main_ppo"]
SCRIPT_TIMEOUT_S = 30
MODEL = "/models/Qwen2.5-7B"  # never read: composition and the checks only pass the path on
# The only keys the recipes add with `+` (verl declares no slot for them): a free-form dict entry the drafter
# workers read, and an environment variable for verl's file logger. Anything else must be a key verl has.
PLUS_KEYS = {
    "+actor_rollout_ref.rollout.engine_kwargs.torch.num_threads",
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH",
}
# Keys that differ between a TLT run and its baseline by design: the tlt block (and its rollout-side view), the
# drafter workers' threads, and the run's name and folders.
ARM_KEYS = (
    ("tlt",),
    ("actor_rollout_ref", "rollout", "custom"),
    ("actor_rollout_ref", "rollout", "engine_kwargs", "torch"),
    ("trainer", "experiment_name"),
    ("trainer", "default_local_dir"),
    ("ray_kwargs", "ray_init", "runtime_env", "env_vars"),
)


# What the scripts read from the environment: the caller's own settings must not leak into the tests.
RECIPE_ENV = (
    "MODEL DRAFTER DATA_DIR TRAIN_FILES VAL_FILES OUT_DIR PROJECT EXPERIMENT PYTHON NNODES GPUS_PER_NODE "
    "DRAFTER_THREADS NUM_PROMPTS STEPS MAX_TOKENS TEMPERATURES TRAIN_DEPTH SEED VERL_TLT VERL_TLT_RECIPE_PRINT "
    "RAY_ADDRESS RAY_PORT HEAD_IP RAY_JOIN_TIMEOUT_S VERL_TLT_ROOT SLURM_SUBMIT_DIR SLURM_GPUS_ON_NODE"
).split()


def script_env(env: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in RECIPE_ENV}, **env}


def recipe_argv(script: str, env: dict[str, str], *extra: str) -> list[str]:
    """The command `script` would run, as printed in its dry-run mode."""
    proc = subprocess.run(
        ["bash", str(RECIPES / script), *extra],
        env=script_env({**env, "VERL_TLT_RECIPE_PRINT": "1"}),
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def compose_recipe(argv: list[str]) -> DictConfig:
    assert argv[1:3] == ENTRY, argv[:3]
    with initialize_config_module(config_module="verl_tlt.hydra_conf", version_base=None):
        return compose(config_name="tlt_ppo_trainer", overrides=argv[3:])


def run_entry_point(cfg: DictConfig, monkeypatch) -> DictConfig:
    """verl-tlt's main on `cfg` up to the point where verl would start Ray; returns the config verl would run."""
    import verl.trainer.main_ppo as verl_main_ppo

    from verl_tlt import main_ppo

    calls = []
    monkeypatch.setattr(verl_main_ppo, "run_ppo", lambda config, task_runner_class: calls.append(config))
    main_ppo.main(cfg)  # Hydra's passthrough: the task function runs on this config
    [config] = calls
    return config


def ref_config(cfg: DictConfig):
    """The ref policy's dataclass as verl 0.9.1's ActorRolloutRefWorker builds it (engine_workers.py, "build
    reference model"): the ref node carries log-prob keys its dataclass does not take, renamed there first."""
    from verl.utils.config import omega_conf_to_dataclass

    ref = OmegaConf.to_container(cfg.actor_rollout_ref.ref, resolve=True)
    ref["ppo_mini_batch_size"] = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    ref["ppo_micro_batch_size"] = ref.pop("log_prob_micro_batch_size", None)
    ref["ppo_micro_batch_size_per_gpu"] = ref.pop("log_prob_micro_batch_size_per_gpu", None)
    ref["use_dynamic_bsz"] = ref.pop("log_prob_use_dynamic_bsz", False)
    ref["ppo_max_token_len_per_gpu"] = ref.pop("log_prob_max_token_len_per_gpu", None)
    return omega_conf_to_dataclass(OmegaConf.create(ref))


def without_arm_keys(cfg: DictConfig) -> dict:
    plain = OmegaConf.to_container(cfg)
    for path in ARM_KEYS:
        node = plain
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
    return plain


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# ---------------------------------------------------------------- the drafter warm-up recipe


@pytest.fixture(scope="module")
def toy_world(tmp_path_factory):
    from verl_tlt.toy.build import build_toy_world

    return build_toy_world(tmp_path_factory.mktemp("toy") / "world", seed=0, num_train=8, num_val=4)


@pytest.fixture(scope="module")
def warm_drafter(toy_world, tmp_path_factory) -> Path:
    """The warm-up recipe run for real on the toy target, tiny: the drafter directory it exports."""
    verl_tlt = Path(sys.executable).with_name("verl-tlt")
    assert verl_tlt.exists(), f"{verl_tlt} is missing: install verl-tlt into this environment (pip install -e .)"
    out = tmp_path_factory.mktemp("drafters") / "toy-warmup"
    env = {
        "MODEL": str(toy_world.model_dir),
        "TRAIN_FILES": str(toy_world.train_parquet),
        "DRAFTER": str(out),
        "VERL_TLT": str(verl_tlt),
        "NUM_PROMPTS": "4",
        "STEPS": "2",
        "MAX_TOKENS": "8",
        "TEMPERATURES": "0 0.9",
        "DEVICE": "cpu",  # the recipe's default is the GPU
    }
    proc = subprocess.run(
        ["bash", str(RECIPES / "drafter_warmup.sh")],
        env=script_env(env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_drafter_warmup_recipe_passes_only_options_the_command_has():
    from verl_tlt.warmup.cli import register

    env = {"MODEL": "/m", "TRAIN_FILES": "/d/train.parquet", "DRAFTER": "/out/drafter", "TEMPERATURES": "0 0.9"}
    argv = recipe_argv("drafter_warmup.sh", env, "--seconds", "60")
    assert argv[:3] == ["verl-tlt", "drafter", "warmup"]
    parser = argparse.ArgumentParser(prog="verl-tlt")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv[1:])  # argparse exits on an option the command does not have
    assert (args.target, args.prompts, args.out) == ("/m", "/d/train.parquet", "/out/drafter")
    assert args.temperature == [0.0, 0.9] and args.max_seconds == 60.0
    assert args.json == "/out/drafter.report.json"
    assert args.device == "cuda"  # the recipe warms up on the GPU


def test_drafter_warmup_recipe_exports_a_drafter_that_loads_against_its_target(toy_world, warm_drafter):
    from verl_tlt.drafter.load import load_eagle
    from verl_tlt.modeling.weights import load_pretrained

    target, _ = load_pretrained(str(toy_world.model_dir))
    load_eagle(str(warm_drafter), target)
    assert Path(f"{warm_drafter}.report.json").is_file()


# ---------------------------------------------------------------- the GRPO recipes: composition and start-up checks


# script, TLT on, nodes, prompts per step, prompts per mini-batch, max prompt length, rollout TP, Ulysses SP
GRPO_RECIPES = [
    ("grpo_qwen2.5_7b_tlt.sh", True, 1, 64, 4, 1024, 4, 4),
    ("grpo_qwen2.5_7b_baseline.sh", False, 1, 64, 4, 1024, 4, 4),
    ("grpo_qwen2.5_32b_tlt.sh", True, 4, 128, 8, 2048, 8, 8),
    ("grpo_qwen2.5_32b_baseline.sh", False, 4, 128, 8, 2048, 8, 8),
]


@pytest.mark.parametrize(
    ("script", "tlt_on", "nnodes", "prompts", "mini_batch", "max_prompt", "tp", "sp"),
    GRPO_RECIPES,
    ids=[recipe[0] for recipe in GRPO_RECIPES],
)
def test_grpo_recipe_composes_and_passes_verl_and_tlt_start_up_checks(
    script, tlt_on, nnodes, prompts, mini_batch, max_prompt, tp, sp, warm_drafter, monkeypatch, capsys
):
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import RolloutConfig

    argv = recipe_argv(script, {"MODEL": MODEL, "DRAFTER": str(warm_drafter)})
    assert {arg.split("=")[0] for arg in argv if arg.startswith("+")} <= PLUS_KEYS
    cfg = compose_recipe(argv)

    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.data.train_batch_size == prompts and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == mini_batch
    assert cfg.data.max_prompt_length == max_prompt and cfg.data.max_response_length == 32768
    assert cfg.actor_rollout_ref.model.path == MODEL
    assert cfg.trainer.nnodes == nnodes and cfg.trainer.n_gpus_per_node == 8
    assert cfg.trainer.logger == ["console", "file"]

    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert isinstance(rollout, RolloutConfig)
    assert rollout.name == "vllm" and rollout.n == 8 and rollout.temperature == 0.9
    assert rollout.tensor_model_parallel_size == tp and rollout.data_parallel_size == 1
    assert rollout.prompt_length == max_prompt and rollout.response_length == 32768
    replicas = nnodes * 8 // tp
    assert replicas >= 2, "spot training needs a replica that drains while another decodes"

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    ref = ref_config(cfg)
    assert actor.engine.strategy == ref.engine.strategy == "fsdp2"
    assert actor.engine.ulysses_sequence_parallel_size == ref.engine.ulysses_sequence_parallel_size == sp
    assert actor.use_dynamic_bsz and ref.use_dynamic_bsz
    assert actor.ppo_max_token_len_per_gpu == ref.ppo_max_token_len_per_gpu == max_prompt + 32768
    assert actor.use_kl_loss and actor.kl_loss_type == "low_var_kl"

    tlt = TLTConfig.from_dict(cfg.tlt)
    assert tlt.enabled is tlt_on
    if tlt_on:
        assert tlt.drafter.init == str(warm_drafter) and tlt.speculative.threshold == 32
        assert rollout.engine_kwargs["torch"] == {"num_threads": 16}

    capsys.readouterr()
    config = run_entry_point(cfg, monkeypatch)
    assert "[validate_config] All configuration checks passed successfully!" in capsys.readouterr().out
    assert config.trainer.v1.trainer_mode == ("tlt_sync" if tlt_on else "sync")
    assert check_requirements(config) == tlt


@pytest.mark.parametrize("size", ["7b", "32b"])
def test_tlt_and_baseline_recipes_differ_only_in_their_tlt_keys(size, warm_drafter):
    env = {"MODEL": MODEL, "DRAFTER": str(warm_drafter)}
    with_tlt = compose_recipe(recipe_argv(f"grpo_qwen2.5_{size}_tlt.sh", env))
    baseline = compose_recipe(recipe_argv(f"grpo_qwen2.5_{size}_baseline.sh", env))
    assert without_arm_keys(with_tlt) == without_arm_keys(baseline)
    # ... and never write into each other's folders.
    assert with_tlt.trainer.default_local_dir != baseline.trainer.default_local_dir


def test_extra_overrides_come_last_and_win(warm_drafter):
    argv = recipe_argv(
        "grpo_qwen2.5_7b_tlt.sh",
        {"MODEL": MODEL, "DRAFTER": str(warm_drafter)},
        "data.train_batch_size=32",
        "trainer.total_training_steps=5",
        "tlt.drafter.train=false",
    )
    cfg = compose_recipe(argv)
    assert cfg.data.train_batch_size == 32 and cfg.trainer.total_training_steps == 5
    assert TLTConfig.from_dict(cfg.tlt).drafter.train is False


def test_32b_batch_follows_the_number_of_nodes(warm_drafter):
    cfg = compose_recipe(recipe_argv("grpo_qwen2.5_32b_tlt.sh", {"DRAFTER": str(warm_drafter), "NNODES": "8"}))
    assert cfg.trainer.nnodes == 8 and cfg.data.train_batch_size == 32 * 8


def test_a_key_verl_does_not_have_fails_composition():
    argv = recipe_argv("grpo_qwen2.5_7b_baseline.sh", {}, "actor_rollout_ref.rollout.speculative_k=4")
    with pytest.raises(ConfigCompositionException, match="speculative_k"):
        compose_recipe(argv)


def test_tlt_recipe_without_a_drafter_stops_before_ray(tmp_path, monkeypatch):
    argv = recipe_argv("grpo_qwen2.5_7b_tlt.sh", {"DRAFTER": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="tlt.drafter.init=.*missing.*verl-tlt drafter warmup"):
        run_entry_point(compose_recipe(argv), monkeypatch)


# ---------------------------------------------------------------- running for real (with stand-in commands)


@pytest.fixture
def fake_tools(tmp_path) -> dict[str, str]:
    """Stand-ins on PATH: `python` records its arguments (or counts 4 Ray nodes for `-c`), `ray` answers,
    `srun` runs its command here, `scontrol` names four nodes, `hostname` prints an IPv6 and an IPv4 address."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    write_executable(
        bin_dir / "python",
        '#!/usr/bin/env bash\nif [ "$1" = -c ]; then echo 4; exit 0; fi\nprintf "%s\\n" "$@" > "$FAKE_ARGV"\n',
    )
    write_executable(bin_dir / "ray", f'#!/usr/bin/env bash\necho "ray $*" >> {log}\nexit "${{FAKE_RAY_RC:-0}}"\n')
    write_executable(
        bin_dir / "srun",
        f'#!/usr/bin/env bash\necho "srun $*" >> {log}\n'
        'while [ "${1#-}" != "$1" ]; do if [ "$1" = -w ]; then shift; fi; shift; done\nexec "$@"\n',
    )
    write_executable(bin_dir / "scontrol", '#!/usr/bin/env bash\nprintf "node%s\\n" 1 2 3 4\n')
    write_executable(bin_dir / "hostname", '#!/usr/bin/env bash\necho "fe80::1 10.0.0.7"\n')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": str(bin_dir / "python"),
        "FAKE_ARGV": str(tmp_path / "argv.txt"),
        "MODEL": str(model),
        "OUT_DIR": str(tmp_path / "out"),
        "LOG": str(log),
    }


def run_script(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=script_env(env), capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)


@pytest.mark.parametrize(
    ("script", "run_name"),
    [("grpo_qwen2.5_7b_tlt.sh", "qwen2.5-7b-grpo-tlt"), ("grpo_qwen2.5_32b_baseline.sh", "qwen2.5-32b-grpo-baseline")],
)
def test_grpo_recipe_runs_exactly_the_command_it_prints(script, run_name, fake_tools):
    proc = run_script(["bash", str(RECIPES / script), "trainer.total_training_steps=2"], fake_tools)
    assert proc.returncode == 0, proc.stderr
    ran = Path(fake_tools["FAKE_ARGV"]).read_text().splitlines()
    assert ran == recipe_argv(script, fake_tools, "trainer.total_training_steps=2")[1:]
    run_dir = Path(fake_tools["OUT_DIR"]) / run_name
    assert run_dir.is_dir() and f"trainer.default_local_dir={run_dir}/checkpoints" in ran


def test_grpo_recipe_refuses_a_hub_id_as_model(fake_tools):
    proc = run_script(
        ["bash", str(RECIPES / "grpo_qwen2.5_7b_baseline.sh")], {**fake_tools, "MODEL": "Qwen/Qwen2.5-7B"}
    )
    assert proc.returncode == 1 and "not a local checkpoint directory" in proc.stderr
    assert "huggingface-cli download Qwen/Qwen2.5-7B" in proc.stderr
    assert not Path(fake_tools["FAKE_ARGV"]).exists()


def test_32b_recipe_refuses_to_start_without_a_ray_cluster(fake_tools):
    proc = run_script(["bash", str(RECIPES / "grpo_qwen2.5_32b_tlt.sh")], {**fake_tools, "FAKE_RAY_RC": "1"})
    assert proc.returncode == 1 and "No running Ray cluster found" in proc.stderr
    assert not Path(fake_tools["FAKE_ARGV"]).exists()


def test_slurm_script_starts_ray_on_every_node_then_the_recipe_on_the_head(fake_tools, tmp_path):
    env = {**fake_tools, "SLURM_JOB_NODELIST": "node[1-4]", "VERL_TLT_ROOT": str(RECIPES.parents[1])}
    proc = run_script(["bash", str(RECIPES / "slurm_32b.sbatch"), "tlt", "trainer.total_training_steps=2"], env)
    assert proc.returncode == 0, proc.stderr
    calls = Path(fake_tools["LOG"]).read_text().splitlines()
    # The Ray steps run in the background: their lines come in any order.
    starts = sorted(call for call in calls if call.startswith("ray start"))
    assert starts == [
        "ray start --address=10.0.0.7:6379 --num-gpus=8 --num-cpus=64 --block",
        "ray start --address=10.0.0.7:6379 --num-gpus=8 --num-cpus=64 --block",
        "ray start --address=10.0.0.7:6379 --num-gpus=8 --num-cpus=64 --block",
        "ray start --head --node-ip-address=10.0.0.7 --port=6379 --num-gpus=8 --num-cpus=64 --block",
    ]
    ray_steps = sorted(call for call in calls if call.startswith("srun") and "ray start" in call)
    assert [call.split(" -w ")[1].split()[0] for call in ray_steps] == ["node1", "node2", "node3", "node4"]
    assert "--head" in ray_steps[0] and all("--gpus-per-node=8 --cpus-per-task=64" in call for call in ray_steps)
    header = (RECIPES / "slurm_32b.sbatch").read_text()
    assert "#SBATCH --cpus-per-task=64" in header and "#SBATCH --mem=0" in header
    assert [call for call in calls if "-w node" in call and "bash" in call] == [
        f"srun --nodes=1 --ntasks=1 --overlap -w node1 env RAY_ADDRESS=10.0.0.7:6379 NNODES=4 GPUS_PER_NODE=8 "
        f"PYTHON={fake_tools['PYTHON']} bash {RECIPES / 'grpo_qwen2.5_32b_tlt.sh'} trainer.total_training_steps=2"
    ]
    ran = Path(fake_tools["FAKE_ARGV"]).read_text().splitlines()
    assert "trainer.nnodes=4" in ran and "tlt.enabled=true" in ran and ran[-1] == "trainer.total_training_steps=2"


def test_slurm_script_names_the_arms(fake_tools):
    proc = run_script(["bash", str(RECIPES / "slurm_32b.sbatch"), "fast"], fake_tools)
    assert proc.returncode == 2 and "tlt|baseline" in proc.stderr
