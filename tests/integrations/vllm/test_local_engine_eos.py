"""The local vLLM engine stops answers where the torch engine does: at the model folder's end-of-sequence ids."""

from __future__ import annotations

import json

from verl_tlt.integrations.vllm.local_engine import model_eos_token_ids


def test_eos_ids_come_from_the_config_and_the_generation_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert model_eos_token_ids(str(tmp_path)) == [2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert model_eos_token_ids(str(tmp_path)) == [2, 7]


def test_a_folder_that_names_no_eos_stops_nowhere(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert model_eos_token_ids(str(tmp_path)) == []
    assert model_eos_token_ids(str(tmp_path / "missing")) == []
