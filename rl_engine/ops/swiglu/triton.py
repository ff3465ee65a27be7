"""Triton SwiGLU, forward and backward.

Each program handles a fixed block of ``BLOCK`` columns of one row; ``silu(gate) * up`` is
computed in FP32 and rounded to BF16 once (Hugging Face rounds silu(gate) to BF16 first). No
reduction: every element depends only on its own gate and up, so batch invariance holds by
construction.

Backward, with ``s = 1 / (1 + exp(-g))``: ``dgate = dy * up * s * (1 + g * (1 - s))`` and
``dup = dy * g * s``, FP32, each rounded once. ``exp`` is CUDA's ``expf`` (libdevice) and division
is IEEE (``div_rn``), as the contract declares, so the CUDA backend gives the same bits
(``docs/declared-arithmetic.md``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_engine.ops._triton_common import FP_FUSION, cdiv, div_ieee, exp_ieee

BLOCK = 1024


@triton.jit
def _swiglu_fwd_kernel(g_ptr, u_ptr, y_ptr, n_cols, stride_g, stride_u, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    y = div_ieee(g, 1.0 + exp_ieee(-g)) * u
    tl.store(y_ptr + row * stride_y + cols, y.to(tl.bfloat16), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, n_cols, stride_g, stride_u, stride_dy,
                       stride_dg, stride_du, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    s = div_ieee(tl.full(g.shape, 1.0, tl.float32), 1.0 + exp_ieee(-g))
    dg = dy * u * s * (1.0 + g * (1.0 - s))
    du = dy * g * s
    tl.store(dg_ptr + row * stride_dg + cols, dg.to(tl.bfloat16), mask=mask)
    tl.store(du_ptr + row * stride_du + cols, du.to(tl.bfloat16), mask=mask)


def swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """y [T, F] bf16 of validated gate, up [T, F] bf16 (unit stride on F)."""
    t, f = gate.shape
    y = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    if t and f:
        _swiglu_fwd_kernel[(t, cdiv(f, BLOCK))](
            gate, up, y, f, gate.stride(0), up.stride(0), y.stride(0), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return y


def swiglu_bwd(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) [T, F] bf16 of gate, up, dy [T, F] bf16 (unit stride on F)."""
    t, f = gate.shape
    dg = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    du = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    if t and f:
        _swiglu_bwd_kernel[(t, cdiv(f, BLOCK))](
            gate, up, dy, dg, du, f, gate.stride(0), up.stride(0), dy.stride(0), dg.stride(0), du.stride(0),
            BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return dg, du
