"""Triton SiLU, forward and backward.

Each program handles a fixed block of ``BLOCK`` elements of one row; the math is FP32 and the
output is rounded to BF16 once. ``exp`` is CUDA's ``expf`` (libdevice) and division is IEEE
(``div_rn``), as the contract declares, so the CUDA backend gives the same bits
(``docs/declared-arithmetic.md``). There is no reduction, so every element's bits depend only on
that element: batch invariance holds by construction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, div_ieee, exp_ieee

BLOCK = 1024


@triton.jit
def _silu_fwd_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    y = div_ieee(x, 1.0 + exp_ieee(-x))
    tl.store(y_ptr + row * stride_y + cols, y.to(tl.bfloat16), mask=mask)


@triton.jit
def _silu_bwd_kernel(x_ptr, dy_ptr, dx_ptr, n_cols, stride_x, stride_dy, stride_dx, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    s = div_ieee(tl.full(x.shape, 1.0, tl.float32), 1.0 + exp_ieee(-x))
    dx = dy * s * (1.0 + x * (1.0 - s))
    tl.store(dx_ptr + row * stride_dx + cols, dx.to(tl.bfloat16), mask=mask)


def silu_fwd(x: torch.Tensor) -> torch.Tensor:
    """y [T, F] bf16 of validated x [T, F] bf16 (unit stride on F)."""
    t, f = x.shape
    y = torch.empty((t, f), dtype=torch.bfloat16, device=x.device)
    if t and f:
        _silu_fwd_kernel[(t, cdiv(f, BLOCK))](x, y, f, x.stride(0), y.stride(0), BLOCK=BLOCK, enable_fp_fusion=FP_FUSION)
    return y


def silu_bwd(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx [T, F] bf16 of x and dy [T, F] bf16 (unit stride on F)."""
    t, f = x.shape
    dx = torch.empty((t, f), dtype=torch.bfloat16, device=x.device)
    if t and f:
        _silu_bwd_kernel[(t, cdiv(f, BLOCK))](
            x, dy, dx, f, x.stride(0), dy.stride(0), dx.stride(0), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return dx
