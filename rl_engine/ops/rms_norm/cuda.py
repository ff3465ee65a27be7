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

from rl_engine.backends.cuda_launch import launch, query


def _rows_view(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(T, H, n, stride_t, stride_h) of a [T, n] (H = 1) or [T, H, n] tensor."""
    if x.dim() == 2:
        return x.shape[0], 1, x.shape[1], x.stride(0), 0
    return x.shape[0], x.shape[1], x.shape[2], x.stride(0), x.stride(1)


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, hf: bool,
                 split: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward on validated rows ([T, E] or [T, H, D]); returns (y like x in BF16,
    rstd [rows] FP32). ``split`` (the Triton negative control's knob) must be 0 here."""
    if split:
        raise ValueError("the split-reduction negative control exists only for triton_cuda_bf16")
    t, h, n, sxt, sxh = _rows_view(x)
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    rows = t * h
    rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
    _, _, _, syt, syh = _rows_view(y)
    launch(x.device, "rl_rms_norm_fwd", x, weight, y, rstd, rows, max(h, 1), n, sxt, sxh, syt, syh, float(eps),
           1 if hf else 0)
    return y, rstd


def rms_norm_bwd(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor, need_dx: bool,
                 need_dw: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Launch the backward (dy BF16 with unit stride on the last axis); returns (dx like x or
    None, dweight [E] or None), BF16, each launched only when needed."""
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
