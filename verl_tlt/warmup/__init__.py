"""Offline drafter warm-up: the target answers prompts on the rollout engine, and a drafter trains on its states."""
