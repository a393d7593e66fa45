"""Character-level tokenizer for the toy tasks, built offline with `tokenizers` and wrapped for transformers.

Why character level: `csub` is arithmetic on digits, and one token per digit or symbol keeps the vocabulary
tiny (32 ids), which keeps the toy model at ~1M parameters. Spaces are dropped when encoding, so "12 - 4" and
"12-4" are the same tokens; decoding re-inserts canonical spaces ("12 - 4 = 8 ; # 8") so a decoded response
reads like `task.solution_text` and parses with `task.parse_answer`.

Chat template (what verl's RLHFDataset and agent loop render): `<bos>` once, user/system contents as-is, each
assistant turn as `<sep> content <eos>`, and the generation prompt is `<sep>`. A single user message "n : d"
therefore becomes `<bos> n : d <sep>`, and the model answers with the solution and `<eos>`.

Three things exist only so that stock loaders handle a model_type "qwen2" directory correctly:
  - `<|im_end|>` and a one-token "\\n": verl 0.9.1's agent loop builds a `QwenContinuousTokenBuilder` for
    qwen2 models, whose constructor requires both. The toy tasks never use either.
  - the `ToyTokenizer` class and its `auto_map` (see tokenization_toy.py): without them transformers 5 loads
    any qwen2 directory with `Qwen2Tokenizer`, which silently replaces this pre-tokenizer and decoder.
"""

from __future__ import annotations

import re

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from verl_tlt.toy.tokenization_toy import ToyTokenizer

PAD, BOS, EOS, SEP, UNK = "<pad>", "<bos>", "<eos>", "<sep>", "<unk>"
QWEN_IM_END = "<|im_end|>"
DIGITS = list("0123456789")
SYMBOLS = list("+-=;#:,<")
NEWLINE = "\n"
NUM_RESERVED = 7  # spare special tokens for future toy tasks; rounds the vocabulary to 32
RESERVED = [f"<reserved_{i}>" for i in range(NUM_RESERVED)]

# Order fixes the ids: <pad> must be 0 (verl and HF pad with it), specials first, then characters.
SPECIAL_TOKENS = [PAD, BOS, EOS, SEP, UNK, QWEN_IM_END, *RESERVED]
VOCAB = [PAD, BOS, EOS, SEP, UNK, QWEN_IM_END, *DIGITS, *SYMBOLS, NEWLINE, *RESERVED]

# Spacing put back around symbols when decoding; digits are glued to their neighbours.
_DECODE_SPACING = {"+": " + ", "-": " - ", "=": " = ", "<": " < ", ";": " ; ", ":": " : ", ",": ", ", "#": "# "}

CHAT_TEMPLATE = (
    "{{- '<bos>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{- '<sep>' + message['content'] + '<eos>' -}}"
    "{%- elif message['role'] in ['user', 'system'] -%}{{- message['content'] -}}"
    "{%- else -%}{{- raise_exception('toy chat template supports roles system/user/assistant, got '"
    " + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<sep>' -}}{%- endif -%}"
)


def build_tokenizer(model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Build the toy tokenizer from scratch (no files, no network); ids are stable across calls."""
    vocab = {token: token_id for token_id, token in enumerate(VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # Drop whitespace except "\n" (verl needs "\n" to be one token, see the module docstring) ...
            pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
            # ... then every remaining character is its own token.
            pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
        ]
    )
    # Anchored patterns: only a token that is exactly the symbol is spaced, never the "<" inside "<bos>".
    spacing = [decoders.Replace(Regex(f"^{re.escape(symbol)}$"), spaced) for symbol, spaced in _DECODE_SPACING.items()]
    backend.decoder = decoders.Sequence([*spacing, decoders.Fuse(), decoders.Replace(Regex(r"^ +| +$"), "")])
    # Specials are matched before pre-tokenization, so "<bos>" is one token, not "<", "b", ...
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    # ToyTokenizer, not PreTrainedTokenizerFast: save_pretrained then writes the auto_map that keeps
    # AutoTokenizer from swapping in Qwen2Tokenizer (see tokenization_toy.py).
    ToyTokenizer.register_for_auto_class("AutoTokenizer")
    return ToyTokenizer(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        sep_token=SEP,
        unk_token=UNK,
        additional_special_tokens=[QWEN_IM_END, *RESERVED],
        # The default cleanup would glue " ," and similar; the decoder already spaces everything.
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
    )
