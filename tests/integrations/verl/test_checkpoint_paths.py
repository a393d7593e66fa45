"""TLT's checkpoint folders resolve as verl's: a relative trainer.default_local_dir is read from the working dir."""

from __future__ import annotations

from types import SimpleNamespace

from verl_tlt.integrations.verl.checkpoint_paths import checkpoint_root, resumed_folder, step_folder


def _config(local_dir: str, resume_mode: str = "auto", resume_from_path: str | None = None) -> SimpleNamespace:
    trainer = SimpleNamespace(default_local_dir=local_dir, resume_mode=resume_mode, resume_from_path=resume_from_path)
    return SimpleNamespace(trainer=trainer)


def test_a_relative_checkpoint_dir_is_read_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert checkpoint_root(_config("checkpoints/run")) == tmp_path / "checkpoints" / "run"
    assert step_folder(_config("checkpoints/run"), 7) == tmp_path / "checkpoints" / "run" / "global_step_7"


def test_an_absolute_checkpoint_dir_is_kept(tmp_path):
    assert step_folder(_config(str(tmp_path / "ckpt")), 3) == tmp_path / "ckpt" / "global_step_3"


def test_auto_resume_comes_from_the_steps_folder(tmp_path):
    assert resumed_folder(_config(str(tmp_path)), 4) == tmp_path / "global_step_4"


def test_resume_path_comes_from_the_given_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _config("elsewhere", resume_mode="resume_path", resume_from_path="old/global_step_9")
    assert resumed_folder(config, 9) == tmp_path / "old" / "global_step_9"
