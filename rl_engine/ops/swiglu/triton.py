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

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import FP_FUSION, check_triton_device, div_ieee, exp_ieee
from rl_engine.ops._validate import check_same_device, check_tensor

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


def _launch_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    t, f = gate.shape
    y = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    if t and f:
        _swiglu_fwd_kernel[(t, triton.cdiv(f, BLOCK))](
            gate, up, y, f, gate.stride(0), up.stride(0), y.stride(0), BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return y


def _launch_bwd(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t, f = gate.shape
    dg = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    du = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    if t and f:
        _swiglu_bwd_kernel[(t, triton.cdiv(f, BLOCK))](
            gate, up, dy, dg, du, f, gate.stride(0), up.stride(0), dy.stride(0), dg.stride(0), du.stride(0),
            BLOCK=BLOCK,
            enable_fp_fusion=FP_FUSION,
        )
    return dg, du


class _SwigluTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _launch_fwd(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dy = dy.to(torch.bfloat16)
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        return _launch_bwd(gate, up, dy)


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU with Triton kernels. gate, up: [T, F] bfloat16 (unit stride on F) -> [T, F] bfloat16.

    ``silu(gate) * up`` in FP32, one rounding to BF16. Backward: dgate, dup [T, F] bfloat16.

    Raises
    ------
    InputError
        gate or up is not a 2-D bfloat16 tensor with unit stride on F, their shapes differ, or
        they sit on different devices.
    BackendUnavailable
        The tensors are not on a CUDA device (and the Triton interpreter is off).
    """
    check_tensor("gate", gate, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_tensor("up", up, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if gate.shape != up.shape:
        raise InputError(f"gate and up must have the same shape [T, F], got {list(gate.shape)} and {list(up.shape)}")
    check_same_device(gate=gate, up=up)
    check_triton_device(gate, up)
    return _SwigluTriton.apply(gate, up)
