"""Loader shim that `save_pretrained` copies next to the toy tokenizer (`auto_map` points here).

Why it exists: transformers 5 forces `AutoTokenizer.from_pretrained` on a directory whose config.json says
model_type "qwen2" to `Qwen2Tokenizer`, which rebuilds a byte-level BPE from the vocabulary and drops the
toy tokenizer's pre-tokenizer and decoder. An `auto_map` entry bypasses that override; with
trust_remote_code=False transformers then loads tokenizer.json as saved, and with trust_remote_code=True it
imports this file. The class defines no `__init__`, which makes transformers load tokenizer.json verbatim.
It must import nothing but transformers: it runs from a copy inside the model directory.
"""

from transformers import PreTrainedTokenizerFast


class ToyTokenizer(PreTrainedTokenizerFast):
    """The toy character-level tokenizer; all behaviour comes from tokenizer.json."""
