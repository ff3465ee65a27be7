"""CUDA C++ RoPE, rotate-half (``cuda_bf16`` backend), forward and backward.

Kernel ``rl_rope`` in ``rl_engine/backends/cuda_src/elementwise.cu``: one block per (token, 4
heads); ``out = [x1*cos - x2*sin, x2*cos + x1*sin]`` with each product and the sum rounded in FP32
(no fused multiply-add), one rounding to BF16 (Hugging Face Qwen3 ``apply_rotary_pos_emb``; FP32
cos/sin from :func:`rl_engine.ops.rope.cos_sin`, ``docs/pitfalls.md`` P3). The backward is the same rotation
with ``-sin`` (the transpose of a rotation; negation is exact). Batch invariant by construction.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neg_sin: bool) -> torch.Tensor:
    """y [T, H, D] bf16 = x rotated by (cos, sin) [T, D/2] fp32; ``neg_sin`` rotates back (the
    backward of the rotation is the rotation by -sin)."""
    t, h, d = x.shape
    y = torch.empty((t, h, d), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_rope", x, cos, sin, y, t, h, d, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
           y.stride(0), y.stride(1), 1 if neg_sin else 0)
    return y
