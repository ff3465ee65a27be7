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

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import FP_FUSION, check_triton_device
from rl_engine.ops._validate import check_same_device, check_tensor

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


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neg_sin: bool) -> torch.Tensor:
    t, h, d = x.shape
    y = torch.empty((t, h, d), dtype=torch.bfloat16, device=x.device)
    if t and h and d:
        half = d // 2
        _rope_kernel[(t, triton.cdiv(h, BLOCK_H))](
            x, cos, sin, y, h, half,
            x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), y.stride(0), y.stride(1),
            BLOCK_H=BLOCK_H, BLOCK_HALF=triton.next_power_of_2(half), NEG_SIN=neg_sin,
            enable_fp_fusion=FP_FUSION,
        )
    return y


class _RopeTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        dy = dy.to(torch.bfloat16)
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        return _launch(dy, cos, sin, True), None, None


def validate_rope_inputs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Shared input checks of the kernel backends (raise InputError before any launch)."""
    check_tensor("x", x, dtype=torch.bfloat16, ndim=3, contiguous_last=True)
    t, _, d = x.shape
    if d % 2:
        raise InputError(f"x: head dim D must be even for rotate-half RoPE, got shape {list(x.shape)}")
    check_tensor("cos", cos, dtype=torch.float32, shape=(t, d // 2), contiguous_last=True)
    check_tensor("sin", sin, dtype=torch.float32, shape=(t, d // 2), contiguous_last=True)
    check_same_device(x=x, cos=cos, sin=sin)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with Triton kernels. x: [T, H, D] bfloat16, cos/sin: [T, D/2] float32 -> [T, H, D] bfloat16.

    ``out = [x1*cos - x2*sin, x2*cos + x1*sin]`` (Hugging Face Qwen3 rotate-half), FP32 math,
    one rounding to BF16. Backward: dx [T, H, D] bfloat16 (cos/sin take no gradient).

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on D, D is odd, cos/sin are not float32
        [T, D/2] with unit stride on the last axis, or the tensors sit on different devices.
    BackendUnavailable
        The tensors are not on a CUDA device (and the Triton interpreter is off).
    """
    validate_rope_inputs(x, cos, sin)
    check_triton_device(x, cos, sin)
    return _RopeTriton.apply(x, cos, sin)
