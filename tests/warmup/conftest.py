"""Tiny target models shared with the engine tests."""

from tests.engine.conftest import tiny_qwen2, varied_qwen2  # noqa: F401
