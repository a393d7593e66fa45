"""What every TLT rollout server offers the TLT runtime: the written contract (`contract.RolloutControl`, checked at
start-up) and the per-rollout bookkeeping both servers share (`bookkeeping.RolloutBookkeeping`). No verl, Ray or
vLLM imports: both backends build on it."""
