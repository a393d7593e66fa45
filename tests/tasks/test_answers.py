from verl_tlt.tasks.answers import SYSTEM_PROMPT, chat_prompt, extract_answer


def test_the_chat_prompt_is_the_system_instruction_then_the_question():
    assert chat_prompt("7 + 15 =") == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "7 + 15 ="},
    ]


def test_the_last_tagged_answer_wins():
    response = "First I thought <answer>12</answer>, but 7 + 15 is 22. <answer> 22 </answer>"
    assert extract_answer(response, numeric=True) == "22"
    assert extract_answer(response, numeric=False) == "22"


def test_a_numeric_task_without_tags_is_read_by_its_last_number():
    assert extract_answer("7 + 15 = 22, so the total is -3.5 apples", numeric=True) == "-3.5"


def test_nothing_to_score_is_none():
    assert extract_answer("I do not know.", numeric=True) is None
    assert extract_answer("The total is 22", numeric=False) is None
