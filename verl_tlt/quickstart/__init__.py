"""The CPU quickstart: verl GRPO on the toy world without TLT, with TLT, with a frozen drafter and without TLT again
(the control), compared: speed, acceptance, and whether every run sampled the baseline's responses.

recipe (what runs), runner (running it: stages, verl jobs, summary), job_progress (lines while a job runs),
verl_job (one verl job in a subprocess), summary / identity (pure: per-step rows, headline, identity claim),
report (the printed text), plot (the figure), cli (`verl-tlt quickstart`)."""
