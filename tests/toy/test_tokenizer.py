"""The character-level toy tokenizer: ids, round trips and the chat template verl renders."""

from __future__ import annotations

import pytest

from verl_tlt.toy.task import Problem, make_problems, parse_answer, response_num_tokens, solution_text
from verl_tlt.toy.tokenizer import DIGITS, SYMBOLS, build_tokenizer


def _ids(tokenizer, tokens: list[str]) -> list[int]:
    return tokenizer.convert_tokens_to_ids(tokens)


def _input_ids(encoded) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); older versions a list.
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_vocab_is_small_and_pad_id_is_zero(tokenizer):
    assert len(tokenizer) == 32 < 128
    assert tokenizer.pad_token_id == 0
    special_ids = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.sep_token_id]
    assert len(set(special_ids)) == 4


def test_every_digit_and_symbol_is_its_own_token_and_spaces_are_dropped(tokenizer):
    for char in DIGITS + SYMBOLS:
        assert tokenizer.encode(char, add_special_tokens=False) == _ids(tokenizer, [char])
    assert tokenizer.encode("12 - 4", add_special_tokens=False) == _ids(tokenizer, ["1", "2", "-", "4"])
    spaced = tokenizer.encode(" 1 2 -\t4 ", add_special_tokens=False)
    assert tokenizer.encode("12-4", add_special_tokens=False) == spaced


def test_encode_then_decode_returns_the_solution_text_exactly(tokenizer):
    for problem in make_problems(200, seed=1):
        text = solution_text(problem)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_response_num_tokens_counts_the_real_tokens_plus_eos(tokenizer):
    for problem in make_problems(100, seed=2):
        num_tokens = len(tokenizer.encode(solution_text(problem), add_special_tokens=False))
        assert response_num_tokens(problem) == num_tokens + 1


def test_decoded_response_with_eos_and_padding_parses_to_the_answer(tokenizer):
    problem = Problem.from_nd(9 * 12 + 2, 9)
    response_ids = tokenizer.encode(solution_text(problem), add_special_tokens=False)
    response_ids += [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * 3
    assert parse_answer(tokenizer.decode(response_ids, skip_special_tokens=True)) == problem.answer


def test_chat_template_renders_bos_prompt_sep(tokenizer):
    messages = [{"role": "user", "content": "11 : 4"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<bos>11 : 4<sep>"


def test_chat_prompt_tokenizes_to_the_expected_ids(tokenizer):
    messages = [{"role": "user", "content": "11 : 4"}]
    expected = _ids(tokenizer, ["<bos>", "1", "1", ":", "4", "<sep>"])
    # verl's RLHFDataset path: render to text, then tokenize without adding specials.
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == expected
    # verl's agent-loop path: tokenize inside apply_chat_template.
    assert _input_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)) == expected
    # Adding specials must not prepend a second <bos>.
    assert tokenizer(text)["input_ids"] == expected


def test_multi_turn_rendering_extends_the_generation_prompt_by_the_answer(tokenizer):
    user = {"role": "user", "content": "11 : 4"}
    answer = {"role": "assistant", "content": "3 - 4 < 0 ; # 3"}
    prompt = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([user, answer], tokenize=False)
    assert full == prompt + answer["content"] + "<eos>"
    assert full.startswith(tokenizer.apply_chat_template([user], tokenize=False))


def test_chat_template_rejects_unknown_roles(tokenizer):
    with pytest.raises(Exception, match="roles system/user/assistant"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_unknown_characters_become_unk_instead_of_failing(tokenizer):
    assert tokenizer.encode("1x", add_special_tokens=False) == [_ids(tokenizer, ["1"])[0], tokenizer.unk_token_id]


def test_decoding_never_fails_on_arbitrary_ids_including_only_specials():
    # A model's output can be anything, e.g. a lone <sep>; tokenizers' Strip decoder panicked on the
    # resulting empty string inside verl's reward worker.
    import random

    tokenizer = build_tokenizer()
    rng = random.Random(0)
    assert tokenizer.decode([tokenizer.convert_tokens_to_ids("<sep>")], skip_special_tokens=True) == ""
    specials = set(tokenizer.all_special_ids)
    for _ in range(2000):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 30))]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        # ... and what it decodes to reads back as the same non-special tokens.
        assert tokenizer.encode(text, add_special_tokens=False) == [i for i in ids if i not in specials], ids
