"""A discrete-event model of synchronous RL rollouts: what TLT buys on a cluster we cannot run, and why.

Pure Python (no verl, no torch). The rollout model (`rollout`) decodes every replica's requests step by step with a
cost model per step (`costs`) and an acceptance model for speculative steps (`acceptance`); the policy deciding each
step is any object with the adaptive policy's `select`/`observe`, the project's real `AdaptivePolicy` included.
"""
