"""The CPU quickstart: verl GRPO on the toy world without TLT, with TLT and with a frozen drafter, compared."""
