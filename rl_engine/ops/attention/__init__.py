"""Attention: causal varlen GQA attention (prefill, chunked prefill, teacher forcing) and a
KV-cache decode entry, bitwise path-independent on the Triton backend.

Public functions: :func:`attention`, :func:`attention_decode` (each selects a backend explicitly).
"""

from rl_engine.ops.attention.api import attention, attention_decode

__all__ = ["attention", "attention_decode"]
