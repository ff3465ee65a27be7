"""CUDA C++ RMSNorm (``cuda_bf16`` backend), forward and backward; shared with ``qk_norm``.

Kernels in ``rl_engine/backends/cuda_src/norm.cu``. Rows are ``x[t]`` of a [T, E] input (H = 1) or
``x[t, h]`` of a [T, H, D] input, numbered ``t * H + h`` and addressed through the strides (no
copy for strided views).

Forward (``rl_rms_norm_fwd``): one block of 128 threads per row; ``sum(x^2)`` in FP32 with a fixed
order that depends only on the row length (thread ``i`` adds columns ``i, i + 128, ...`` in order,
a fixed warp butterfly, then ``(w0 + w1) + (w2 + w3)``); ``r = 1 / sqrt(sum / n + eps)`` (IEEE
square root and division); then the contract's rounding order
(``declared_exceptions.rms_norm_rounding_order``): ``"hf"`` ``bf16(w * bf16(x * r))`` (Hugging
Face Qwen3RMSNorm, the declared order) or ``"fused"`` ``bf16((x * r) * w)``. ``r`` is kept (FP32).

Backward (FP32, from ``y = w * x * r``; rounding treated as identity): ``g = dy * w``,
``dx = r * (g - x * ((sum(g * x) / n) * (r * r)))`` per row with the same fixed reduction, rounded
once (``rl_rms_norm_bwd_dx``); ``dweight = sum over rows of dy * (x * r)`` in two stages without
atomics (``rl_rms_norm_bwd_dw``): FP32 partials over fixed chunks of 64 rows in row order, then
the partials in chunk order, rounded once.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch, query, unit_last
from rl_engine.ops._validate import check_same_device, check_tensor
from rl_engine.ops.rms_norm.triton import check_eps_order


def _rows_view(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(T, H, n, stride_t, stride_h) of a [T, n] (H = 1) or [T, H, n] tensor."""
    if x.dim() == 2:
        return x.shape[0], 1, x.shape[1], x.stride(0), 0
    return x.shape[0], x.shape[1], x.shape[2], x.stride(0), x.stride(1)


def _fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, hf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    t, h, n, sxt, sxh = _rows_view(x)
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    rows = t * h
    rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
    _, _, _, syt, syh = _rows_view(y)
    launch(x.device, "rl_rms_norm_fwd", x, weight, y, rstd, rows, max(h, 1), n, sxt, sxh, syt, syh, float(eps),
           1 if hf else 0)
    return y, rstd


def _bwd(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor, need_dx: bool,
         need_dw: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    t, h, n, sxt, sxh = _rows_view(x)
    _, _, _, sdyt, sdyh = _rows_view(dy)
    rows = t * h
    dx = dw = None
    if need_dx:
        dx = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
        _, _, _, sdxt, sdxh = _rows_view(dx)
        launch(x.device, "rl_rms_norm_bwd_dx", x, weight, dy, rstd, dx, rows, max(h, 1), n, sxt, sxh, sdyt, sdyh,
               sdxt, sdxh)
    if need_dw:
        dw = torch.empty((n,), dtype=torch.bfloat16, device=x.device)
        chunks = query("rl_rms_norm_dw_chunks", rows)
        partial = torch.empty((max(chunks, 1), n), dtype=torch.float32, device=x.device)
        launch(x.device, "rl_rms_norm_bwd_dw", x, dy, rstd, partial, dw, rows, max(h, 1), n, sxt, sxh, sdyt, sdyh)
    return dx, dw


class _RmsNormCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, hf):
        y, rstd = _fwd(x, weight, eps, hf)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _bwd(x, weight, unit_last(dy.to(torch.bfloat16)), rstd, ctx.needs_input_grad[0],
                      ctx.needs_input_grad[1])
        return dx, dw, None, None


def rms_norm_rows_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str) -> torch.Tensor:
    """Launch on validated inputs ([T, E] or [T, H, D] with weight [last axis])."""
    check_cuda_device(x, weight)
    return _RmsNormCuda.apply(x, weight, float(eps), order == "hf")


def rms_norm_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """RMSNorm with CUDA C++ kernels. x: [T, E] bfloat16, weight: [E] bfloat16 -> [T, E] bfloat16.

    FP32 statistics (one fixed-order sum per row), then ``order="hf"``: ``bf16(weight * bf16(x *
    rstd))`` (Hugging Face Qwen3RMSNorm) or ``order="fused"``: ``bf16(x * rstd * weight)``.
    ``eps`` has no default (pitfall P12). Backward: dx [T, E] and dweight [E] bfloat16, FP32 math,
    dweight reduced over T in fixed chunks without atomics.

    Raises
    ------
    InputError
        x is not a 2-D bfloat16 tensor with unit stride on E; weight is not bfloat16 [E] with unit
        stride; devices differ; eps is not a finite number >= 0; order is not "hf" or "fused".
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_tensor("weight", weight, dtype=torch.bfloat16, shape=(x.shape[1],), contiguous_last=True)
    check_same_device(x=x, weight=weight)
    check_eps_order(eps, order)
    return rms_norm_rows_cuda(x, weight, eps, order)
