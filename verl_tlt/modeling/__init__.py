"""Torch model code shared by the rollout engine and the drafter: the decoder, fast CPU linears, weight loading.

Below both `engine/` and `drafter/`; imports only torch, transformers' configs and `verl_tlt.spec`.
"""
