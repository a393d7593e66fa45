"""Real reasoning tasks with verifiers: reasoning-gym problems as verl parquet, and a verl reward function.

`verl-tlt tasks write` writes train/val parquet with chat prompts; `verl_tlt/tasks/reward.py` is the file verl's
`reward.custom_reward_function.path` names; `verl-tlt tasks eval` measures a model's pass rate per task, how often
a GRPO group's rewards differ, and the response-length tail. Only `evaluate` imports torch.
"""
