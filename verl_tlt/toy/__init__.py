"""The toy world: a synthetic long-tail reasoning task and a ~1M-parameter model, built offline in seconds.

Used for demos, tests and CPU benchmarks, where TLT needs a target whose rollouts have a long tail but which
trains on a laptop. Modules, lightest first (this package imports none of them, so `import verl_tlt.toy` is
free):

- `task`: the `csub` task (sampling, reference solutions, parsing, reward rule); pure Python.
- `reward`: verl's custom reward function (`compute_score`), loaded by file path; pure Python.
- `dataset`: verl's RL parquet format (pandas).
- `tokenizer`, `tokenization_toy`: the character-level tokenizer (transformers).
- `model`: the tiny Qwen2 model (torch, transformers).
- `build`: `build_toy_world(out_dir)` writes everything verl needs and returns the paths.
"""
