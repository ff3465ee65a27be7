"""QK-norm: RMSNorm over the head dim D of every (token, head) of q or k (Qwen3 q_norm / k_norm).

Public function: :func:`qk_norm` (selects a backend explicitly).
"""

from rl_engine.ops.qk_norm.api import qk_norm

__all__ = ["qk_norm"]
