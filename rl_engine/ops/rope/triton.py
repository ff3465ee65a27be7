"""Triton RoPE (rotate-half), forward and backward.

One program per (token, block of ``BLOCK_H`` heads) loads the token's FP32 cos/sin half tables
once and rotates a [BLOCK_H, D/2] tile of each half of ``x`` in FP32, rounding the result to
BF16 once. Every element depends only on its own token's x, cos and sin, so batch invariance
holds by construction. The backward is the same rotation with ``-sin`` (the transpose of a
rotation); negating an FP32 value is exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, next_power_of_2

BLOCK_H = 8
"""Heads per program (a fixed constant; the head grid covers H)."""


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, n_heads, half,
                 stride_xt, stride_xh, stride_ct, stride_st, stride_yt, stride_yh,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, NEG_SIN: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    cmask = cols < half
    c = tl.load(cos_ptr + t * stride_ct + cols, mask=cmask, other=0.0)
    s = tl.load(sin_ptr + t * stride_st + cols, mask=cmask, other=0.0)
    if NEG_SIN:
        s = -s
    mask = (heads[:, None] < n_heads) & cmask[None, :]
    xo = x_ptr + t * stride_xt + heads[:, None].to(tl.int64) * stride_xh + cols[None, :]
    x1 = tl.load(xo, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xo + half, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * c[None, :] - x2 * s[None, :]
    y2 = x2 * c[None, :] + x1 * s[None, :]
    yo = y_ptr + t * stride_yt + heads[:, None].to(tl.int64) * stride_yh + cols[None, :]
    tl.store(yo, y1.to(tl.bfloat16), mask=mask)
    tl.store(yo + half, y2.to(tl.bfloat16), mask=mask)


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neg_sin: bool) -> torch.Tensor:
    """y [T, H, D] bf16 = x rotated by (cos, sin) [T, D/2] fp32; ``neg_sin`` rotates back (the
    backward of the rotation is the rotation by -sin)."""
    t, h, d = x.shape
    y = torch.empty((t, h, d), dtype=torch.bfloat16, device=x.device)
    if t and h and d:
        half = d // 2
        _rope_kernel[(t, cdiv(h, BLOCK_H))](
            x, cos, sin, y, h, half,
            x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), y.stride(0), y.stride(1),
            BLOCK_H=BLOCK_H, BLOCK_HALF=next_power_of_2(half), NEG_SIN=neg_sin,
            enable_fp_fusion=FP_FUSION,
        )
    return y
