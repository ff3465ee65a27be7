"""Rotary position embedding (rotate-half convention of Hugging Face Qwen3).

Public functions: :func:`rope` (selects a backend explicitly) and :func:`cos_sin` (the FP32
cos/sin tables for given positions, ``docs/pitfalls.md`` P3).
"""

from rl_engine.ops.rope.api import cos_sin, inv_freq, rope

__all__ = ["cos_sin", "inv_freq", "rope"]
